"""One idempotent step per Sweep: carry out requests, reconcile with the planner and renderer, publish status.

`OperatorBackend` is the Kubernetes backend with its state in the Sweep resource and its TrialSlices
(`SweepResourceStore`), Jobs and pods read from the operator's watch caches (`ClusterCache`), plus a write guard:
every write to the cluster first checks that this replica still holds the Lease (`may_write`), carries the Lease's
remaining validity as its request timeout, and is followed by a second check that stops the step when the Lease was
lost meanwhile; so a replica that lost it (paused, partitioned, slow) stops acting before another may have started.
A step can be interrupted at any point (SIGKILL included) and the next step, in this process or another, observes
the same Jobs and finishes the work; Jobs are named after their trial and created only for trials that have none (a
create, which fails on an existing name), so no trial is started twice. Each trial Job carries the finalizer
`kubesweep.io/outcome` until its outcome is recorded in its TrialSlice, so a Job deleted early (TTL, by hand) is
read before it goes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from kubesweep.backends import k8s_kueue
from kubesweep.backends.base import BackendError, SweepNotFound, SweepStatus
from kubesweep.backends.k8s_state import Recorded, SweepState, discard, phase_for
from kubesweep.backends.k8s_status import job_finished
from kubesweep.backends.k8s_watch import Informer
from kubesweep.backends.kubernetes import JobRefused, KubernetesBackend
from kubesweep.manifests import LABEL_TRIAL, image_problem, render_tuner_job, resolve_image, tuner_name
from kubesweep.operator import testhooks
from kubesweep.operator.cache import ClusterCache
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
from kubesweep.plan import SweepTooLarge, Trial, check_size
from kubesweep.spec import Sweep
from kubesweep.wire.env import TrackingEnv
from kubesweep.wire.outcomes import Outcome

log = logging.getLogger("kubesweep.operator")
# A write is sent only with at least this much Lease validity left (it is the write's request timeout).
MIN_WRITE_WINDOW = 0.25
# The request timeout of writes where no Lease bounds them (a backend built without `lease_remaining`).
DEFAULT_WRITE_TIMEOUT = 30.0
DELETED_EARLY = "its Job was deleted before the trial finished"
SLOW_STEP = 2.0  # seconds: a step taking longer is logged with its number of writes
TAG_RETRY_S = 30.0  # seconds before MLflow is asked again to tag runs after it failed to
# The label that opens a PersistentVolumeClaim to sweeps' trials (spec.storage): set by whoever may label claims
CLAIM_LABEL = "kubesweep.io/sweeps"
CLAIM_ALLOWED = "allowed"


class NotLeader(BackendError):
    """This replica does not hold the Lease (any more): it must not write."""


class OperatorBackend(KubernetesBackend):
    job_finalizers = (FINALIZER_OUTCOME,)
    reads_search_trials = False  # a search sweep's trials belong to its tuner Job
    # a step publishes status after at most this many new Jobs (their cache events bring the next step at once)
    max_starts_per_step = 500

    def __init__(self, namespace: str, *, api_client: Any, may_write: Callable[[], bool],
                 lease_remaining: Callable[[], float] | None = None, faults: testhooks.FaultPoints | None = None,
                 tracking: TrackingPolicy | None = None, tuner_image: str | None = None,
                 test_hooks: bool = False, allow_unpinned: bool = False, cache: ClusterCache | None = None,
                 max_trials: int | None = None, default_queue: str | None = None,
                 priority_classes: tuple[str, ...] = ()):
        super().__init__(namespace=namespace, api_client=api_client, allow_unpinned=allow_unpinned,
                         pod_annotations=self._hook_annotations if test_hooks else None)
        self.sweeps = SweepResourceStore(self.custom, namespace, call=self._call, write=self._write,
                                         not_found=self.ApiException, remember=True, allow_unpinned=allow_unpinned)
        self.store = self.sweeps
        self.cache = cache
        self.max_trials = max_trials
        self.default_queue = default_queue  # the Kueue LocalQueue of sweeps that name none
        self.priority_classes = priority_classes  # the Kueue WorkloadPriorityClasses a Sweep may name
        self.may_write = may_write
        self.lease_remaining = lease_remaining
        self.faults = faults if faults is not None else testhooks.FaultPoints()
        self._scope = threading.local()  # "cancel" / "resume" while one runs in this thread (fault points)
        self.tracking_policy = tracking or TrackingPolicy()
        self.tuner_image = tuner_image
        self.test_hooks = test_hooks
        self._hook_rules: dict[str, list[tuple[dict[str, Any], dict[str, str]]]] = {}
        self._status_extra: dict[str, dict[str, Any]] = {}
        self._sized: dict[str, tuple[Any, ...]] = {}  # sweep -> (uid, generation) whose size and image were checked
        # sweep -> (what a step saw, the status it found): a finished sweep whose last step changed nothing
        self._settled: dict[str, tuple[tuple[Any, ...], SweepStatus]] = {}
        self._noted_evictions: dict[str, dict[str, int]] = {}  # sweep -> Job UID -> Kueue evictions noted on it
        self._tag_retry_at: dict[str, float] = {}  # sweep -> when MLflow may be asked again to tag its runs

    # -- every write is guarded ----------------------------------------------------------------------

    def _guard(self) -> None:
        if not self.may_write():
            raise NotLeader("this replica does not hold the leader Lease; it makes no change")

    def _lease_left(self) -> float:
        if self.lease_remaining is not None:
            return self.lease_remaining()
        return DEFAULT_WRITE_TIMEOUT if self.may_write() else 0.0

    def _write(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A write, only while this replica holds the Lease: the request's timeout is the Lease's remaining
        validity (which ends `margin` seconds before a standby may take over), read again just before the
        request is sent, and leadership is checked once more after it returned: a replica that lost the Lease
        meanwhile (paused, partitioned, slow API) stops the step there (NotLeader) and makes no further write."""
        self._guard()
        self.faults.reached("write")  # tests: SIGSTOP here, between the check and the request
        left = self._lease_left()
        if left < MIN_WRITE_WINDOW:
            log.warning("the leader Lease is valid for %.2f s more only: a write is not sent, the step stops", left)
            raise NotLeader("the leader Lease is about to lapse; this write is not sent")
        try:
            result = super()._write(fn, *args, _request_timeout=left, **kwargs)
        except BackendError:
            self._still_leading()
            raise
        self._still_leading()
        return result

    def _still_leading(self) -> None:
        if not self.may_write():
            log.warning("the leader Lease lapsed while a write was under way: the step stops")
            raise NotLeader("the leader Lease lapsed during a write") from None

    def _create_job(self, job: Mapping[str, Any]) -> None:
        super()._create_job(job)  # a guarded `_write`
        self.faults.reached("job-apply")

    def patch_status(self, name: str, patch: Mapping[str, Any]) -> None:
        self._guard()  # before `_status_extra` is taken: a replica that may not write keeps it
        self.sweeps.patch_status(name, {**patch, **self._status_extra.pop(name, {})})

    def _informers(self, sweep: str) -> tuple[Informer, Informer] | None:
        if self.cache is None:
            return super()._informers(sweep)
        return self.cache.synced(self.namespace)

    def _recorded(self, name: str) -> dict[str, Recorded]:
        """The outcomes recorded for the sweep now (this process is their only writer while it leads)."""
        return self.sweeps.recorded(name)

    def _body(self, name: str) -> dict[str, Any]:
        return self.sweeps.resources.get(name) or {}

    def _deleted(self, job: Mapping[str, Any]) -> None:
        scope = getattr(self._scope, "name", None)
        if scope:
            self.faults.reached(f"{scope}-delete")

    def _save_state(self, state: SweepState, *, outcomes: Mapping[str, Recorded] | None = None,
                    cancelled: bool | None = None, parent_run_id: str | None = None) -> None:
        super()._save_state(state, outcomes=outcomes, cancelled=cancelled, parent_run_id=parent_run_id)
        if outcomes is not None:
            self.faults.reached("outcome-recorded")

    def _cancel_impl(self, sweep: str) -> None:
        self._within("cancel", super()._cancel_impl, sweep)

    def _resume_impl(self, sweep: str) -> None:
        self._within("resume", super()._resume_impl, sweep)

    def _within(self, scope: str, fn: Callable[[str], None], sweep: str) -> None:
        """Run a cancel or resume with its name set for this thread (the fault points `<scope>-delete`)."""
        self._scope.name = scope
        try:
            fn(sweep)
        finally:
            self._scope.name = None

    # -- the finalizer on trial Jobs -------------------------------------------------------------------

    def _release_jobs(self, sweep: str) -> None:
        """Remove the finalizer from all of the sweep's Jobs: its Sweep is gone or being deleted, so nothing is
        left to record and the garbage collector must not wait on us."""
        self._release_all(self._jobs(sweep))

    def _record_deleted(self, state: SweepState, jobs: list[dict[str, Any]]) -> None:
        """A trial Job deleted before its trial finished (by hand) is still there, held by the finalizer: record
        the trial as cancelled (`sweep resume` runs it again), so that it is not started again on its own once
        the Job is gone. A deleted Job that did finish (its TTL) is left to the next step's reconcile, which
        records its real outcome."""
        name = state.sweep.name
        uid = self._body(name).get("metadata", {}).get("uid")
        recorded = self._recorded(name)
        trials = self._plan_for(state).by_id()
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
            self._save_state(state, outcomes={**recorded, **gone})

    def _shown_as_recorded(self, name: str, status: SweepStatus) -> SweepStatus:
        """The status with every recorded outcome shown as such: a trial recorded while its Job still runs (a Job
        deleted early, waiting on the finalizer) is published with its recorded outcome, not as running."""
        recorded = self._recorded(name)
        trials = []
        for t in status.trials:
            rec = recorded.get(t.trial_id)
            if rec is not None and not t.phase.terminal:
                t = replace(t, phase=phase_for(rec.outcome), outcome=rec.outcome, reason=rec.reason,
                            started_at=rec.started_at or t.started_at, finished_at=rec.finished_at)
            trials.append(t)
        return replace(status, trials=trials)

    def _release_recorded(self, name: str, jobs: list[dict[str, Any]]) -> None:
        """Remove the finalizer from every Job whose trial's outcome is recorded (`final` in its slice), and
        from Jobs that this Sweep (by UID) does not own."""
        uid = self._body(name).get("metadata", {}).get("uid")
        recorded = self._recorded(name)
        done = []
        for job in jobs:
            meta = job["metadata"]
            if FINALIZER_OUTCOME not in (meta.get("finalizers") or []):
                continue
            owners = {ref.get("uid") for ref in meta.get("ownerReferences") or []}
            if meta.get("labels", {}).get(LABEL_TRIAL) in recorded or uid not in owners:
                done.append(job)
        self._release_all(done)

    # -- per-sweep hooks -----------------------------------------------------------------------------

    def _load_state(self, sweep: str) -> SweepState:
        state = super()._load_state(sweep)
        if self.default_queue and not state.sweep.spec.queue:
            spec = state.sweep.spec.model_copy(update={"queue": self.default_queue})
            state = replace(state, sweep=state.sweep.model_copy(update={"spec": spec}))
        meta = self._body(sweep).get("metadata", {})
        sized = (meta.get("uid"), meta.get("generation"))
        if self._sized.get(sweep) != sized:  # once per change of the spec
            if self.max_trials is not None:
                try:  # counted from the axes, before anything is expanded
                    check_size(state.sweep, self.max_trials, source=f"sweep {self.namespace}/{sweep}",
                               hint="the operator's --max-trials, chart value operator.maxTrials")
                except SweepTooLarge as exc:
                    raise InvalidSweep(str(exc)) from None
            problem = image_problem(state.sweep, allow_unpinned=self.allow_unpinned)
            if problem is not None:  # no image its trials can run as (e.g. a lock key not built yet)
                raise InvalidSweep(f"{state.sweep.source}: spec.image: {problem}")
            problem = self._claim_problem(state.sweep) or self._priority_problem(state.sweep)
            if problem is not None:
                raise InvalidSweep(f"{state.sweep.source}: {problem}")
            self._sized[sweep] = sized
        if self.test_hooks:
            annotations = self._body(sweep)["metadata"].get("annotations") or {}
            try:
                self._hook_rules[sweep] = testhooks.parse_rules(annotations.get(testhooks.ANNOTATION))
            except testhooks.TestHookError as exc:
                raise InvalidSweep(str(exc)) from None
        return state

    def _claim_problem(self, sweep: Sweep) -> str | None:
        """Why the sweep may not mount a claim it names (None: it may). A claim is open to sweeps only when a
        namespace admin labelled it `kubesweep.io/sweeps=allowed`: without that, a Sweep could mount any claim of
        the namespace (MLflow's store, another team's checkpoints) read-write into pods running its own image."""
        storage = sweep.spec.storage
        for field_name in ("cache_claim", "checkpoint_claim"):
            claim = getattr(storage, field_name)
            if not claim:
                continue
            try:
                pvc = self._call(self.core.read_namespaced_persistent_volume_claim, claim, self.namespace)
            except self.ApiException:  # 404
                return f"spec.storage.{field_name}: no PersistentVolumeClaim {claim!r} in namespace {self.namespace}"
            labels = (pvc.metadata.labels if pvc.metadata else None) or {}
            if labels.get(CLAIM_LABEL) != CLAIM_ALLOWED:
                return (f"spec.storage.{field_name}: claim {claim!r} is not open to sweeps; a namespace admin opens "
                        f"it with `kubectl label pvc {claim} {CLAIM_LABEL}={CLAIM_ALLOWED}`")
        return None

    def _priority_problem(self, sweep: Sweep) -> str | None:
        """Why the sweep may not name its Kueue priority class (None: it may). The operator creates the trial Jobs
        with its own identity, so a policy that keeps high priorities to some users (an admission policy on Jobs)
        sees the operator, not the Sweep's author: only the classes the chart lists may be named."""
        wanted = sweep.spec.priority_class
        if not wanted or wanted in self.priority_classes:
            return None
        allowed = ", ".join(self.priority_classes) or "none"
        return (f"spec.priority_class: {wanted!r} is not a priority class this operator may give trials (allowed: "
                f"{allowed}; the operator's --priority-class, chart value kueue.allowedPriorityClasses)")

    def _hook_annotations(self, trial: Trial) -> Mapping[str, str]:
        return testhooks.annotations_for(trial, self._hook_rules.get(trial.config.sweep, []))

    def _tracking_for(self, state: SweepState) -> TrackingEnv | None:
        uri = state.sweep.spec.tracking.uri or self.tracking_policy.default_uri
        if not uri:
            return None
        experiment = self.tracking_policy.experiment_name(uri, self.namespace, state.sweep.experiment)
        return TrackingEnv(uri, experiment, state.parent_run_id,
                           credentials_secret=self.tracking_policy.credentials_for(uri))

    def _mlflow(self, uri: str) -> MlflowRest:
        """MLflow as the operator talks to it: its own credentials go to its own server only, never to a server
        a Sweep names."""
        own = self.tracking_policy.is_default(uri)
        return MlflowRest(uri, environ=None if own else {},
                          owner_key=self.tracking_policy.ownership_key if own else None)

    def _evicted_by_kueue(self, state: SweepState,
                          evicted: Mapping[str, tuple[Mapping[str, Any], k8s_kueue.Admission]]) -> None:
        """Tag the MLflow runs of trials Kueue evicted (`kueue.evictions`, `kueue.last_eviction`: its words), then
        note the count on their Jobs, so a restarted operator tags nothing twice. A trial evicted before its job
        made a run has nothing to tag; an MLflow error leaves the notes unwritten, tried again `TAG_RETRY_S` later
        while the trials wait."""
        name = state.sweep.name
        noted = self._noted_evictions.setdefault(name, {})
        fresh = {tid: (job, adm) for tid, (job, adm) in evicted.items()
                 if noted.get(job["metadata"].get("uid", ""), 0) < adm.evictions}  # else: the cache is behind
        if not fresh or time.monotonic() < self._tag_retry_at.get(name, 0.0):
            return
        tracking = self._tracking_for(state)
        if tracking and state.parent_run_id:
            try:
                missing = self._mlflow(tracking.uri).tag_trial_runs(state.parent_run_id, {
                    tid: k8s_kueue.eviction_tags(adm) for tid, (_, adm) in fresh.items()})
            except MlflowError as exc:
                log.warning("sweep %s/%s: %d trial(s) evicted by Kueue; their MLflow runs not tagged (again in "
                            "%.0f s): %s", self.namespace, name, len(fresh), TAG_RETRY_S, exc)
                self._tag_retry_at[name] = time.monotonic() + TAG_RETRY_S
                return
            if missing:
                log.info("sweep %s/%s: evicted by Kueue before making an MLflow run: %s", self.namespace, name,
                         ", ".join(sorted(missing)))
        for job, adm in fresh.values():
            with contextlib.suppress(self.ApiException):  # 404: gone meanwhile
                discard(self._write(self.batch.patch_namespaced_job, job["metadata"]["name"], self.namespace,
                                    {"metadata": {"annotations": {k8s_kueue.EVICTIONS_NOTED: str(adm.evictions)}}},
                                    _preload_content=False))
            noted[job["metadata"].get("uid", "")] = adm.evictions

    # -- the step ------------------------------------------------------------------------------------

    def step(self, name: str) -> SweepStatus | None:
        """Bring one Sweep forward. Returns its status, or None when it is gone, invalid or waiting."""
        began, writes = time.monotonic(), self.writes
        try:
            return self._step(name)
        finally:
            took = time.monotonic() - began
            if took > SLOW_STEP:
                log.info("sweep %s/%s: a step took %.1f s (%d writes)", self.namespace, name, took,
                         self.writes - writes)

    def _step(self, name: str) -> SweepStatus | None:
        try:
            state = self._load_state(name)
        except SweepNotFound:  # its Jobs are being garbage-collected: nothing is left to record
            self._release_jobs(name)
            self._forget(name)
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
        current = body.get("status") or {}
        refusal = state.sweep.spec.tracking.uri and self.tracking_policy.refusal(state.sweep.spec.tracking.uri)
        if refusal:  # checked before anything is requested from it; the field is immutable, so this is final
            self._publish_message(name, "Invalid", refusal)
            return None
        seen = self._seen(name, body)
        settled = self._settled.get(name)
        if seen is not None and settled is not None and settled[0] == seen:
            return settled[1]  # finished, and nothing of it changed since a step that changed nothing
        writes = self.writes

        if annotations.get(ANNOTATION_CANCEL) == "true" and not current.get("cancelled"):
            log.info("sweep %s/%s: cancelling", self.namespace, name)
            self._cancel_impl(name)
        elif current.get("cancelled"):
            self._finish_cancel(state)
        resume = annotations.get(ANNOTATION_RESUME)
        if resume and resume != current.get("resumeHandled"):
            log.info("sweep %s/%s: resuming (request %s)", self.namespace, name, resume)
            self._status_extra[name] = {"resumeHandled": resume}  # written with the forgotten outcomes
            self._resume_impl(name)

        message = ""
        tracking = self._tracking_for(state)
        if tracking and not state.parent_run_id:
            try:
                # the operator's own credentials go to its own server only, never to a Sweep's choice; there,
                # with a user per namespace, the experiment is this namespace's and its user may edit it
                user = self.tracking_policy.namespace_user(tracking.uri, self.namespace)
                run_id = self._mlflow(tracking.uri).parent_run(
                    tracking.experiment, name, body["metadata"]["uid"],
                    namespace=self.namespace if user else None, grant_to=user)
            except ExperimentRefused as exc:  # not this namespace's experiment: nothing is granted, nothing starts
                self._publish_message(name, "Invalid", f"spec.tracking.experiment: {exc}")
                return None
            except MlflowError as exc:
                self._publish_message(name, "Pending", f"waiting for MLflow (no trial starts without the "
                                                      f"sweep's parent run): {exc}")
                return None
            self._save_state(state, parent_run_id=run_id)

        if state.sweep.spec.search.adaptive:
            message = self._ensure_tuner(state, tracking)
        try:
            status = self.reconcile(name)
        except JobRefused as exc:  # refused as it is, so on every try: the Sweep says why, and keeps its phase
            self._publish_message(name, self.sweeps.status_of(name).get("phase") or "Pending", str(exc))
            return None
        self._record_late(state, status)
        jobs = self._jobs(name)
        self._record_deleted(state, jobs)
        if name not in self._capped:  # starts first: finalizers wait for a step that started all it could
            self._release_recorded(name, jobs)
        status = self._shown_as_recorded(name, status)
        if state.sweep.spec.suspend and not status.done:
            message = "suspended: running trials finish, no new trial starts"
        elif self._status_extra.get(name):  # a resume request with nothing to forget
            self.patch_status(name, {})
        self.publish(name, state.sweep, status, message)
        if seen is not None and status.done and self.writes == writes and name not in self._capped:
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
            return (f"{state.sweep.spec.search.strategy} search: waiting, this operator has no tuner image "
                    "(--tuner-image or KUBESWEEP_TUNER_IMAGE; the chart sets it to the operator's image)")
        strategy = state.sweep.spec.search.strategy
        if self.sweeps.status_of(state.sweep.name).get("searchFinished"):
            return f"{strategy} search: finished (tuner Job {name})"
        jobs = self._jobs(state.sweep.name)
        tuner = next((j for j in jobs if j["metadata"]["name"] == name), None)
        if tuner is not None and job_finished(tuner):
            # recorded while the Job is still there (its TTL is at least UNGUARDED_TTL_FLOOR), so a tuner Job the
            # TTL controller removed later is never taken for one that has yet to run
            self.patch_status(state.sweep.name, {"searchFinished": True})
            return f"{strategy} search: finished (tuner Job {name})"
        if tuner is None:
            trial_image = resolve_image(state.sweep, allow_unpinned=self.allow_unpinned)
            if tracking is not None and state.parent_run_id and not tracking.parent_run_id:
                tracking = replace(tracking, parent_run_id=state.parent_run_id)
            # the tuner's token may create Jobs: it runs the operator's own code, never the Sweep's image
            self._apply(self.batch.patch_namespaced_job,
                        render_tuner_job(state.sweep, image=self.tuner_image, trial_image=trial_image,
                                         namespace=self.namespace, tracking=tracking, owner=self._owner(state)))
        return f"{strategy} search: tuner Job {name} makes and runs the trials"

    def _record_late(self, state: SweepState, status: SweepStatus) -> None:
        """Record outcomes that finished between reconcile's two looks at the cluster, so a published terminal
        phase always has its outcome recorded."""
        recorded = self._recorded(state.sweep.name)
        late = {t.trial_id: Recorded(t.outcome, t.reason, t.started_at, t.finished_at) for t in status.trials
                if t.phase.terminal and t.outcome and t.trial_id not in recorded}
        if late:
            self._save_state(state, outcomes={**recorded, **late})

    def _finish_cancel(self, state: SweepState) -> None:
        """A cancel was recorded: make sure no Job of a cancelled trial still runs (a process killed between
        recording and deleting left some)."""
        p = self._plan_for(state)
        jobs = self._jobs(state.sweep.name)
        cancelled = {tid for tid, rec in state.outcomes.items() if rec.outcome == Outcome.CANCELLED}
        running = {j["metadata"]["labels"].get(LABEL_TRIAL) for j in jobs if not job_finished(j)}
        stale = (cancelled & running) & set(p.by_id())
        if stale:
            self._delete_jobs(state.sweep.name, stale)

    def publish(self, name: str, sweep: Sweep, status: SweepStatus, message: str = "") -> None:
        """Write what changed: the trials' phases into their slices, then the bounded status."""
        state = SweepState(sweep)
        self.sweeps.publish(name, status.trials, self._order(state))
        body = self._body(name)
        view = status_view(status, sweep, message=message, generation=body.get("metadata", {}).get("generation"),
                           slices=self.sweeps.slices.count(name))
        if _changed(view, body.get("status") or {}):
            view["updatedAt"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            self.patch_status(name, view)

    def _publish_message(self, name: str, phase: str, message: str) -> None:
        message = clip_message(message)
        current = self.sweeps.status_of(name)
        if current.get("phase") != phase or current.get("message") != message:
            log.warning("sweep %s/%s: %s", self.namespace, name, message)
            self.patch_status(name, {"phase": phase, "message": message})

    def _forget(self, sweep: str) -> None:
        super()._forget(sweep)
        for cache in (self._hook_rules, self._status_extra, self._sized, self._settled, self._noted_evictions,
                      self._tag_retry_at):
            cache.pop(sweep, None)  # type: ignore[attr-defined]


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if v is not None}
    return value


def _changed(view: Mapping[str, Any], current: Mapping[str, Any]) -> bool:
    """Whether a merge patch of `view` would change `current` (null values delete; absent keys stay)."""
    return any(_strip(value) != _strip(current.get(key)) for key, value in view.items())


class SweepController:
    """The operator's business logic, kopf-free: one `OperatorBackend` per namespace, one step at a time per
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
        self._backends: dict[str, OperatorBackend] = {}
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._guard = threading.Lock()

    def backend(self, namespace: str) -> OperatorBackend:
        with self._guard:
            if namespace not in self._backends:
                self._backends[namespace] = OperatorBackend(namespace, api_client=self.api_client,
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
                        backend._forget(name)
            backend._released.clear()

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
