"""Check 3: the offline audit predicts real vLLM's prefix cache, request for request.

A multi-turn corpus (``multi_turn_corpus``: conversations sharing a system prompt, growing
turn by turn, some with a per-request value near the top, some retrying a turn, some
dropping their oldest exchange) is sent to a real vLLM one request at a time, in the
audit's replay order (warm-up conversations first), as token ids with ``max_tokens: 1``,
as live mode sends it; vLLM's own count of each prompt's cached tokens
(``usage.prompt_tokens_details``) is recorded. The engine's pool is read from its
``vllm:cache_config_info`` by live mode's reader (``num_gpu_blocks``, the null block
included), and ``cachescale audit run`` replays the same corpus offline with that
``--kv-blocks`` and the engine's block size: every request's cached tokens must be equal,
at a pool that never evicts and at a tight one. At the tight pool the replay with one
block more (the pool read without vLLM's null block) must get some request wrong, so the
check can tell the two readings apart; and some retried prompt must meet vLLM's full-hit
cap, so the check covers it. One vLLM server per pool, one after the other.
The figures of a run are in docs/audit.md, "Checked against real vLLM".
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cachescale.audit.corpus import read_corpus
from cachescale.audit.live import Engine, parse_samples, read_engine
from cachescale.audit.replay import split_passes
from cachescale.commands.main import main
from referee.vllm import EngineSettings, VllmServer

BLOCK_SIZE = 32
LARGE_POOL = 1024
"""More blocks than the corpus has distinct blocks: nothing is ever evicted."""
TIGHT_POOL = 64
"""About three conversations' worth: the interleaved conversations evict each other."""
CONVERSATIONS = 20
TURNS = 5
INTERLEAVED = 5
"""Conversations in flight together: their turns alternate in the corpus."""
SEED = 60
TOKENS = (3, 500)
"""Token ids drawn from here: within the tiny model's vocabulary, past its special ids."""


def _tokens(rng: random.Random, low: int, high: int) -> list[int]:
    return [rng.randrange(*TOKENS) for _ in range(rng.randint(low, high))]


def _conversation(rng: random.Random, number: int, system: list[int]) -> list[list[int]]:
    """One conversation's prompts: the system prompt, its own context, then exchanges.

    Every 5th (from the 4th) writes a per-request value into block 1 of the system prompt;
    every 7th (from the 3rd) retries turn 2 as turn 3, padded to whole blocks so a full hit
    meets vLLM's ``num_tokens − 1`` cap; every 6th (from the 6th) drops its first exchange
    from turn 3 on.
    """
    context = _tokens(rng, 80, 200)
    exchanges: list[list[int]] = []
    prompts: list[list[int]] = []
    for turn in range(TURNS):
        top = list(system)
        if number % 5 == 3:
            top[40] = rng.randrange(*TOKENS)
        kept = exchanges[1:] if number % 6 == 5 and turn >= 3 else exchanges
        head = [*top, *context, *(token for exchange in kept for token in exchange)]
        user = _tokens(rng, 20, 80)
        if number % 7 == 2 and turn == 2:
            user += [7] * (-(len(head) + len(user)) % BLOCK_SIZE)
        if number % 7 == 2 and turn == 3:
            prompts.append(prompts[-1])
            continue
        prompts.append([*head, *user])
        exchanges.append([*user, *_tokens(rng, 10, 60)])
    return prompts


def multi_turn_corpus() -> list[dict[str, Any]]:
    """The corpus's records: ``INTERLEAVED`` conversations at a time, turns alternating."""
    rng = random.Random(SEED)
    system = _tokens(rng, 70, 70)
    prompts = [_conversation(rng, number, system) for number in range(CONVERSATIONS)]
    records = []
    for first in range(0, CONVERSATIONS, INTERLEAVED):
        for turn in range(TURNS):
            for number in range(first, first + INTERLEAVED):
                records.append(
                    {
                        "conversation_id": f"c{number:02d}",
                        "turn": turn,
                        "prompt_token_ids": prompts[number][turn],
                    }
                )
    return records


@pytest.fixture(scope="module")
def corpus_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The corpus as a JSONL file."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in multi_turn_corpus()), "utf-8")
    return path


@pytest.fixture(scope="module", params=[LARGE_POOL, TIGHT_POOL], ids=["large", "tight"])
def engine_settings(request: pytest.FixtureRequest) -> EngineSettings:
    """One server per pool (``referee/conftest.py`` starts it)."""
    return EngineSettings(block_size=BLOCK_SIZE, num_blocks=request.param)


@dataclass(frozen=True)
class Served:
    """What the real engine said: its configuration, then each request's usage."""

    engine: Engine
    requests: list[tuple[str, int]]
    """(conversation, turn) in the order sent."""
    prompt_tokens: list[int]
    cached_tokens: list[int]

    @property
    def hit_rate(self) -> float:
        """Cached prompt tokens / prompt tokens, over every request."""
        return sum(self.cached_tokens) / sum(self.prompt_tokens)


@pytest.fixture(scope="module")
def served(vllm_server: VllmServer, corpus_path: Path) -> Served:
    """The corpus sent to the fresh server in the audit's replay order, one at a time."""
    engine = read_engine(vllm_server.url + "/metrics", parse_samples(vllm_server.metrics()))
    order, _ = split_passes(read_corpus(corpus_path), None)
    prompts, cached = [], []
    for record in order:
        usage = vllm_server.complete(record.tokens.tolist(), max_tokens=1)["usage"]
        prompts.append(int(usage["prompt_tokens"]))
        cached.append(int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0))
    requests = [(r.conversation_id, r.turn) for r in order]
    return Served(engine, requests, prompts, cached)


def offline(corpus: Path, out: Path, kv_blocks: int) -> dict[str, Any]:
    """``cachescale audit run`` at the engine's block size and ``--kv-blocks``."""
    flags = ["--block-size", str(BLOCK_SIZE), "--kv-blocks", str(kv_blocks)]
    assert main(["audit", "run", str(corpus), "--out", str(out), *flags]) == 0
    result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return result


def test_live_mode_reads_the_pool_vllm_was_given(
    served: Served, engine_settings: EngineSettings
) -> None:
    assert (served.engine.num_blocks, served.engine.block_size) == (
        engine_settings.num_blocks,
        BLOCK_SIZE,
    )
    assert served.engine.kind == "vllm"


def test_the_offline_audit_predicts_every_request(
    served: Served, corpus_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert served.engine.num_blocks is not None
    result = offline(corpus_path, tmp_path / "offline.json", served.engine.num_blocks)
    capsys.readouterr()
    requests = result["requests"]
    assert [(r["conversation_id"], r["turn"]) for r in requests] == served.requests
    assert [r["prompt_tokens"] for r in requests] == served.prompt_tokens
    predicted = [r["cached_tokens"] for r in requests]
    matched = sum(p == c for p, c in zip(predicted, served.cached_tokens, strict=True))
    rate = sum(predicted) / sum(r["prompt_tokens"] for r in requests)
    with capsys.disabled():
        print(
            f"\npool {served.engine.num_blocks}: {matched} of {len(requests)} requests matched; "
            f"token hit rate offline {rate:.4f}, real {served.hit_rate:.4f}"
        )
    assert predicted == served.cached_tokens
    assert 0 < served.hit_rate < 1


def test_the_pool_read_without_the_null_block_tells_at_the_tight_pool(
    served: Served,
    corpus_path: Path,
    tmp_path: Path,
    engine_settings: EngineSettings,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One block more than vLLM can use: equal where nothing is evicted, wrong where the
    pool is tight (so the check above tells the null block apart)."""
    assert served.engine.num_blocks is not None
    result = offline(corpus_path, tmp_path / "plus-one.json", served.engine.num_blocks + 1)
    capsys.readouterr()
    predicted = [r["cached_tokens"] for r in result["requests"]]
    wrong = [p - c for p, c in zip(predicted, served.cached_tokens, strict=True) if p != c]
    with capsys.disabled():
        print(
            f"\npool {served.engine.num_blocks} read as {served.engine.num_blocks} usable: "
            f"{len(wrong)} requests wrong, by {sorted(set(wrong))} tokens"
        )
    if engine_settings.num_blocks == LARGE_POOL:
        assert wrong == []
    else:
        assert wrong
        assert all(delta > 0 for delta in wrong)  # the extra block kept more


def test_the_corpus_meets_the_full_hit_cap(served: Served) -> None:
    """A retried prompt of whole blocks, all cached, takes all but its last block."""
    capped = [
        (prompt, cached)
        for prompt, cached in zip(served.prompt_tokens, served.cached_tokens, strict=True)
        if prompt % BLOCK_SIZE == 0 and cached == prompt - BLOCK_SIZE
    ]
    assert capped
