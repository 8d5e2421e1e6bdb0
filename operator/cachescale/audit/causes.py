"""The causes the audit names, and which one a change's shape names.

A cause is named from what changed, never from where: a prompt is compared token by token
with a reference (``divergence.diff``), and the change's shape says what happened, at
whatever token and block it sits, whatever the prompt's layout:

* the same tokens in another order: ``unstable-ordering``;
* a few tokens replaced by a few others, the rest the same: ``variable-span`` (a
  timestamp or a request id);
* text of the previous turn dropped, all the rest of it kept: ``sliding-window``;
* text inserted, or a long span replaced or dropped, ahead of what the turn keeps of the
  previous one: ``retrieval-rerun``;
* a turn that never rejoins its previous one: ``not-append-only``;
* the same tokens cached under another ``cache_salt``: ``cache-salt`` (tenancy
  isolation), said to be intended when the salts follow the tenants;
* a bounded pool that dropped a computed prefix: ``evicted``;
* new content: ``boundary-shift`` when a later request reuses it (it heals), else
  ``unique``.
"""

from __future__ import annotations

from cachescale.audit.divergence import Change

#: A replaced span of at most this many tokens on each side is a variable value (a
#: timestamp, a request id); a longer one is new text.
VARIABLE_SPAN_TOKENS = 48

#: Cause ids, in the order reports list them, with their one-line meaning.
CAUSES: dict[str, str] = {
    "variable-span": "a span that differs on every request: a few tokens replaced, the rest "
    "of the prompt the same (a timestamp or request id?)",
    "unstable-ordering": "unstable ordering: the same tokens in another order "
    "(tool definitions or JSON keys in nondeterministic order)",
    "sliding-window": "history dropped from the front: a turn drops text of the previous "
    "one and keeps the rest (a sliding window or truncation), so the rest is recomputed",
    "retrieval-rerun": "new text ahead of the history: a turn inserts or replaces text before "
    "what it keeps of the previous one (retrieval re-run every turn?)",
    "not-append-only": "history not append-only: a turn does not extend the previous one and "
    "never rejoins it",
    "cache-salt": "tenancy isolation: the same tokens are cached under another cache_salt",
    "evicted": "evicted: the prefix was computed before but the bounded pool (--kv-blocks) "
    "evicted it",
    "boundary-shift": "new content that later requests reuse: a boundary shift or a cold "
    "prefix, which heals after warm-up (not a regression by itself)",
    "unique": "genuinely unique: content no other request shares",
}


def _short(change: Change) -> bool:
    """A few tokens in place of a few (or of none): a variable value."""
    return 0 < change.inserted <= VARIABLE_SPAN_TOKENS and change.removed <= VARIABLE_SPAN_TOKENS


def turn_cause(change: Change) -> str:
    """The cause of a turn that does not extend its conversation's previous turn."""
    if change.reordered:
        return "unstable-ordering"
    if not change.rejoins:
        return "not-append-only"
    if change.inserted == 0 and change.keeps_rest:
        return "sliding-window"
    if _short(change):
        return "variable-span"
    return "retrieval-rerun"


def cache_cause(change: Change, block_size: int) -> str | None:
    """The cause a divergence from the longest cached prompt names by its shape, or None
    (new content): a reordering, or a short span replaced and then a block or more the
    same (another conversation's prompt differs there only by a variable value)."""
    if change.reordered:
        return "unstable-ordering"
    if _short(change) and change.rejoined >= block_size:
        return "variable-span"
    return None


def salt_detail(
    salt: str | None, tenant: str | None, other_salt: str | None, other_tenant: str | None
) -> str:
    """Whether a ``cache_salt`` that keeps a prompt from another's cached blocks looks
    intended: salts that follow the tenants are; a salt that changes within one tenant
    (per request or conversation) isolates finer than tenancy."""
    salts = f"cache_salt {salt!r} where the cached prompt has {other_salt!r}"
    if tenant is not None and other_tenant is not None:
        if tenant != other_tenant:
            return f"{salts}, tenants {tenant!r} and {other_tenant!r}: isolation as intended"
        return (
            f"{salts}, both of tenant {tenant!r}: the salt changes within a tenant, "
            "finer than tenancy: probably not intended"
        )
    return f"{salts}: intended if each tenant keeps one salt (give records a tenant to check)"
