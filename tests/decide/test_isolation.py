"""The CacheIsolation condition: tenancy against the engines' prefix-cache configuration."""

from __future__ import annotations

import dataclasses

import pytest

from cachescale.api.reasons import ConditionReason
from cachescale.api.status import ConditionStatus, ConditionType
from cachescale.decide import Decision
from cachescale.snapshot import CacheConfig, EngineCacheConfig, EngineSignals, FetchFailure
from tests.decide.decide_builders import T0, condition, run, signals, snapshot, spec

MULTI = {"tenancy": "MultiTenant"}


def engines(
    *algos: str | None, caching: bool | None = True, block_size: int | None = 16
) -> CacheConfig:
    return CacheConfig(
        engines=tuple(
            EngineCacheConfig(f"vllm-{i}", algo, caching, block_size)
            for i, algo in enumerate(algos)
        )
    )


def evaluate(config: CacheConfig, tenancy: dict[str, str] | None = None) -> Decision:
    engine = dataclasses.replace(signals(), cache_config=config)
    policy = spec(cache=tenancy) if tenancy else spec()
    (decision,) = run(policy, [snapshot(engine)])
    return decision


def isolation(decision: Decision) -> tuple[ConditionStatus, str, str]:
    verdict = next(c for c in decision.conditions if c.type is ConditionType.CACHE_ISOLATION)
    return verdict.status, verdict.reason, verdict.message


@pytest.mark.parametrize("algo", ["xxhash", "xxhash_cbor", "builtin"])
def test_multi_tenant_with_a_non_cryptographic_hash_is_not_isolated(algo: str) -> None:
    status, reason, message = isolation(evaluate(engines(algo, algo), MULTI))
    assert (status, reason) == (
        ConditionStatus.FALSE,
        ConditionReason.NON_CRYPTOGRAPHIC_PREFIX_HASH,
    )
    assert message.startswith(
        f"cache.tenancy is MultiTenant but prefix blocks are hashed with {algo} on 2 of 2 "
        "engines (pods vllm-0, vllm-1): vLLM documents that a non-cryptographic hash can "
        "collide across tenants"
    )
    assert "\n" not in message


def test_one_weak_engine_is_enough() -> None:
    status, _, message = isolation(evaluate(engines("sha256", "xxhash"), MULTI))
    assert status is ConditionStatus.FALSE
    assert "xxhash on 1 of 2 engines (pods vllm-1)" in message


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor", "sha256_cbor_64bit"])
def test_multi_tenant_with_sha256_is_isolated(algo: str) -> None:
    status, reason, message = isolation(evaluate(engines(algo, algo), MULTI))
    assert (status, reason) == (ConditionStatus.TRUE, ConditionReason.CRYPTOGRAPHIC_PREFIX_HASH)
    assert message == (
        f"cache.tenancy is MultiTenant and every engine (2) hashes prefix blocks with {algo}"
    )


def test_single_tenant_is_the_default_and_any_hash_will_do() -> None:
    status, reason, message = isolation(evaluate(engines("xxhash")))
    assert (status, reason) == (ConditionStatus.TRUE, ConditionReason.SINGLE_TENANT)
    assert message == (
        "cache.tenancy is SingleTenant: prefix blocks (xxhash) are shared by one tenant's "
        "prompts only"
    )


@pytest.mark.parametrize("tenancy", [None, MULTI])
def test_prefix_caching_off_is_false_and_says_what_it_means(
    tenancy: dict[str, str] | None,
) -> None:
    status, reason, message = isolation(evaluate(engines("sha256", caching=False), tenancy))
    assert (status, reason) == (ConditionStatus.FALSE, ConditionReason.PREFIX_CACHING_OFF)
    assert "every prompt is computed in full" in message


def test_sglang_and_absent_info_are_unknown_never_a_default() -> None:
    reason = "SGLang exports no cache configuration metric"
    status, why, message = isolation(evaluate(CacheConfig.unknown(reason), MULTI))
    assert (status, why, message) == (
        ConditionStatus.UNKNOWN,
        ConditionReason.CACHE_CONFIG_UNKNOWN,
        reason,
    )
    # Built without a cache configuration: unknown, not assumed isolated.
    assert isolation(run(spec(cache=MULTI), [snapshot()])[0])[0] is ConditionStatus.UNKNOWN


@pytest.mark.parametrize(("algo", "shown"), [(None, "not exported"), ("md5", "'md5'")])
def test_an_unreadable_hash_is_unknown_under_multi_tenant(algo: str | None, shown: str) -> None:
    status, reason, message = isolation(evaluate(engines(algo), MULTI))
    assert (status, reason) == (ConditionStatus.UNKNOWN, ConditionReason.CACHE_CONFIG_UNKNOWN)
    assert shown in message


def test_unknown_prefix_caching_is_unknown() -> None:
    status, _, message = isolation(evaluate(engines("sha256", caching=None), MULTI))
    assert status is ConditionStatus.UNKNOWN
    assert "enable_prefix_caching is not exported" in message


def test_isolation_is_reported_while_other_metrics_are_missing() -> None:
    blind = EngineSignals.all_unknown(
        "Prometheus is unreachable",
        observed_at=T0,
        window_seconds=300,
        failure=FetchFailure.UNREACHABLE,
    )
    (frozen,) = run(spec(cache=MULTI), [snapshot(blind)])
    assert condition(frozen, ConditionType.CACHE_ISOLATION) == (
        ConditionStatus.UNKNOWN,
        ConditionReason.CACHE_CONFIG_UNKNOWN,
    )
    weak = dataclasses.replace(signals(ttft_p95_seconds=None), cache_config=engines("xxhash"))
    (missing,) = run(spec(cache=MULTI), [snapshot(weak)])
    assert condition(missing, ConditionType.CACHE_ISOLATION)[0] is ConditionStatus.FALSE


def test_isolation_never_changes_scaling() -> None:
    weak, strong = evaluate(engines("xxhash"), MULTI), evaluate(engines("sha256"), MULTI)
    assert (weak.envelope, weak.max_num_seqs, weak.reason, weak.alerts) == (
        strong.envelope,
        strong.max_num_seqs,
        strong.reason,
        strong.alerts,
    )
