"""The Job reconciler (`k8s_reconcile.JobReconciler`) with the parts it is handed, against an in-memory stand-in for
the API server's Jobs: what it starts, records, keeps and deletes. The reconciler against the real control plane:
tests/backends/test_kubernetes.py (direct) and tests/operator/test_controller_cluster.py (the operator)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import kubernetes
import pytest

from kubesweep.backends.base import Phase
from kubesweep.backends.k8s_client import Api
from kubesweep.backends.k8s_reconcile import JobPolicy, JobReconciler, Listed
from kubesweep.backends.k8s_state import Recorded, StateStore, SweepState
from kubesweep.manifests import LABEL_TRIAL, UNGUARDED_TTL_FLOOR
from kubesweep.sweep_spec import Sweep, parse_sweep
from kubesweep.wire.outcomes import Outcome

DIGEST = "registry.example/job@sha256:" + "0" * 64


class _Resp:
    def __init__(self, body: Any = None):
        self.data = json.dumps(body or {}).encode()

    def drain_conn(self) -> None:
        pass

    def release_conn(self) -> None:
        pass


class _Batch:
    """Jobs by name; creates, deletes and finalizer patches as the API server takes them."""

    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}
        self.creates: list[str] = []
        self.deleted: list[str] = []
        self.released: list[str] = []

    def list_namespaced_job(self, namespace: str, **kwargs: Any) -> _Resp:
        return _Resp({"items": list(self.jobs.values())})

    def create_namespaced_job(self, namespace: str, body: dict[str, Any], **kwargs: Any) -> _Resp:
        name = body["metadata"]["name"]
        self.creates.append(name)
        self.jobs[name] = {**body, "metadata": {**body["metadata"], "uid": f"uid-{name}"}, "status": {}}
        return _Resp()

    def delete_namespaced_job(self, name: str, namespace: str, **kwargs: Any) -> None:
        self.deleted.append(name)
        self.jobs[name]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"

    def patch_namespaced_job(self, name: str, namespace: str, body: Mapping[str, Any], **kwargs: Any) -> _Resp:
        self.released.append(name)
        return _Resp()

    def finish(self, trial_id: str) -> None:
        job = next(j for j in self.jobs.values() if j["metadata"]["labels"][LABEL_TRIAL] == trial_id)
        job["status"] = {"startTime": "2026-01-01T00:00:00Z", "completionTime": "2026-01-01T00:01:00Z",
                         "conditions": [{"type": "Complete", "status": "True"}]}


class _Core:
    def list_namespaced_pod(self, namespace: str, **kwargs: Any) -> _Resp:
        return _Resp({"items": []})


class _Store(StateStore):
    """A sweep's state in memory; `saved` counts the saves that recorded outcomes."""

    def __init__(self, sweep: Sweep):
        self.state = SweepState(sweep)
        self.saved = 0

    def load(self, sweep: str) -> SweepState:
        return SweepState(self.state.sweep, dict(self.state.outcomes), self.state.cancelled)

    def create(self, sweep: Sweep, parent_run_id: str | None) -> None:
        raise AssertionError("not used")

    def save(self, state: SweepState, order: Mapping[str, int], *, outcomes: Mapping[str, Recorded] | None = None,
             cancelled: bool | None = None, parent_run_id: str | None = None) -> None:
        if outcomes is not None:
            self.saved += 1
            self.state.outcomes = state.outcomes = dict(outcomes)
        if cancelled is not None:
            self.state.cancelled = state.cancelled = cancelled

    def delete(self, sweep: str) -> None:
        raise AssertionError("not used")

    def names(self) -> list[str]:
        return [self.state.sweep.name]

    def forget(self, sweep: str) -> None:
        pass


class _Checkpoints:
    def __init__(self) -> None:
        self.points: list[str] = []

    def reached(self, point: str) -> None:
        self.points.append(point)


def reconciler(jobs: JobPolicy | None = None, **spec: Any) -> tuple[JobReconciler, _Store, _Batch, _Checkpoints]:
    sweep = parse_sweep({"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "s"},
                         "spec": {"image": DIGEST, "matrix": {"gpu": ["l4"], "batch_size": [8, 16, 32]},
                                  "warm_pods": False, **spec}})  # a Job per trial; warm pods: test_k8s_warm.py
    api = Api(kubernetes.client.ApiClient(), "ns")
    batch = _Batch()
    api.batch, api.core = batch, _Core()
    store, points = _Store(sweep), _Checkpoints()
    engine = JobReconciler(api, store=store, source=Listed(), tracking=lambda state: None, jobs=jobs,
                           checkpoints=points)
    return engine, store, batch, points


def test_it_starts_what_the_limits_allow_records_outcomes_and_starts_the_next() -> None:
    engine, store, batch, points = reconciler(concurrency={"max_parallel": 2})
    first = engine.reconcile(store.load("s"))
    assert [t.phase for t in first.trials] == [Phase.PENDING] * 3
    assert len(batch.creates) == 2 and points.points == ["job-apply", "job-apply"]
    engine.reconcile(store.load("s"))
    assert len(batch.creates) == 2  # both still pending with their Jobs: nothing more, nothing twice
    done = first.trials[0].trial_id
    batch.finish(done)
    status = engine.reconcile(store.load("s"))
    assert store.state.outcomes[done].outcome == Outcome.SUCCEEDED and store.saved == 1
    assert points.points.count("outcome-recorded") == 1
    assert len(batch.creates) == 3 and status.trials[0].phase == Phase.SUCCEEDED


def test_without_finalizers_a_job_gets_the_ttl_floor_and_with_them_keeps_them_until_released() -> None:
    engine, store, batch, _ = reconciler(concurrency={"max_parallel": 1})
    engine.reconcile(store.load("s"))
    [job] = batch.jobs.values()
    assert job["spec"]["ttlSecondsAfterFinished"] >= UNGUARDED_TTL_FLOOR
    assert "finalizers" not in job["metadata"]

    engine, store, batch, _ = reconciler(JobPolicy(finalizers=("example.com/keep",)), concurrency={"max_parallel": 1})
    engine.reconcile(store.load("s"))
    [job] = batch.jobs.values()
    assert job["metadata"]["finalizers"] == ["example.com/keep"]
    engine.release(job)
    engine.release(job)  # a cache behind the first patch: not sent again
    assert batch.released == [job["metadata"]["name"]]


class _Behind:
    """Watch caches that have not shown anything yet (a Job created a moment ago)."""

    def of_sweep(self, namespace: str, sweep: str) -> list[Any]:
        return []


class _BehindSource:
    def informers(self, sweep: str) -> tuple[Any, Any]:
        return _Behind(), _Behind()


def test_a_trial_stopped_before_the_cache_shows_its_job_still_has_its_job_deleted() -> None:
    engine, store, batch, _ = reconciler(JobPolicy(finalizers=("example.com/keep",)), concurrency={"max_parallel": 1})
    status = engine.reconcile(store.load("s"))
    [name] = batch.jobs
    engine.source = _BehindSource()
    engine.stop(store.load("s"), status.trials[0], "stopped by the search")
    assert store.state.outcomes[status.trials[0].trial_id].outcome == Outcome.STOPPED
    assert batch.deleted == [name] and batch.released == [name]


def test_cancel_records_every_unfinished_trial_then_deletes_their_jobs_inside_the_cancel() -> None:
    engine, store, batch, points = reconciler(concurrency={"max_parallel": 2})
    status = engine.reconcile(store.load("s"))
    batch.finish(status.trials[0].trial_id)
    engine.cancel(store.load("s"))
    outcomes = {tid: rec.outcome for tid, rec in store.state.outcomes.items()}
    assert sorted(outcomes.values()) == sorted([Outcome.SUCCEEDED, Outcome.CANCELLED, Outcome.CANCELLED])
    assert store.state.cancelled and len(batch.deleted) == 1
    assert points.points.count("cancel-delete") == 1
    engine.reconcile(store.load("s"))
    assert len(batch.creates) == 2  # a cancelled sweep starts nothing


@pytest.mark.parametrize("cap", [1, None])
def test_a_step_starts_at_most_its_cap(cap: int | None) -> None:
    engine, store, batch, _ = reconciler(JobPolicy(max_starts_per_step=cap), concurrency={"max_parallel": 3})
    engine.reconcile(store.load("s"))
    assert len(batch.creates) == (cap or 3) and engine.capped("s") == (cap is not None)


NO_NODE = "0/8 nodes are available: 8 node(s) didn't match Pod's node affinity/selector."


class _Pods(_Core):
    """Pods by name, as the scheduler left them."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}

    def list_namespaced_pod(self, namespace: str, **kwargs: Any) -> _Resp:
        return _Resp({"items": list(self.pods.values())})

    def unscheduled(self, job: Mapping[str, Any], message: str, since: str) -> None:
        name = f"{job['metadata']['name']}-pod"
        self.pods[name] = {"metadata": {"name": name, "labels": dict(job["metadata"]["labels"]),
                                        "creationTimestamp": since},
                           "status": {"phase": "Pending", "conditions": [
                               {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                "message": message, "lastTransitionTime": since}]}}


def test_a_trial_no_node_can_take_ends_unschedulable_its_job_goes_and_resume_runs_it_again() -> None:
    engine, store, batch, _ = reconciler(concurrency={"max_parallel": 1}, resources={"unschedulable_seconds": 60})
    pods = _Pods()
    engine.api.core = pods
    engine.reconcile(store.load("s"))
    [name] = batch.creates
    pods.unscheduled(batch.jobs[name], NO_NODE, since="2026-01-01T00:00:00Z")  # long before now: over the bound
    status = engine.reconcile(store.load("s"))
    first = status.trials[0]
    recorded = store.state.outcomes[first.trial_id]
    assert recorded.outcome == Outcome.UNSCHEDULABLE and NO_NODE in recorded.reason
    assert (first.phase, first.outcome) == (Phase.FAILED, Outcome.UNSCHEDULABLE) and status.has_failures
    assert batch.deleted == [name]  # its pod would wait for ever
    assert len(batch.creates) == 2  # its slot goes to the next trial
    batch.jobs.pop(name)  # the deletion done
    pods.pods.clear()
    assert not engine.status(store.load("s")).trials[0].settled  # not a result: resume runs it again
    engine.resume(store.load("s"))
    assert first.trial_id not in store.state.outcomes


def test_a_trial_waiting_for_gpus_in_use_is_not_ended() -> None:
    engine, store, batch, _ = reconciler(concurrency={"max_parallel": 1}, resources={"unschedulable_seconds": 60})
    pods = _Pods()
    engine.api.core = pods
    engine.reconcile(store.load("s"))
    [name] = batch.creates
    pods.unscheduled(batch.jobs[name], "0/8 nodes are available: 8 Insufficient nvidia.com/gpu.",
                     since="2026-01-01T00:00:00Z")
    status = engine.reconcile(store.load("s"))
    assert status.trials[0].phase == Phase.UNSCHEDULABLE and not store.state.outcomes and not batch.deleted
