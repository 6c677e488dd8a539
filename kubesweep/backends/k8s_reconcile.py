"""The Job work of a sweep on Kubernetes, shared by the backend used directly and the operator: `JobReconciler`.

`reconcile` is the one step everything uses: observe the sweep's Jobs and pods, record newly finished outcomes, and
create the next trials the concurrency limits allow (a create per Job, field manager `kubesweep`; a Job of the
trial's name already there is taken as the trial's, so it is idempotent). Around it: a trial's Job kept until its
outcome is recorded (finalizers, or a TTL floor), cancel, resume, stop, delete.

The reconciler is handed what differs between its users, each a small explicit part:

| part | direct (`KubernetesBackend`) | operator (`NamespaceReconciler`) |
|---|---|---|
| `store` (`k8s_state.StateStore`) | ConfigMaps | the Sweep resource and its TrialSlices |
| `source` (`ObjectSource`) | the informers of followed sweeps, else a LIST | the operator's caches, else a LIST |
| the write guard (in `api.write`, shared with the store) | none | the leader Lease, checked around each write |
| `evictions` (`EvictionNotes`) | none | MLflow tags on the runs of trials Kueue evicted |
| `jobs` (`JobPolicy`) | no finalizer (a TTL floor), no cap | the outcome finalizer, starts capped per step |

A trial whose Job vanished before its outcome was recorded would read as Pending and run again. With
`JobPolicy.finalizers` (the operator's) each trial Job carries them until the outcome is recorded; without (a
backend used directly may have no process left to remove one) its `ttlSecondsAfterFinished` is raised to at least
`UNGUARDED_TTL_FLOOR`, which leaves a driver that follows the sweep ample time to record each outcome.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Protocol

from kubesweep.backends import k8s_kueue
from kubesweep.backends.base import BackendError, Phase, SweepStatus, TrialStatus
from kubesweep.backends.k8s_client import Api, api_error, api_message
from kubesweep.backends.k8s_state import Recorded, SearchTrials, StateStore, SweepState, discard, phase_for
from kubesweep.backends.k8s_status import Observed, observe
from kubesweep.backends.k8s_warm import WarmPods, warm_trial_log
from kubesweep.backends.k8s_watch import Informer, Obj
from kubesweep.manifests import (
    FIELD_MANAGER,
    LABEL_SWEEP,
    LABEL_TRIAL,
    LABEL_WORKER,
    UNGUARDED_TTL_FLOOR,
    render_trial,
    resolve_image,
    worker_key,
)
from kubesweep.plan import Plan, Trial, make_trial, plan
from kubesweep.wire.env import TrackingEnv
from kubesweep.wire.outcomes import Outcome

APPLY = "application/apply-patch+yaml"
STRATEGIC = "application/strategic-merge-patch+json"
WRITE_THREADS = 8
APPLIED_GRACE = 60.0  # seconds a Job applied here counts as existing while no cache has shown it
WARM_JOB = "warm-job/"  # a warm Job's key beside the trial ids whose Jobs Kueue's reader reads (no trial id has "/")
# Answers to a Job create that the same Job gets again on every try: invalid (422), too large (413), refused by
# admission or a quota (403), malformed (400)
REFUSALS = frozenset({400, 403, 413, 422})
PodAnnotations = Callable[[Trial], Mapping[str, str]]
TrackingFor = Callable[[SweepState], TrackingEnv | None]  # where a sweep's trials log (None: untracked)
Evicted = Mapping[str, tuple[Mapping[str, Any], k8s_kueue.Admission]]  # trial id -> (its Job, Kueue's word)


class JobRefused(BackendError):
    """The API server refuses a trial's Job as it is; the message says why (its own words, clipped)."""


class ObjectSource(Protocol):
    """Where a sweep's Jobs and pods are read: synced watch caches, or None (the reconciler lists them)."""

    def informers(self, sweep: str) -> tuple[Informer, Informer] | None: ...


class Listed:
    """No caches: every read lists the sweep's Jobs and pods."""

    def informers(self, sweep: str) -> tuple[Informer, Informer] | None:
        return None


class EvictionNotes(Protocol):
    """What is done about trials Kueue evicted since their Jobs last noted it (status shows it either way)."""

    def evicted(self, state: SweepState, evicted: Evicted) -> None: ...


class Checkpoints(Protocol):
    """Named points of the Job work a test may stop or kill the process at (`operator.testhooks.FaultPoints`):
    `job-apply`, `outcome-recorded`, `cancel-delete`, `resume-delete`."""

    def reached(self, point: str) -> None: ...


class NoCheckpoints:
    def reached(self, point: str) -> None:
        return None


@dataclass(frozen=True)
class JobPolicy:
    """How trial Jobs are made and kept."""

    finalizers: tuple[str, ...] = ()  # put on trial Jobs, removed once the outcome is recorded (none: a TTL floor)
    max_starts_per_step: int | None = None  # trials one reconcile starts at most (None: all the limits allow)
    pod_annotations: PodAnnotations | None = None  # added to each trial pod (test hooks)
    search: SearchTrials | None = None  # where a search's added trials are read (None: left to its tuner Job)


class JobReconciler:
    """The Job work of the sweeps of one namespace. Its operations take a `SweepState` as the caller loaded it
    (the operator admits it first); recorded outcomes are saved through `store`."""

    def __init__(self, api: Api, *, store: StateStore, source: ObjectSource, tracking: TrackingFor,
                 evictions: EvictionNotes | None = None, jobs: JobPolicy | None = None,
                 checkpoints: Checkpoints | None = None, name: str = "kubernetes"):
        self.api = api
        self.namespace = api.namespace
        self.store = store
        self.source = source
        self.tracking = tracking
        self.evictions = evictions
        self.jobs = jobs or JobPolicy()
        self.checkpoints = checkpoints or NoCheckpoints()
        self.name = name
        self.kueue = k8s_kueue.QueueReader(api.custom, api.namespace, api.call, (BackendError, api.ApiException))
        self.warm = WarmPods(api, create=self.apply_all, protect=self.protect)
        self._plans: dict[str, Plan] = {}
        self._orders: dict[str, tuple[Plan, dict[str, int]]] = {}  # per sweep: the plan, trial id → position
        self._applied: dict[str, dict[str, float]] = {}  # sweep -> trial id -> when its Job was applied here
        self._released: dict[str, float] = {}  # Job uid -> when its finalizer was removed here
        self._capped: set[str] = set()  # sweeps whose last step started `max_starts_per_step` trials

    # -- the plan and the state ------------------------------------------------------------------------

    def plan_for(self, state: SweepState) -> Plan:
        cached = self._plans.get(state.sweep.name)
        if cached is None or cached.sweep.to_document() != state.sweep.to_document():
            # admitted at submission (`sweep submit`'s --max-trials, the operator's check): planned without a limit
            cached = self._plans[state.sweep.name] = self._with_added(plan(state.sweep, max_trials=None))
        return cached

    def remember(self, p: Plan) -> None:
        """Take `p` as the sweep's plan (as submitted, or with trials just added)."""
        self._plans[p.sweep.name] = p

    def order(self, state: SweepState) -> dict[str, int]:
        """trial id → its position in the plan (which decides its trial slice)."""
        p = self.plan_for(state)
        cached = self._orders.get(state.sweep.name)
        if cached is None or cached[0] is not p:
            cached = self._orders[state.sweep.name] = (p, {t.id: i for i, t in enumerate(p.trials)})
        return cached[1]

    def _with_added(self, base: Plan) -> Plan:
        if self.jobs.search is None or not base.sweep.spec.adaptive:
            return base
        added = self.jobs.search.added(base.sweep.name)
        if not added:
            return base
        known = {t.id for t in base.trials}
        trials = list(base.trials)
        for entry in added:
            trial = make_trial(base.sweep, entry["axes"], int(entry.get("repeat", 0)))
            if trial.id not in known:
                known.add(trial.id)
                trials.append(trial)
        return replace(base, trials=trials)

    def save(self, state: SweepState, *, outcomes: Mapping[str, Recorded] | None = None,
             cancelled: bool | None = None, parent_run_id: str | None = None) -> None:
        """Record outcomes (the complete set: a trial left out is forgotten and runs again) and flags."""
        self.store.save(state, self.order(state), outcomes=outcomes, cancelled=cancelled,
                        parent_run_id=parent_run_id)
        if outcomes is not None:
            self.checkpoints.reached("outcome-recorded")

    # -- observing ----------------------------------------------------------------------------------------

    def objects(self, sweep: str) -> tuple[list[Obj], list[Obj]]:
        """The sweep's Jobs and pods: from the source's caches when synced, else as the API server lists them."""
        cached = self.source.informers(sweep)
        if cached is not None:
            return cached[0].of_sweep(self.namespace, sweep), cached[1].of_sweep(self.namespace, sweep)
        return (self._labelled(self.api.batch.list_namespaced_job, sweep),
                self._labelled(self.api.core.list_namespaced_pod, sweep))

    def job_objects(self, sweep: str) -> list[Obj]:
        """The sweep's Jobs (as `objects`, without the pods)."""
        cached = self.source.informers(sweep)
        if cached is not None:
            return cached[0].of_sweep(self.namespace, sweep)
        return self._labelled(self.api.batch.list_namespaced_job, sweep)

    def _labelled(self, list_fn: Callable[..., Any], sweep: str, *, trial: str | None = None) -> list[Obj]:
        selector = f"{LABEL_SWEEP}={sweep}" + (f",{LABEL_TRIAL}={trial}" if trial is not None else "")
        resp = self.api.call(list_fn, self.namespace, label_selector=selector, _preload_content=False)
        return json.loads(resp.data)["items"]  # type: ignore[no-any-return]

    def observe(self, state: SweepState, p: Plan) -> dict[str, tuple[Observed, bool]]:
        """trial id → (what the cluster says, whether its Job exists). A Job applied here that the cache has
        not shown yet counts as existing (Pending), so a lagging cache never makes it applied again."""
        name = state.sweep.name
        jobs, pods = self.objects(name)
        jobs_by_trial = {j["metadata"]["labels"][LABEL_TRIAL]: j for j in jobs
                         if LABEL_TRIAL in j["metadata"]["labels"]}
        pods_by_trial: dict[str, list[Obj]] = {}
        for pod in pods:
            pods_by_trial.setdefault(pod["metadata"].get("labels", {}).get(LABEL_TRIAL, ""), []).append(pod)
        applied = self._applied.get(name, {})
        now = time.monotonic()
        for tid in [t for t, at in applied.items() if t in jobs_by_trial or now - at > APPLIED_GRACE]:
            del applied[tid]
        warm_jobs: dict[str | None, Obj] = {f"{WARM_JOB}{j['metadata']['name']}": j
                                            for j in self.warm.warm_jobs(jobs)} if state.sweep.spec.warm_pods else {}
        words = self.kueue.waiting(state.sweep.name, state.sweep.spec.queue, {**jobs_by_trial, **warm_jobs})
        queued = {k: word for k, word in words.items() if k not in warm_jobs}
        slot_words = {warm_jobs[k]["metadata"]["labels"][LABEL_WORKER]: word for k, word in words.items()
                      if k in warm_jobs}  # a warm Job's slot kind -> Kueue's word on it
        if self.evictions is not None and (evicted := k8s_kueue.not_noted(queued, jobs_by_trial)):
            self.evictions.evicted(state, evicted)
        out = {}
        bound, at = state.sweep.spec.resources.unschedulable_seconds, time.time()
        for trial in p.trials:
            job = jobs_by_trial.get(trial.id)
            seen = observe(job, pods_by_trial.get(trial.id, []), unschedulable_seconds=bound, now=at)
            if trial.id in queued and not seen.phase.terminal:
                seen = replace(seen, reason=queued[trial.id].reason)
            out[trial.id] = (seen, job is not None or trial.id in applied)
        if state.sweep.spec.warm_pods:  # its one-node trials are read off its warm pods
            out.update(self.warm.observe(state, p, jobs, pods, slot_words, own=jobs_by_trial))
        return out

    def statuses(self, state: SweepState, p: Plan, seen: Mapping[str, tuple[Observed, bool]]) -> list[TrialStatus]:
        statuses = []
        for trial in p.trials:
            observed, exists = seen[trial.id]
            recorded = state.outcomes.get(trial.id)
            if recorded and (recorded.outcome == Outcome.STOPPED or not (exists and not observed.phase.terminal)):
                phase = phase_for(recorded.outcome)
                statuses.append(TrialStatus(trial.id, trial.name, trial.label(), trial.gpu, phase, recorded.outcome,
                                            recorded.reason, 1, recorded.started_at, recorded.finished_at,
                                            axes=trial.axes))
            else:
                phase = Phase.CANCELLED if state.cancelled and not observed.phase.terminal else observed.phase
                outcome = Outcome.CANCELLED if phase == Phase.CANCELLED else observed.outcome
                statuses.append(TrialStatus(trial.id, trial.name, trial.label(), trial.gpu, phase, outcome,
                                            observed.reason, 1 if exists else 0, observed.started_at,
                                            observed.finished_at, axes=trial.axes))
        return statuses

    def status(self, state: SweepState) -> SweepStatus:
        """The sweep's trials as the cluster and the recorded outcomes say, without acting."""
        p = self.plan_for(state)
        trials = self.statuses(state, p, self.observe(state, p))
        return SweepStatus(state.sweep.name, self.name, trials, message=f"namespace {self.namespace}")

    # -- driving ------------------------------------------------------------------------------------------

    def reconcile(self, state: SweepState) -> SweepStatus:
        """Observe, record newly finished outcomes, and start the trials the limits allow. Idempotent."""
        sweep = state.sweep.name
        p = self.plan_for(state)
        seen = self.observe(state, p)
        newly = {tid: Recorded(o.outcome, o.reason, o.started_at, o.finished_at)
                 for tid, (o, _) in seen.items()
                 if o.phase.terminal and o.outcome and tid not in state.outcomes}
        if state.sweep.spec.warm_pods:
            newly.update(self.warm.overdue(state, p, self.statuses(state, p, seen), time.time()))
        if newly:
            self.save(state, outcomes={**state.outcomes, **newly})
        self._drop_unschedulable(state, newly)
        statuses = self.statuses(state, p, seen)
        if not state.cancelled and not state.sweep.spec.suspend and self._start_next(state, p, statuses):
            statuses = self.statuses(state, p, self.observe(state, p))
        return SweepStatus(sweep, self.name, statuses, message=f"namespace {self.namespace}")

    def _drop_unschedulable(self, state: SweepState, newly: Mapping[str, Recorded]) -> None:
        """Delete the Jobs of trials just recorded `unschedulable` (a pod no node can take waits for ever), and
        the warm Jobs of slot kinds no node can take (each of their trials is recorded by now)."""
        sweep = state.sweep.name
        ended = {tid for tid, rec in newly.items() if rec.outcome == Outcome.UNSCHEDULABLE}
        if ended:
            self.delete_jobs(sweep, ended)
        if state.sweep.spec.warm_pods:
            for job in self.warm.unschedulable_jobs(sweep):
                self._delete_job(job, None)

    def capped(self, sweep: str) -> bool:
        """Whether the sweep's last reconcile started as many trials as one step may (more may be waiting)."""
        return sweep in self._capped

    def _start_next(self, state: SweepState, p: Plan, statuses: list[TrialStatus]) -> int:
        """Create the Jobs of the next trials the limits allow (for warm trials: hand them over, and make the warm
        pods the limits allow); returns how many Jobs."""
        spec = state.sweep.spec
        trials = p.by_id()
        own = [s for s in statuses if not self.warm.runs(trials[s.trial_id], state.sweep)]  # Jobs of their own
        active = [s for s in own if s.phase in (Phase.RUNNING, Phase.UNSCHEDULABLE)
                  or (s.phase == Phase.PENDING and s.attempts)]
        held = self.warm.held(state.sweep.name) if spec.warm_pods else []  # slots of warm pods, by kind
        gpu_of = {worker_key(t): t.gpu for t in p.trials}
        room = spec.concurrency.max_parallel - len(active) - len(held)
        per_type = Counter(s.gpu for s in active) + Counter(gpu_of.get(key) for key in held)
        chosen: list[Trial] = []
        cap = self.jobs.max_starts_per_step
        if cap:
            room = min(room, cap)
        for s in own:
            if room <= 0:
                break
            if s.phase != Phase.PENDING or s.attempts:
                continue
            limit = spec.concurrency.per_gpu_type
            if limit and s.gpu and per_type[s.gpu] >= limit:
                continue
            chosen.append(trials[s.trial_id])
            per_type[s.gpu] += 1
            room -= 1
        capped = cap is not None and len(chosen) >= cap
        (self._capped.add if capped else self._capped.discard)(state.sweep.name)
        if not chosen and not spec.warm_pods:
            return 0
        image = resolve_image(state.sweep, allow_unpinned=True)
        tracking = self.tracking(state)
        queued_at = time.time() if state.sweep.spec.queue else None  # the job measures its wait from here
        owner = self.store.owner(state.sweep.name)
        made = 0
        if spec.warm_pods:
            made = self.warm.step(state, p, statuses, room - len(chosen), dict(per_type), image=image,
                                  tracking=tracking, owner=owner, queued_at=queued_at)
        if not chosen:
            return made
        objects = []
        for trial in chosen:
            extra = dict(self.jobs.pod_annotations(trial)) if self.jobs.pod_annotations else None
            for obj in render_trial(trial, state.sweep, image=image, namespace=self.namespace, tracking=tracking,
                                    owner=owner, queued_at=queued_at):
                if obj["kind"] == "Job":
                    if extra:
                        obj["spec"]["template"]["metadata"]["annotations"].update(extra)
                    self.protect(obj)
                objects.append(obj)
        self.apply_all(objects)
        return len(chosen) + made

    def protect(self, job: dict[str, Any]) -> None:
        """Keep a trial's Job until its outcome is recorded: with finalizers (the operator's), the Job carries
        them until the outcome is recorded; without (nothing may be left to remove a finalizer), its TTL is at
        least `UNGUARDED_TTL_FLOOR`."""
        if self.jobs.finalizers:
            job["metadata"]["finalizers"] = list(self.jobs.finalizers)
        else:
            spec = job["spec"]
            spec["ttlSecondsAfterFinished"] = max(spec.get("ttlSecondsAfterFinished") or 0, UNGUARDED_TTL_FLOOR)

    def release(self, job: Mapping[str, Any]) -> None:
        """Remove this reconciler's finalizers from a Job (a strategic merge patch: finalizers of others, such
        as the garbage collector's `foregroundDeletion`, stay). Call it only once the trial's outcome is
        recorded, or when the Job's outcome no longer matters (its Sweep is going away)."""
        mine = [f for f in self.jobs.finalizers if f in (job["metadata"].get("finalizers") or [])]
        key = job["metadata"].get("uid") or job["metadata"]["name"]
        now = time.monotonic()
        if not mine or now - self._released.get(key, -APPLIED_GRACE) < APPLIED_GRACE:  # a cache behind our patch
            return
        with contextlib.suppress(self.api.ApiException):  # 404: gone already
            discard(self.api.write(self.api.batch.patch_namespaced_job, job["metadata"]["name"], self.namespace,
                                   {"metadata": {"$deleteFromPrimitiveList/finalizers": mine}},
                                   _content_type=STRATEGIC, _preload_content=False))
        self._released[key] = now
        if len(self._released) > 4 * len(self._applied) + 10_000:  # keep it bounded: drop expired entries
            self._released = {k: t for k, t in self._released.items() if now - t < APPLIED_GRACE}

    def release_all(self, jobs: list[Obj]) -> None:
        """`release` each Job, `WRITE_THREADS` at a time (a step may release a thousand)."""
        if len(jobs) <= 1:
            for job in jobs:
                self.release(job)
            return
        with ThreadPoolExecutor(max_workers=min(WRITE_THREADS, len(jobs))) as pool:
            list(pool.map(self.release, jobs))

    def forget_releases(self) -> None:
        """Forget which finalizers were removed here (a new term as leader: another may have written since)."""
        self._released.clear()

    def apply(self, patch_fn: Callable[..., Any], body: Mapping[str, Any]) -> None:
        """Server-side apply of one object (field manager `kubesweep`)."""
        discard(self.api.write(patch_fn, body["metadata"]["name"], self.namespace, body, field_manager=FIELD_MANAGER,
                               force=True, _content_type=APPLY, _preload_content=False))

    def create_job(self, job: Mapping[str, Any]) -> None:
        """Create a trial's Job, which has none yet. A create costs the API server less than an apply (no merge
        with a live object); a Job of that name already there (409: a cache behind, another writer) is the
        trial's Job, left as it is."""
        def create(body: Mapping[str, Any], **kwargs: Any) -> None:
            try:
                discard(self.api.batch.create_namespaced_job(self.namespace, body, field_manager=FIELD_MANAGER,
                                                             _preload_content=False, **kwargs))
            except self.api.ApiException as exc:
                status = getattr(exc, "status", None)
                if status in REFUSALS:  # the same Job is refused again on every try: say why, where seen
                    raise JobRefused(f"the API server refused trial Job {job['metadata']['name']}: HTTP "
                                     f"{status} {api_message(exc)}") from None
                if status != 409:
                    raise

        self.api.write(create, job)
        self.checkpoints.reached("job-apply")

    def apply_all(self, objects: list[dict[str, Any]]) -> None:
        """Create the trials' Jobs and apply their other objects (Services), `WRITE_THREADS` at a time."""
        def one(obj: dict[str, Any]) -> None:
            if obj["kind"] != "Job":
                self.apply(self.api.core.patch_namespaced_service, obj)
                return
            self.create_job(obj)
            labels = obj["metadata"]["labels"]
            if LABEL_TRIAL in labels:  # a warm pod's Job is counted by `WarmPods` instead
                self._applied.setdefault(labels[LABEL_SWEEP], {})[labels[LABEL_TRIAL]] = time.monotonic()

        with ThreadPoolExecutor(max_workers=min(WRITE_THREADS, len(objects))) as pool:
            list(pool.map(one, objects))

    # -- stop / cancel / resume / delete ------------------------------------------------------------------

    def delete_jobs(self, sweep: str, trial_ids: set[str] | None = None, *, during: str | None = None) -> None:
        """Delete the sweep's Jobs (of `trial_ids`, or all); `during`: the request this is part of (`cancel`,
        `resume`), which names the checkpoint between a deletion and the removal of its finalizer."""
        for job in self.job_objects(sweep):
            if trial_ids is None or job["metadata"]["labels"].get(LABEL_TRIAL) in trial_ids:
                self._delete_job(job, during)

    def _delete_job(self, job: Mapping[str, Any], during: str | None) -> None:
        """Delete one Job (its pods go with it: background propagation), then remove our finalizer so the
        deletion completes: whoever deletes a trial's Job on purpose has recorded its outcome first."""
        try:
            self.api.write(self.api.batch.delete_namespaced_job, job["metadata"]["name"], self.namespace,
                           propagation_policy="Background")
        except self.api.ApiException:  # 404: gone already
            return
        if during:
            self.checkpoints.reached(f"{during}-delete")
        self.release(job)

    def stop(self, state: SweepState, trial: TrialStatus, reason: str) -> None:
        """Record the trial stopped, then delete its Job (its pods go with it: background propagation). The Job
        is listed from the API server, not the cache: one created a moment ago, which a cache behind has not
        shown yet, is deleted too (a search may stop a trial seconds after it began)."""
        stopped = Recorded(Outcome.STOPPED, reason, trial.started_at, time.time())
        self.save(state, outcomes={**state.outcomes, trial.trial_id: stopped})
        for job in self._labelled(self.api.batch.list_namespaced_job, state.sweep.name, trial=trial.trial_id):
            if job["metadata"]["labels"].get(LABEL_TRIAL) == trial.trial_id:
                self._delete_job(job, None)
        if state.sweep.spec.warm_pods:
            self.warm.stop(state.sweep.name, trial.trial_id)

    def cancel(self, state: SweepState) -> None:
        """Record every unfinished trial cancelled (a trial whose Job just finished: its outcome), then delete
        the unfinished trials' Jobs."""
        sweep = state.sweep.name
        p = self.plan_for(state)
        statuses = self.statuses(state, p, self.observe(state, p))
        now = time.time()
        outcomes = dict(state.outcomes)
        for s in statuses:
            if not s.phase.terminal or s.trial_id not in outcomes:
                if s.outcome in (Outcome.SUCCEEDED, Outcome.OOM, Outcome.GPU_MISMATCH, Outcome.FAILED,
                                 Outcome.UNSCHEDULABLE):
                    outcomes[s.trial_id] = Recorded(s.outcome, s.reason, s.started_at, s.finished_at)
                else:
                    outcomes[s.trial_id] = Recorded(Outcome.CANCELLED, "cancelled", s.started_at, now)
        self.save(state, outcomes=outcomes, cancelled=True)
        unfinished = {s.trial_id for s in statuses if not s.phase.terminal}
        self.delete_jobs(sweep, unfinished, during="cancel")
        for job in self.job_objects(sweep):  # warm pods: their trials are recorded cancelled or ended
            if job["metadata"].get("labels", {}).get(LABEL_WORKER):
                self._delete_job(job, "cancel")

    def resume(self, state: SweepState) -> None:
        """Forget the outcomes of trials that ended without an answer and delete their Jobs, so the next
        reconcile runs them again; clears a cancel."""
        sweep = state.sweep.name
        p = self.plan_for(state)
        statuses = self.statuses(state, p, self.observe(state, p))
        rerun = {s.trial_id for s in statuses if s.phase.terminal and not s.settled}
        outcomes = {k: v for k, v in state.outcomes.items() if k not in rerun}
        self.delete_jobs(sweep, rerun, during="resume")
        self._wait_gone(sweep, rerun)
        for tid in rerun:
            self._applied.get(sweep, {}).pop(tid, None)
        self.save(state, outcomes=outcomes, cancelled=False)

    def _wait_gone(self, sweep: str, trial_ids: set[str], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while trial_ids and time.monotonic() < deadline:
            if not any(j["metadata"]["labels"].get(LABEL_TRIAL) in trial_ids for j in self.job_objects(sweep)):
                return
            time.sleep(0.2)

    def delete(self, sweep: str) -> None:
        """Delete the sweep's Jobs, its added trials and its state."""
        self.delete_jobs(sweep)
        if self.jobs.search is not None:
            self.jobs.search.delete(sweep)
        self.store.delete(sweep)
        self.forget(sweep)

    def forget(self, sweep: str) -> None:
        """Drop everything this process remembers of a sweep."""
        for cache in (self._plans, self._orders, self._applied):
            cache.pop(sweep, None)  # type: ignore[attr-defined]
        self._capped.discard(sweep)
        self.warm.forget(sweep)
        self.kueue.forget(sweep)
        self.store.forget(sweep)

    # -- logs --------------------------------------------------------------------------------------------

    def logs(self, sweep: str, trial: TrialStatus, follow: bool) -> Iterator[str]:
        _, pods = self.objects(sweep)
        return trial_log(self.api, pods, trial, follow)


def trial_log(api: Api, pods: list[Obj], trial: TrialStatus, follow: bool) -> Iterator[str]:
    """The log of the trial's newest pod among `pods`: all of it, or followed as it grows; a trial without a pod of
    its own, its lines in the warm pod it ran in (`k8s_warm.warm_trial_log`)."""
    mine = sorted((p for p in pods if p["metadata"].get("labels", {}).get(LABEL_TRIAL) == trial.trial_id),
                  key=lambda p: p["metadata"].get("creationTimestamp") or "")
    if not mine and any(p["metadata"].get("labels", {}).get(LABEL_WORKER) for p in pods):
        yield from warm_trial_log(api, pods, trial, follow)
        return
    if not mine:
        raise BackendError(f"trial {trial.name} has no pod ({trial.phase.value}"
                           f"{': ' + trial.reason if trial.reason else ''}); no log yet")
    name = mine[-1]["metadata"]["name"]
    try:
        if follow:
            resp = api.core.read_namespaced_pod_log(name, api.namespace, follow=True, _preload_content=False)
            for chunk in resp.stream(4096):
                yield chunk.decode(errors="replace")
        else:
            yield api.core.read_namespaced_pod_log(name, api.namespace)
    except api.ApiException as exc:
        raise BackendError(f"cannot read the log of pod {name}: {api_error(exc)}") from None
