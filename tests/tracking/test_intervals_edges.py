"""A t quantile of no degree of freedom is an error that says why."""

from __future__ import annotations

import pytest

from kubesweep.tracking.intervals import t975


def test_no_degree_of_freedom_is_refused_with_the_reason() -> None:
    for df in (0, -1):
        with pytest.raises(ValueError) as err:
            t975(df)
        assert str(err.value) == "a t quantile needs at least one degree of freedom"
