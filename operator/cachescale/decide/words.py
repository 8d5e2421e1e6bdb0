"""Numbers as a human reads them in a condition message or an Event.

Every decision message carries its evidence; these keep the formatting of that evidence
uniform (two decimals for ratios, thousands separators for token counts, units always).
A latency quantile also says how far it can be trusted: ``> 400 s`` when it is past the
histogram's last finite bucket, its bucket beside it when that bucket is wide.
"""

from __future__ import annotations

from cachescale.snapshot import Measured


def ratio(value: float) -> str:
    """A hit rate or share: ``0.85``."""
    return f"{value:.2f}"


def tokens(value: float) -> str:
    """A token count: ``9,800``."""
    return f"{value:,.0f}"


def rate(value: float) -> str:
    """Requests per second: ``32`` or ``0.42``."""
    return f"{value:.0f}" if value >= 10 else f"{value:.2g}"


def seconds(value: float) -> str:
    """A latency: ``0.58 s``, ``2,368 s``."""
    return f"{value:.2f} s" if value < 10 else f"{value:,.0f} s"


def latency(quantile: Measured) -> str:
    """A latency quantile as read: ``0.58 s``; ``> 400 s`` when only a lower bound is
    known; ``1.3 s (bucket 1–2.5 s)`` when its bucket is wide; ``unknown`` if unknown."""
    if quantile.value is None:
        return "unknown"
    if quantile.lower_bound:
        return f"> {seconds(quantile.value)}"
    if quantile.bucket is not None:
        low, high = quantile.bucket
        return f"{seconds(quantile.value)} (bucket {low:,g}–{high:,g} s)"
    return seconds(quantile.value)


def latency_cell(quantile: Measured) -> str:
    """:func:`latency` for a ``kubectl get`` column, without spaces (so the table's
    columns stay one word each): ``0.58s``, ``>400s``, ``1.3s(1–2.5s)``."""
    return latency(quantile).replace("bucket ", "").replace(" ", "")


def cost(value: float) -> str:
    """GPU-seconds per 1k requests: ``1,142``."""
    return f"{value:,.0f}"


def spread(low: float, high: float) -> str:
    """A range as centre ± half-width: ``32 ± 1`` (whole numbers from 10 up, so a
    half-width under 0.5 still reads ± 1 rather than ± 0)."""
    centre, half = (low + high) / 2, (high - low) / 2
    if centre >= 10:
        return f"{centre:.0f} ± {max(1, round(half))}"
    return f"{centre:.2g} ± {half:.1g}"
