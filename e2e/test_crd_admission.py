"""Point 4: admission on a real API server, against the CRD the chart installed.

Every file in examples/invalid/ is rejected, and the server's message names the same
rule that ``cachescale validate`` names (the CEL rule's message, the OpenAPI bound, the
unknown field). The example policy and the whole examples/stack/ are accepted: the stack
is applied for real, with a minimal stand-in CRD for the Prometheus Operator's PodMonitor
(its schema is not what is under test here).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cachescale.api.status import CacheScalingPolicyStatus
from cachescale.api.validation import validate_yaml
from cachescale.controller.reconcile.status import render
from cachescale.decide import decide
from e2e.harness.cluster import REPO, Cluster
from e2e.harness.release import Release
from e2e.kube_helpers import apply, get
from tests.decide.decide_builders import learned, signals, snapshot, spec

INVALID = REPO / "examples" / "invalid"
RULES = {
    "bad-selector.yaml": ("spec.metrics", "Prometheus label name"),
    "bad-window.yaml": ("spec.metrics.window", "window"),
    "empty-selector-value.yaml": ("spec.metrics", "selector values must not be empty"),
    "managed-without-shape.yaml": ("spec.batching", "model and gpu"),
    "min-above-max-replicas.yaml": ("spec.budget", "must be less than or equal to maxReplicas"),
    "negative-budget.yaml": ("spec.budget.gpuSecondsPer1kRequests", "greater than 0"),
    "no-autoscaler.yaml": ("spec.target", "set exactly one of hpaName"),
    "num-seqs-inverted.yaml": ("spec.batching", "must be less than or equal to maxNumSeqs"),
    "p99-below-p95.yaml": ("spec.slo", "must be at least ttftP95Seconds"),
    "prompt-source-bad-namespace.yaml": (
        "spec.cache.promptSources[0].namespace",
        "[a-z0-9]([-a-z0-9]*[a-z0-9])?",
    ),
    "two-autoscalers.yaml": ("spec.target", "set exactly one of hpaName"),
    "unknown-field.yaml": ("spec.slo.ttftP95", "unknown field"),
}
"""Per file: the field path both must name, and the rule's words both must say."""

PODMONITOR_STAND_IN = """\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: podmonitors.monitoring.coreos.com}
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names: {kind: PodMonitor, listKind: PodMonitorList, plural: podmonitors, singular: podmonitor}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
"""


def validate(path: Path) -> str:
    """What ``cachescale validate`` prints about ``path`` (the same function, in process:
    a Python start-up per file would cost more than the API server's answers)."""
    problems = validate_yaml(path.read_text(encoding="utf-8"))
    assert problems, f"cachescale validate accepted {path.name}"
    return "\n".join(problem.render(str(path)) for problem in problems)


def test_every_invalid_example_has_its_rule() -> None:
    assert sorted(p.name for p in INVALID.glob("*.yaml")) == sorted(RULES)


@pytest.mark.parametrize("name", sorted(RULES))
def test_invalid_example_rejected_for_the_rule_validate_names(
    cluster: Cluster, release: Release, namespace: str, name: str
) -> None:
    path, words = RULES[name]
    offline = validate(INVALID / name)
    server = cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", str(INVALID / name)
    )
    assert server.returncode != 0, f"the API server accepted {name}"
    print(f"{name}: validate: {offline.strip()}\n{name}: server: {server.stderr.strip()}")
    for text, who in ((offline, "cachescale validate"), (server.stderr, "the API server")):
        assert path in text, f"{who} does not name {path}: {text}"
        assert words in text, f"{who} does not say {words!r}: {text}"
    # Only that rule: the server stops at the first schema error, so nothing else may fail.
    assert "some validation rules were not checked" not in server.stderr


def test_example_stack_and_policy_accepted(cluster: Cluster, release: Release) -> None:
    stand_in = cluster.kubectl("apply", "-f", "-", stdin=PODMONITOR_STAND_IN)
    assert stand_in.returncode == 0, stand_in.stderr
    established = cluster.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s",
        "crd/podmonitors.monitoring.coreos.com",
    )  # fmt: skip
    assert established.returncode == 0, established.stderr
    try:
        applied = cluster.kubectl("apply", "-f", str(REPO / "examples" / "stack"))
        assert applied.returncode == 0, applied.stderr
        assert "cachescalingpolicy.cachescale.dev/llama3-8b-chat created" in applied.stdout
        policy = cluster.kubectl(
            "apply", "--dry-run=server", "-f", str(REPO / "examples" / "policy-vllm.yaml")
        )
        assert policy.returncode == 0, policy.stderr
    finally:
        cluster.kubectl("delete", "namespace", "llm", "--wait=false")


def test_a_policy_without_a_selector_is_accepted_as_its_namespace(
    cluster: Cluster, release: Release, namespace: str
) -> None:
    # Left out or {}, the selector means {namespace: <the policy's namespace>}
    # (MetricsSpec.selector_in), so the server accepts it as validate does.
    policy = yaml.safe_load((REPO / "examples" / "policy-vllm.yaml").read_text(encoding="utf-8"))
    policy["metadata"]["namespace"] = namespace
    policy["spec"]["metrics"]["selector"] = {}
    text = yaml.safe_dump(policy)
    assert validate_yaml(text) == []
    server = cluster.kubectl("apply", "--dry-run=server", "-f", "-", stdin=text)
    assert server.returncode == 0, server.stderr


def test_a_rendered_status_is_stored_as_it_was_written(
    cluster: Cluster, release: Release, namespace: str
) -> None:
    """The status schema keeps every field the operator writes as written (no pruning, no
    defaulting): ``status_writes`` knows a status unchanged, and keeps one copy of it, by
    the watch delivering back a status equal to the one written."""
    policy = yaml.safe_load((REPO / "examples" / "policy-vllm.yaml").read_text(encoding="utf-8"))
    policy["metadata"]["namespace"] = namespace
    apply(cluster, namespace, policy)
    name = policy["metadata"]["name"]
    previous, memory = CacheScalingPolicyStatus(), learned()
    for changed in ({}, {"hit": 0.04}, {"hit": 0.04}, {"ttft_p95_seconds": None}, {}):
        state = snapshot(signals(**changed))
        decision = decide(spec(), state, memory, state.signals.observed_at)
        status = render(
            previous,
            decision,
            state,
            generation=1,
            now=state.signals.observed_at,
            applied=True,
            warmup_seconds=300.0,
        ).wire
        patch = json.dumps([{"op": "add", "path": "/status", "value": status}])
        written = cluster.kubectl(
            "patch", "-n", namespace, "cachescalingpolicy", name, "--subresource=status",
            "--type=json", "-p", patch,
        )  # fmt: skip
        assert written.returncode == 0, written.stderr
        stored = get(cluster, "cachescalingpolicy", "-n", namespace, name)["status"]
        assert stored == status, decision.reason
        previous, memory = CacheScalingPolicyStatus.model_validate(status), decision.memory
