"""How the e2e suite stays on one pytest-xdist worker.

`make e2e` (and so `make test`) runs ``pytest -n 2 --dist loadfile e2e``. Under
``--dist loadfile`` every test module is one unit of work, so its module-scoped fixtures
are built once; the e2e suite is the exception to "one module, one unit": all of it shares
the session's cluster (``e2e/conftest.py``), and one envtest control plane per worker
would cost both cores, so the whole of ``e2e/`` is a single unit, run by one worker. The
same holds for a plain ``pytest -n 2 --dist loadfile`` over ``tests/`` and ``e2e/``
together: one worker runs ``e2e/`` while the other takes ``tests/``.

The grouping is by node id here rather than by xdist's ``xdist_group`` mark, because
``--dist loadgroup`` carries the mark to the scheduler by rewriting node ids, which
pytest 9.2 no longer lets it do: the tests would be spread with no error at all.
"""

from __future__ import annotations

from xdist.scheduler import LoadFileScheduling

E2E_UNIT = "e2e/"


class OneClusterScheduling(LoadFileScheduling):
    """``--dist loadfile``, with every test under ``e2e/`` in one unit of work."""

    def _split_scope(self, nodeid: str) -> str:
        if nodeid.startswith(E2E_UNIT):
            return E2E_UNIT
        scope: str = super()._split_scope(nodeid)
        return scope
