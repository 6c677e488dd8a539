"""The operator's ownership key: 16 bytes is the least it takes."""

from __future__ import annotations

import pytest

from kubesweep.operator.ownership import MIN_KEY_BYTES, OwnershipKeyError, check_key


def test_a_key_of_16_bytes_is_taken_and_one_of_15_is_refused() -> None:
    assert MIN_KEY_BYTES == 16
    assert check_key(b"k" * 16) == b"k" * 16
    with pytest.raises(OwnershipKeyError, match="at least 16 bytes"):
        check_key(b"k" * 15)
    with pytest.raises(OwnershipKeyError):
        check_key(b"")
