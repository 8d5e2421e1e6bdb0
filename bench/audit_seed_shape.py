"""The boundary-shift seed shape: 3,000 RAG prompts over 100 topic groups, re-chunked.

Run from the repository root::

    .venv/bin/python bench/audit_seed_shape.py

The fleet's cache is first warmed by 3,000 prompts built with 512-token chunks (the
warm-up pass); then the same 3,000 questions arrive with the documents re-chunked at 500
tokens (the audit pass), as after the incident's deploy. Each prompt is a 300-token system
prompt, the four chunks its topic's retrieval returns (of a 8,192-token document;
the same four chunk numbers per topic, so the content moves with the boundaries) and a 60-token
question, each prompt its own conversation, topics drawn uniformly. It prints the audit
pass's token hit rate per 100 requests: a dip while each topic's first re-chunked prompt
misses, then the steady state, which is why a boundary shift alone must not fail the gate.
"""

from __future__ import annotations

import random
from pathlib import Path

from cachescale.audit.corpus import parse_corpus
from cachescale.audit.replay import replay
from cachescale.audit.result import WINDOW, build_result

PROMPTS = 3000
TOPICS = 100


def _lines(chunk: int, tag: str, seed: int) -> list[str]:
    rng = random.Random(seed)
    system = [rng.randrange(1000, 60000) for _ in range(300)]
    documents = [[rng.randrange(1000, 60000) for _ in range(16 * 512)] for _ in range(TOPICS)]
    picks = [rng.sample(range(15), 4) for _ in range(TOPICS)]
    lines = []
    for index in range(PROMPTS):
        topic = rng.randrange(TOPICS)
        doc = documents[topic]
        retrieved = [t for k in picks[topic] for t in doc[k * chunk : (k + 1) * chunk]]
        question = [rng.randrange(1000, 60000) for _ in range(60)]
        ids = system + retrieved + question
        lines.append(f'{{"conversation_id": "{tag}{index}", "turn": 0, "prompt_token_ids": {ids}}}')
    return lines


def main() -> None:
    """Print the audit pass's hit rate per window."""
    text = "\n".join(_lines(512, "old-", 1) + _lines(500, "new-", 1))
    corpus = parse_corpus(Path("seed-shape.jsonl"), text)
    result = build_result(corpus, "seed-shape", replay(corpus, warmup_conversations=PROMPTS))
    windows = result["hit_rate_windows"]["token_hit_rate"][PROMPTS // WINDOW :]
    print(f"audit pass (re-chunked 512 → 500), token hit rate per {WINDOW} requests:")
    print(" ".join(f"{rate:.2f}" for rate in windows))
    audit = result["passes"]["audit"]
    print(
        f"audit pass overall: {audit['token_hit_rate']:.3f}; warm-up pass: "
        f"{result['passes']['warmup']['token_hit_rate']:.3f}"
    )
    steady = windows[2:]
    print(f"first window {windows[0]:.2f}; windows 3+ mean {sum(steady) / len(steady):.3f}")


if __name__ == "__main__":
    main()
