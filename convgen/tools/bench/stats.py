"""Statistics of `convgen bench`: per-rep time summaries, rates, ratios and geometric means.

Pure functions on numbers, so they run (and are tested) on any machine.  Missing values
stay missing: a ratio or mean of nothing is None, never 0.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Iterable, Optional, Sequence


def tflops(flops: float, us: Optional[float]) -> Optional[float]:
    return None if not us or us <= 0 else flops / (us * 1e6)


def ratio(num: Optional[float], den: Optional[float]) -> Optional[float]:
    if num is None or den is None or den <= 0 or num <= 0:
        return None
    return num / den


def geomean(values: Iterable[Optional[float]]) -> Optional[float]:
    """Geometric mean of the positive finite values; None when there are none."""
    vals = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def _quantile(sorted_vals: Sequence[float], q: float) -> float:
    if len(sorted_vals) == 1:
        return sorted_vals[0]
    pos = q * (len(sorted_vals) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def time_stats(samples_us: Sequence[float]) -> Optional[dict[str, Any]]:
    """Median and spread of per-rep times (microseconds); None for no samples."""
    vals = sorted(float(v) for v in samples_us)
    if not vals:
        return None
    return {
        "median": statistics.median(vals), "min": vals[0], "max": vals[-1],
        "p20": _quantile(vals, 0.2), "p80": _quantile(vals, 0.8),
        "mean": statistics.fmean(vals), "n": len(vals),
    }


def _median_of(stats: Optional[dict[str, Any]]) -> Optional[float]:
    return None if not stats else stats.get("median")
