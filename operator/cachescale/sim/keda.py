"""KEDA's ScaledObject with a Prometheus queue trigger, as many vLLM fleets autoscale.

vLLM production-stack scales its engines with KEDA: a Prometheus trigger on
``sum(vllm:num_requests_waiting)`` with ``threshold: 5``. KEDA turns it into an HPA on an
*External* metric with an AverageValue target, and that differs from the Pods-metric HPA of
``sim/hpa.py`` in the arithmetic, not only in the plumbing (``replica_calculator.go``,
``GetExternalPerPodMetricReplicas``): the HPA asks for ceil(sum / threshold), its
tolerance read against sum / (threshold × the Deployment's replicas), whichever pods export
the metric. Pods still loading weights count as serving: KEDA's HPA may shrink a fleet
whose new pods are not ready yet, where a Pods-metric HPA keeps its count whenever the
loading pods could reverse the direction. The HPA's own tolerance, stabilization windows
and rate policies apply as they do in ``sim/hpa.py``, whose model runs here unchanged: it
is fed the sum spread evenly over the replicas, which gives it the External metric's
ratio exactly.

KEDA's ``pollingInterval`` matters to the replica count when ``useCachedMetrics`` is on:
the HPA then reads the value of KEDA's last poll instead of a fresh query at each sync.
``cooldownPeriod`` and ``activationThreshold`` only act between 0 and 1 replica (scale to
zero), which a simulated fleet never reaches (its minimum is at least 1), so they are not
modelled.
"""

from __future__ import annotations

from cachescale.sim.autoscaler import FleetObservation, HPAAutoscaler, ScaleDecision
from cachescale.sim.hpa import HPAModel
from cachescale.sim.scenario import HPAMetric, KedaSpec


class KedaAutoscaler(HPAAutoscaler):
    """KEDA's generated HPA on ``sum(vllm:<metric>)`` with the threshold as its target."""

    name = "keda"

    def __init__(self, model: HPAModel, metric: HPAMetric, keda: KedaSpec) -> None:
        super().__init__(model, metric)
        self._keda = keda
        self._polled: float | None = None
        self._next_poll_s = 0.0

    def step_within(
        self, observation: FleetObservation, envelope: tuple[int, int, float] | None
    ) -> ScaleDecision:
        """One sync of KEDA's HPA inside ``(minReplicaCount, maxReplicaCount, threshold)``
        (None: the ScaledObject as written)."""
        per_pod = (
            observation.waiting_per_ready_pod
            if self.metric_name.endswith("num_requests_waiting")
            else observation.running_per_ready_pod
        )
        total = float(sum(per_pod))  # the query: a sum over the pods that export it
        if observation.now_s + 1e-9 >= self._next_poll_s:
            self._polled = total
            self._next_poll_s = observation.now_s + self._keda.polling_interval_s
        if self._keda.use_cached_metrics and self._polled is not None:
            total = self._polled
        replicas = max(observation.replicas, 1)
        low, high, target = envelope if envelope is not None else (None, None, None)
        decision = self._model.step(
            observation.now_s,
            observation.replicas,
            [total / replicas] * replicas,  # the External metric's ratio, sum / (target × n)
            min_replicas=low,
            max_replicas=high,
            target=target,
        )
        return ScaleDecision(decision.desired_replicas, decision.reason)
