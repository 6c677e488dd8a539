"""The bounds of the job's batch sizes: at the bound a setting is taken, one past it is refused."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kubesweep.wire.config import MAX_BATCH_SIZE, JobConfig


@pytest.mark.parametrize("field", ["batch_size", "eval_batch_size"])
def test_a_batch_size_is_taken_from_one_to_the_bound_and_refused_beyond(field: str) -> None:
    assert MAX_BATCH_SIZE == 1 << 20
    assert getattr(JobConfig.model_validate({field: 1}), field) == 1
    assert getattr(JobConfig.model_validate({field: MAX_BATCH_SIZE}), field) == MAX_BATCH_SIZE
    for bad in (0, MAX_BATCH_SIZE + 1):
        with pytest.raises(ValidationError, match=field):
            JobConfig.model_validate({field: bad})

