"""95% confidence intervals of a mean over repeats, and the tie rule the answer uses.

- interval: mean ± t(0.975, n - 1) x s / sqrt(n), Student's t with the sample standard deviation s (n - 1): the
  repeats are few and their spread is estimated, so the normal 1.96 would claim too much. One repeat has no
  interval: its value is a point.
- tie: two settings are tied on a metric when their intervals overlap (a point counts as an interval of width
  zero). The answer names a winner only when no other setting's interval overlaps the best one's; otherwise it
  names every setting tied with the best. Overlapping 95% intervals is a conservative test (two means can differ
  at the 5% level while their intervals touch): a "tied" reads "not shown to differ with these repeats", and more
  repeats narrow the intervals.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# t(0.975, df) for df = 1..30; beyond, the normal quantile is within 2% of it
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
Z975 = 1.960


def t975(df: int) -> float:
    """The two-sided 95% quantile of Student's t with `df` degrees of freedom (df >= 1)."""
    if df < 1:
        raise ValueError("a t quantile needs at least one degree of freedom")
    return _T975[df - 1] if df <= len(_T975) else Z975


@dataclass(frozen=True)
class Interval:
    low: float
    high: float

    def overlaps(self, other: Interval) -> bool:
        return self.low <= other.high and other.low <= self.high


def half_width(values: Sequence[float]) -> float | None:
    """The 95% interval's half-width of the mean of `values`; None with fewer than two."""
    n = len(values)
    if n < 2:
        return None
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return t975(n - 1) * std / math.sqrt(n)


def interval(values: Sequence[float]) -> Interval | None:
    """The 95% interval of the mean (a point for one value; None for none)."""
    if not values:
        return None
    mean = sum(values) / len(values)
    hw = half_width(values) or 0.0
    return Interval(mean - hw, mean + hw)
