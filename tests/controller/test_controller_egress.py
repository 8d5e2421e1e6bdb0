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
import json
import logging
from typing import Any

import pytest

from cachescale.api.policy import PROMETHEUS_CREDENTIALS
from cachescale.api.reasons import Problem
from cachescale.cli import build_parser
from cachescale.controller.evaluation import Operator
from cachescale.gather.egress import AllowedUrls
from tests.controller.cluster import NAMESPACE, Clock, FakeCluster
from tests.controller.engine_fake import EngineFake
from tests.controller.test_controller_evaluation import (
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
    assert prometheus.queries == []
    assert not [r for r in cluster.requests("get") if "/secrets/" in str(r.url.path)]
    assert outcome.reason == Problem.METRICS_URL_NOT_ALLOWED
    reason, message = refusal(cluster)
    assert reason == Problem.METRICS_URL_NOT_ALLOWED
    assert message.startswith(f"prometheusUrl {prometheus.url} is outside")
    assert "--allowed-prometheus-url" in message
    assert "allowedPrometheusUrls" in message
    assert [(e["type"], e["reason"]) for e in events(cluster)] == [("Warning", reason)]


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
