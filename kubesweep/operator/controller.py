"""One idempotent step per Sweep: admit it, carry out requests, reconcile its Jobs, publish status.

`NamespaceReconciler` (one per namespace) composes the Job work of `k8s_reconcile.JobReconciler` with the operator's
parts: the state in the Sweep resource and its TrialSlices (`SweepResourceStore`), Jobs and pods read from the
operator's watch caches (`cache.CacheSource`), the Lease as write guard (`leader.LeaseGuard`: every write to the
cluster first checks that this replica still holds the Lease, carries the Lease's remaining validity as its
request timeout, and is followed by a second check that stops the step when the Lease was lost meanwhile; so a
replica that lost it stops acting before another may have started), and Kueue's evictions tagged on the trials'
MLflow runs (`evictions.EvictionTags`). Each step first admits the Sweep (`admission.admit`, once per change of its
spec). A step can be interrupted at any point (SIGKILL included) and the next step, in this process or another,
observes the same Jobs and finishes the work; Jobs are named after their trial and created only for trials that
have none (a create, which fails on an existing name), so no trial is started twice. Each trial Job carries the
finalizer `kubesweep.io/outcome` until its outcome is recorded in its TrialSlice, so a Job deleted early (TTL, by
hand) is read before it goes.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from kubesweep.backends.base import SweepNotFound, SweepStatus
from kubesweep.backends.k8s_client import Api
from kubesweep.backends.k8s_reconcile import JobPolicy, JobReconciler, JobRefused, Listed, ObjectSource
from kubesweep.backends.k8s_state import Recorded, SweepState, phase_for
from kubesweep.backends.k8s_status import job_finished
from kubesweep.crd import SweepStatusBody
from kubesweep.manifests import LABEL_TRIAL, LABEL_WORKER, render_tuner_job, resolve_image, tuner_name
from kubesweep.operator import admission, testhooks
from kubesweep.operator.cache import CacheSource, ClusterCache
from kubesweep.operator.evictions import EvictionTags
from kubesweep.operator.leader import LeaseGuard, NotLeader
from kubesweep.operator.mlflow_rest import ExperimentRefused, MlflowError, MlflowRest, TrackingPolicy
from kubesweep.operator.store import (
    ANNOTATION_CANCEL,
    ANNOTATION_RESUME,
    FINALIZER_OUTCOME,
    InvalidSweep,
    SweepResourceStore,
    clip_message,
    epoch,
    status_view,
)
from kubesweep.plan import Trial
from kubesweep.sweep_spec import Sweep
from kubesweep.wire.env import TrackingEnv
from kubesweep.wire.outcomes import Outcome

log = logging.getLogger("kubesweep.operator")
DELETED_EARLY = "its Job was deleted before the trial finished"
SLOW_STEP = 2.0  # seconds: a step taking longer is logged with its number of writes
MAX_STARTS_PER_STEP = 500  # a step publishes status after at most this many new Jobs (their events bring the next)


class NamespaceReconciler:
    """The operator's work on the Sweeps of one namespace: `step` brings one forward."""

    def __init__(self, namespace: str, *, api_client: Any, may_write: Callable[[], bool],
                 lease_remaining: Callable[[], float] | None = None, faults: testhooks.FaultPoints | None = None,
                 tracking: TrackingPolicy | None = None, tuner_image: str | None = None,
                 test_hooks: bool = False, allow_unpinned: bool = False, cache: ClusterCache | None = None,
                 max_trials: int | None = None, default_queue: str | None = None,
                 priority_classes: tuple[str, ...] = ()):
        self.namespace = namespace
        self.faults = faults if faults is not None else testhooks.FaultPoints()
        self.guard = LeaseGuard(may_write, lease_remaining, self.faults)
        self.api = api = Api(api_client, namespace, guard=self.guard)
        self.sweeps = SweepResourceStore(api.custom, namespace, call=api.call, write=api.write,
                                         not_found=api.ApiException, remember=True, allow_unpinned=allow_unpinned)
        self.cache = cache
        self.policy = admission.Policy(max_trials, allow_unpinned, default_queue, priority_classes)
        self.tracking_policy = tracking or TrackingPolicy()
        self.tuner_image = tuner_image
        self.test_hooks = test_hooks
        self.evictions = EvictionTags(api, tracking=self.tracking_for, mlflow=self.mlflow)
        source: ObjectSource = CacheSource(cache, namespace) if cache is not None else Listed()
        self.jobs = JobReconciler(api, store=self.sweeps, source=source, tracking=self.tracking_for,
                                  evictions=self.evictions, checkpoints=self.faults,
                                  jobs=JobPolicy(finalizers=(FINALIZER_OUTCOME,),
                                                 max_starts_per_step=MAX_STARTS_PER_STEP,
                                                 pod_annotations=self._hook_annotations if test_hooks else None))
        self._hook_rules: dict[str, list[tuple[dict[str, Any], dict[str, str]]]] = {}
        self._status_extra: dict[str, dict[str, Any]] = {}
        # sweep -> ((uid, generation) admitted, the sweep as admitted)
        self._admitted: dict[str, tuple[tuple[Any, ...], Sweep]] = {}
        # sweep -> (what a step saw, the status it found): a finished sweep whose last step changed nothing
        self._settled: dict[str, tuple[tuple[Any, ...], SweepStatus]] = {}

    @property
    def writes(self) -> int:
        return self.api.writes

    def patch_status(self, name: str, patch: Mapping[str, Any]) -> None:
        self.guard.check()  # before `_status_extra` is taken: a replica that may not write keeps it
        self.sweeps.patch_status(name, {**patch, **self._status_extra.pop(name, {})})

    def _body(self, name: str) -> dict[str, Any]:
        return self.sweeps.resources.get(name) or {}

    # -- admission ---------------------------------------------------------------------------------------

    def load(self, name: str) -> SweepState:
        """The Sweep's state, its sweep as admitted. Raises SweepNotFound, or InvalidSweep with the reason the
        operator does not run it (a spec that does not validate, a refusal of `admission.admit`, test hooks
        that do not parse)."""
        state = self.sweeps.load(name)
        meta = self._body(name).get("metadata", {})
        key = (meta.get("uid"), meta.get("generation"))
        admitted = self._admitted.get(name)
        if admitted is None or admitted[0] != key:  # once per change of the spec
            verdict = admission.admit(state.sweep, self.policy, self._claim_labels, namespace=self.namespace,
                                      account_labels=self._account_labels)
            if isinstance(verdict, admission.Refused):
                raise InvalidSweep(verdict.reason)
            admitted = self._admitted[name] = (key, verdict.sweep)
        state = replace(state, sweep=admitted[1])
        if self.test_hooks:
            annotations = self._body(name)["metadata"].get("annotations") or {}
            try:
                self._hook_rules[name] = testhooks.parse_rules(annotations.get(testhooks.ANNOTATION))
            except testhooks.TestHookError as exc:
                raise InvalidSweep(str(exc)) from None
        return state

    def _claim_labels(self, claim: str) -> Mapping[str, str] | None:
        """A PersistentVolumeClaim's labels in this namespace (None: there is none of that name)."""
        return self._labels(self.api.core.read_namespaced_persistent_volume_claim, claim)

    def _account_labels(self, account: str) -> Mapping[str, str] | None:
        """A ServiceAccount's labels in this namespace (None: there is none of that name)."""
        return self._labels(self.api.core.read_namespaced_service_account, account)

    def _labels(self, read: Any, name: str) -> Mapping[str, str] | None:
        """The labels of the object `read` finds by `name` in this namespace (None: there is none)."""
        try:
            obj = self.api.call(read, name, self.namespace)
        except self.api.ApiException:  # 404
            return None
        return (obj.metadata.labels if obj.metadata else None) or {}

    # -- the finalizer on trial Jobs -------------------------------------------------------------------

    def _release_jobs(self, sweep: str) -> None:
        """Remove the finalizer from all of the sweep's Jobs: its Sweep is gone or being deleted, so nothing is
        left to record and the garbage collector must not wait on us."""
        self.jobs.release_all(self.jobs.job_objects(sweep))

    def _record_deleted(self, state: SweepState, jobs: list[dict[str, Any]]) -> None:
        """A trial Job deleted before its trial finished (by hand) is still there, held by the finalizer: record
        the trial as cancelled (`sweep resume` runs it again), so that it is not started again on its own once
        the Job is gone. A deleted Job that did finish (its TTL) is left to the next step's reconcile, which
        records its real outcome."""
        name = state.sweep.name
        uid = self._body(name).get("metadata", {}).get("uid")
        recorded = self.sweeps.recorded(name)
        trials = self.jobs.plan_for(state).by_id()
        now = time.time()
        gone: dict[str, Recorded] = {}
        for job in jobs:
            meta = job["metadata"]
            tid = meta.get("labels", {}).get(LABEL_TRIAL)
            owners = {ref.get("uid") for ref in meta.get("ownerReferences") or []}
            if (meta.get("deletionTimestamp") and FINALIZER_OUTCOME in (meta.get("finalizers") or [])
                    and uid in owners and tid in trials and tid not in recorded and not job_finished(job)):
                gone[tid] = Recorded(Outcome.CANCELLED, DELETED_EARLY, epoch(job.get("status", {}).get("startTime")),
                                     now)
        if gone:
            log.warning("sweep %s/%s: Job(s) %s deleted before the trial finished: recorded as cancelled",
                        self.namespace, name, ", ".join(sorted(trials[t].name for t in gone)))
            self.jobs.save(state, outcomes={**recorded, **gone})

    def _shown_as_recorded(self, name: str, status: SweepStatus) -> SweepStatus:
        """The status with every recorded outcome shown as such: a trial recorded while its Job still runs (a Job
        deleted early, waiting on the finalizer) is published with its recorded outcome, not as running."""
        recorded = self.sweeps.recorded(name)
        trials = []
        for t in status.trials:
            rec = recorded.get(t.trial_id)
            if rec is not None and not t.phase.terminal:
                t = replace(t, phase=phase_for(rec.outcome), outcome=rec.outcome, reason=rec.reason,
                            started_at=rec.started_at or t.started_at, finished_at=rec.finished_at)
            trials.append(t)
        return replace(status, trials=trials)

    def _release_recorded(self, name: str, jobs: list[dict[str, Any]]) -> None:
        """Remove the finalizer from every Job whose trial's outcome is recorded (`final` in its slice), from
        finished warm pods' Jobs (this step read their pods' last events and recorded what ended there), and from
        Jobs that this Sweep (by UID) does not own."""
        uid = self._body(name).get("metadata", {}).get("uid")
        recorded = self.sweeps.recorded(name)
        done = []
        for job in jobs:
            meta = job["metadata"]
            if FINALIZER_OUTCOME not in (meta.get("finalizers") or []):
                continue
            owners = {ref.get("uid") for ref in meta.get("ownerReferences") or []}
            labels = meta.get("labels", {})
            if labels.get(LABEL_TRIAL) in recorded or uid not in owners or (
                    labels.get(LABEL_WORKER) and job_finished(job)):
                done.append(job)
        self.jobs.release_all(done)

    # -- tracking and test hooks ---------------------------------------------------------------------------

    def _hook_annotations(self, trial: Trial) -> Mapping[str, str]:
        return testhooks.annotations_for(trial, self._hook_rules.get(trial.config.sweep, []))

    def tracking_for(self, state: SweepState) -> TrackingEnv | None:
        """Where a sweep's trials log: its own server (allowed by the policy) or the operator's, the namespace's
        experiment, its parent run."""
        uri = state.sweep.spec.tracking.uri or self.tracking_policy.default_uri
        if not uri:
            return None
        experiment = self.tracking_policy.experiment_name(uri, self.namespace, state.sweep.experiment)
        return TrackingEnv(uri, experiment, state.parent_run_id,
                           credentials_secret=self.tracking_policy.credentials_for(uri))

    def mlflow(self, uri: str) -> MlflowRest:
        """MLflow as the operator talks to it: its own credentials go to its own server only, never to a server
        a Sweep names."""
        return self.tracking_policy.client(uri)

    # -- the step ------------------------------------------------------------------------------------

    def step(self, name: str) -> SweepStatus | None:
        """Bring one Sweep forward. Returns its status, or None when it is gone, invalid or waiting."""
        began, writes = time.monotonic(), self.writes
        try:
            try:
                return self._step(name)
            except SweepNotFound:  # deleted while this step ran (its status write found it gone): as at load
                self._release_jobs(name)
                self.forget(name)
                return None
        finally:
            took = time.monotonic() - began
            if took > SLOW_STEP:
                log.info("sweep %s/%s: a step took %.1f s (%d writes)", self.namespace, name, took,
                         self.writes - writes)

    def _step(self, name: str) -> SweepStatus | None:
        try:
            state = self.load(name)
        except SweepNotFound:  # its Jobs are being garbage-collected: nothing is left to record
            self._release_jobs(name)
            self.forget(name)
            return None
        except InvalidSweep as exc:
            if self._body(name).get("metadata", {}).get("deletionTimestamp"):
                self._release_jobs(name)
            else:
                self._publish_message(name, "Invalid", str(exc))
            return None
        body = self._body(name)
        if body["metadata"].get("deletionTimestamp"):  # e.g. foreground deletion, which waits for its Jobs
            log.info("sweep %s/%s is being deleted: removing the finalizers of its Jobs", self.namespace, name)
            self._release_jobs(name)
            return None
        annotations = body["metadata"].get("annotations") or {}
        current = SweepStatusBody.read(body.get("status"))
        refusal = state.sweep.spec.tracking.uri and self.tracking_policy.refusal(state.sweep.spec.tracking.uri)
        if refusal:  # checked before anything is requested from it; the field is immutable, so this is final
            self._publish_message(name, "Invalid", refusal)
            return None
        seen = self._seen(name, body)
        settled = self._settled.get(name)
        if seen is not None and settled is not None and settled[0] == seen:
            return settled[1]  # finished, and nothing of it changed since a step that changed nothing
        writes = self.writes

        if annotations.get(ANNOTATION_CANCEL) == "true" and not current.cancelled:
            log.info("sweep %s/%s: cancelling", self.namespace, name)
            self.jobs.cancel(state)
        elif current.cancelled:
            self._finish_cancel(state)
        resume = annotations.get(ANNOTATION_RESUME)
        if resume and resume != current.resumeHandled:
            log.info("sweep %s/%s: resuming (request %s)", self.namespace, name, resume)
            self._status_extra[name] = {"resumeHandled": resume}  # written with the forgotten outcomes
            self.jobs.resume(state)

        message = ""
        tracking = self.tracking_for(state)
        if tracking and not state.parent_run_id:
            try:
                # the operator's own credentials go to its own server only, never to a Sweep's choice; there,
                # with a user per namespace, the experiment is this namespace's and its user may edit it
                user = self.tracking_policy.namespace_user(tracking.uri, self.namespace)
                run_id = self.mlflow(tracking.uri).parent_run(
                    tracking.experiment, name, body["metadata"]["uid"],
                    namespace=self.namespace if user else None, grant_to=user)
            except ExperimentRefused as exc:  # not this namespace's experiment: nothing is granted, nothing starts
                self._publish_message(name, "Invalid", f"spec.tracking.experiment: {exc}")
                return None
            except MlflowError as exc:
                self._publish_message(name, "Pending", f"waiting for MLflow (no trial starts without the "
                                                      f"sweep's parent run): {exc}")
                return None
            self.jobs.save(state, parent_run_id=run_id)

        if state.sweep.spec.adaptive:
            message = self._ensure_tuner(state, tracking)
        try:
            status = self.jobs.reconcile(state)
        except JobRefused as exc:  # refused as it is, so on every try: the Sweep says why, and keeps its phase
            self._publish_message(name, self.sweeps.status_of(name).phase, str(exc))
            return None
        self._record_late(state, status)
        jobs = self.jobs.job_objects(name)
        self._record_deleted(state, jobs)
        if not self.jobs.capped(name):  # starts first: finalizers wait for a step that started all it could
            self._release_recorded(name, jobs)
        status = self._shown_as_recorded(name, status)
        if state.sweep.spec.suspend and not status.done:
            message = "suspended: running trials finish, no new trial starts"
        elif self._status_extra.get(name):  # a resume request with nothing to forget
            self.patch_status(name, {})
        self.publish(name, state.sweep, status, message)
        if seen is not None and status.done and self.writes == writes and not self.jobs.capped(name):
            self._settled[name] = (seen, status)
        else:
            self._settled.pop(name, None)
        return status

    def _seen(self, name: str, body: Mapping[str, Any]) -> tuple[Any, ...] | None:
        """What a step of this sweep depends on, compared cheaply: the Sweep's identity, spec generation,
        requests (cancel, resume, test hooks) and status, and how many changes of its Jobs and pods the caches
        have seen. None without the caches (a change of a Job could not be told)."""
        if self.cache is None:
            return None
        meta = body.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        return (meta.get("uid"), meta.get("generation"), meta.get("deletionTimestamp"),
                annotations.get(ANNOTATION_CANCEL), annotations.get(ANNOTATION_RESUME),
                annotations.get(testhooks.ANNOTATION), json.dumps(body.get("status") or {}, sort_keys=True),
                self.cache.changes(self.namespace, name))

    def _ensure_tuner(self, state: SweepState, tracking: TrackingEnv | None) -> str:
        """A search sweep's trials are made by its tuner Job (`python -m kubesweep.tune`), which drives them
        with the kubernetes backend; the operator creates that Job once."""
        name = tuner_name(state.sweep.name)
        if not self.tuner_image:
            return (f"{state.sweep.spec.search_title}: waiting, this operator has no tuner image "
                    "(--tuner-image or KUBESWEEP_TUNER_IMAGE; the chart sets it to the operator's image)")
        search = state.sweep.spec.search_title
        if self.sweeps.status_of(state.sweep.name).searchFinished:
            return f"{search}: finished (tuner Job {name})"
        jobs = self.jobs.job_objects(state.sweep.name)
        tuner = next((j for j in jobs if j["metadata"]["name"] == name), None)
        if tuner is not None and job_finished(tuner):
            # recorded while the Job is still there (its TTL is at least UNGUARDED_TTL_FLOOR), so a tuner Job the
            # TTL controller removed later is never taken for one that has yet to run
            self.patch_status(state.sweep.name, {"searchFinished": True})
            return f"{search}: finished (tuner Job {name})"
        if tuner is None:
            trial_image = resolve_image(state.sweep, allow_unpinned=self.policy.allow_unpinned)
            if tracking is not None and state.parent_run_id and not tracking.parent_run_id:
                tracking = replace(tracking, parent_run_id=state.parent_run_id)
            # the tuner's token may create Jobs: it runs the operator's own code, never the Sweep's image
            owner = self.sweeps.owner(state.sweep.name)
            self.jobs.apply(self.api.batch.patch_namespaced_job,
                            render_tuner_job(state.sweep, image=self.tuner_image, trial_image=trial_image,
                                             namespace=self.namespace, tracking=tracking, owner=owner))
        return f"{search}: tuner Job {name} makes and runs the trials"

    def _record_late(self, state: SweepState, status: SweepStatus) -> None:
        """Record outcomes that finished between reconcile's two looks at the cluster, so a published terminal
        phase always has its outcome recorded."""
        recorded = self.sweeps.recorded(state.sweep.name)
        late = {t.trial_id: Recorded(t.outcome, t.reason, t.started_at, t.finished_at) for t in status.trials
                if t.phase.terminal and t.outcome and t.trial_id not in recorded}
        if late:
            self.jobs.save(state, outcomes={**recorded, **late})

    def _finish_cancel(self, state: SweepState) -> None:
        """A cancel was recorded: make sure no Job of a cancelled trial still runs (a process killed between
        recording and deleting left some)."""
        p = self.jobs.plan_for(state)
        jobs = self.jobs.job_objects(state.sweep.name)
        cancelled = {tid for tid, rec in state.outcomes.items() if rec.outcome == Outcome.CANCELLED}
        running = {j["metadata"]["labels"].get(LABEL_TRIAL) for j in jobs if not job_finished(j)}
        stale = (cancelled & running) & set(p.by_id())
        if stale:
            self.jobs.delete_jobs(state.sweep.name, stale)

    def publish(self, name: str, sweep: Sweep, status: SweepStatus, message: str = "") -> None:
        """Write what changed: the trials' phases into their slices, then the bounded status."""
        state = SweepState(sweep)
        self.sweeps.publish(name, status.trials, self.jobs.order(state))
        body = self._body(name)
        view = status_view(status, sweep, message=message, generation=body.get("metadata", {}).get("generation"),
                           slices=self.sweeps.slices.count(name))
        if _changed(view, body.get("status") or {}):
            view["updatedAt"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            self.patch_status(name, view)

    def _publish_message(self, name: str, phase: str, message: str) -> None:
        message = clip_message(message)
        current = self.sweeps.status_of(name)
        if current.phase != phase or current.message != message:
            log.warning("sweep %s/%s: %s", self.namespace, name, message)
            self.patch_status(name, {"phase": phase, "message": message})

    def forget(self, sweep: str) -> None:
        """Drop everything this process remembers of a sweep."""
        self.jobs.forget(sweep)
        self.evictions.forget(sweep)
        for cache in (self._hook_rules, self._status_extra, self._admitted, self._settled):
            cache.pop(sweep, None)  # type: ignore[attr-defined]


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if v is not None}
    return value


def _changed(view: Mapping[str, Any], current: Mapping[str, Any]) -> bool:
    """Whether a merge patch of `view` would change `current` (null values delete; absent keys stay)."""
    return any(_strip(value) != _strip(current.get(key)) for key, value in view.items())


class SweepController:
    """The operator's business logic, kopf-free: one `NamespaceReconciler` per namespace, one step at a time per
    sweep (steps of different sweeps may run in parallel threads)."""

    def __init__(self, api_client: Any, *, may_write: Callable[[], bool],
                 lease_remaining: Callable[[], float] | None = None, faults: testhooks.FaultPoints | None = None,
                 tracking: TrackingPolicy | None = None, tuner_image: str | None = None, test_hooks: bool = False,
                 allow_unpinned: bool = False, cache: ClusterCache | None = None, max_trials: int | None = None,
                 default_queue: str | None = None, priority_classes: tuple[str, ...] = ()):
        self.api_client = api_client
        self.may_write = may_write
        self.cache = cache
        self.options: dict[str, Any] = {"lease_remaining": lease_remaining, "faults": faults,
                                        "tracking": tracking, "tuner_image": tuner_image,
                                        "test_hooks": test_hooks, "allow_unpinned": allow_unpinned,
                                        "cache": cache, "max_trials": max_trials, "default_queue": default_queue,
                                        "priority_classes": priority_classes}
        self._backends: dict[str, NamespaceReconciler] = {}
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._guard = threading.Lock()

    def backend(self, namespace: str) -> NamespaceReconciler:
        with self._guard:
            if namespace not in self._backends:
                self._backends[namespace] = NamespaceReconciler(namespace, api_client=self.api_client,
                                                            may_write=self.may_write, **self.options)
            return self._backends[namespace]

    def leading(self) -> None:
        """This replica just gained the Lease: forget what it remembered (another leader may have written
        since), so each sweep's next step reads its state from the cluster."""
        with self._guard:
            backends = list(self._backends.items())
            locks = dict(self._locks)
        for namespace, backend in backends:
            for (ns, name), lock in locks.items():
                if ns == namespace:
                    with lock:
                        backend.forget(name)
            backend.jobs.forget_releases()

    def step(self, namespace: str, name: str) -> SweepStatus | None:
        with self._guard:
            lock = self._locks.setdefault((namespace, name), threading.Lock())
        with lock:
            if not self.may_write():
                return None
            try:
                return self.backend(namespace).step(name)
            except NotLeader:
                log.info("sweep %s/%s: step stopped, the Lease is no longer held here", namespace, name)
                return None
