"""A collapse that heals on its own clears itself, in the closed loop.

``rechunk-heals`` (chunk size 512 → 500 at 1,800 s) never pages under the default policy:
the fleet's hit rate dips for about a minute while the new chunks are computed once, and
stays far above the collapse threshold. Under a policy sensitive enough to call that dip a
collapse (a 1m window every 10 s, a 5%/3-point drop, 2 windows), the same run raises
``PrefixCollapse`` and then clears it as healed, with the healing time, and no human
acknowledges anything (``docs/decisions.md``, "PrefixCollapse").
"""

from __future__ import annotations

from cachescale.commands.simulate import build_autoscaler
from cachescale.sim.drive import run
from cachescale.sim.scenario import load_builtin

SENSITIVE = {
    "metrics": {"window": "1m", "interval": "10s"},
    "budget": {"gpuSecondsPer1kRequests": 900},
    "cache": {"collapseWindows": 2, "collapseRelativeDrop": 0.05, "collapseAbsoluteDrop": 0.03},
}
CHANGE_S = 1800.0


def test_rechunk_heals_clears_its_collapse_as_healed_with_the_time_it_took() -> None:
    base = load_builtin("rechunk-heals")
    scenario = base.model_copy(update={"duration_s": 2000.0, "policy": SENSITIVE})
    result = run(scenario, build_autoscaler("cachescale", scenario))
    raised = [
        (record.t_s, message)
        for record in result.policy
        for message in record.raised
        if message.startswith("PrefixCollapse:")
    ]
    assert raised, "the sensitive policy did not call the dip a collapse"
    assert all(t_s > CHANGE_S for t_s, _ in raised)
    cleared = [
        (record.t_s, message)
        for record in result.policy
        for reason, message in zip(record.cleared, record.cleared_messages, strict=True)
        if reason == "PrefixCollapse"
    ]
    assert len(cleared) == len(raised)
    for t_s, message in cleared:
        assert message.startswith("healed after "), message
        assert "with no human action" in message
        assert t_s - CHANGE_S < 300  # healed within minutes, as the scenario says
    assert not result.policy[-1].alerts
