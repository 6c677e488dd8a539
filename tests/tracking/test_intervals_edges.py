"""A t quantile of no degree of freedom is an error that says why."""

from __future__ import annotations

import pytest

from kubesweep.tracking.intervals import t975


def test_no_degree_of_freedom_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="at least one degree of freedom"):
        t975(0)
