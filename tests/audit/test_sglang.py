"""``--engine sglang``: the radix cache at page size 1 (the longest common token prefix
with any cached prompt hits, no block rounding, capped at num_tokens − 1, isolated by
salt), against vLLM's full-block rule on the same small corpora.

Block size 16 throughout. Conversation "w" is the warm-up pass, "a" the audit pass.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from cachescale.audit.corpus import parse_corpus
from cachescale.audit.demo import build_case
from cachescale.audit.radix import RadixTree
from cachescale.audit.replay import replay
from cachescale.audit.result import build_result
from cachescale.exit_codes import ExitCode
from tests.audit.helpers import cli, corpus, results_by_setting, two_conversations

A32 = list(range(1, 33))


def cached(
    warm: list[list[int]], audited: list[list[int]], engine: str, **fields: str
) -> list[int]:
    result = replay(two_conversations(warm, audited, **fields), engine=engine)
    return [o.cached_tokens for o in result.outcomes if o.pass_name == "audit"]


def test_hits_are_the_longest_common_token_prefix_not_whole_blocks() -> None:
    # A partial last block: vLLM never caches it; SGLang reuses every shared token.
    assert cached([A32[:20]], [[*A32[:20], 99]], "vllm") == [16]
    assert cached([A32[:20]], [[*A32[:20], 99]], "sglang") == [20]
    # Prompts that part at token 25: vLLM stops at the last full block before it.
    parted = [*A32[:25], 77, 78, 79]
    assert cached([A32], [parted], "vllm") == [16]
    assert cached([A32], [parted], "sglang") == [25]
    # No full block in common: nothing for vLLM, 15 tokens for SGLang.
    assert cached([A32[:15]], [[*A32[:15], 99]], "vllm") == [0]
    assert cached([A32[:15]], [[*A32[:15], 99]], "sglang") == [15]


def test_a_full_hit_is_capped_at_num_tokens_minus_one() -> None:
    assert cached([A32], [A32], "sglang") == [31]  # one token computed, for the logits
    assert cached([A32], [A32], "vllm") == [16]  # the last whole block


def test_the_longest_match_among_all_cached_prompts_wins() -> None:
    warm = [[*A32[:10], 50, 51], [*A32[:20], 60, 61], [*A32[:5], 70]]
    assert cached(warm, [[*A32[:24], 8]], "sglang") == [20]


def test_a_salt_still_isolates() -> None:
    tokens = [*A32, 5]
    assert cached([tokens], [tokens], "sglang", cache_salt="tenant-b") == [0]
    same = corpus(
        {"conversation_id": "w", "turn": 0, "prompt_token_ids": tokens, "cache_salt": "t"},
        {"conversation_id": "a", "turn": 0, "prompt_token_ids": tokens, "cache_salt": "t"},
    )
    assert [o.cached_tokens for o in replay(same, engine="sglang").outcomes] == [0, 32]


def test_the_radix_tree_finds_the_longest_common_prefix() -> None:
    rng = random.Random(7)
    tree, seen = RadixTree(), list[list[int]]()
    for index in range(300):
        base = seen[rng.randrange(len(seen))] if seen and rng.random() < 0.8 else []
        cut = rng.randrange(len(base) + 1)
        prompt = np.asarray(
            base[:cut] + [rng.randrange(4) for _ in range(rng.randrange(1, 12))], dtype=np.int32
        )
        matched, owner = tree.match(prompt, None)
        best = 0
        for other in seen:
            common = 0
            while common < min(len(other), len(prompt)) and other[common] == prompt[common]:
                common += 1
            best = max(best, common)
        assert matched == best
        if owner is not None:  # the quoted prompt shares the whole match
            assert seen[owner][:matched] == prompt[:matched].tolist()
        tree.insert(prompt, None, index)
        seen.append(prompt.tolist())


def test_on_a_demo_corpus_sglang_hits_at_least_as_much_and_keeps_the_causes() -> None:
    baseline, candidate = build_case("timestamp-top", 0)
    for lines in (baseline, candidate):
        data = parse_corpus(Path("demo.jsonl"), "\n".join(lines))
        vllm, sglang = replay(data), replay(data, engine="sglang")
        pairs = list(zip(vllm.outcomes, sglang.outcomes, strict=True))
        assert all(s.cached_tokens >= v.cached_tokens for v, s in pairs)
        assert any(s.cached_tokens > v.cached_tokens for v, s in pairs)
        v_rate, s_rate = (
            build_result(data, "x", run)["passes"]["audit"]["token_hit_rate"]
            for run in (vllm, sglang)
        )
        assert s_rate >= v_rate
    # A timestamp near the top defeats both caches in the same way.
    assert {o.cause for o in sglang.outcomes if o.pass_name == "audit"} - {None} == {
        "variable-span"
    }


def test_the_engine_is_a_setting_and_sglang_refuses_vllms_flags(tmp_path: Path) -> None:
    source, outs = results_by_setting(tmp_path, "engine", ("vllm", "sglang"))
    done = cli("compare", *outs)
    assert done.returncode == ExitCode.USAGE
    assert "engine differs" in done.stderr
    for flags in (("--kv-blocks", "8"), ("--hash-algo", "xxhash")):
        done = cli("run", str(source), "--out", outs[1], "--engine", "sglang", *flags)
        assert done.returncode == ExitCode.USAGE
        assert done.stderr.count("\n") == 1
        assert "vLLM's settings" in done.stderr
