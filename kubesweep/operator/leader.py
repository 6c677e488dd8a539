"""Leader election on a coordination.k8s.io/v1 Lease, so that of several operator replicas one acts at a time.

The algorithm is client-go's: the holder renews `spec.renewTime` every `renew_every` seconds; a candidate takes
the Lease over when the record it observed has not changed for `duration` seconds, measured on its own
monotonic clock (clocks of different machines are never compared). Writes use the Lease's resourceVersion, so
of two candidates racing for an expired Lease one wins and the other gets a conflict.

The holder stops acting on its own when it could not renew in time: `holding()` is true only until
`duration - margin` seconds after the start of its last successful renewal, which is before any other
candidate may take over. The operator's `LeaseGuard` checks `holding()` before every write, gives the write
`remaining()` as its request timeout, and checks `holding()` again once the write returned.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubesweep.backends.base import BackendError
from kubesweep.backends.k8s_reconcile import Checkpoints, NoCheckpoints

log = logging.getLogger("kubesweep.operator.leader")
# A write is sent only with at least this much Lease validity left (it is the write's request timeout).
MIN_WRITE_WINDOW = 0.25
# The request timeout of writes where no Lease bounds them (a guard built without `lease_remaining`).
DEFAULT_WRITE_TIMEOUT = 30.0


def _now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class _Observed:
    record: tuple[Any, ...]
    since: float  # local monotonic time at which this record was first seen


class LeaseElector:
    def __init__(self, coordination: Any, namespace: str, name: str, identity: str, *, duration: float = 15.0,
                 renew_every: float = 5.0, margin: float = 2.0, clock: Callable[[], float] = time.monotonic):
        if not 0 < renew_every < duration - margin:
            raise ValueError("the Lease must be renewed well within its duration (renew_every < duration - margin)")
        self.api = coordination
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.duration = duration
        self.renew_every = renew_every
        self.margin = margin
        self.clock = clock
        self._valid_until = 0.0
        self._observed: _Observed | None = None
        self.holder: str | None = None  # who holds it, as last seen

    def holding(self) -> bool:
        return self.clock() < self._valid_until

    def remaining(self) -> float:
        """Seconds this replica may still act on its last renewal (0 when it does not hold the Lease). The
        operator gives every write this as its request timeout, so no request of it is still under way when
        a standby may take over."""
        return max(0.0, self._valid_until - self.clock())

    def _observe(self, spec: dict[str, Any], version: str) -> None:
        record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseTransitions"), version)
        if self._observed is None or self._observed.record[:3] != record[:3]:
            self._observed = _Observed(record, self.clock())
        self.holder = spec.get("holderIdentity")

    def try_acquire_or_renew(self) -> bool:
        """One round: create, renew or take over the Lease. True while this process holds it."""
        started = self.clock()
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
        except Exception as exc:
            if getattr(exc, "status", None) != 404:
                log.warning("cannot read Lease %s/%s: %s", self.namespace, self.name, _brief(exc))
                return self.holding()
            return self._create(started)
        spec = lease.spec.to_dict() if lease.spec else {}
        spec = {_camel(k): v for k, v in spec.items()}
        version = lease.metadata.resource_version
        self._observe(spec, version)
        holder = spec.get("holderIdentity")
        mine = holder == self.identity
        assert self._observed is not None
        expired = not holder or self.clock() - self._observed.since > self.duration
        if not mine and not expired:
            self._valid_until = 0.0
            return False
        now = _now_micro()
        body: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace, "resourceVersion": version},
            "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": int(self.duration),
                     "acquireTime": spec.get("acquireTime") if mine else now, "renewTime": now,
                     "leaseTransitions": (spec.get("leaseTransitions") or 0) + (0 if mine else 1)},
        }
        if isinstance(body["spec"]["acquireTime"], datetime):
            body["spec"]["acquireTime"] = body["spec"]["acquireTime"].strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        try:
            self.api.replace_namespaced_lease(self.name, self.namespace, body)
        except Exception as exc:
            log.info("Lease %s/%s not %s: %s", self.namespace, self.name, "renewed" if mine else "taken",
                     _brief(exc))
            return self.holding() if mine else False
        if not mine:
            log.info("took the Lease %s/%s over from %s", self.namespace, self.name, holder or "nobody")
        self.holder = self.identity
        self._valid_until = started + self.duration - self.margin
        return True

    def _create(self, started: float) -> bool:
        now = _now_micro()
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": int(self.duration),
                         "acquireTime": now, "renewTime": now, "leaseTransitions": 0}}
        try:
            self.api.create_namespaced_lease(self.namespace, body)
        except Exception as exc:
            log.info("Lease %s/%s not created: %s", self.namespace, self.name, _brief(exc))
            return False
        log.info("created the Lease %s/%s", self.namespace, self.name)
        self.holder = self.identity
        self._valid_until = started + self.duration - self.margin
        return True

    def release(self) -> None:
        """Give the Lease up at a clean shutdown, so a standby replica takes over at once."""
        if not self.holding():
            return
        self._valid_until = 0.0
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
            if lease.spec and lease.spec.holder_identity == self.identity:
                lease.spec.holder_identity = None
                lease.spec.lease_duration_seconds = 1
                self.api.replace_namespaced_lease(self.name, self.namespace, lease)
                log.info("released the Lease %s/%s", self.namespace, self.name)
        except Exception as exc:
            log.warning("could not release the Lease %s/%s: %s", self.namespace, self.name, _brief(exc))


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _brief(exc: Exception) -> str:
    status = getattr(exc, "status", None)
    return f"{status} {getattr(exc, 'reason', '')}".strip() if status else str(exc)


class NotLeader(BackendError):
    """This replica does not hold the Lease (any more): it must not write."""


class LeaseGuard:
    """The operator's write guard (`k8s_client.WriteGuard`): a write goes out only while this replica holds the
    Lease; its request timeout is the Lease's remaining validity (which ends `margin` seconds before a standby may
    take over), read just before the request is sent, and leadership is checked once more after it returned: a
    replica that lost the Lease meanwhile (paused, partitioned, slow API) stops the step there (NotLeader) and
    makes no further write."""

    def __init__(self, may_write: Callable[[], bool], lease_remaining: Callable[[], float] | None = None,
                 checkpoints: Checkpoints | None = None):
        self.may_write = may_write
        self.lease_remaining = lease_remaining
        self.checkpoints = checkpoints or NoCheckpoints()

    def check(self) -> None:
        """Raise NotLeader unless this replica holds the Lease."""
        if not self.may_write():
            raise NotLeader("this replica does not hold the leader Lease; it makes no change")

    def _left(self) -> float:
        if self.lease_remaining is not None:
            return self.lease_remaining()
        return DEFAULT_WRITE_TIMEOUT if self.may_write() else 0.0

    def before(self) -> Mapping[str, Any]:
        self.check()
        self.checkpoints.reached("write")  # tests: SIGSTOP here, between the check and the request
        left = self._left()
        if left < MIN_WRITE_WINDOW:
            log.warning("the leader Lease is valid for %.2f s more only: a write is not sent, the step stops", left)
            raise NotLeader("the leader Lease is about to lapse; this write is not sent")
        return {"_request_timeout": left}

    def after(self) -> None:
        if not self.may_write():
            log.warning("the leader Lease lapsed while a write was under way: the step stops")
            raise NotLeader("the leader Lease lapsed during a write") from None
