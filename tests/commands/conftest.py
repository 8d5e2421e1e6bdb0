"""Fixtures the command tests share with the gather tests.

``synthetic_prometheus`` is a real Prometheus over the synthetic engine series of
``tests/gather/gather_dataset.py``; ``cachescale signals`` and ``cachescale report`` are
checked against it as the gather layer is.
"""

from __future__ import annotations

from tests.gather.conftest import synthetic_prometheus

__all__ = ["synthetic_prometheus"]
