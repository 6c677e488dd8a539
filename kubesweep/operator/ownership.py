"""Which namespace an MLflow experiment was made for, as only the operator can say it.

Tags, names and grants on the MLflow server are things its users can set: an experiment's creator manages it and
may grant others (the operator included) any right on it, and a namespace's user with EDIT may rename and retag
the experiments of its namespace. None of that may decide whose an experiment is. The operator seals each
experiment it makes for a namespace: the tag `kubesweep.owner-seal` holds an HMAC-SHA256, under a key only the
operator holds, of the experiment's identity and the namespace. The identity is the experiment's id and its
creation time (milliseconds, which the server sets when it makes the experiment and nothing changes after): an
id alone names another experiment once a store reuses it (SQLite gives a hard-deleted experiment's id, after
`mlflow gc`, to the next one made; so does a store made anew beside a kept key), and the seal copied onto that one
would be good. A user can copy a seal, but a seal is good for its own experiment and namespace only, and none can
be made without the key: an experiment whose seal does not match (absent, copied from another experiment, from
one whose id this one took again, for another namespace) was not made by the operator for that namespace, whatever
its name or other tags say.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubesweep.wire import tags

MIN_KEY_BYTES = 16


class OwnershipKeyError(ValueError):
    pass


def check_key(key: bytes) -> bytes:
    if len(key) < MIN_KEY_BYTES:
        raise OwnershipKeyError(f"the operator's ownership key must be at least {MIN_KEY_BYTES} bytes long")
    return key


@dataclass(frozen=True)
class Identity:
    """An experiment as no other is: its id and the time the server made it (ms since the epoch)."""

    experiment_id: str
    created_ms: int

    @classmethod
    def of(cls, experiment: Mapping[str, Any]) -> Identity | None:
        """The identity of an experiment as MLflow's REST API describes it; None without a creation time."""
        exp, created = experiment.get("experiment_id"), experiment.get("creation_time")
        if not isinstance(exp, str | int) or isinstance(created, bool) or not isinstance(created, str | int):
            return None
        try:
            ms = int(created)
        except ValueError:
            return None
        return cls(str(exp), ms) if ms > 0 and str(exp) else None


def seal(key: bytes, identity: Identity, namespace: str) -> str:
    """The seal of the experiment `identity` made for `namespace` (hex)."""
    message = b"\0".join([b"kubesweep-experiment-2", identity.experiment_id.encode(),
                          str(identity.created_ms).encode(), namespace.encode()])
    return hmac.new(check_key(key), message, hashlib.sha256).hexdigest()


def sealed_for(key: bytes, identity: Identity, namespace: str, experiment_tags: Mapping[str, str | None]) -> bool:
    """Whether the experiment's tags carry the operator's seal for `namespace`."""
    return hmac.compare_digest(experiment_tags.get(tags.OWNER_SEAL) or "", seal(key, identity, namespace))


def owner(key: bytes, identity: Identity, experiment_tags: Mapping[str, str | None]) -> str | None:
    """The namespace the operator made the experiment for, or None: the namespace tag, if the seal confirms it."""
    claimed = experiment_tags.get(tags.NAMESPACE)
    return claimed if claimed and sealed_for(key, identity, claimed, experiment_tags) else None
