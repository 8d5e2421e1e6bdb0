"""``cachescale audit`` throughput: 50 conversations × 10 turns of ~4k-token prompts.

Run from the repository root::

    .venv/bin/python -m bench.bench_audit

It writes a corpus of 500 requests (a 2,000-token system prompt, then 400 tokens of
history a turn: prompts of 2.2k to 5.8k tokens, ~4k on average) to a temporary folder,
then times ``cachescale audit run`` in-process, as the CLI does it, in three parts:
reading and checking the JSONL, the replay (hashing, the engine's lookups, the causes) and
the result (figures, JSON). It prints the machine, the date, prompt tokens per second,
and the raw sha256 rate on one 96-byte input (a parent digest and a 16-token block: the
hashing floor) for comparison. The goal is under 5 s in all. Then the same corpora once
per other setting (vLLM's ``--hash-algo`` digests, ``--engine sglang``): the
time of the whole run and its token hit rate.

``--scale`` measures the audit at 2,000 conversations × 8 turns instead (~1.6k-token
prompts, ~26 M tokens, two corpora: append-only, and retrieval re-run ahead of the
history every turn, so every follow-up is explained): the whole run (read, replay,
causes, result JSON) against a plain loop that only parses each JSONL line, makes its
int32 ids and hashes its blocks, the floor any audit pays. The goal is within 2× of it.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.provenance import provenance
from cachescale.audit.corpus import read_corpus
from cachescale.audit.replay import replay
from cachescale.audit.result import build_result, dumps
from cachescale.sim.hashing import hash_blocks

VARIANTS = (
    ("vllm", "sha256"),
    ("vllm", "sha256_cbor"),
    ("vllm", "xxhash"),
    ("vllm", "xxhash_cbor"),
    ("sglang", "fast"),
)
"""(engine, hash algorithm) settings timed beside the default vLLM + fast."""
CONVERSATIONS = 50
TURNS = 10
SYSTEM = 2000
PER_TURN = 400


def _corpus(path: Path, rerun: bool) -> int:
    """Write the corpus; ``rerun``: fresh retrieval ahead of the history every turn."""
    rng = np.random.default_rng(0)
    system = rng.integers(1000, 60000, SYSTEM).tolist()
    tokens = 0
    with path.open("w", encoding="utf-8") as out:
        for conversation in range(CONVERSATIONS):
            history: list[int] = []
            for turn in range(TURNS):
                history += rng.integers(1000, 60000, PER_TURN).tolist()
                fresh = rng.integers(1000, 60000, PER_TURN).tolist() if rerun else []
                prompt = system + fresh + history[: -PER_TURN if rerun else None]
                tokens += len(prompt)
                record = {"conversation_id": conversation, "turn": turn, "prompt_token_ids": prompt}
                out.write(json.dumps(record) + "\n")
    return tokens


def _sha256_rate() -> float:
    data = bytes(96)
    best = 0.0
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(500_000):
            hashlib.sha256(data).digest()
        best = max(best, 500_000 / (time.perf_counter() - start))
    return best


def main() -> None:
    """Print the measurements."""
    print("\n".join(provenance(f"numpy {np.__version__}")))
    if "--scale" in sys.argv[1:]:
        for rerun in (False, True):
            _measure_scale(rerun)
        return
    for rerun in (False, True):
        _measure(rerun)
    for rerun in (False, True):
        _measure_variants(rerun)
    rate = _sha256_rate()
    print(f"raw sha256(96 B): {rate:,.0f} calls/s = {rate * 16:,.0f} tokens/s at 16 tokens a block")


def _measure(rerun: bool) -> None:
    kind = "every turn misses (retrieval re-run ahead)" if rerun else "append-only (hits)"
    print(f"--- {kind}")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "corpus.jsonl"
        tokens = _corpus(path, rerun)
        size = path.stat().st_size
        start = time.perf_counter()
        corpus = read_corpus(path)
        read = time.perf_counter()
        outcome = replay(corpus)
        replayed = time.perf_counter()
        text = dumps(build_result(corpus, str(path), outcome))
        done = time.perf_counter()
    total = done - start
    print(f"corpus: {len(corpus.records)} requests, {tokens:,} prompt tokens, {size / 1e6:.1f} MB")
    print(f"read + check JSONL   {read - start:6.2f} s")
    print(f"replay               {replayed - read:6.2f} s")
    label = f"result ({len(text) / 1e3:,.0f} kB)"
    print(f"{label:<21}{done - replayed:6.2f} s")
    print(f"total                {total:6.2f} s   (goal < 5 s)")
    audit = outcome.outcomes
    hit = sum(o.cached_tokens for o in audit) / sum(o.prompt_tokens for o in audit)
    print(f"token hit rate (both passes) {hit:.3f}")
    print(f"audit: {tokens / total:,.0f} prompt tokens/s")


def _measure_variants(rerun: bool) -> None:
    kind = "every turn misses" if rerun else "append-only"
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "corpus.jsonl"
        tokens = _corpus(path, rerun)
        for engine, algo in VARIANTS:
            start = time.perf_counter()
            corpus = read_corpus(path)
            outcome = replay(corpus, hash_algo=algo, engine=engine)
            dumps(build_result(corpus, str(path), outcome))
            total = time.perf_counter() - start
            audit = outcome.outcomes
            hit = sum(o.cached_tokens for o in audit) / sum(o.prompt_tokens for o in audit)
            print(
                f"--- {kind}, --engine {engine} --hash-algo {algo}: total {total:5.2f} s, "
                f"hit rate {hit:.3f}, {tokens / total:,.0f} prompt tokens/s"
            )


SCALE_CONVERSATIONS = 2000
SCALE_TURNS = 8
SCALE_SYSTEM = 1000
SCALE_PER_TURN = 120


def _scale_corpus(path: Path, rerun: bool) -> int:
    """2,000 conversations × 8 turns: a shared system prompt, then history (or, with
    ``rerun``, fresh retrieved text ahead of the history every turn)."""
    rng = np.random.default_rng(1)
    system = rng.integers(1000, 60000, SCALE_SYSTEM).tolist()
    tokens = 0
    with path.open("w", encoding="utf-8") as out:
        for conversation in range(SCALE_CONVERSATIONS):
            history: list[int] = []
            for turn in range(SCALE_TURNS):
                history += rng.integers(1000, 60000, SCALE_PER_TURN).tolist()
                fresh = rng.integers(1000, 60000, SCALE_PER_TURN).tolist() if rerun else []
                prompt = system + fresh + history
                tokens += len(prompt)
                record = {"conversation_id": conversation, "turn": turn, "prompt_token_ids": prompt}
                out.write(json.dumps(record) + "\n")
    return tokens


def _parse_and_hash(path: Path) -> int:
    """The floor: parse every line, make its ids, hash its blocks."""
    blocks = 0
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            ids = np.asarray(json.loads(line)["prompt_token_ids"], dtype=np.int32)
            blocks += len(hash_blocks(ids.tobytes(), 16, b""))
    return blocks


def _measure_scale(rerun: bool) -> None:
    kind = "retrieval re-run every turn" if rerun else "append-only"
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "corpus.jsonl"
        tokens = _scale_corpus(path, rerun)
        start = time.process_time()
        _parse_and_hash(path)
        floor = time.process_time() - start
        start = time.process_time()
        corpus = read_corpus(path)
        outcome = replay(corpus)
        dumps(build_result(corpus, str(path), outcome))
        audit = time.process_time() - start
    explained = sum(o.cause is not None for o in outcome.outcomes)
    print(
        f"--- {SCALE_CONVERSATIONS} × {SCALE_TURNS}, {kind}: {tokens:,} prompt tokens, "
        f"{explained:,} requests explained; parse-and-hash {floor:5.2f} s CPU, audit "
        f"{audit:5.2f} s CPU: {audit / floor:.2f}× (goal ≤ 2×)"
    )


if __name__ == "__main__":
    main()
