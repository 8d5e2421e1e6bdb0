"""Print the import cycles among cachescale's modules; exit 1 when there is one.

A cycle is a strongly connected component of more than one module in grimp's import graph
of the package (the graph import-linter checks its contracts on): every import statement
counts, those inside functions and under ``TYPE_CHECKING`` included, and a package is its
``__init__`` module. ``tests/test_layout.py`` asserts there is none.

    .venv/bin/python scripts/import_cycles.py
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping, Set

import grimp

PACKAGE = "cachescale"


def import_graph(package: str = PACKAGE) -> dict[str, set[str]]:
    """Each module of ``package`` and the modules of ``package`` it imports directly."""
    graph = grimp.build_graph(package, cache_dir=None)
    modules = set(graph.modules)
    return {
        module: graph.find_modules_directly_imported_by(module) & modules
        for module in sorted(modules)
    }


def strongly_connected(edges: Mapping[str, Set[str]]) -> list[list[str]]:
    """The strongly connected components of ``edges`` (every node is a key), each sorted
    (Tarjan's algorithm, with an explicit stack instead of recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    path: list[str] = []
    components: list[list[str]] = []
    for root in edges:
        if root in index:
            continue
        index[root] = low[root] = len(index)
        path.append(root)
        walk: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(edges[root])))]
        while walk:
            node, successors = walk[-1]
            following = next((n for n in successors if n not in index or n in path), None)
            if following is not None and following not in index:
                index[following] = low[following] = len(index)
                path.append(following)
                walk.append((following, iter(sorted(edges[following]))))
            elif following is not None:
                low[node] = min(low[node], index[following])
            else:
                walk.pop()
                if walk:
                    parent = walk[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    cut = path.index(node)
                    components.append(sorted(path[cut:]))
                    del path[cut:]
    return components


def cycles(edges: Mapping[str, Set[str]]) -> list[list[str]]:
    """The strongly connected components of ``edges`` with more than one node, sorted."""
    return sorted(c for c in strongly_connected(edges) if len(c) > 1)


def import_cycles(package: str = PACKAGE) -> list[list[str]]:
    """The import cycles among the modules of ``package``: each one's modules, sorted."""
    return cycles(import_graph(package))


def main() -> int:
    """Print how many modules and cycles there are, then each cycle's modules."""
    graph = import_graph()
    found = cycles(graph)
    print(
        f"{len(graph)} modules of {PACKAGE}, {len(found)} import cycles (grimp {grimp.__version__})"
    )
    for cycle in found:
        print("  " + ", ".join(cycle))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
