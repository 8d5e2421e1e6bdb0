"""Cache isolation: whether the engines' prefix cache keeps tenants apart.

vLLM finds a cached prefix by its chain of block hashes. With a non-cryptographic hash
(``xxhash``, or ``builtin`` before 0.10.2) two different prompts can hash alike, and vLLM
documents that such a collision can serve one tenant's cached KV blocks to another: fine
for one tenant, a leak between tenants. So a policy declares ``cache.tenancy``, the gather
layer reads each engine's ``vllm:cache_config_info`` (``snapshot.CacheConfig``), and this
check turns the two into the ``CacheIsolation`` condition (``docs/decisions.md``,
"Conditions"). It never changes scaling, and it reads no learned state: the configuration
is read again each evaluation, so a rollout that changes the hash changes the verdict at
once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cachescale.api.reasons import ConditionReason
from cachescale.api.spec import CacheScalingPolicySpec, Tenancy
from cachescale.api.status import ConditionStatus
from cachescale.snapshot import EngineCacheConfig, Snapshot

CRYPTOGRAPHIC_HASHES = frozenset({"sha256", "sha256_cbor", "sha256_cbor_64bit"})
"""``--prefix-caching-hash-algo`` values that hash with SHA-256 (every vLLM version's)."""
NON_CRYPTOGRAPHIC_HASHES = frozenset({"builtin", "xxhash", "xxhash_cbor"})
"""Values open to collisions: Python's ``hash`` (``builtin``, the default up to vLLM
0.10.1) and xxHash (from 0.13)."""
_SHOWN_PODS = 3
"""Pods named in a message; more are counted."""


@dataclass(frozen=True, slots=True)
class Isolation:
    """The verdict: the condition's status, reason and one-line message."""

    status: ConditionStatus
    reason: ConditionReason
    message: str


def check_isolation(spec: CacheScalingPolicySpec, snapshot: Snapshot) -> Isolation:
    """``CacheIsolation``: False when prefix caching is off, or when a MultiTenant policy's
    engines hash with a non-cryptographic hash; True when the configuration rules both
    out; Unknown when what decides it was not read (never assumed)."""
    config = snapshot.signals.cache_config
    if not config.is_known:
        return Isolation(
            ConditionStatus.UNKNOWN, ConditionReason.CACHE_CONFIG_UNKNOWN, str(config.reason)
        )
    engines = config.engines
    off = [e for e in engines if e.prefix_caching is False]
    if off:
        return Isolation(
            ConditionStatus.FALSE,
            ConditionReason.PREFIX_CACHING_OFF,
            f"prefix caching is off on {_where(off, engines)}: no prompt reuses a cached "
            "prefix there, so nothing is shared between tenants, but every prompt is "
            "computed in full and there is no hit rate for this policy to guard",
        )
    multi = spec.cache.tenancy is Tenancy.MULTI_TENANT
    weak = [e for e in engines if e.hash_algo in NON_CRYPTOGRAPHIC_HASHES]
    if multi and weak:
        algos = "/".join(sorted({str(e.hash_algo) for e in weak}))
        return Isolation(
            ConditionStatus.FALSE,
            ConditionReason.NON_CRYPTOGRAPHIC_PREFIX_HASH,
            f"cache.tenancy is MultiTenant but prefix blocks are hashed with {algos} on "
            f"{_where(weak, engines)}: vLLM documents that a non-cryptographic hash can "
            "collide across tenants and serve one tenant's cached KV blocks to another; "
            "run vLLM with --prefix-caching-hash-algo sha256",
        )
    undecided = [e for e in engines if e.prefix_caching is None]
    if undecided:
        return Isolation(
            ConditionStatus.UNKNOWN,
            ConditionReason.CACHE_CONFIG_UNKNOWN,
            f"enable_prefix_caching is not exported on {_where(undecided, engines)}",
        )
    if not multi:
        algos = ", ".join(sorted({e.hash_algo or "an unexported hash" for e in engines}))
        return Isolation(
            ConditionStatus.TRUE,
            ConditionReason.SINGLE_TENANT,
            f"cache.tenancy is SingleTenant: prefix blocks ({algos}) are shared by one "
            "tenant's prompts only",
        )
    unknown = [e for e in engines if e.hash_algo not in CRYPTOGRAPHIC_HASHES]
    if unknown:
        seen = ", ".join(sorted({repr(e.hash_algo) for e in unknown if e.hash_algo}))
        what = (
            f"the hash algorithm {seen} is not one cachescale knows"
            if seen
            else ("prefix_caching_hash_algo is not exported (vLLM too old?)")
        )
        return Isolation(
            ConditionStatus.UNKNOWN,
            ConditionReason.CACHE_CONFIG_UNKNOWN,
            f"cache.tenancy is MultiTenant and {what} on {_where(unknown, engines)}",
        )
    algos = ", ".join(sorted({str(e.hash_algo) for e in engines}))
    return Isolation(
        ConditionStatus.TRUE,
        ConditionReason.CRYPTOGRAPHIC_PREFIX_HASH,
        f"cache.tenancy is MultiTenant and every engine ({len(engines)}) hashes prefix "
        f"blocks with {algos}",
    )


def _where(some: Sequence[EngineCacheConfig], engines: Sequence[EngineCacheConfig]) -> str:
    """``2 of 3 engines (pods a, b)``."""
    pods = sorted({e.pod for e in some if e.pod})
    named = ", ".join(pods[:_SHOWN_PODS]) + (
        f" and {len(pods) - _SHOWN_PODS} more" if len(pods) > _SHOWN_PODS else ""
    )
    where = f" (pods {named})" if pods else ""
    return f"{len(some)} of {len(engines)} engines{where}"
