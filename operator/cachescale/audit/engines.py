"""The prefix caches the audit replays against: what each engine would find cached.

``VllmCache`` is the simulator's own engine (``sim/replica.py``), serving one request at a
time with one output token, in a pool that holds exactly the blocks asked for: vLLM's
full-block, first-miss lookup, the ``num_tokens − 1`` cap, LRU eviction and tail-first
freeing, so the audit and the simulator can never disagree about a hit. A bound is given
as vLLM states it, ``num_gpu_blocks`` (``--kv-blocks``, ``vllm:cache_config_info``): vLLM's
block pool takes one of those blocks for its null block (the placeholder of skipped
attention blocks), which never holds KV, so the pool here holds
:func:`~cachescale.sim.profiles.usable_blocks` of them. Unbounded (the default) means a
pool as large as every block of the corpus: nothing is evicted and only the prompts'
structure decides what hits.

``SglangCache`` is SGLang's radix cache at page size 1 (``audit/radix.py``): a request
reuses the longest common token prefix it shares with any earlier prompt of the same salt,
with no block rounding, capped at ``num_tokens − 1`` as SGLang's scheduler caps it (one
token is always computed, for the logits). It is unbounded: nothing is evicted.

Each cache answers :class:`Lookup`: the tokens the engine takes from the cache, and for
the explanation, how many leading tokens are known cached and which earlier prompts go on
past them (the candidates for the longest cached prompt this one could have matched).
"""

from __future__ import annotations

from dataclasses import dataclass

from cachescale.audit.divergence import Tokens
from cachescale.audit.explain import References
from cachescale.audit.radix import RadixTree
from cachescale.sim.profiles import GpuProfile, ModelProfile, ReplicaProfile, StepTimeModel
from cachescale.sim.replica import EngineReplica
from cachescale.sim.request import SimRequest


@dataclass(frozen=True, slots=True)
class Lookup:
    """What the cache held for one request when it arrived."""

    cached_tokens: int
    """Prompt tokens the engine took from the cache."""
    known: int
    """Leading tokens the cache is known to hold (the explanation starts there)."""
    candidates: list[int]
    """Indices of earlier requests that share those tokens and go on past them."""


def _audit_profile(block_size: int, num_blocks: int, budget: int) -> ReplicaProfile:
    """An engine whose pool holds exactly ``num_blocks`` blocks (2 bytes of KV a token)."""
    return ReplicaProfile(
        name="audit",
        model=ModelProfile(
            name="audit",
            layers=1,
            kv_heads=1,
            head_dim=1,
            kv_dtype_bytes=1,
            weight_bytes=0,
            params=1,
        ),
        gpu=GpuProfile(
            name="audit",
            memory_bytes=num_blocks * block_size * 2,
            hbm_bytes_per_s=1.0,
            bf16_flops=1.0,
            fp8_flops=None,
        ),
        gpus_per_replica=1,
        gpu_memory_utilization=1.0,
        block_size=block_size,
        max_num_batched_tokens=budget,
        step=StepTimeModel(
            t_fixed_s=1e-3, t_prefill_token_s=1e-6, t_decode_seq_s=1e-5, t_kv_token_s=0.0
        ),
    )


class VllmCache:
    """vLLM's block pool and prefix cache: the simulator's engine, one request at a time."""

    def __init__(self, block_size: int, pool_blocks: int, longest_prompt: int) -> None:
        profile = _audit_profile(block_size, pool_blocks, longest_prompt)
        self._engine = EngineReplica(profile, 1, 0, 0.0)
        self._references = References()
        self._block_size = block_size
        self._now = 0.0

    def serve(
        self, index: int, length: int, hashes: list[bytes], salt: str | None, tenant: str
    ) -> Lookup:
        """Serve request ``index`` (``length`` prompt tokens, chained ``hashes``)."""
        engine, now, key = self._engine, self._now, (salt or "").encode()
        cached_blocks = engine.has_prefix(hashes)
        request = SimRequest(
            request_id=index,
            arrival_s=now,
            tenant=tenant,
            prefix_group=0,
            prompt_tokens=length,
            output_tokens=1,
            block_hashes=hashes,
        )
        engine.advance_to(now)
        engine.submit(request, now)
        finished = engine.drain()
        self._now = finished[-1].finished_s or now
        candidates = list(self._references.candidates(hashes, cached_blocks, key))
        self._references.add(index, length, hashes, self._block_size, key)
        return Lookup(
            cached_tokens=request.cached_tokens or 0,
            known=cached_blocks * self._block_size,
            candidates=candidates,
        )


class SglangCache:
    """SGLang's radix cache at page size 1, unbounded."""

    def __init__(self) -> None:
        self._tree = RadixTree()

    def serve(self, index: int, tokens: Tokens, salt: str | None) -> Lookup:
        """Serve request ``index`` and keep its prompt."""
        matched, owner = self._tree.match(tokens, salt)
        self._tree.insert(tokens, salt, index)
        return Lookup(
            cached_tokens=min(matched, len(tokens) - 1),
            known=matched,
            candidates=[] if owner is None else [owner],
        )
