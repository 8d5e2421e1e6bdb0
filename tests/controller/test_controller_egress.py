"""No confused deputy, no SSRF: what a policy author may make the operator send and fetch.

A policy names a Prometheus URL and, optionally, a Secret whose value becomes the bearer
token. Without limits, an author who may create policies but not read Secrets could have
any Secret of the namespace sent to a server of their choice, or make the operator fetch
internal addresses and read the answers back from the status. These tests run one
evaluation against kmock's API emulator and the scripted fake Prometheus (a real HTTP
server on loopback, so what reaches it is what the operator really sent).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import logging
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

import pytest

from cachescale.api.policy import PROMETHEUS_CREDENTIALS
from cachescale.api.reasons import Problem
from cachescale.api.spec import CacheScalingPolicySpec
from cachescale.commands.main import build_parser
from cachescale.controller.reconcile.context import Operator
from cachescale.controller.reconcile.prometheus_access import (
    EgressRefused,
    prometheus_config,
    prometheus_source,
)
from cachescale.gather.egress import AllowedUrls
from tests.controller.cluster import NAMESPACE, Clock, FakeCluster, policy
from tests.controller.engine_fake import EngineFake
from tests.controller.reconcile.test_evaluation import (
    POLICIES,
    SECRET,
    TOKEN_AUTH,
    conditions,
    run,
    stack,
)
from tests.gather.gather_fakes import FakePrometheus, api_error, fake_prometheus

TOKEN = "db-password-not-for-prometheus"
BODY_MARKER = "internal-metadata-fragment"
"""What an internal address would answer: it must never be readable from the status."""
OPT_IN = f"kubectl label secret prom -n {NAMESPACE} {PROMETHEUS_CREDENTIALS}=true"


def put_secret(cluster: FakeCluster, *, labelled: bool) -> None:
    metadata: dict[str, Any] = {"name": "prom", "namespace": NAMESPACE}
    if labelled:
        metadata["labels"] = {PROMETHEUS_CREDENTIALS: "true"}
    data = {"token": base64.b64encode(TOKEN.encode()).decode()}
    cluster.put("v1/secrets", {**SECRET, "metadata": metadata, "data": data})


def events(cluster: FakeCluster) -> list[dict[str, Any]]:
    return list(cluster.api.items(f"/api/v1/namespaces/{NAMESPACE}/events"))


def refusal(cluster: FakeCluster) -> tuple[str, str]:
    """The refused policy's MetricsAvailable reason and message (Ready must match)."""
    status = cluster.get(POLICIES, "vllm")["status"]
    found = {c["type"]: c for c in status["conditions"]}
    ready, metrics = found["Ready"], found["MetricsAvailable"]
    assert (ready["status"], metrics["status"]) == ("False", "False")
    assert (ready["reason"], ready["message"]) == (metrics["reason"], metrics["message"])
    assert "\n" not in metrics["message"]
    return metrics["reason"], metrics["message"]


def secret_reads(cluster: FakeCluster) -> list[object]:
    """The operator's GETs of any Secret."""
    return [r for r in cluster.requests("get") if "/secrets/" in str(r.url.path)]


def refused_before_reading(
    cluster: FakeCluster, prometheus: FakePrometheus, outcome_reason: str, reason: Problem
) -> str:
    """The policy was refused with ``reason`` before any fetch or Secret read, with one
    Warning Event: its message."""
    assert prometheus.queries == []
    assert not secret_reads(cluster)
    assert outcome_reason == reason
    said, message = refusal(cluster)
    assert said == reason
    assert [(e["type"], e["reason"]) for e in events(cluster)] == [("Warning", reason)]
    return message


def test_an_unlabelled_secret_is_never_sent_and_the_status_says_how_to_opt_in(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    stack(cluster, engines, prometheus, clock, extra=TOKEN_AUTH)
    put_secret(cluster, labelled=False)
    (outcome,) = run(operator, cluster, clock)
    assert prometheus.queries == []  # nothing fetched, so nothing sent
    assert outcome.reason == Problem.CREDENTIALS_NOT_ALLOWED
    reason, message = refusal(cluster)
    assert reason == Problem.CREDENTIALS_NOT_ALLOWED
    assert message.endswith(OPT_IN)
    (event,) = events(cluster)
    assert (event["type"], event["reason"], event["message"]) == ("Warning", reason, message)
    patched = {str(r.url.path) for r in cluster.requests("patch")}
    status_path = f"/apis/cachescale.dev/v1alpha1/namespaces/{NAMESPACE}/cachescalingpolicies"
    assert patched == {f"{status_path}/vllm/status"}  # no HPA or Deployment touched
    labels = {"namespace": NAMESPACE, "policy": "vllm", "kind": reason}
    errors = "cachescale_evaluation_errors_total"
    assert operator.metrics.registry.get_sample_value(errors, labels) == 1


def test_a_labelled_secret_is_sent_as_the_bearer_token(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    stack(cluster, engines, prometheus, clock, extra=TOKEN_AUTH)
    put_secret(cluster, labelled=True)
    run(operator, cluster, clock)
    assert prometheus.headers
    assert {h.get("Authorization") for h in prometheus.headers} == {f"Bearer {TOKEN}"}
    assert conditions(cluster)["Ready"] == ("True", "Evaluated")


def allow_only(cluster: FakeCluster, clock: Clock, *entries: str) -> Operator:
    return Operator(cluster.api, clock=clock, allowed_urls=AllowedUrls.parse(list(entries)))


def test_a_url_outside_the_allow_list_is_refused_before_any_fetch_or_secret_read(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
) -> None:
    stack(cluster, engines, prometheus, clock, extra=TOKEN_AUTH)
    put_secret(cluster, labelled=True)
    operator = allow_only(cluster, clock, "http://prometheus.monitoring:9090", "re:https://.*")
    (outcome,) = run(operator, cluster, clock)
    message = refused_before_reading(
        cluster, prometheus, outcome.reason, Problem.METRICS_URL_NOT_ALLOWED
    )
    assert message.startswith(f"prometheusUrl {prometheus.url} is outside")
    assert "--allowed-prometheus-url" in message
    assert "allowedPrometheusUrls" in message


def test_a_url_inside_the_allow_list_is_read(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
) -> None:
    stack(cluster, engines, prometheus, clock)
    run(
        allow_only(cluster, clock, "http://prometheus.monitoring:9090", prometheus.url),
        cluster,
        clock,
    )
    assert prometheus.queries
    assert conditions(cluster)["Ready"] == ("True", "Evaluated")


def test_no_token_and_no_answer_body_reaches_a_log_line_a_status_or_an_event(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
    caplog: pytest.LogCaptureFixture,
) -> None:
    stack(cluster, engines, prometheus, clock, extra=TOKEN_AUTH)
    put_secret(cluster, labelled=True)
    written: list[str] = []

    def evaluate_and_keep() -> None:
        run(operator, cluster, clock)
        written.append(json.dumps(cluster.get(POLICIES, "vllm").get("status")))

    answers = [
        api_error(500, "internal", BODY_MARKER),
        api_error(400, "bad_data", BODY_MARKER),
        (403, f"<html>{BODY_MARKER}</html>".encode()),
        (200, f'{{"status": "success", "data": {{"result": ["{BODY_MARKER}"]}}}}'.encode()),
    ]
    with caplog.at_level(logging.DEBUG), fake_prometheus() as elsewhere:
        evaluate_and_keep()  # healthy
        for answer in answers:
            prometheus.respond = functools.partial(lambda found, _q: found, answer)
            evaluate_and_keep()
        # A redirect to another host (and port) is not followed: the token stays home.
        prometheus.respond = lambda _q: (302, BODY_MARKER.encode())
        elsewhere_host = elsewhere.url.replace("127.0.0.1", "localhost")
        prometheus.answer_headers["Location"] = f"{elsewhere_host}/api/v1/query?query=up"
        evaluate_and_keep()
        assert elsewhere.queries == []
        prometheus.answer_headers.clear()
        put_secret(cluster, labelled=False)
        evaluate_and_keep()
    assert "redirects are not followed" in written[-2]
    assert "CredentialsNotAllowed" in written[-1]
    texts = (
        written
        + [json.dumps(e) for e in events(cluster)]
        + [r.getMessage() for r in caplog.records]
    )
    assert caplog.records, "the evaluations logged nothing: the log check would be vacuous"
    for text in texts:
        assert TOKEN not in text
        assert base64.b64encode(TOKEN.encode()).decode() not in text
        assert BODY_MARKER not in text


def test_the_flag_is_repeatable_and_rejects_an_entry_that_is_no_url(
    capsys: pytest.CaptureFixture[str],
) -> None:
    flag = "--allowed-prometheus-url"
    args = build_parser().parse_args(["run", flag, "http://prom:9090", flag, "re:https://.*"])
    assert args.allowed_prometheus_url == ["http://prom:9090", "re:https://.*"]
    with pytest.raises(SystemExit) as caught:
        build_parser().parse_args(["run", flag, "prom:9090"])
    assert caught.value.code == 2
    assert "'prom:9090' is neither an http(s) URL prefix nor re:<regex>" in capsys.readouterr().err


def without_url(cluster: FakeCluster) -> None:
    """Take ``prometheusUrl`` out of the stack's policy (it reads the operator's default)."""
    body = cluster.get(POLICIES, "vllm")
    del body["spec"]["metrics"]["prometheusUrl"]
    cluster.put(POLICIES, body)


def test_a_policy_without_a_url_reads_the_operators_default_and_says_so(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
) -> None:
    stack(cluster, engines, prometheus, clock)
    without_url(cluster)
    # The default is the cluster owner's choice: an allow list that omits it does not apply.
    operator = Operator(
        cluster.api,
        clock=clock,
        allowed_urls=AllowedUrls.parse(["http://elsewhere:9090"]),
        default_prometheus_url=prometheus.url,
    )
    run(operator, cluster, clock)
    assert prometheus.queries
    assert conditions(cluster)["Ready"] == ("True", "Evaluated")
    signals = cluster.get(POLICIES, "vllm")["status"]["signals"]
    assert signals["prometheus"] == f"{prometheus.url} (the operator's default)"


def test_a_policys_own_url_wins_over_the_default_and_is_named_as_its_own(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
) -> None:
    stack(cluster, engines, prometheus, clock)
    operator = Operator(cluster.api, clock=clock, default_prometheus_url="http://unused:9090")
    run(operator, cluster, clock)
    assert prometheus.queries
    signals = cluster.get(POLICIES, "vllm")["status"]["signals"]
    assert signals["prometheus"] == f"{prometheus.url} (the policy's)"


def test_no_url_anywhere_is_one_clear_refusal_and_nothing_fetched(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    stack(cluster, engines, prometheus, clock)
    without_url(cluster)
    (outcome,) = run(operator, cluster, clock)
    assert prometheus.queries == []
    assert outcome.reason == Problem.NO_PROMETHEUS_URL
    reason, message = refusal(cluster)
    assert reason == Problem.NO_PROMETHEUS_URL
    assert "prometheus.url" in message
    assert "--default-prometheus-url" in message


def test_the_default_url_flag_is_checked_when_parsed() -> None:
    parsed = build_parser().parse_args(["run", "--default-prometheus-url", "http://prom:9090"])
    assert parsed.default_prometheus_url == "http://prom:9090"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--default-prometheus-url", "prom:9090"])


# -- one URL for checking and connecting (an allow-list bypass) ----------------------------


def with_url(cluster: FakeCluster, url: str, **metrics: Any) -> None:
    """Give the stack's policy this ``prometheusUrl`` (and other ``spec.metrics`` fields)."""
    body = cluster.get(POLICIES, "vllm")
    body["spec"]["metrics"] = {**body["spec"]["metrics"], "prometheusUrl": url, **metrics}
    cluster.put(POLICIES, body)


def with_raw_url(spec: dict[str, Any], url: str | None) -> CacheScalingPolicySpec:
    """A valid spec with ``prometheusUrl`` replaced, unvalidated (as a CRD without the
    spec's own pattern would let it through)."""
    valid = CacheScalingPolicySpec.model_validate(spec)
    metrics = valid.metrics.model_copy(update={"prometheus_url": url})
    return valid.model_copy(update={"metrics": metrics})


def test_a_backslash_url_naming_the_allowed_host_is_refused_and_nothing_reaches_its_host(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
) -> None:
    """A backslash URL: urlsplit read the allowed host, requests connected to 127.0.0.1.
    The spec's own pattern may refuse it first (InvalidSpec, as the CRD would at
    admission); either way nothing is read or sent, and the egress check refuses it on its
    own (a CRD installed before the pattern, a spec read without validation)."""
    stack(cluster, engines, prometheus, clock, extra=TOKEN_AUTH)
    put_secret(cluster, labelled=True)
    hostile = f"{prometheus.url}\\@prom.monitoring:9090"
    with_url(cluster, hostile)
    operator = allow_only(cluster, clock, "http://prom.monitoring:9090")
    (outcome,) = run(operator, cluster, clock)
    assert prometheus.queries == []
    assert prometheus.headers == []
    assert not secret_reads(cluster)
    assert outcome.reason in (Problem.INVALID_SPEC, Problem.METRICS_URL_NOT_ALLOWED)
    assert conditions(cluster)["Ready"] == ("False", outcome.reason)
    spec = with_raw_url(policy(prometheus_url=prometheus.url)["spec"], hostile)
    with pytest.raises(EgressRefused) as caught:
        prometheus_config(operator, NAMESPACE, spec)
    assert caught.value.reason == Problem.METRICS_URL_NOT_ALLOWED
    message = caught.value.message
    assert message.startswith("prometheusUrl is refused because it contains a backslash")
    assert "prom.monitoring" not in message  # never the host it only pretends to be
    assert prometheus.queries == []
    assert not secret_reads(cluster)


def test_an_empty_allow_list_refuses_every_policy_url_and_says_how_to_change_it(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
) -> None:
    stack(cluster, engines, prometheus, clock)
    operator = Operator(
        cluster.api,
        clock=clock,
        allowed_urls=AllowedUrls.parse([]),
        default_prometheus_url="http://prometheus.monitoring:9090",
    )
    (outcome,) = run(operator, cluster, clock)
    assert prometheus.queries == []
    assert outcome.reason == Problem.METRICS_URL_NOT_ALLOWED
    _, message = refusal(cluster)
    assert message.startswith(f"prometheusUrl {prometheus.url} is not allowed")
    assert "the operator allows no policy-chosen Prometheus URL" in message
    assert "remove prometheusUrl to read the operator's default Prometheus" in message
    assert "allowedPrometheusUrls" in message
    # Without it, the policy reads the default, which no allow list limits.
    without_url(cluster)
    operator.default_prometheus_url = prometheus.url
    run(operator, cluster, clock)
    assert prometheus.queries
    assert conditions(cluster)["Ready"] == ("True", "Evaluated")


def test_the_client_gets_and_the_status_names_the_normalized_url(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
) -> None:
    stack(cluster, engines, prometheus, clock)
    spelled = f"{prometheus.url}//"
    with_url(cluster, spelled)
    operator = allow_only(cluster, clock, prometheus.url)
    spec = CacheScalingPolicySpec.model_validate(cluster.get(POLICIES, "vllm")["spec"])
    assert prometheus_config(operator, NAMESPACE, spec).url == prometheus.url
    run(operator, cluster, clock)
    assert prometheus.queries
    signals = cluster.get(POLICIES, "vllm")["status"]["signals"]
    assert signals["prometheus"] == f"{prometheus.url} (the policy's)"


def test_the_default_port_is_written_out_where_the_url_is_named(
    cluster: FakeCluster, clock: Clock
) -> None:
    operator = Operator(cluster.api, clock=clock, default_prometheus_url="http://prom.monitoring")
    spec = with_raw_url(policy(prometheus_url="http://x")["spec"], "HTTPS://Thanos.Example/p/")
    assert prometheus_config(operator, NAMESPACE, spec).url == "https://thanos.example:443/p"
    assert prometheus_source(operator, spec) == "https://thanos.example:443/p (the policy's)"
    spec = with_raw_url(policy(prometheus_url="http://x")["spec"], None)
    assert prometheus_config(operator, NAMESPACE, spec).url == "http://prom.monitoring:80"


# -- TLS: unverified only where the cluster owner allows it --------------------------------

INSECURE = {"metrics": {"auth": {**TOKEN_AUTH["metrics"]["auth"], "insecureSkipVerify": True}}}


def test_insecure_tls_is_refused_before_any_secret_read_or_fetch(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
    operator: Operator,
) -> None:
    stack(cluster, engines, prometheus, clock, extra=INSECURE)
    put_secret(cluster, labelled=True)
    assert not operator.allow_insecure_tls  # the default
    (outcome,) = run(operator, cluster, clock)
    message = refused_before_reading(
        cluster, prometheus, outcome.reason, Problem.INSECURE_TLS_NOT_ALLOWED
    )
    assert "prometheus.allowInsecureSkipVerify" in message
    assert "--allow-insecure-tls" in message


def test_insecure_tls_is_used_when_the_cluster_owner_allows_it(
    cluster: FakeCluster,
    engines: EngineFake,
    prometheus: FakePrometheus,
    clock: Clock,
) -> None:
    stack(cluster, engines, prometheus, clock, extra=INSECURE)
    put_secret(cluster, labelled=True)
    operator = Operator(cluster.api, clock=clock, allow_insecure_tls=True)
    spec = CacheScalingPolicySpec.model_validate(cluster.get(POLICIES, "vllm")["spec"])
    assert prometheus_config(operator, NAMESPACE, spec).verify_tls is False
    run(operator, cluster, clock)
    assert prometheus.queries
    assert conditions(cluster)["Ready"] == ("True", "Evaluated")


# -- CA material in a private directory ----------------------------------------------------

PEM = "-----BEGIN CERTIFICATE-----\nMIIB-not-a-real-one\n-----END CERTIFICATE-----\n"


def ca_config(cluster: FakeCluster, operator: Operator, pem: str) -> str:
    """The CA file the operator writes for a policy whose caSecretRef holds ``pem``."""
    metadata = {"name": "ca", "namespace": NAMESPACE, "labels": {PROMETHEUS_CREDENTIALS: "true"}}
    data = {"ca.crt": base64.b64encode(pem.encode()).decode()}
    cluster.put("v1/secrets", {**SECRET, "metadata": metadata, "data": data})
    auth = {"metrics": {"auth": {"caSecretRef": {"name": "ca", "key": "ca.crt"}}}}
    spec = CacheScalingPolicySpec.model_validate(
        policy(prometheus_url="https://prom.monitoring:9090", extra=auth)["spec"]
    )
    path = prometheus_config(operator, NAMESPACE, spec).ca_file
    assert path is not None
    return path


def test_the_ca_bundle_is_written_afresh_in_a_private_directory(
    cluster: FakeCluster, operator: Operator, tmp_path: Path
) -> None:
    digest = hashlib.sha256(PEM.encode()).hexdigest()[:16]
    planted = Path(tempfile.gettempdir()) / f"cachescale-ca-{digest}.pem"  # the old path
    planted_before = planted.exists()
    if not planted_before:
        planted.write_text("attacker's CA")
    try:
        path = Path(ca_config(cluster, operator, PEM))
    finally:
        if not planted_before:
            planted.unlink()
    assert path != planted
    assert path.read_text() == PEM
    directory = path.parent
    assert directory.name.startswith("cachescale-ca-")
    assert directory.name != "cachescale-ca-"  # mkdtemp's unpredictable suffix
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # An existing file is never trusted: whatever is there is replaced by the Secret's text.
    path.write_text("tampered")
    assert Path(ca_config(cluster, operator, PEM)).read_text() == PEM
    assert [p.name for p in directory.iterdir() if p.name.startswith(".ca-")] == []
    # A directory that disappeared is made again, private.
    shutil.rmtree(directory)
    again = Path(ca_config(cluster, operator, PEM))
    assert again.read_text() == PEM
    assert again.parent != directory
    assert stat.S_IMODE(again.parent.stat().st_mode) == 0o700


# -- flags ---------------------------------------------------------------------------------


def test_the_default_url_flag_is_normalized_and_read_by_the_strict_rules(
    capsys: pytest.CaptureFixture[str],
) -> None:
    flag = "--default-prometheus-url"
    parsed = build_parser().parse_args(["run", flag, "HTTP://Prom.Monitoring:9090/"])
    assert parsed.default_prometheus_url == "http://prom.monitoring:9090"
    with pytest.raises(SystemExit) as caught:
        build_parser().parse_args(["run", flag, "http://127.0.0.1:18080\\@prom:9090"])
    assert caught.value.code == 2
    assert "contains a backslash" in capsys.readouterr().err


def test_the_insecure_tls_flag_is_off_unless_given() -> None:
    assert build_parser().parse_args(["run"]).allow_insecure_tls is False
    assert build_parser().parse_args(["run", "--allow-insecure-tls"]).allow_insecure_tls is True


@pytest.mark.parametrize(
    ("entries", "insecure", "warned"),
    [
        ([], False, []),
        (["http://prom:9090"], False, []),
        (["re:.*"], False, ["re:.* allows any URL"]),
        ([r"re:http://prom-[a-z]+\.mon:9090"], False, ["has regular expressions"]),
        (["http://prom:9090"], True, ["--allow-insecure-tls"]),
    ],
)
def test_the_operator_warns_at_start_when_policies_may_reach_more_than_listed(
    entries: list[str], insecure: bool, warned: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    from cachescale.controller.runtime.serve import _warn_about_egress

    with caplog.at_level(logging.INFO, "cachescale.operator"):
        _warn_about_egress(AllowedUrls.parse(entries), insecure)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == len(warned)
    for warning, says in zip(warnings, warned, strict=True):
        assert says in warning
