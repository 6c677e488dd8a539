"""The operator's ownership key: 16 bytes is the least it takes; and the seal it makes, as stored."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from kubesweep.operator.ownership import MIN_KEY_BYTES, Identity, OwnershipKeyError, check_key, seal


def test_a_key_of_16_bytes_is_taken_and_one_of_15_is_refused() -> None:
    assert MIN_KEY_BYTES == 16
    assert check_key(b"k" * 16) == b"k" * 16
    with pytest.raises(OwnershipKeyError, match="at least 16 bytes"):
        check_key(b"k" * 15)
    with pytest.raises(OwnershipKeyError):
        check_key(b"")


def test_a_seal_is_the_one_written_down() -> None:
    """A seal is stored on the server: one an earlier operator made must still be good after an upgrade, so its
    message (the domain tag, then the id, the creation time and the namespace, NUL between) and MAC are fixed.
    Changing them is a migration of every sealed experiment, not a refactoring."""
    key = b"a-key-of-thirty-two-bytes-012345"
    made = seal(key, Identity("7", 1_700_000_000_000), "team-b")
    assert made == "4e8deacb2030c1c3c49ff2f5bf1f3e575b6e368b2e828203efd86eae85f3b580"
    assert made == hmac.new(key, b"kubesweep-experiment-2\x007\x001700000000000\x00team-b", hashlib.sha256).hexdigest()
    # the time and the id kept apart too: experiment 1 made at 23 ms is not experiment 12 made at 3 ms
    assert seal(key, Identity("1", 23), "a") != seal(key, Identity("12", 3), "a")


def test_an_identity_needs_an_id_and_a_creation_time_after_the_epoch() -> None:
    assert Identity.of({"experiment_id": "7", "creation_time": 1}) == Identity("7", 1)  # the first millisecond
    for bad in ({"experiment_id": "", "creation_time": 5}, {"experiment_id": "7", "creation_time": 0},
                {"experiment_id": "7", "creation_time": True}):
        assert Identity.of(bad) is None, bad
