"""The base of every document model (`kubesweep.wire.base.StrictModel`): unknown keys are errors, assignments are
validated, fields are filled by name or alias."""

from __future__ import annotations

import pytest
from pydantic import Field, ValidationError

from kubesweep.wire.base import StrictModel


class Doc(StrictModel):
    batch_size: int = 8
    gpu_type: str = Field("l4", alias="gpuType")


def test_an_unknown_key_is_an_error() -> None:
    with pytest.raises(ValidationError, match="batch_sise"):
        Doc.model_validate({"batch_sise": 16})


def test_an_assignment_is_validated() -> None:
    doc = Doc()
    doc.batch_size = "32"  # type: ignore[assignment]
    assert doc.batch_size == 32
    with pytest.raises(ValidationError, match="batch_size"):
        doc.batch_size = "many"  # type: ignore[assignment]
    assert doc.batch_size == 32


def test_fields_are_filled_by_name_or_by_alias() -> None:
    assert Doc.model_validate({"gpuType": "h100-80gb"}).gpu_type == "h100-80gb"
    assert Doc.model_validate({"gpu_type": "a100-40gb"}).gpu_type == "a100-40gb"
