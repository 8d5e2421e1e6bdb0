"""Live mode over real HTTP: ``audit run --endpoint`` against ``cachescale emulate``.

One emulator subprocess (``--no-traffic``: one pod, no simulated traffic) serves a demo
case's baseline and candidate corpora through its ``/v1/completions``; the live results
must equal the offline replay's, figure for figure and request for request, and gate the
same way. The tolerance is exact (1e-9 on the rates): the emulator's engine is the
simulator's ``EngineReplica``, the very engine the offline replay runs, fed one request at
a time, so any difference would be a bug in the live path (a lost request, a counter read
at the wrong moment), not noise. ``docs/audit.md`` ("Live mode") says what to expect from
a real vLLM instead.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from cachescale.api import engine_metrics
from cachescale.api.spec import Engine
from cachescale.audit.live import (
    PROFILES,
    Counters,
    choose_profile,
    parse_samples,
    read_counters,
)
from cachescale.commands.main import main
from cachescale.gather.detection import detection_query
from cachescale.gather.selector import QueryScope, Selector
from tests.polling import wait_for
from tests.prometheus_fixture import free_port_block, run_emulator, small_scenario

REPO = Path(__file__).resolve().parents[2]
#: Absolute tolerance on the figures (see the module docstring: the same engine code).
TOLERANCE = 1e-9


@contextmanager
def _engine(workdir: Path) -> Iterator[str]:
    """The URL of a fresh emulated engine (empty cache) with no traffic but ours."""
    workdir.mkdir(exist_ok=True)
    port = free_port_block(1)
    with run_emulator(
        workdir, small_scenario(), "--no-traffic", "--base-port", str(port), speed=100
    ) as emulator:
        emulator.wait_for_targets()
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _get(url + "/metrics") or None, timeout_s=10, what="the pod's /metrics")
        yield url


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One emulated engine shared by the tests that only need it to answer."""
    with _engine(tmp_path_factory.mktemp("emulator")) as url:
        yield url


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        body: bytes = response.read()
        return body


def _post(url: str, body: bytes) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _run(corpus: Path, out: Path, *flags: str) -> dict[str, Any]:
    assert main(["audit", "run", str(corpus), "--out", str(out), *flags]) == 0
    result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return result


def test_live_and_offline_agree_and_gate_alike(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", "demo", "--case", "timestamp-top", "--out", str(tmp_path)]) == 0
    for side in ("baseline", "candidate"):
        corpus = tmp_path / f"{side}.jsonl"
        with _engine(tmp_path / side) as endpoint:  # each side on an empty cache, as in CI
            live = _run(corpus, tmp_path / f"{side}-live.json", "--endpoint", endpoint)
        assert f"live: {endpoint}, counters vllm at" in capsys.readouterr().out
        pool = str(live["settings"]["kv_blocks"])  # the emulated engine's pool, as offline
        offline = _run(corpus, tmp_path / f"{side}-offline.json", "--kv-blocks", pool)
        assert live["settings"]["mode"] == "live"
        assert live["live"] == {
            "endpoint": endpoint,
            "metrics_url": endpoint + "/metrics",
            "metrics": "vllm",
        }
        assert len(live["notes"]) == 1, live["notes"]  # no counter mismatch noted
        for name in ("warmup", "audit"):
            got, want = live["passes"][name], offline["passes"][name]
            assert got.keys() == want.keys()
            for key, value in want.items():
                assert got[key] == pytest.approx(value, abs=TOLERANCE), (side, name, key)
        assert [(r["prompt_tokens"], r["cached_tokens"], r["chain"]) for r in live["requests"]] == [
            (r["prompt_tokens"], r["cached_tokens"], r["chain"]) for r in offline["requests"]
        ]
        # The causes come from the corpus, the engine's counters saying what hit: the same
        # as offline (the timestamp at the top named in the candidate).
        assert live["causes"] == offline["causes"]
        assert [r["cause"] for r in live["requests"]] == [r["cause"] for r in offline["requests"]]
    assert {e["cause"] for e in live["causes"]["audit"]} == {"variable-span"}
    capsys.readouterr()
    verdicts = {}
    for mode in ("live", "offline"):
        paths = [str(tmp_path / f"{side}-{mode}.json") for side in ("baseline", "candidate")]
        verdicts[mode] = main(["audit", "compare", *paths, "--format", "json"])
        verdict = json.loads(capsys.readouterr().out)
        assert verdict["verdict"] == "regression"
    assert verdicts == {"live": 1, "offline": 1}
    mixed = [str(tmp_path / "baseline-offline.json"), str(tmp_path / "candidate-live.json")]
    assert main(["audit", "compare", *mixed]) == 2
    assert "mode differs" in capsys.readouterr().err


def test_the_completions_endpoint_answers_one_token_and_moves_the_counters(
    endpoint: str,
) -> None:
    def counters() -> tuple[float, float]:
        samples = parse_samples(_get(endpoint + "/metrics").decode())
        totals = {name: value for name, _, value in samples}
        return totals["vllm:prefix_cache_queries_total"], totals["vllm:prefix_cache_hits_total"]

    before = counters()
    body = {"prompt": list(range(100, 180)), "max_tokens": 1, "temperature": 0, "cache_salt": "x"}
    status, first = _post(endpoint + "/v1/completions", json.dumps(body).encode())
    assert status == 200
    assert first["object"] == "text_completion"
    assert [choice["finish_reason"] for choice in first["choices"]] == ["length"]
    assert first["usage"]["prompt_tokens"] == 80
    assert first["usage"]["completion_tokens"] == 1
    status, second = _post(endpoint + "/v1/completions", json.dumps(body).encode())
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 64  # cap: last block
    after = counters()
    assert (after[0] - before[0], after[1] - before[1]) == (160, 64)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{nope", "not JSON"),
        (b"[1]", "JSON object"),
        (b'{"prompt": "hello"}', "no tokenizer"),
        (b'{"prompt": []}', "non-empty list"),
        (b'{"prompt": [1, -2]}', "token ids"),
        (b'{"prompt": [1], "max_tokens": 5}', "'max_tokens' must be 1"),
        (b'{"prompt": [1], "stream": true}', "'stream'"),
        (b'{"prompt": [1], "cache_salt": 7}', "'cache_salt'"),
        (b'{"prompt": [1], "temperature": "hot"}', "'temperature'"),
    ],
)
def test_a_bad_completion_body_is_a_400_saying_why(
    endpoint: str, body: bytes, message: str
) -> None:
    status, answer = _post(endpoint + "/v1/completions", body)
    assert status == 400
    assert message in answer["error"]["message"]
    assert _get(endpoint + "/metrics").startswith(b"# HELP")  # the metrics still served


def test_an_unreachable_endpoint_is_one_line_and_exit_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", "demo", "--case", "timestamp-top", "--out", str(tmp_path)]) == 0
    port = free_port_block(1)  # nothing listens there
    out = tmp_path / "r.json"
    code = main(
        ["audit", "run", str(tmp_path / "baseline.jsonl"), "--out", str(out),
         "--endpoint", f"http://127.0.0.1:{port}"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 3
    assert err.count("\n") == 1
    assert "cannot connect" in err
    assert "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--metrics-url", "http://x/metrics"], "--metrics-url needs --endpoint"),
        (["--endpoint", "http://x", "--kv-blocks", "8"], "--kv-blocks is for the offline"),
    ],
)
def test_live_flags_that_do_not_fit_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"conversation_id": "c", "turn": 0, "prompt_token_ids": [1]}\n')
    assert main(["audit", "run", str(corpus), "--out", str(tmp_path / "r.json"), *flags]) == 2
    assert message in capsys.readouterr().err


def test_an_endpoint_must_be_an_http_url(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["audit", "run", "c.jsonl", "--out", "r.json", "--endpoint", "localhost:8000"])
    assert caught.value.code == 2
    assert "not an http(s) URL" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("exposition", "profile", "queries", "hits"),
    [
        (
            'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100.0\n'
            'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 40.0\n'
            'vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 10.0\n'
            'vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e9\n',
            "vllm",
            100,
            50,
        ),
        (
            'vllm:gpu_prefix_cache_queries_total{model_name="m"} 30\n'
            'vllm:gpu_prefix_cache_hits_total{model_name="m"} 12\n',
            "vllm-legacy",
            30,
            12,
        ),
        (
            "# TYPE sglang:prefill_effective_tokens_total counter\n"
            'sglang:prefill_effective_tokens_total{mode="input",tp_rank="0"} 60\n'
            'sglang:prefill_effective_tokens_total{mode="device_hit",tp_rank="0"} 30\n'
            'sglang:prefill_effective_tokens_total{mode="host_hit",tp_rank="0"} 8\n'
            'sglang:prefill_effective_tokens_total{mode="storage_hit",tp_rank="0"} 2\n',
            "sglang",
            100,
            40,
        ),
    ],
)
def test_each_engine_generation_counters_are_read(
    exposition: str, profile: str, queries: float, hits: float
) -> None:
    samples = parse_samples(exposition)
    chosen = choose_profile(samples)
    assert chosen is not None
    assert chosen.name == profile
    assert read_counters(chosen, samples) == Counters(queries, hits)


def test_the_profiles_read_the_names_the_operator_queries() -> None:
    """Every counter the live audit reads is one of the engine metric names the operator's
    PromQL uses too (one home, ``api/engine_metrics.py``), and so are its SGLang modes."""
    known = {value for name, value in vars(engine_metrics).items() if name.isupper()}
    vllm, legacy, sglang = PROFILES
    for profile in PROFILES:
        for name, mode in (*profile.queries, *profile.hits):
            assert name in known, name
            assert mode is None or mode in (
                engine_metrics.SGLANG_INPUT_MODE,
                *engine_metrics.SGLANG_HIT_MODES,
            ), mode
    detected = detection_query(Engine.VLLM, QueryScope.for_selector(Selector.of({"a": "b"})))
    for name in (vllm.queries[0][0], legacy.queries[0][0]):  # gather detects both, as here
        assert name in detected, (name, detected)
    assert sglang.queries[0][0] in detection_query(
        Engine.SGLANG, QueryScope.for_selector(Selector.of({"a": "b"}))
    )
