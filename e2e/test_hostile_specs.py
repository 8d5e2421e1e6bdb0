"""Hostile and broken policies through the real API server, with the operator running.

Every spec below is either refused by the API server with a message that names the field,
or stored and then handled by the operator with a clear condition. Meanwhile the operator
(as the chart's ServiceAccount) never crashes, never writes to an HPA or a Deployment on
behalf of a refused policy (the API server's audit log counts its writes), and a healthy
policy beside them keeps its evaluations on schedule.

- Generated specs (hypothesis, derandomized, ``EXAMPLES`` per run): a valid policy with
  one to four fields replaced by something hostile — huge or tiny numbers, integers past
  int64, wrong types, very long strings, quotes, braces, newlines, PromQL fragments,
  unicode — or removed, or an unknown field added. They go to the API server as
  server-side dry runs (what ``kubectl apply`` would do, fieldValidation=Strict); the
  operator's own model (pydantic) reads every spec the server accepts, and a few of them
  (those it refuses first) are then created for real for the operator to see.
- Hand-written: NaN and Inf (JSON has none; YAML's ``.nan``/``.inf`` stop at kubectl),
  ``minReplicas: 0``, a target in another namespace, the operator's own Deployment as a
  target, two policies on one HPA (the older holds it, the other says ``TargetClaimed``
  and takes over when the older is deleted).

The findings (what the server accepts that the operator then refuses) are in
docs/security.md.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from cachescale.api.reasons import Problem
from cachescale.api.spec import CacheScalingPolicySpec
from cachescale.api.validation import check_text
from cachescale.controller.target.claims import DEPLOYMENT_ENV, NAMESPACE_ENV
from e2e.harness.api import ApiError
from e2e.harness.cluster import Cluster
from e2e.harness.release import Release
from e2e.kube_helpers import apply, condition_of, events_for, get, until
from e2e.operators import operator_process
from e2e.serving import APP, create_stack
from e2e.tenancy import grant_enforce
from tests.controller.engine_fake import EngineFake, EngineNumbers
from tests.controller.process_fixture import LOOPBACK_PROMETHEUS, OperatorProcess
from tests.gather.gather_fakes import fake_prometheus

EXAMPLES = 300
"""Generated specs per run (each a server-side dry run, ~20 ms)."""
CREATED = 8
"""How many of the specs the server stores are then created for real."""
INTERVAL_S = 10.0
POLICIES = "/apis/cachescale.dev/v1alpha1/namespaces/{namespace}/cachescalingpolicies"
PROBLEMS = {str(p) for p in Problem}
FIELD_PATH = re.compile(r"spec(\.[A-Za-z0-9]+)*|\.spec\b|json|unknown field|decode", re.I)


def valid_spec(prometheus_url: str, hpa: str = APP, mode: str = "Enforce") -> dict[str, Any]:
    """A policy the API server and the operator both accept (10 s interval)."""
    return {
        "mode": mode,
        "target": {"deploymentName": APP, "hpaName": hpa, "containerName": "vllm"},
        "metrics": {
            "prometheusUrl": prometheus_url,
            "selector": {"model_name": "m"},
            "window": "1m",
            "interval": "10s",
        },
        "slo": {"ttftP95Seconds": 1.0, "ttftP99Seconds": 2.0},
        "budget": {"gpuSecondsPer1kRequests": 800, "minReplicas": 1, "maxReplicas": 4},
        "cache": {"podWarmupSeconds": 0},
    }


def body(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "cachescale.dev/v1alpha1",
        "kind": "CacheScalingPolicy",
        "metadata": {"name": name},
        "spec": spec,
    }


# -- hostile values -----------------------------------------------------------------------

FRAGMENTS = [
    '"', "'", "`", "\\", "{", "}", '"}', "{{ .Values }}", "${HOME}", "\n", "\r\n", "\t",
    '"} or vector(1) #', 'up{job=~".+"}', "sum(rate(x[5m])) by (pod)", ")) or on() vector(1",
    "http://169.254.169.254/latest/meta-data/", "file:///etc/passwd", "../../../",
    "'; DROP TABLE policies; --", "\u202e", "\ufeff", "\u0000", "０", "☃", "🙂", "ñ",
    "null", "NaN", "Infinity", "-Infinity", "1e309", "0x10", " 5m", "5m ", "-5m", "0s",
    "1h-30m", "99999999999999999999h", "5M", "1.5m", "",
]  # fmt: skip
TEXT = st.one_of(
    st.text(max_size=40),
    st.sampled_from(FRAGMENTS),
    st.builds(
        lambda part, n: part * n,
        st.sampled_from(["a", "é", "{", '"', "\n", "🙂", "x" * 9 + "."]),
        st.sampled_from([64, 254, 5_000, 70_000]),
    ),
)
NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, -1, -0.0, 1e308, -1e308, 5e-324, 2**63 - 1, 2**63, 2**64, 10_001]),
)
ANYTHING = st.one_of(
    NUMBERS,
    TEXT,
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(TEXT, st.one_of(TEXT, NUMBERS), max_size=3),
)
LEAVES = [
    ("mode",), ("restoreOnDelete",),
    ("target", "deploymentName"), ("target", "containerName"), ("target", "hpaName"),
    ("target", "engine"), ("target", "namespace"),
    ("metrics", "prometheusUrl"), ("metrics", "selector"), ("metrics", "window"),
    ("metrics", "interval"), ("metrics", "demandQuery"),
    ("slo", "ttftP95Seconds"), ("slo", "ttftP99Seconds"),
    ("budget", "gpuSecondsPer1kRequests"), ("budget", "minReplicas"), ("budget", "maxReplicas"),
    ("cache", "collapseRelativeDrop"), ("cache", "collapseAbsoluteDrop"),
    ("cache", "collapseWindows"), ("cache", "podWarmupSeconds"), ("cache", "onCollapse"),
    ("batching", "manageMaxNumSeqs"), ("batching", "minNumSeqs"), ("batching", "maxNumSeqs"),
    ("batching", "cooldown"), ("batching", "cacheReserveGiB"),
    ("batching", "gpu", "memoryGiB"), ("batching", "model", "weightsGiB"),
    ("target", "scaledObjectName"), ("cache", "promptSources"),
    ("target",), ("metrics",), ("unknownField",),
]  # fmt: skip
SOURCE = {"namespace": "rag", "kind": "Deployment", "labelSelector": "app=rag-api"}
"""A valid ``spec.cache.promptSources`` item."""
SOURCE_VALUES = {
    "namespace": st.one_of(TEXT, st.sampled_from(["rag", "n" * 63, "n" * 64, "Rag", "rag.prod"])),
    "kind": st.one_of(TEXT, st.sampled_from(["Deployment", "ConfigMap", "Secret", "Pod"])),
    "labelSelector": st.one_of(
        TEXT, st.sampled_from(["app=rag-api", "app in (a", "a" * 1025, "!canary", "=x"])
    ),
}

NUMERIC = {
    "ttftP95Seconds", "ttftP99Seconds", "gpuSecondsPer1kRequests", "minReplicas",
    "maxReplicas", "collapseRelativeDrop", "collapseAbsoluteDrop", "collapseWindows",
    "podWarmupSeconds", "minNumSeqs", "maxNumSeqs", "cacheReserveGiB", "memoryGiB",
    "weightsGiB",
}  # fmt: skip


@st.composite
def prompt_sources(draw: st.DrawFn) -> Any:
    """A list of valid items, 1 to 1,000 of them, one or two of them made hostile (a field
    replaced, removed or added, or the item not an object); or not a list at all."""
    if draw(st.integers(0, 5)) == 0:
        return draw(st.one_of(ANYTHING, st.just(dict(SOURCE))))
    items: list[Any] = [dict(SOURCE) for _ in range(draw(st.sampled_from([1, 2, 16, 17, 1000])))]
    for _ in range(draw(st.integers(0, 2))):
        index = draw(st.integers(0, len(items) - 1))
        key = draw(st.sampled_from([*SOURCE_VALUES, "labels", None]))
        if key is None:
            items[index] = draw(ANYTHING)
        elif not isinstance(items[index], dict):
            continue
        elif key == "labels" or draw(st.integers(0, 4)):
            items[index][key] = draw(SOURCE_VALUES.get(key, ANYTHING))
        else:
            items[index].pop(key, None)
    return items


@st.composite
def hostile_specs(draw: st.DrawFn) -> dict[str, Any]:
    """A valid spec with one to four fields replaced by something hostile, or removed."""
    spec = valid_spec("http://prometheus.invalid:9090")
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(LEAVES))
        parent = spec
        for key in path[:-1]:
            if not isinstance(parent.get(key), dict):
                parent[key] = {}
            parent = parent[key]
        if draw(st.integers(0, 5)) == 0:
            parent.pop(path[-1], None)
        elif path[-1] == "selector":
            parent["selector"] = draw(st.dictionaries(TEXT, TEXT, max_size=4))
        elif path[-1] == "promptSources":
            parent["promptSources"] = draw(prompt_sources())
        elif path[-1] == "scaledObjectName":
            if draw(st.booleans()):  # instead of the HPA (else both are set)
                parent.pop("hpaName", None)
            parent["scaledObjectName"] = draw(st.one_of(TEXT, TEXT, ANYTHING))
        else:  # mostly the right type at a hostile value, else anything at all
            kind = NUMBERS if path[-1] in NUMERIC else TEXT
            parent[path[-1]] = draw(st.one_of(kind, kind, ANYTHING))
    return spec


# -- the stack ----------------------------------------------------------------------------


@dataclass
class Outcome:
    """What the API server said of one spec, and what the operator's model says of it."""

    spec: dict[str, Any]
    refused: str | None = None
    """The server's message when it refused the spec."""
    operator: str | None = None
    """The operator's InvalidSpec summary for a spec the server stored."""


@dataclass
class Hostile:
    cluster: Cluster
    release: Release
    namespace: str
    prometheus_url: str
    operator: OperatorProcess
    user: str
    before: dict[tuple[str, str], int]
    outcomes: list[Outcome] = field(default_factory=list)
    fuzzed: list[str] = field(default_factory=list)
    """Generated specs created for real."""

    def submit(self, spec: dict[str, Any], namespace: str | None = None) -> Outcome:
        """A server-side dry run of a policy with ``spec`` (as kubectl would send it)."""
        path = POLICIES.format(namespace=namespace or self.namespace)
        outcome = Outcome(spec)
        try:
            stored = self.api_post(f"{path}?dryRun=All&fieldValidation=Strict", body("fuzz", spec))
        except ApiError as error:
            failed = error
        else:
            failed = None
        if failed is not None:
            assert failed.status in (400, 422), f"{failed.status} for {spec!r}: {failed}"
            outcome.refused = server_message(str(failed))
            assert outcome.refused, f"no message for {spec!r}"
            assert FIELD_PATH.search(outcome.refused), outcome.refused
            return outcome
        try:
            CacheScalingPolicySpec.model_validate(stored["spec"])
        except ValidationError as error:  # anything else is an operator crash: the test fails
            outcome.operator = "; ".join(
                f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors()
            )
        return outcome

    def api_post(self, path: str, payload: dict[str, Any]) -> Any:
        plane = self.cluster.plane
        assert plane is not None
        return plane.admin_api().post(path, payload)

    def writes(self) -> dict[tuple[str, str], int]:
        """The operator's successful writes to HPAs and Deployments, per namespace."""
        plane = self.cluster.plane
        assert plane is not None
        return {
            (namespace, resource): len(plane.writes(self.user, resource, namespace))
            for namespace in (self.namespace, self.release.namespace)
            for resource in ("horizontalpodautoscalers", "deployments")
        }

    def ready(self, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        found = get(self.cluster, "csp", name, "-n", namespace or self.namespace)
        return condition_of(found or {}, "Ready")

    def alive(self) -> None:
        assert self.operator.process.poll() is None, self.operator.tail()
        log = self.operator.output()
        assert "Traceback" not in log, self.operator.tail(80)
        assert not re.search(r"evaluation of \S+ failed", log), self.operator.tail(80)


def server_message(error: str) -> str:
    """The ``message`` of the Status in an ApiError's text."""
    _, _, text = error.partition(": ")
    try:
        return str(json.loads(text).get("message", ""))
    except ValueError:
        return text


@pytest.fixture(scope="module")
def hostile(
    cluster: Cluster, release: Release, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Hostile]:
    if cluster.plane is None:
        pytest.skip("counts the operator's writes in the envtest API server's audit log")
    workdir = tmp_path_factory.mktemp("hostile")
    namespace = f"cachescale-e2e-hostile-{int(time.time()) % 100000}"
    assert cluster.kubectl("create", "namespace", namespace).returncode == 0
    kubeconfig = cluster.token_kubeconfig(
        workdir / "operator.kubeconfig", release.namespace, release.service_account
    )
    grant_enforce(cluster, release, namespace)  # Enforce: rbac.enforceNamespaces
    _, pods = create_stack(cluster, namespace, "m", 1)
    user = f"system:serviceaccount:{release.namespace}:{release.service_account}"
    with ExitStack() as stack, pytest.MonkeyPatch.context() as env:
        prometheus = stack.enter_context(fake_prometheus())
        engines = EngineFake()  # a healthy engine behind every policy's selector
        # As the operator reads it: confined to the policy's namespace (docs/security.md).
        engines.set({"model_name": "m", "namespace": namespace}, EngineNumbers(pods=tuple(pods)))
        prometheus.respond = engines
        # Who the operator is, as the chart's Deployment tells it (downward API).
        env.setenv(NAMESPACE_ENV, release.namespace)
        env.setenv(DEPLOYMENT_ENV, release.name)
        operator = stack.enter_context(
            operator_process(
                workdir,
                kubeconfig,
                namespaces=(namespace, release.namespace),
                flags=LOOPBACK_PROMETHEUS,
            )
        )
        hostile = Hostile(cluster, release, namespace, prometheus.url, operator, user, {})
        hostile.before = hostile.writes()
        # Two policies on one HPA: "healthy" is older (or, the same second, first by name).
        # It only advises; "late" would enforce, and patch the HPA once its window is full.
        apply(cluster, namespace, body("healthy", valid_spec(prometheus.url, mode="Advise")))
        apply(cluster, namespace, body("late", valid_spec(prometheus.url)))
        yield hostile
        # While the operator runs: it holds their finalizers.
        cluster.kubectl("delete", "csp", "--all", "-n", namespace, "--timeout=60s")
        cluster.kubectl("delete", "csp", "itself", "-n", release.namespace, "--timeout=30s")
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")


# -- the tests ----------------------------------------------------------------------------


def test_generated_specs_are_refused_readably_or_stored(hostile: Hostile) -> None:
    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(hostile_specs())
    # The unmutated spec. No generated spec has failed here yet; the admitted extremes
    # that crashed the decision itself are tests/decide/test_admitted_extremes.py.
    @example(valid_spec("http://prometheus.invalid:9090"))
    def submit(spec: dict[str, Any]) -> None:
        hostile.outcomes.append(hostile.submit(spec))

    submit()
    refused = [o for o in hostile.outcomes if o.refused]
    doubted = [o for o in hostile.outcomes if not o.refused and o.operator]
    print(
        f"\n{len(hostile.outcomes)} specs: {len(refused)} refused by the API server, "
        f"{len(doubted)} stored but refused by the operator (InvalidSpec), "
        f"{len(hostile.outcomes) - len(refused) - len(doubted)} valid"
    )
    for outcome in doubted:
        print(f"  stored, then InvalidSpec: {outcome.operator[:200] if outcome.operator else ''}")
    assert len(refused) > EXAMPLES // 2, "most hostile specs never reach the operator"
    # A few of the stored ones, created for real: the operator sees them (below). Those
    # the operator refuses first, then distinct valid ones.
    seen: set[str] = set()
    for outcome in [*doubted, *(o for o in hostile.outcomes if not o.refused)]:
        key = json.dumps(outcome.spec, sort_keys=True)
        if key not in seen and len(hostile.fuzzed) < CREATED:
            seen.add(key)
            hostile.fuzzed.append(f"fuzz-{len(seen)}")
            apply(hostile.cluster, hostile.namespace, body(hostile.fuzzed[-1], outcome.spec))


def test_nan_inf_huge_and_foreign_targets_are_refused_by_the_api_server(
    hostile: Hostile,
) -> None:
    base = valid_spec(hostile.prometheus_url)
    path = POLICIES.format(namespace=hostile.namespace)
    for word in ("nan", "inf", "-inf"):
        spec = copy.deepcopy(base)
        spec["slo"]["ttftP95Seconds"] = float(word)
        # JSON has no NaN/Inf: a client that sends them anyway gets a decode error.
        with pytest.raises(ApiError) as raised:
            hostile.api_post(f"{path}?dryRun=All", body("fuzz", spec))  # json.dumps writes NaN
        assert raised.value.status == 400, raised.value
        print(f"  JSON {word}: {server_message(str(raised.value))[:160]}")
        # YAML has them (.nan, .inf): kubectl cannot turn them into JSON and sends nothing.
        text = yaml.safe_dump(body("fuzz", spec))
        assert f"ttftP95Seconds: {word.replace('nan', '.nan').replace('inf', '.inf')}" in text
        result = hostile.cluster.kubectl(
            "apply", "--dry-run=server", "-n", hostile.namespace, "-f", "-", stdin=text
        )
        assert result.returncode != 0, text
        assert result.stderr.strip(), "kubectl says why"
        print(f"  YAML {word}: {result.stderr.strip()[:160]}")
    cases: dict[str, tuple[tuple[str, ...], Any]] = {
        "minReplicas 0": (("budget", "minReplicas"), 0),
        "a huge budget": (("budget", "maxReplicas"), 10**30),
        "a target in another namespace": (("target", "namespace"), "kube-system"),
        "a quoted number": (("slo", "ttftP95Seconds"), "1.0"),
        "a newline in a name": (("target", "hpaName"), "vllm\nother"),
        "a PromQL selector key": (("metrics", "selector"), {'x"} or vector(1) #': "v"}),
        "an empty selector value": (("metrics", "selector"), {"model_name": ""}),
        "a 70k-character URL": (("metrics", "prometheusUrl"), "http://" + "a" * 70_000),
        "a 960 KB selector": (
            ("metrics", "selector"),
            {f"l{i}": "v" * 60_000 for i in range(16)},
        ),
        "a URL with a backslash and user info": (
            ("metrics", "prometheusUrl"),
            "http://127.0.0.1:18080\\@prom.monitoring:9090",
        ),
    }
    for what, (where, value) in cases.items():
        spec = copy.deepcopy(base)
        parent = spec
        for key in where[:-1]:
            parent = parent[key]
        parent[where[-1]] = value
        outcome = hostile.submit(spec)
        assert outcome.refused, f"{what}: stored by the API server"
        print(f"  {what}: {outcome.refused[:160]}")
    # Without strict field validation (raw API clients), an unknown field is dropped with
    # a warning: the target is still the policy's own namespace, never another one.
    spec = copy.deepcopy(base)
    spec["target"]["namespace"] = "kube-system"
    stored = hostile.api_post(f"{path}?dryRun=All", body("fuzz", spec))
    assert "namespace" not in stored["spec"]["target"]


def edited(spec: dict[str, Any], section: str, edits: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with ``edits`` merged into ``spec[section]`` (a None value removes a key)."""
    merged = {**spec.get(section, {}), **edits}
    return {**spec, section: {key: value for key, value in merged.items() if value is not None}}


def sources(count: int) -> list[dict[str, str]]:
    """``count`` valid prompt sources, each its own object (YAML would alias one repeated)."""
    return [dict(SOURCE) for _ in range(count)]


NAME, SELECTOR = "scaledObjectName", "labelSelector"
AUTOSCALER_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("both autoscalers", {NAME: APP}, "exactly one of"),
    ("neither autoscaler", {"hpaName": None}, "exactly one of"),
    ("both, the HPA's name empty", {"hpaName": "", NAME: APP}, "hpaName"),
    *(
        (f"{NAME} {what}", {"hpaName": None, NAME: name}, NAME)
        for what, name in [
            ("upper case", "Vllm"),
            ("with an underscore", "vllm_keda"),
            ("ending in a dash", "vllm-"),
            ("ending in a newline", "vllm\n"),
            ("with a slash", "keda/vllm"),
            ("empty", ""),
            ("of 254 characters", "a" * 254),
            ("of 70k characters", "a" * 70_000),
            ("a number", 5),
            ("a list", [APP]),
        ]
    ),
]
"""``spec.target`` edits the API server and ``cachescale validate`` both refuse, and the
word both name."""
SOURCE_CASES: list[tuple[str, Any, str]] = [
    ("an object", SOURCE, "promptSources"),
    ("a string", "app=rag-api", "promptSources"),
    ("of 17 items", sources(17), "promptSources"),
    ("of 1,000 items", sources(1000), "promptSources"),
    ("with a string item", ["app=rag-api"], "promptSources"),
    ("with a null item", [None], "promptSources"),
    ("with a nested list", [[SOURCE]], "promptSources"),
    ("with an empty item", [{}], "namespace"),
    ("with a Pod", [{**SOURCE, "kind": "Pod"}], "kind"),
    ("with a lower-case kind", [{**SOURCE, "kind": "deployment"}], "kind"),
    ("without a selector", [{"namespace": "rag", "kind": "Secret"}], SELECTOR),
    ("with an empty selector", [{**SOURCE, SELECTOR: ""}], SELECTOR),
    ("with a 1,025-byte selector", [{**SOURCE, SELECTOR: "a" * 1025}], SELECTOR),
    ("with a 70k selector", [{**SOURCE, SELECTOR: "a=" + "b" * 70_000}], SELECTOR),
    ("with a namespace of 64", [{**SOURCE, "namespace": "n" * 64}], "namespace"),
    ("with a dotted namespace", [{**SOURCE, "namespace": "rag.prod"}], "namespace"),
    ("with an unknown field", [{**SOURCE, "labels": {"app": "x"}}], "labels"),
    ("bad in the 16th item", [*sources(15), {**SOURCE, "kind": "Job"}], "kind"),
]
"""``spec.cache.promptSources`` values both refuse, and the word both name."""


def test_autoscaler_names_and_prompt_sources_are_refused_alike(hostile: Hostile) -> None:
    """``spec.target.scaledObjectName`` and ``spec.cache.promptSources``: the API server
    (schema, CEL and strict field validation) and ``cachescale validate`` refuse each of
    these, both naming the field. A label selector that does not parse is stored (the CRD
    bounds its length only) and refused by the operator: it and a policy on a ScaledObject
    that does not exist are created for real: the operator says why for each, and the
    next test sees it keep evaluating the healthy policy meanwhile."""
    base = valid_spec(hostile.prometheus_url)
    cases = [(what, edited(base, "target", edits), word) for what, edits, word in AUTOSCALER_CASES]
    cases += [
        (f"promptSources {what}", edited(base, "cache", {"promptSources": value}), word)
        for what, value, word in SOURCE_CASES
    ]
    for what, spec, word in cases:
        outcome = hostile.submit(spec)
        assert outcome.refused, f"{what}: stored by the API server"
        assert word in outcome.refused, f"{what}: {outcome.refused[:300]}"
        problems = check_text(yaml.safe_dump(body("fuzz", spec))).problems
        assert problems, f"{what}: refused by the API server, accepted by cachescale validate"
        assert any(word in p.path or word in p.message for p in problems), (what, problems)
        assert all("\n" not in p.message for p in problems), (what, problems)
        print(f"  {what}: {outcome.refused[:140]} | validate: {problems[0].message[:100]}")
    # Stored by the server; the selector refused by validate and by the operator.
    stored = {
        "selector": edited(base, "cache", {"promptSources": [{**SOURCE, SELECTOR: "app in (a"}]}),
        "no-scaled-object": edited(base, "target", {"hpaName": None, NAME: "no-such-keda"}),
    }
    for name, spec in stored.items():
        outcome = hostile.submit(spec)
        assert outcome.refused is None, f"{name}: {outcome.refused}"
        invalid = check_text(yaml.safe_dump(body(name, spec))).problems
        assert bool(invalid) == (name == "selector"), invalid
        if invalid:
            assert [p.path for p in invalid] == [f"spec.cache.promptSources[0].{SELECTOR}"]
            assert outcome.operator is not None
            assert "is not a label selector" in outcome.operator, outcome
        hostile.fuzzed.append(f"hand-{name}")
        apply(hostile.cluster, hostile.namespace, body(hostile.fuzzed[-1], spec))
    # The operator says why, in one line, for each.
    expected = {
        "hand-selector": ({"InvalidSpec"}, "is not a label selector"),
        "hand-no-scaled-object": ({"TargetNotFound", "ApiError"}, "ScaledObject no-such-keda"),
    }
    for name, (reasons, words) in expected.items():

        def said(name: str = name, reasons: set[str] = reasons) -> dict[str, Any] | None:
            ready = hostile.ready(name)
            return ready if ready and ready["reason"] in reasons else None

        ready = until(said, f"{name}: the operator's reason", INTERVAL_S * 3)
        assert ready["status"] == "False", ready
        assert words in ready["message"], ready
        assert "\n" not in ready["message"], ready
        print(f"  {name}: {ready['reason']}: {ready['message'][:160]}")


def test_refused_policies_say_why_and_the_healthy_one_stays_on_schedule(
    hostile: Hostile,
) -> None:
    cluster, namespace, release = hostile.cluster, hostile.namespace, hostile.release
    itself = valid_spec(hostile.prometheus_url, hpa="cachescale-operator")
    itself["target"]["deploymentName"] = release.name
    apply(cluster, release.namespace, body("itself", itself))
    fuzzed = hostile.fuzzed
    observed: list[tuple[float, float]] = []

    def evaluations() -> None:
        # The operator's own gauge: the status is written only when it changed.
        stamp = hostile.operator.last_evaluation(namespace, "healthy")
        if stamp is not None and (not observed or observed[-1][1] != stamp):
            observed.append((time.monotonic(), stamp))

    def deciding() -> bool:
        found = get(cluster, "csp", "healthy", "-n", namespace) or {}
        reason = found.get("status", {}).get("lastDecision", {}).get("reason")
        return reason not in (None, "WaitingForFullWindow", "FrozenOnMissingMetrics")

    def settled() -> bool | None:
        evaluations()
        names = [("late", namespace), ("itself", release.namespace)]
        names += [(name, namespace) for name in fuzzed]
        refused = all(hostile.ready(n, ns) for n, ns in names)
        return True if refused and len(observed) >= 4 and deciding() else None

    # Until the healthy policy's window is full and it decides: by then "late", enforcing on
    # the same HPA with the same data, would have patched it, were it not refused.
    try:
        until(settled, "a condition on every refused policy, the healthy one deciding", 120)
    except AssertionError as timed_out:
        names = [("late", namespace), ("itself", release.namespace)]
        names += [(name, namespace) for name in fuzzed]
        silent = [name for name, ns in names if not hostile.ready(name, ns)]
        found = (get(cluster, "csp", "healthy", "-n", namespace) or {}).get("status", {})
        raise AssertionError(
            f"{timed_out}: no condition on {silent}; {len(observed)} evaluations of the "
            f"healthy one, its decision {found.get('lastDecision')}, its conditions "
            f"{found.get('conditions')}; operator: {hostile.operator.tail(30)}"
        ) from None
    late = hostile.ready("late")
    assert late is not None
    assert (late["status"], late["reason"]) == ("False", "TargetClaimed"), late
    assert f"managed by policy {namespace}/healthy" in late["message"]
    own = hostile.ready("itself", release.namespace)
    assert own is not None
    assert (own["status"], own["reason"]) == ("False", "TargetIsOperator"), own
    for name in fuzzed:
        ready = hostile.ready(name)
        assert ready is not None
        assert ready["status"] == "False", (name, ready)
        assert ready["reason"] in PROBLEMS, (name, ready)
        assert ready["message"], (name, ready)
        assert "\n" not in ready["message"], (name, ready)
    healthy = hostile.ready("healthy")
    assert healthy is not None
    assert (healthy["status"], healthy["reason"]) == ("True", "Evaluated"), healthy
    found = get(cluster, "csp", "healthy", "-n", namespace)
    assert condition_of(found, "MetricsAvailable")["status"] == "True", found["status"]
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(observed)]
    assert max(gaps) < INTERVAL_S * 1.6, f"evaluations of the healthy policy: gaps {gaps}"
    warnings = events_for(cluster, namespace, "CacheScalingPolicy", "late")
    assert [e["reason"] for e in warnings if e["type"] == "Warning"] == ["TargetClaimed"]
    described = cluster.kubectl("describe", "csp", "late", "-n", namespace).stdout
    assert "TargetClaimed" in described
    assert "delete one of them" in described
    assert hostile.writes() == hostile.before, "no HPA or Deployment write for any of them"
    hostile.alive()


def test_when_the_holder_is_deleted_the_next_policy_takes_over(hostile: Hostile) -> None:
    cluster, namespace = hostile.cluster, hostile.namespace
    deleted = cluster.kubectl("delete", "csp", "healthy", "-n", namespace, "--timeout=60s")
    assert deleted.returncode == 0, deleted.stderr
    gone = time.monotonic()

    def took_over() -> dict[str, Any] | None:
        ready = hostile.ready("late")
        return ready if ready and ready["reason"] != "TargetClaimed" else None

    ready = until(took_over, "the late policy taking over its HPA", INTERVAL_S * 3)
    at_takeover = hostile.writes()
    assert (ready["status"], ready["reason"]) == ("True", "Evaluated"), ready
    print(f"\n  taken over {time.monotonic() - gone:.1f}s after the delete: {ready}")
    # Every other policy on that HPA (generated ones, created later) now names the new holder.
    for name in hostile.fuzzed:
        found = get(cluster, "csp", name, "-n", namespace)
        refused = (hostile.ready(name) or {}).get("reason") == "InvalidSpec"
        if found["spec"]["target"].get("hpaName") != APP or refused:
            continue  # not on that HPA, or a spec the operator refuses: it claims nothing

        def renamed(name: str = name) -> dict[str, Any] | None:
            now = hostile.ready(name)
            return now if now and f"{namespace}/late" in now["message"] else None

        until(renamed, f"{name} naming the new holder", INTERVAL_S * 3)
    # Until the takeover nothing wrote to the HPA; from there "late" enforces (its first
    # patch comes after a full window of its own: tests/controller/target/test_claims.py).
    assert at_takeover == hostile.before, "no write before the takeover"
    hostile.alive()
