"""The fleet: pods of engine replicas as a Deployment runs them, and the router in front.

What this models, because the cache depends on it:

- **Each pod has its own cache** (no KV connector) and starts **cold**; a pod takes
  ``pod_start_delay_s`` (image pull, weight load, CUDA graphs) before it is ready, and its
  GPUs are paid for from the moment it is created.
- **Scale-down** removes the youngest pods first (the ReplicaSet controller prefers pods
  that have been ready the shortest time). A removed pod stops receiving requests and
  drains what it holds; its GPUs are paid for until it is empty.
- **Rolling restart** with a Deployment's default strategy (maxSurge 25%, maxUnavailable
  25%): new pods are created in surge batches and old pods drained as new ones become
  ready, so the whole fleet ends up cold within a few start delays.
- **Client timeouts** (optional): a request still queued without output that long after
  it arrived is aborted, as a client closing its connection; vLLM counts it as
  ``request_success_total{finished_reason="abort"}``. Checked whenever a pod is advanced.
- **Routers**: ``round_robin`` (a Kubernetes Service), ``least_loaded`` (fewest waiting +
  running), ``prefix_aware`` (like llm-d's approximate prefix-cache scorer: the router
  remembers which pod it last sent each sampled prefix block to, sends a request to the
  pod that got its longest remembered prefix, and falls back to the least loaded pod when
  that one is overloaded or gone).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from itertools import islice

from cachescale.sim.metrics import MAX_MODEL_LEN_TOKENS, ReplicaSeries
from cachescale.sim.profiles import ReplicaProfile
from cachescale.sim.replica import EngineReplica
from cachescale.sim.request import SimRequest

PREFIX_SAMPLE_STRIDE_BLOCKS = 16
"""The prefix-aware router indexes every 16th block (256 tokens), like a chunked scorer."""
PREFIX_INDEX_MAX_ENTRIES = 400_000
"""Router-side index size; the oldest half is forgotten when it is exceeded."""
PREFIX_AWARE_OVERLOAD_SLACK = 8
"""A pod may hold this many more requests than the least loaded pod and still win on prefix."""
ROLLOUT_SURGE_FRACTION = 0.25
"""Rolling restart: new pods per batch as a fraction of the fleet (Deployment maxSurge)."""


class RouterKind(StrEnum):
    """How requests are spread over ready pods."""

    ROUND_ROBIN = "round_robin"
    LEAST_LOADED = "least_loaded"
    PREFIX_AWARE = "prefix_aware"


@dataclass(eq=False)
class Pod:
    """One pod: an engine replica, its lifecycle times and its exported series."""

    name: str
    engine: EngineReplica
    series: ReplicaSeries
    created_s: float
    ready_s: float
    gpus: int
    revision: int
    draining_since_s: float | None = None
    gone_s: float | None = None

    def is_ready(self, now_s: float) -> bool:
        """Ready and not being removed: may receive requests."""
        return self.ready_s <= now_s and self.draining_since_s is None

    def age_s(self, now_s: float) -> float:
        """Seconds since the pod became ready (negative while starting)."""
        return now_s - self.ready_s

    def gpu_seconds_between(self, start_s: float, end_s: float) -> float:
        """GPU-seconds this pod held within [start_s, end_s)."""
        return self.span().gpu_seconds_between(start_s, end_s)

    def span(self) -> PodSpan:
        """What a run's result keeps of this pod (not its engine)."""
        return PodSpan(self.name, self.gpus, self.created_s, self.gone_s)


@dataclass(frozen=True, slots=True)
class PodSpan:
    """When a pod held its GPUs: what a run's cost is counted from."""

    name: str
    gpus: int
    created_s: float
    gone_s: float | None
    """None while the pod lives (it holds its GPUs to the end of any window)."""

    def gpu_seconds_between(self, start_s: float, end_s: float) -> float:
        """GPU-seconds the pod held within [start_s, end_s)."""
        alive_from = max(start_s, self.created_s)
        alive_to = min(end_s, self.gone_s if self.gone_s is not None else end_s)
        return self.gpus * max(0.0, alive_to - alive_from)


class Fleet:
    """The Deployment's pods, scaled by an autoscaler and fed by a router."""

    def __init__(
        self,
        profile: ReplicaProfile,
        max_num_seqs: int,
        router: RouterKind,
        pod_start_delay_s: float,
        initial_replicas: int,
        start_warm: bool = True,
        client_timeout_s: float | None = None,
        max_model_len: int | None = None,
    ) -> None:
        """``max_model_len`` sizes the pods' token histograms (None: the exporter's own
        default)."""
        self.profile = profile
        self.max_num_seqs = max_num_seqs
        self.router = router
        self.pod_start_delay_s = pod_start_delay_s
        self.pods: list[Pod] = []
        self._next_pod_index = 0
        self._round_robin = 0
        self._prefix_index: dict[bytes, Pod] = {}
        self.revision = 0
        self.desired_replicas = initial_replicas
        self.finished: list[SimRequest] = []
        self.client_timeout_s = client_timeout_s
        self.aborted: list[SimRequest] = []
        self.max_model_len = max_model_len
        for _ in range(initial_replicas):
            # Pods present at t=0 are ready at t=0 (their caches are still empty: "warm"
            # here means started, not cache-warm; the first minutes of a run warm them).
            self._create_pod(0.0, ready_now=start_warm)

    # -- lifecycle -----------------------------------------------------------------------

    def _create_pod(self, now_s: float, ready_now: bool = False) -> Pod:
        index = self._next_pod_index
        self._next_pod_index += 1
        ready_s = now_s if ready_now else now_s + self.pod_start_delay_s
        engine = EngineReplica(self.profile, self.max_num_seqs, index, ready_s)
        pod = Pod(
            name=f"engine-{index}",
            engine=engine,
            series=ReplicaSeries(self.max_model_len or MAX_MODEL_LEN_TOKENS),
            created_s=now_s,
            ready_s=ready_s,
            gpus=self.profile.gpus_per_replica,
            revision=self.revision,
        )
        self.pods.append(pod)
        return pod

    @property
    def live_pods(self) -> list[Pod]:
        """Pods that exist and are not being removed (starting or ready)."""
        return [pod for pod in self.pods if pod.draining_since_s is None]

    def ready_pods(self, now_s: float) -> list[Pod]:
        """Pods that may receive requests now."""
        return [pod for pod in self.pods if pod.is_ready(now_s)]

    def scale_to(self, replicas: int, now_s: float) -> None:
        """Set the Deployment's replica count; pods follow at once (see ``reconcile``)."""
        self.desired_replicas = replicas
        self.reconcile(now_s)

    def start_rolling_restart(self, now_s: float) -> None:
        """Roll every pod to a new revision: each is replaced by a new, cold pod."""
        self.revision += 1
        self.reconcile(now_s)

    def change_max_num_seqs(self, max_num_seqs: int, now_s: float) -> None:
        """Edit ``--max-num-seqs`` in the pod template: every pod rolls to a new one."""
        self.max_num_seqs = max_num_seqs
        self.start_rolling_restart(now_s)

    @property
    def rollout_in_progress(self) -> bool:
        """Whether pods of an older revision still exist (serving or draining)."""
        return any(pod.revision < self.revision and pod.gone_s is None for pod in self.pods)

    def reconcile(self, now_s: float) -> None:
        """Move pods toward ``desired_replicas`` of the current revision, as a Deployment.

        Rolling update with the Deployment defaults: maxSurge ceil(25%) extra pods may
        exist, and at least desired − floor(25%) pods stay ready, so old pods are drained
        only as new ones become ready. Outside a rollout this reduces to "create the
        missing pods, drain the surplus youngest first".
        """
        desired = self.desired_replicas
        live = self.live_pods
        old = [pod for pod in live if pod.revision < self.revision]
        new = [pod for pod in live if pod.revision == self.revision]
        if len(new) > desired:
            for pod in sorted(new, key=lambda p: p.ready_s, reverse=True)[: len(new) - desired]:
                pod.draining_since_s = now_s
            new = new[:desired]
        max_surge = math.ceil(ROLLOUT_SURGE_FRACTION * desired) if old else 0
        room = desired + max_surge - len(old) - len(new)
        for _ in range(max(0, min(desired - len(new), room))):
            self._create_pod(now_s)
        if old:
            min_available = desired - math.floor(ROLLOUT_SURGE_FRACTION * desired)
            ready_total = sum(1 for pod in self.live_pods if pod.ready_s <= now_s)
            drainable = max(0, ready_total - min_available)
            for pod in sorted(old, key=lambda p: p.ready_s, reverse=True)[:drainable]:
                pod.draining_since_s = now_s

    # -- time ---------------------------------------------------------------------------

    def advance_to(self, now_s: float) -> None:
        """Run every pod up to ``now_s``; collect finished requests; retire drained pods."""
        for pod in self.pods:
            if pod.gone_s is None and pod.ready_s <= now_s:
                self._advance_pod(pod, now_s)
                if (
                    pod.draining_since_s is not None
                    and pod.engine.num_running == 0
                    and pod.engine.num_waiting == 0
                ):
                    pod.gone_s = now_s

    def next_event_s(self) -> float:
        """When the first pod's engine next finishes a step or a decode run."""
        return min(
            (pod.engine.next_event_s for pod in self.pods if pod.gone_s is None),
            default=math.inf,
        )

    def _advance_pod(self, pod: Pod, now_s: float) -> None:
        for request in pod.engine.advance_to(now_s):
            pod.series.record_finished(request)
            request.block_hashes = []  # the engine is done with them; reports never need them
            self.finished.append(request)
        if self.client_timeout_s is not None:
            for request in pod.engine.abort_waiting(now_s - self.client_timeout_s):
                request.aborted_s = now_s
                request.block_hashes = []
                pod.series.record_aborted()
                self.aborted.append(request)

    # -- routing ------------------------------------------------------------------------

    def route(self, request: SimRequest) -> bool:
        """Send ``request`` to a ready pod; False when no pod is ready (request dropped).

        Every ready pod is first brought up to the arrival time, so the router reads
        current queues and caches, as a real router scraping live state would.
        """
        now_s = request.arrival_s
        ready = self.ready_pods(now_s)
        if not ready:
            return False
        for pod in ready:
            self._advance_pod(pod, now_s)
        self._pick(ready, request).engine.submit(request, now_s)
        return True

    def _pick(self, ready: list[Pod], request: SimRequest) -> Pod:
        if self.router is RouterKind.ROUND_ROBIN:
            self._round_robin += 1
            return ready[self._round_robin % len(ready)]
        loads = [pod.engine.load for pod in ready]
        least = min(loads)
        if self.router is RouterKind.LEAST_LOADED:
            return ready[loads.index(least)]
        prompt_blocks = request.prompt_tokens // self.profile.block_size
        sampled = request.block_hashes[:prompt_blocks:PREFIX_SAMPLE_STRIDE_BLOCKS]
        index = self._prefix_index
        chosen = ready[loads.index(least)]
        eligible = {
            id(pod)
            for pod, load in zip(ready, loads, strict=True)
            if load <= least + PREFIX_AWARE_OVERLOAD_SLACK
        }
        for block_hash in reversed(sampled):  # longest remembered prefix first
            holder = index.get(block_hash)
            if holder is not None and id(holder) in eligible:
                chosen = holder
                break
        index.update(dict.fromkeys(sampled, chosen))
        if len(index) > PREFIX_INDEX_MAX_ENTRIES:
            self._prefix_index = dict(islice(index.items(), len(index) // 2, None))
        return chosen
