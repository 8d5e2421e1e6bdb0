"""Tenancy: whether tenants share cached prefixes, how much, and what the hash risks.

vLLM isolates tenants only by ``cache_salt`` (it goes into block 0, so into every block):
two tenants that send the same prefix without a salt, or with the same salt, share its
cached blocks, which is a saving and also a cross-tenant timing channel. So when records
carry tenants, the result says which requests come without a salt, and which prefixes
the prompts of more than one tenant hold: each as its size in blocks and tokens, its
tenants, the requests that reach it and a short id (the first 4 bytes of its last block's
hash), never its content. A shared prefix is maximal: a request counts towards the
longest cross-tenant prefix it holds. With ``--hash-algo xxhash`` (not cryptographic) and
more than one tenant in one cache, a crafted prompt can collide with another tenant's
block: the result warns.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from cachescale.audit.explain import Outcome

#: Shared prefixes listed in the result (largest reach first) and named in the note.
LISTED = 10
NAMED = 3


def _tenants_of_blocks(outcomes: list[Outcome]) -> dict[bytes, set[str]]:
    """For every block in a tenant's prompt, the tenants whose prompts hold it."""
    tenants_of: dict[bytes, set[str]] = {}
    for outcome in outcomes:
        tenant = outcome.record.tenant
        if tenant is not None:
            for block in outcome.chain:
                tenants_of.setdefault(block, set()).add(tenant)
    return tenants_of


def _shared_prefixes(
    outcomes: list[Outcome], tenants_of: dict[bytes, set[str]], block_size: int
) -> list[dict[str, Any]]:
    """The maximal prefixes (block chains) the prompts of two or more tenants hold."""
    reach: Counter[tuple[bytes, int]] = Counter()
    for outcome in outcomes:
        if outcome.record.tenant is None:
            continue
        depth = 0  # chains are prefix-closed: a shared block's parents are shared too
        while depth < len(outcome.chain) and len(tenants_of[outcome.chain[depth]]) > 1:
            depth += 1
        if depth:
            reach[(outcome.chain[depth - 1], depth)] += 1
    ranked = sorted(reach.items(), key=lambda item: (-item[1], -item[0][1]))
    return [
        {
            "id": block[:4].hex(),
            "blocks": depth,
            "tokens": depth * block_size,
            "tenants": sorted(tenants_of[block]),
            "requests": requests,
        }
        for (block, depth), requests in ranked
    ]


def tenancy(
    outcomes: list[Outcome], block_size: int, hash_algo: str
) -> tuple[dict[str, Any] | None, list[str], list[str]]:
    """The result's ``tenancy`` section (None without two tenants), its notes and its
    warnings."""
    tenants = {o.record.tenant for o in outcomes if o.record.tenant is not None}
    if len(tenants) < 2:
        return None, [], []
    unsalted = [o for o in outcomes if o.record.tenant is not None and not o.record.cache_salt]
    unsalted_tenants = {o.record.tenant for o in unsalted}
    tenants_of = _tenants_of_blocks(outcomes)
    shared = _shared_prefixes(outcomes, tenants_of, block_size)
    section = {
        "tenants": len(tenants),
        "unsalted_tenants": len(unsalted_tenants),
        "unsalted_requests": len(unsalted),
        "shared_blocks": sum(len(holders) > 1 for holders in tenants_of.values()),
        "shared_requests": sum(entry["requests"] for entry in shared),
        "shared_prefixes": shared[:LISTED],
    }
    notes: list[str] = []
    if unsalted:
        notes.append(
            f"{len(unsalted_tenants)} of {len(tenants)} tenants send requests without "
            f"cache_salt ({len(unsalted):,} requests): vLLM isolates tenants only by "
            "cache_salt, so those requests share cached prefixes across tenants"
        )
    if shared:
        named = "; ".join(
            f"#{entry['id']}: {entry['blocks']} blocks ({entry['tokens']:,} tokens), "
            f"{len(entry['tenants'])} tenants, {entry['requests']:,} requests"
            for entry in shared[:NAMED]
        )
        notes.append(
            f"prefixes shared across tenants: {len(shared)} ({section['shared_blocks']:,} "
            f"blocks, reached by {section['shared_requests']:,} requests); the most reached: "
            f"{named}"
        )
    warnings = []
    if hash_algo in ("xxhash", "xxhash_cbor"):
        warnings.append(
            f"--hash-algo {hash_algo} is not a cryptographic hash: with {len(tenants)} tenants in "
            "one cache, a crafted prompt can collide with another tenant's block (wrong KV "
            "reused, or a probe of what others sent); use sha256 or sha256_cbor"
        )
    return section, notes, warnings
