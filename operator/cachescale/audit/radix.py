"""A token radix tree: SGLang's prefix cache at page size 1, unbounded.

SGLang keeps every computed prompt in a radix tree of token ids and reuses the longest
common token prefix a new request shares with anything in it: no blocks, so no rounding
down to a block boundary. Requests with different extra keys (``cache_salt``) live in
separate trees and never share. Edges are slices of the prompts' own id arrays (nothing
is copied), compared with numpy, so a lookup costs one comparison per branch point on its
path. Each node remembers one prompt that runs through it, which the audit quotes as the
cached prompt a request parted from.
"""

from __future__ import annotations

from cachescale.audit.divergence import Tokens, common_prefix


class _Node:
    __slots__ = ("children", "edge", "owner")

    def __init__(self, edge: Tokens, owner: int) -> None:
        self.edge = edge
        """The ids from the parent to this node."""
        self.owner = owner
        """The index of a prompt that runs through the whole edge."""
        self.children: dict[int, _Node] = {}


class RadixTree:
    """Every prompt inserted, per salt, with longest-common-prefix lookup."""

    def __init__(self) -> None:
        self._roots: dict[str, _Node] = {}

    def match(self, tokens: Tokens, salt: str | None) -> tuple[int, int | None]:
        """The longest common prefix of ``tokens`` with any prompt of the same salt, and
        the index of a prompt that shares it (None when nothing is shared)."""
        node = self._roots.get(salt or "")
        matched, owner, length = 0, None, len(tokens)
        while node is not None and matched < length:
            child = node.children.get(int(tokens[matched]))
            if child is None:
                break
            edge = child.edge
            step = common_prefix(tokens[matched : matched + len(edge)], edge)
            matched, owner = matched + step, child.owner
            node = child if step == len(edge) else None
        return matched, owner

    def insert(self, tokens: Tokens, salt: str | None, index: int) -> None:
        """Add prompt ``index``, splitting the edge where it parts from the tree."""
        node = self._roots.setdefault(salt or "", _Node(tokens[:0], index))
        position, length = 0, len(tokens)
        while position < length:
            key = int(tokens[position])
            child = node.children.get(key)
            if child is None:
                node.children[key] = _Node(tokens[position:], index)
                return
            edge = child.edge
            step = common_prefix(tokens[position : position + len(edge)], edge)
            if step < len(edge):
                middle = _Node(edge[:step], child.owner)
                child.edge = edge[step:]
                middle.children[int(edge[step])] = child
                node.children[key] = child = middle
            position += step
            node = child
