"""``cachescale audit run CORPUS --endpoint URL``: the audit against a running engine.

The offline audit replays the corpus through the simulator's cache; this sends it to a
real OpenAI-compatible server instead (the incident team's ephemeral-engine variant) and
lets the engine's own prefix-cache counters say what hit. Same corpus, same two passes
(the first conversations warm the cache, the rest are audited: ``replay.split_passes``), same
result shape (``result.build_result``), so ``audit compare`` reads either; a live result
says ``settings.mode: "live"``, and compare refuses to mix it with an offline one.

Each request is ``POST /v1/completions`` with ``prompt`` as token ids, ``max_tokens: 1``,
``temperature: 0`` and the record's ``cache_salt``, one at a time. The engine's
``/metrics`` is read before the first request and after every request: the pass figures
are the counters' differences over each pass, and the per-request differences give what
only a per-request figure can (the request hit share, the per-conversation figures). The
counters are the ones the signals layer reads (``gather/promql.py``), by engine
generation, first present wins (:data:`PROFILES`): vLLM's ``prefix_cache_queries/hits``
(0.9.2 on, external KV-connector hits included), vLLM's older ``gpu_prefix_cache_*``, and
SGLang's ``prefill_effective_tokens_total{mode}``.

The counters are the engine's, not the audit's: anything else the engine serves meanwhile
moves them too. A request whose query tokens differ from its prompt is reported in the
result's notes (other traffic, a preemption, or counters that lag the response), never
silently absorbed. The causes ("why") come from the corpus itself, as offline: every
request the engine served short is compared token by token with its previous turn or the
earlier prompts (``replay.explain_outcomes``), the engine's counters saying what hit.

Standard library only (``urllib``), so the audit stays on the core install; TLS is
verified against the system's trust store (``SSL_CERT_FILE`` to add one); an
``OPENAI_API_KEY`` in the environment is sent as a bearer token, as vLLM's ``--api-key``
expects. An engine that cannot be reached is :class:`EngineUnavailableError` (exit 3).
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from cachescale.api.engine_metrics import (
    SGLANG_HIT_MODES,
    SGLANG_INPUT_MODE,
    SGLANG_PREFILL_EFFECTIVE_TOKENS,
    VLLM_EXTERNAL_PREFIX_CACHE_HITS,
    VLLM_LEGACY_PREFIX_CACHE_HITS,
    VLLM_LEGACY_PREFIX_CACHE_QUERIES,
    VLLM_PREFIX_CACHE_HITS,
    VLLM_PREFIX_CACHE_QUERIES,
)
from cachescale.audit.corpus import Corpus, Record
from cachescale.audit.explain import HIT_FRACTION, Decode, Outcome
from cachescale.audit.replay import Replay, explain_outcomes, split_passes
from cachescale.audit.result import build_result
from cachescale.exit_codes import ExitCode
from cachescale.sim.hashing import hash_blocks

#: Seconds one HTTP request may take (a long prompt's prefill on a busy engine included).
TIMEOUT_S = 60.0
#: Seconds to wait for the counters to count a request the engine has already answered
#: (vLLM updates them from its output loop, just after the response).
SETTLE_S = 2.0
_SETTLE_POLL_S = 0.01


@dataclass(frozen=True, slots=True)
class Profile:
    """Which samples hold an engine generation's prefix-cache token counters."""

    name: str
    queries: tuple[tuple[str, str | None], ...]
    """(sample name, required ``mode`` label or None) summed for the tokens looked up."""
    hits: tuple[tuple[str, str | None], ...]
    """The same for the tokens found in the cache."""


_SGLANG_HITS = tuple((SGLANG_PREFILL_EFFECTIVE_TOKENS, mode) for mode in SGLANG_HIT_MODES)

#: Engine generations, newest first; the first whose query counter is exported is used.
PROFILES = (
    Profile(
        "vllm",
        ((VLLM_PREFIX_CACHE_QUERIES, None),),
        ((VLLM_PREFIX_CACHE_HITS, None), (VLLM_EXTERNAL_PREFIX_CACHE_HITS, None)),
    ),
    Profile(
        "vllm-legacy",
        ((VLLM_LEGACY_PREFIX_CACHE_QUERIES, None),),
        ((VLLM_LEGACY_PREFIX_CACHE_HITS, None),),
    ),
    Profile(
        "sglang",
        ((SGLANG_PREFILL_EFFECTIVE_TOKENS, SGLANG_INPUT_MODE), *_SGLANG_HITS),
        _SGLANG_HITS,
    ),
)


class LiveError(Exception):
    """The live audit could not run; ``code`` is the exit code, the message one line."""

    code: int = ExitCode.USAGE


class EngineUnavailableError(LiveError):
    """The engine or its metrics could not be reached (refused, timed out, TLS, 5xx)."""

    code = ExitCode.UNAVAILABLE


@dataclass(frozen=True, slots=True)
class Counters:
    """One read of the engine's prefix-cache counters (tokens)."""

    queries: float
    hits: float


def parse_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """The samples of a Prometheus text exposition (name, labels, value); an exposition
    that does not parse has none (the caller then finds no prefix-cache counters)."""
    try:
        return [
            (sample.name, dict(sample.labels), sample.value)
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        ]
    except ValueError:
        return []


def _sum(samples: list[tuple[str, dict[str, str], float]], wanted: tuple[Any, ...]) -> float:
    return sum(
        value
        for name, labels, value in samples
        for want, mode in wanted
        if name == want and (mode is None or labels.get("mode") == mode)
    )


def choose_profile(samples: list[tuple[str, dict[str, str], float]]) -> Profile | None:
    """The newest generation whose query counter the exposition holds."""
    names = {name for name, _, _ in samples}
    for profile in PROFILES:
        if profile.queries[0][0] in names:
            return profile
    return None


class _Client:
    """HTTP to one engine: completions and metrics, errors turned into one line."""

    def __init__(self, endpoint: str, metrics_url: str, timeout_s: float) -> None:
        self.completions_url = endpoint.rstrip("/") + "/v1/completions"
        self.metrics_url = metrics_url
        self._timeout_s = timeout_s
        self._tls = ssl.create_default_context()
        key = os.environ.get("OPENAI_API_KEY")
        self._auth = {"Authorization": f"Bearer {key}"} if key else {}

    def _open(self, request: urllib.request.Request) -> bytes:
        url = request.full_url
        try:
            with urllib.request.urlopen(request, timeout=self._timeout_s, context=self._tls) as r:
                body: bytes = r.read()
                return body
        except urllib.error.HTTPError as error:
            detail = _error_message(error.read())
            if error.code >= 500:
                raise EngineUnavailableError(f"{url}: HTTP {error.code}{detail}") from None
            raise LiveError(f"{url}: HTTP {error.code}{detail}") from None
        except urllib.error.URLError as error:
            raise EngineUnavailableError(f"{url}: cannot connect: {error.reason}") from None
        except (OSError, http.client.HTTPException) as error:  # timeouts, resets included
            raise EngineUnavailableError(f"{url}: {error or type(error).__name__}") from None

    def complete(self, record: Record) -> None:
        """Send one record's prompt; the answer only has to be a completion."""
        body: dict[str, Any] = {
            "prompt": record.tokens.tolist(),
            "max_tokens": 1,
            "temperature": 0,
        }
        if record.cache_salt:
            body["cache_salt"] = record.cache_salt
        request = urllib.request.Request(
            self.completions_url,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", **self._auth},
            method="POST",
        )
        try:
            answer = json.loads(self._open(request))
        except LiveError as error:
            raise type(error)(f"line {record.line}: {error}") from None
        except (UnicodeDecodeError, json.JSONDecodeError):
            answer = None
        if not isinstance(answer, dict) or not isinstance(answer.get("choices"), list):
            raise LiveError(
                f"line {record.line}: {self.completions_url} did not answer with a completion"
            )

    def samples(self) -> list[tuple[str, dict[str, str], float]]:
        """The engine's metrics now."""
        request = urllib.request.Request(self.metrics_url, headers={"Accept": "text/plain"})
        return parse_samples(self._open(request).decode("utf-8", errors="replace"))


def _error_message(body: bytes) -> str:
    """``: <message>`` from an OpenAI-style error body, or nothing."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return ""
    error = data.get("error") if isinstance(data, dict) else None
    message = error.get("message") if isinstance(error, dict) else data.get("message", None)
    return f": {message}" if isinstance(message, str) else ""


@dataclass(frozen=True, slots=True)
class Engine:
    """What the first read of ``/metrics`` says about the engine."""

    profile: Profile
    block_size: int | None
    num_blocks: int | None
    """``num_gpu_blocks``: vLLM's pool, its null block included."""
    hash_algo: str | None

    @property
    def kind(self) -> str:
        """``vllm`` or ``sglang``, as an offline result's ``settings.engine`` says it."""
        return "sglang" if self.profile.name == "sglang" else "vllm"


def read_engine(metrics_url: str, samples: list[tuple[str, dict[str, str], float]]) -> Engine:
    """The engine an exposition (read from ``metrics_url``) describes: its counters, and
    from ``vllm:cache_config_info`` its block size, ``num_gpu_blocks`` (the pool as vLLM
    states it, its null block included: what offline ``--kv-blocks`` takes) and hash."""
    profile = choose_profile(samples)
    if profile is None:
        names = ", ".join(p.queries[0][0] for p in PROFILES)
        raise LiveError(
            f"{metrics_url}: no prefix-cache counters ({names}): is it the engine's "
            "/metrics (give --metrics-url), with prefix caching on?"
        )
    info = next((labels for name, labels, _ in samples if name == "vllm:cache_config_info"), {})

    def number(key: str) -> int | None:
        value = info.get(key, "")
        return int(value) if value.isdigit() else None

    return Engine(
        profile,
        number("block_size"),
        number("num_gpu_blocks"),
        info.get("prefix_caching_hash_algo"),
    )


def read_counters(profile: Profile, samples: list[tuple[str, dict[str, str], float]]) -> Counters:
    """The profile's counters in an exposition's samples, summed over its series."""
    return Counters(_sum(samples, profile.queries), _sum(samples, profile.hits))


def _settled(client: _Client, engine: Engine, before: Counters, prompt: int) -> Counters:
    """The counters once they count this request's ``prompt`` tokens (or ``SETTLE_S`` on)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        now = read_counters(engine.profile, client.samples())
        if now.queries - before.queries >= prompt or time.monotonic() >= deadline:
            return now
        time.sleep(_SETTLE_POLL_S)


@dataclass(frozen=True, slots=True)
class Live:
    """Where a live run went."""

    endpoint: str
    metrics_url: str
    block_size: int
    warmup_conversations: int | None = None
    timeout_s: float = TIMEOUT_S
    hit_fraction: float = HIT_FRACTION
    decode: Decode | None = None
    """The tokenizer's decoder, to quote changed spans as text."""


def live_result(
    corpus: Corpus,
    corpus_path: str,
    live: Live,
    tokenizer_sha256: str | None = None,
    chat_template_sha256: str | None = None,
) -> dict[str, Any]:
    """Audit ``corpus`` against the engine at ``live.endpoint``: the result object."""
    order, warm_count = split_passes(corpus, live.warmup_conversations)
    warm_ids = set(corpus.conversations[:warm_count])
    client = _Client(live.endpoint, live.metrics_url, live.timeout_s)
    first = client.samples()
    engine = read_engine(client.metrics_url, first)
    if engine.block_size is not None and engine.block_size != live.block_size:
        raise LiveError(
            f"the engine's block size is {engine.block_size} (vllm:cache_config_info): "
            f"give --block-size {engine.block_size}"
        )
    before = read_counters(engine.profile, first)
    outcomes: list[Outcome] = []
    mismatched = 0
    for record in order:
        client.complete(record)
        prompt = len(record.tokens)
        after = _settled(client, engine, before, prompt)
        queries = round(after.queries - before.queries)
        cached = round(after.hits - before.hits)
        mismatched += queries != prompt
        before = after
        outcomes.append(
            Outcome(
                record=record,
                pass_name="warmup" if record.conversation_id in warm_ids else "audit",
                prompt_tokens=queries,
                cached_tokens=cached,
                chain=hash_blocks(
                    record.tokens.tobytes(), live.block_size, (record.cache_salt or "").encode()
                ),
                hit_fraction=live.hit_fraction,
            )
        )
    explain_outcomes(outcomes, live.block_size, live.decode)
    result = build_result(
        corpus,
        corpus_path,
        Replay(
            outcomes,
            live.block_size,
            engine.num_blocks,
            warm_count,
            engine=engine.kind,
            hit_fraction=live.hit_fraction,
        ),
        tokenizer_sha256,
        chat_template_sha256,
    )
    result["settings"] |= {"mode": "live", "hash_algo": engine.hash_algo}
    result["live"] = {
        "endpoint": live.endpoint,
        "metrics_url": live.metrics_url,
        "metrics": engine.profile.name,
    }
    result["notes"] = [*result["notes"], *_notes(mismatched, len(outcomes))]
    return result


def _notes(mismatched: int, requests: int) -> list[str]:
    notes = [
        "live mode: the figures are the engine's prefix-cache counters; the causes come from "
        "the corpus's prompts compared token by token, the engine's counters saying what hit"
    ]
    if mismatched:
        notes.append(
            f"{mismatched} of {requests} requests moved the engine's query counter by other "
            "than their prompt's length: other traffic on the engine, preemptions, or "
            "counters that lag; the figures include it (give the audit an engine of its own)"
        )
    return notes
