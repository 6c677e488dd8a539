"""Operator parts that need no cluster: the write guard, the finalizer and TTL a Job gets, and when a finished
sweep is stepped again. Admission's checks: tests/operator/test_admission.py."""

from __future__ import annotations

import pytest

from kubesweep.backends.base import Phase, SweepStatus, TrialStatus
from kubesweep.operator.controller import NamespaceReconciler
from kubesweep.operator.leader import LeaseElector
from kubesweep.wire.outcomes import Outcome
from tests.support.operator_sweeps import two_trial_plan

# -- the write guard ---------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Leases:
    """A coordination API where the Lease does not exist yet and creating it succeeds."""

    def read_namespaced_lease(self, name: str, namespace: str) -> None:
        raise type("NotFound", (Exception,), {"status": 404})()

    def create_namespaced_lease(self, namespace: str, body: dict) -> None:  # type: ignore[type-arg]
        pass


def _guarded_backend() -> tuple[_Clock, LeaseElector, NamespaceReconciler]:
    import kubernetes

    clock = _Clock()
    elector = LeaseElector(_Leases(), "ns", "lease", "me", duration=15, renew_every=5, margin=2, clock=clock)
    backend = NamespaceReconciler("ns", api_client=kubernetes.client.ApiClient(), may_write=elector.holding,
                              lease_remaining=elector.remaining)
    return clock, elector, backend


def test_writes_carry_the_remaining_lease_as_timeout_and_stop_once_it_lapsed() -> None:
    from kubesweep.operator.leader import NotLeader

    clock, elector, backend = _guarded_backend()
    calls: list[dict] = []  # type: ignore[type-arg]

    def write(*args: object, **kwargs: object) -> str:
        calls.append(kwargs)
        return "done"

    with pytest.raises(NotLeader):  # no Lease yet: nothing is sent
        backend.api.write(write, "x")
    assert calls == [] and elector.remaining() == 0

    assert elector.try_acquire_or_renew()
    clock.now += 4
    assert backend.api.write(write, "x", field_manager="m") == "done"
    assert calls[-1] == {"field_manager": "m", "_request_timeout": 9.0}  # 15 - 2 - 4 s left

    def slow_write(*args: object, **kwargs: object) -> str:  # the process paused past the Lease mid-request
        calls.append(kwargs)
        clock.now += 20
        return "done"

    with pytest.raises(NotLeader, match="lapsed during a write"):
        backend.api.write(slow_write, "x")
    assert len(calls) == 2
    with pytest.raises(NotLeader):  # and it makes no further write
        backend.api.write(write, "x")
    assert len(calls) == 2


def test_a_write_is_not_sent_with_too_little_lease_left() -> None:
    from kubesweep.operator.leader import MIN_WRITE_WINDOW, NotLeader

    clock, elector, backend = _guarded_backend()
    assert elector.try_acquire_or_renew()
    clock.now += 13 - MIN_WRITE_WINDOW / 2
    assert elector.holding()
    with pytest.raises(NotLeader, match="about to lapse"):
        backend.api.write(lambda *a, **k: pytest.fail("sent"), "x")


def test_operator_jobs_carry_the_outcome_finalizer_and_unguarded_jobs_a_ttl_floor() -> None:
    import kubernetes

    from kubesweep.backends.kubernetes import KubernetesBackend
    from kubesweep.manifests import UNGUARDED_TTL_FLOOR

    _, _, operator = _guarded_backend()
    job: dict = {"metadata": {}, "spec": {"ttlSecondsAfterFinished": 0}}  # type: ignore[type-arg]
    operator.jobs.protect(job)
    assert job == {"metadata": {"finalizers": ["kubesweep.io/outcome"]}, "spec": {"ttlSecondsAfterFinished": 0}}

    direct = KubernetesBackend(namespace="ns", api_client=kubernetes.client.ApiClient())  # and the tuner's
    for ttl, kept in ((0, UNGUARDED_TTL_FLOOR), (7 * 86400, 7 * 86400)):
        job = {"metadata": {}, "spec": {"ttlSecondsAfterFinished": ttl}}
        direct.jobs.protect(job)
        assert job == {"metadata": {}, "spec": {"ttlSecondsAfterFinished": kept}}


class _Changes:
    """The caches' count of changes to a sweep's Jobs and pods."""

    def __init__(self) -> None:
        self.count = 0

    def changes(self, namespace: str, sweep: str) -> int:
        return self.count


def test_a_finished_sweep_that_nothing_changed_is_not_stepped_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step of a finished sweep that wrote nothing is the answer until the Sweep (spec, requests, status) or
    one of its Jobs or pods changes; the step's parts that read the cluster are stubbed here."""
    import kubernetes

    from kubesweep.backends.k8s_state import SweepState

    cache = _Changes()
    backend = NamespaceReconciler("ns", api_client=kubernetes.client.ApiClient(), may_write=lambda: True,
                              cache=cache)  # type: ignore[arg-type]
    sweep, p = two_trial_plan()
    body = {"metadata": {"name": "s", "uid": "u1", "generation": 1, "annotations": {}},
            "status": {"phase": "Succeeded"}}
    done = SweepStatus("s", "kubernetes", [TrialStatus(t.id, t.name, t.label(), t.gpu, Phase.SUCCEEDED,
                                                       Outcome.SUCCEEDED) for t in p.trials])
    reconciled: list[str] = []

    def publish(*args: object) -> None:
        backend.api.writes += writes_per_publish

    writes_per_publish = 0
    monkeypatch.setattr(backend, "load", lambda name: SweepState(sweep))
    monkeypatch.setattr(backend, "_body", lambda name: body)
    monkeypatch.setattr(backend.jobs, "reconcile", lambda state: reconciled.append(state.sweep.name) or done)
    monkeypatch.setattr(backend.jobs, "job_objects", lambda name: [])
    monkeypatch.setattr(backend, "_shown_as_recorded", lambda name, status: status)
    for part in ("_record_late", "_record_deleted", "_release_recorded"):
        monkeypatch.setattr(backend, part, lambda *args: None)
    monkeypatch.setattr(backend, "publish", publish)

    def steps(n: int) -> int:
        before = len(reconciled)
        for _ in range(n):
            assert backend.step("s") is done
        return len(reconciled) - before

    assert steps(3) == 1  # one full step; then nothing changed
    cache.count += 1  # a Job or pod of the sweep changed
    assert steps(2) == 1
    body["metadata"]["annotations"]["example.com/note"] = "x"  # an annotation kubesweep does not read
    assert steps(2) == 0
    body["metadata"]["generation"] = 2  # the spec changed
    assert steps(2) == 1
    body["status"] = {"phase": "Succeeded", "message": "edited"}  # someone else wrote the status
    assert steps(1) == 1
    writes_per_publish = 1  # a step that wrote something is not taken as the answer
    cache.count += 1
    assert steps(2) == 2
    writes_per_publish = 0
    assert steps(3) == 1
    backend.forget("s")  # a new leader forgets: its first step is a full one
    assert steps(2) == 1
    backend.cache = None  # without the caches a changed Job could not be told: every step is a full one
    assert steps(2) == 2
