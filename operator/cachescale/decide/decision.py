"""``Decision``: everything one evaluation decided, as ``decide`` returns it.

The operator renders it into the policy's status, Events and metrics and applies its
envelope and batch ceiling; the simulator's closed loop applies the same fields to its
fleet. The ``memory`` field is what the next evaluation receives.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cachescale.api.reasons import Action, Diagnosis
from cachescale.decide.alerts import AlertChange
from cachescale.decide.checks import Finding
from cachescale.decide.conditions import ConditionVerdict
from cachescale.decide.demand import Demand, ExtraCost
from cachescale.decide.envelope import Envelope
from cachescale.decide.learned import LearnedAlert, LearnedState


@dataclass(frozen=True, slots=True)
class Decision:
    """Everything one evaluation decided."""

    state: Diagnosis
    """The leading diagnosis (``kubectl get`` shows it)."""
    findings: tuple[Finding, ...]
    envelope: Envelope
    max_num_seqs: int | None
    """The batch ceiling to run with (the current one when unchanged or unmanaged)."""
    reason: Action
    """What the evaluation did (the Event's reason when it is applied)."""
    message: str
    alerts: tuple[LearnedAlert, ...]
    raised: tuple[AlertChange, ...]
    cleared: tuple[AlertChange, ...]
    conditions: tuple[ConditionVerdict, ...]
    memory: LearnedState
    budget_max_replicas: int | None = None
    hpa_wanted_replicas: int | None = None
    """What the HPA's own metric asks for at the current target (an estimate)."""
    ceiling: int | None = None
    """B_max, when known."""
    demand: Demand | None = None
    """The request rate the decision read as demand (arrivals when known)."""
    slo_needed_replicas: int | None = None
    """Replicas the SLO needs at the current cost, while an incident lasts."""
    demand_replicas: int | None = None
    """The demand-alone reference: replicas the demand needs at the baseline cost."""
    drain_replicas: int | None = None
    """The maxReplicas that drains a backlog within ``DRAIN_SECONDS``, when the SLO estimate's
    headroom would take longer."""
    headroom_replicas: int | None = None
    """The maxReplicas that leaves the HPA room for rising demand, while requests cost what
    they did (``headroom.demand_headroom``)."""
    extra_cost: ExtraCost | None = None
    """What requests cost over the baseline, as the OverBudget and PrefixCollapse
    messages quote it."""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def has(self, diagnosis: Diagnosis) -> bool:
        """Whether ``diagnosis`` is among the findings."""
        return any(f.diagnosis is diagnosis for f in self.findings)

    def alert_active(self, reason: Diagnosis) -> bool:
        """Whether an alert with this reason is active after the evaluation."""
        return any(a.reason == reason for a in self.alerts)
