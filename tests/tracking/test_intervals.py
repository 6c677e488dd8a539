"""95% intervals and the tie rule (kubesweep/tracking/intervals.py), checked by hand on known numbers."""

from __future__ import annotations

import math

import pytest

from kubesweep.tracking.intervals import Interval, half_width, interval, t975


def test_t_quantiles_are_students_then_the_normal() -> None:
    assert t975(1) == 12.706 and t975(2) == 4.303 and t975(30) == 2.042
    assert t975(31) == t975(500) == 1.960
    with pytest.raises(ValueError):
        t975(0)


def test_the_half_width_of_three_repeats_by_hand() -> None:
    # 10, 12, 14: mean 12, s = 2, n = 3, t(0.975, 2) = 4.303: h = 4.303 x 2 / sqrt(3) = 4.9687
    assert half_width([10.0, 12.0, 14.0]) == pytest.approx(4.303 * 2 / math.sqrt(3))
    assert interval([10.0, 12.0, 14.0]) == Interval(pytest.approx(12 - 4.9687, abs=1e-4),  # type: ignore[arg-type]
                                                    pytest.approx(12 + 4.9687, abs=1e-4))  # type: ignore[arg-type]


def test_one_repeat_is_a_point_and_none_is_nothing() -> None:
    assert half_width([5.0]) is None and interval([5.0]) == Interval(5.0, 5.0)
    assert half_width([]) is None and interval([]) is None


def test_intervals_that_touch_overlap_and_disjoint_ones_do_not() -> None:
    assert Interval(1.0, 2.0).overlaps(Interval(2.0, 3.0)) and Interval(2.0, 3.0).overlaps(Interval(1.0, 2.0))
    assert Interval(0.0, 10.0).overlaps(Interval(4.0, 5.0))  # one inside the other
    assert not Interval(1.0, 2.0).overlaps(Interval(2.1, 3.0))
