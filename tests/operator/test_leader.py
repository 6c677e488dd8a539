"""Leader election (`LeaseElector`): who may act, and until when, measured on each replica's own clock.

Replicas share one Lease held by `LeaseServer`, which plays the API server's part for one object: it stores the
Lease as JSON, returns it through the Kubernetes client's own deserializer (times as datetimes, fields in
snake_case, as a real read returns them) and refuses a write that does not carry the current resourceVersion
(409 Conflict), as the API server does. Each replica has its own clock; `elapse` moves them together. Replicas on
a real API server, killed and paused, are tests/operator/test_controller_cluster.py."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from kubesweep.operator.leader import LeaseElector

DURATION, RENEW, MARGIN = 15.0, 5.0, 2.0


class LeaseServer:
    def __init__(self) -> None:
        self.client = ApiClient()
        self.body: dict[str, Any] | None = None
        self.version = 0
        self.writes = 0
        self.read_error: int | None = None  # answer reads with this status
        self.write_error: int | None = None  # answer writes with this status
        self.before_write: Callable[[], None] | None = None  # runs once, before the next write is decided

    def _race(self) -> None:
        hook, self.before_write = self.before_write, None
        if hook is not None:
            hook()

    def read_namespaced_lease(self, name: str, namespace: str) -> Any:
        if self.read_error:
            raise ApiException(status=self.read_error, reason="Internal Server Error")
        if self.body is None:
            raise ApiException(status=404, reason="Not Found")
        return self.client.deserialize(json.dumps(self.body), "V1Lease", "application/json")

    def create_namespaced_lease(self, namespace: str, body: Any) -> None:
        self._race()
        if self.body is not None:
            raise ApiException(status=409, reason="AlreadyExists")
        self._store(body)

    def replace_namespaced_lease(self, name: str, namespace: str, body: Any) -> None:
        self._race()
        if self.write_error:
            raise ApiException(status=self.write_error, reason="Internal Server Error")
        body = self.client.sanitize_for_serialization(body)
        if body["metadata"].get("resourceVersion") != str(self.version):
            raise ApiException(status=409, reason="Conflict")
        self._store(body)

    def _store(self, body: Any) -> None:
        self.version += 1
        self.writes += 1
        self.body = copy.deepcopy(self.client.sanitize_for_serialization(body))
        self.body["metadata"]["resourceVersion"] = str(self.version)

    @property
    def spec(self) -> dict[str, Any]:
        assert self.body is not None
        return self.body["spec"]  # type: ignore[no-any-return]


class Clock:
    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


class Replicas:
    def __init__(self) -> None:
        self.server = LeaseServer()
        self.clocks: list[Clock] = []

    def replica(self, identity: str) -> LeaseElector:
        clock = Clock(1000.0 * (len(self.clocks) + 1))  # machines' clocks differ; only intervals count
        self.clocks.append(clock)
        return LeaseElector(self.server, "ns", "lease", identity, duration=DURATION, renew_every=RENEW,
                            margin=MARGIN, clock=clock)

    def elapse(self, seconds: float) -> None:
        for clock in self.clocks:
            clock.now += seconds


@pytest.fixture
def cluster() -> Replicas:
    return Replicas()


@pytest.mark.parametrize(("renew_every", "margin"), [(13.0, 2.0), (14.0, 2.0), (0.0, 2.0), (5.0, 10.0)])
def test_the_lease_must_be_renewed_well_within_its_duration(renew_every: float, margin: float) -> None:
    with pytest.raises(ValueError, match="renew_every < duration - margin"):
        LeaseElector(LeaseServer(), "ns", "lease", "a", duration=15, renew_every=renew_every, margin=margin)


def test_the_first_replica_creates_the_lease_and_may_act_until_duration_less_margin_after_the_round_began(
        cluster: Replicas) -> None:
    a = cluster.replica("a")
    assert not a.holding() and a.remaining() == 0
    began = a.clock()
    cluster.server.before_write = lambda: cluster.elapse(1.5)  # the round's requests take 1.5 s
    assert a.try_acquire_or_renew()
    spec = cluster.server.spec
    assert (spec["holderIdentity"], spec["leaseDurationSeconds"], spec["leaseTransitions"]) == ("a", 15, 0)
    assert spec["acquireTime"] == spec["renewTime"]
    assert a.holder == "a"
    assert a.remaining() == pytest.approx(DURATION - MARGIN - 1.5)  # from when the round began, not ended
    cluster.elapse(began + DURATION - MARGIN - a.clock() - 0.01)
    assert a.holding()
    cluster.elapse(0.01)
    assert not a.holding() and a.remaining() == 0


def test_a_renewal_moves_renew_time_and_keeps_acquire_time_and_transitions(cluster: Replicas) -> None:
    a = cluster.replica("a")
    assert a.try_acquire_or_renew()
    created = dict(cluster.server.spec)
    cluster.elapse(RENEW)
    cluster.server.before_write = lambda: cluster.elapse(1.0)  # a slow round: validity counts from its start
    assert a.try_acquire_or_renew()
    renewed = cluster.server.spec
    assert renewed["acquireTime"] == created["acquireTime"]  # read back as a datetime, written as it was
    assert renewed["renewTime"] >= created["renewTime"] and renewed["leaseTransitions"] == 0
    assert a.remaining() == DURATION - MARGIN - 1.0


def test_a_standby_takes_over_only_after_the_record_stood_still_for_the_whole_duration(cluster: Replicas) -> None:
    a, b = cluster.replica("a"), cluster.replica("b")
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew() and b.holder == "a" and not b.holding()
    for _ in range(5):  # a renews every 5 s: b never sees the record stand still for 15 s
        cluster.elapse(RENEW)
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()
    cluster.elapse(DURATION)  # a stopped renewing: exactly the duration is not yet past it
    assert not b.try_acquire_or_renew()
    assert not a.holding()  # a stopped acting before any standby may take over
    cluster.elapse(0.01)
    assert b.try_acquire_or_renew() and b.holding()
    spec = cluster.server.spec
    assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("b", 1)
    assert spec["acquireTime"] == spec["renewTime"]
    # a comes back: it sees b's record, new to it, and does not act
    assert not a.try_acquire_or_renew() and a.holder == "b" and not a.holding()


def test_of_two_standbys_racing_for_an_expired_lease_one_wins(cluster: Replicas) -> None:
    a, b, c = cluster.replica("a"), cluster.replica("b"), cluster.replica("c")
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew() and not c.try_acquire_or_renew()
    cluster.elapse(DURATION + 1)
    cluster.server.before_write = lambda: b.try_acquire_or_renew()  # b writes between c's read and c's write
    assert not c.try_acquire_or_renew() and not c.holding()
    assert b.holding() and cluster.server.spec["holderIdentity"] == "b"
    assert cluster.server.spec["leaseTransitions"] == 1


def test_two_replicas_creating_the_lease_at_once_one_wins(cluster: Replicas) -> None:
    a, b = cluster.replica("a"), cluster.replica("b")
    cluster.server.before_write = lambda: b.try_acquire_or_renew()
    assert not a.try_acquire_or_renew() and not a.holding()
    assert b.holding() and cluster.server.spec["holderIdentity"] == "b"


def test_a_holder_that_cannot_renew_acts_only_until_its_last_renewal_lapses(cluster: Replicas) -> None:
    a = cluster.replica("a")
    assert a.try_acquire_or_renew()
    cluster.server.write_error = 500
    cluster.elapse(RENEW)
    assert a.try_acquire_or_renew()  # still within its last renewal
    assert a.remaining() == DURATION - MARGIN - RENEW
    cluster.elapse(RENEW)
    assert a.try_acquire_or_renew()
    cluster.elapse(RENEW)
    assert not a.try_acquire_or_renew() and not a.holding()
    cluster.server.write_error = None
    cluster.elapse(0.5)
    assert a.try_acquire_or_renew() and a.remaining() == DURATION - MARGIN  # its own record: renewed at once


def test_a_failed_read_changes_nothing(cluster: Replicas) -> None:
    a, b = cluster.replica("a"), cluster.replica("b")
    cluster.server.read_error = 500
    assert not a.try_acquire_or_renew() and cluster.server.body is None  # nothing created on a failed read
    cluster.server.read_error = None
    assert a.try_acquire_or_renew()
    cluster.server.read_error = 500
    cluster.elapse(RENEW)
    assert a.try_acquire_or_renew()  # as long as its last renewal lasts
    assert not b.try_acquire_or_renew()
    writes = cluster.server.writes
    cluster.elapse(DURATION)
    assert not a.try_acquire_or_renew() and cluster.server.writes == writes


def test_a_released_lease_is_taken_over_at_once(cluster: Replicas) -> None:
    a, b = cluster.replica("a"), cluster.replica("b")
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    a.release()
    assert not a.holding()
    assert "holderIdentity" not in cluster.server.spec and cluster.server.spec["leaseDurationSeconds"] == 1
    assert b.try_acquire_or_renew()  # no wait: nobody holds it
    assert cluster.server.spec["holderIdentity"] == "b" and cluster.server.spec["leaseTransitions"] == 1
    writes = cluster.server.writes
    a.release()  # not holding: nothing to give up
    assert cluster.server.writes == writes and cluster.server.spec["holderIdentity"] == "b"
