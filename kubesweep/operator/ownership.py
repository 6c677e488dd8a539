"""Which namespace an MLflow experiment was made for, as only the operator can say it.

Tags, names and grants on the MLflow server are things its users can set: an experiment's creator manages it and
may grant others (the operator included) any right on it, and a namespace's user with EDIT may rename and retag
the experiments of its namespace. None of that may decide whose an experiment is. The operator seals each
experiment it makes for a namespace: the tag `kubesweep.owner-seal` holds an HMAC-SHA256, under a key only the
operator holds, of the experiment's id and the namespace. A user can copy a seal, but a seal is good for its own
experiment id and namespace only, and none can be made without the key: an experiment whose seal does not match
(absent, copied from another experiment, for another namespace) was not made by the operator for that namespace,
whatever its name or other tags say.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from kubesweep.wire import tags

MIN_KEY_BYTES = 16


class OwnershipKeyError(ValueError):
    pass


def check_key(key: bytes) -> bytes:
    if len(key) < MIN_KEY_BYTES:
        raise OwnershipKeyError(f"the operator's ownership key must be at least {MIN_KEY_BYTES} bytes long")
    return key


def seal(key: bytes, experiment_id: str, namespace: str) -> str:
    """The seal of experiment `experiment_id` made for `namespace` (hex)."""
    message = b"kubesweep-experiment\0" + experiment_id.encode() + b"\0" + namespace.encode()
    return hmac.new(check_key(key), message, hashlib.sha256).hexdigest()


def sealed_for(key: bytes, experiment_id: str, namespace: str, experiment_tags: Mapping[str, str | None]) -> bool:
    """Whether the experiment's tags carry the operator's seal for `namespace`."""
    return hmac.compare_digest(experiment_tags.get(tags.OWNER_SEAL) or "", seal(key, experiment_id, namespace))


def owner(key: bytes, experiment_id: str, experiment_tags: Mapping[str, str | None]) -> str | None:
    """The namespace the operator made the experiment for, or None: the namespace tag, if the seal confirms it."""
    claimed = experiment_tags.get(tags.NAMESPACE)
    return claimed if claimed and sealed_for(key, experiment_id, claimed, experiment_tags) else None
