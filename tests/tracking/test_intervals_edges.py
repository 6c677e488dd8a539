"""A t quantile of no degree of freedom is an error that says why."""

from __future__ import annotations

import pytest

from kubesweep.tracking.intervals import half_width, t975


def test_no_degree_of_freedom_is_refused_with_the_reason() -> None:
    for df in (0, -1):
        with pytest.raises(ValueError) as err:
            t975(df)
        assert str(err.value) == "a t quantile needs at least one degree of freedom"


def test_two_values_are_the_fewest_with_a_half_width() -> None:
    # t(0.975, 1) = 12.706; s = sqrt(2) for 10 and 12: 12.706 x sqrt(2) / sqrt(2)
    assert half_width([10.0, 12.0]) == pytest.approx(12.706)
