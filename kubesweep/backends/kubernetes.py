"""The Kubernetes backend: each trial a Job (rendered by `kubesweep.manifests`), followed by watches.

State lives in the cluster, so any shell (or the operator) can pick a sweep up:
- the sweep's spec, flags and per-trial outcomes in a `StateStore` (`k8s_state`): ConfigMaps when the backend is
  used directly (`kubesweep-sweep-<name>` and its trial slices), the Sweep resource and its TrialSlices for the
  operator; outcomes survive the Jobs' `ttlSecondsAfterFinished`, and no object grows with the sweep;
- the trials themselves as Jobs labelled `kubesweep.io/sweep` and `kubesweep.io/trial`, read through
  watch-backed caches (`k8s_watch`) while a sweep is followed, by a LIST otherwise.

`reconcile` is the one step everything uses: observe the sweep's Jobs and pods, record newly finished outcomes, and
create the next trials the concurrency limits allow (a create per Job, field manager `kubesweep`; a Job of the
trial's name already there is taken as the trial's, so it is idempotent). Whoever waits on a sweep drives it by
calling `reconcile` whenever a watch reports a change.

A trial whose Job vanished before its outcome was recorded would read as Pending and run again. The operator
(`job_finalizers`) puts a finalizer on its trial Jobs and removes it only once the outcome is recorded. This
backend, used directly (`sweep submit --direct`) and by a search's tuner, may have no process left to remove one,
so its Jobs carry none; their `ttlSecondsAfterFinished` is raised to at least `UNGUARDED_TTL_FLOOR` instead, which
leaves a driver that follows the sweep ample time to record each outcome.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kubesweep.backends import k8s_kueue
from kubesweep.backends.base import (
    Backend,
    BackendError,
    Phase,
    SweepConflict,
    SweepNotFound,
    SweepStatus,
    TrialStatus,
)
from kubesweep.backends.k8s_client import api_error, api_message, import_client, load_config, unreachable
from kubesweep.backends.k8s_state import (
    STATE_PREFIX,
    ConfigMapStore,
    Recorded,
    StateStore,
    SweepState,
    discard,
    phase_for,
)
from kubesweep.backends.k8s_status import Observed, observe
from kubesweep.backends.k8s_watch import Informer, Obj, trim_job, trim_pod
from kubesweep.manifests import (
    FIELD_MANAGER,
    LABEL_SWEEP,
    LABEL_TRIAL,
    UNGUARDED_TTL_FLOOR,
    RenderError,
    render_trial,
    resolve_image,
    sweep_labels,
)
from kubesweep.plan import Plan, Trial, make_trial, plan
from kubesweep.spec import Sweep
from kubesweep.wire.env import TrackingEnv
from kubesweep.wire.outcomes import Outcome

SEARCH_SUFFIX = "-search"  # ConfigMap of the trials a search added while the sweep runs
APPLY = "application/apply-patch+yaml"
WRITE_THREADS = 8
STRATEGIC = "application/strategic-merge-patch+json"
APPLIED_GRACE = 60.0  # seconds a Job applied here counts as existing while no cache has shown it
PodAnnotations = Callable[[Trial], Mapping[str, str]]
# Answers to a Job create that the same Job gets again on every try: invalid (422), too large (413), refused by
# admission or a quota (403), malformed (400)
REFUSALS = frozenset({400, 403, 413, 422})


class JobRefused(BackendError):
    """The API server refuses a trial's Job as it is; the message says why (its own words, clipped)."""


@dataclass
class _Follower:
    changed: threading.Event
    jobs: Informer
    pods: Informer


class KubernetesBackend(Backend):
    name = "kubernetes"
    # the trials a search added (its tuner drives them); the operator leaves them to the tuner Job
    reads_search_trials = True
    # finalizers put on trial Jobs and removed once their outcome is recorded (the operator's; none here)
    job_finalizers: tuple[str, ...] = ()
    # trials started by one reconcile at most (None: all the limits allow); the next reconcile starts more
    max_starts_per_step: int | None = None

    def __init__(self, namespace: str | None = None, kubeconfig: str | Path | None = None, *,
                 api_client: Any = None, tracking: TrackingEnv | None = None, allow_unpinned: bool = False,
                 pod_annotations: PodAnnotations | None = None):
        k8s = import_client()
        if api_client is None:
            api_client, context_namespace = load_config(k8s, kubeconfig)
        else:
            context_namespace = None
        self.client = api_client
        self.core = k8s.client.CoreV1Api(api_client)
        self.batch = k8s.client.BatchV1Api(api_client)
        self.custom = k8s.client.CustomObjectsApi(api_client)
        self.ApiException = k8s.client.exceptions.ApiException
        self.namespace = namespace or context_namespace or "default"
        self.tracking = tracking
        self.allow_unpinned = allow_unpinned
        self.pod_annotations = pod_annotations
        self.writes = 0  # API write requests made, for benchmarks
        self._followers: dict[str, _Follower] = {}
        self._plans: dict[str, Plan] = {}
        self._orders: dict[str, tuple[Plan, dict[str, int]]] = {}  # per sweep: the plan, trial id → position
        self._applied: dict[str, dict[str, float]] = {}  # sweep -> trial id -> when its Job was applied here
        self._released: dict[str, float] = {}  # Job uid -> when its finalizer was removed here
        self._capped: set[str] = set()  # sweeps whose last step started `max_starts_per_step` trials
        self.kueue = k8s_kueue.QueueReader(self.custom, self.namespace, self._call, (BackendError, self.ApiException))
        self.store: StateStore = ConfigMapStore(self.core, self.namespace, call=self._call, write=self._write,
                                                not_found=self.ApiException)

    # -- state ----------------------------------------------------------------------------------------

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except self.ApiException as exc:
            if exc.status == 404:
                raise
            raise BackendError(api_error(exc)) from None
        except Exception as exc:
            if isinstance(exc, BackendError):
                raise
            raise BackendError(unreachable(exc, self.client.configuration.host)) from None

    def _load_state(self, sweep: str) -> SweepState:
        return self.store.load(sweep)

    def sweep_of(self, sweep: str) -> Sweep | None:
        """The sweep as submitted (None for an unknown sweep)."""
        try:
            return self._load_state(sweep).sweep
        except SweepNotFound:
            return None

    def parent_run_id(self, sweep: str) -> str | None:
        """The MLflow parent run the sweep's trials log under, as recorded in its state (None: none yet)."""
        try:
            return self._load_state(sweep).parent_run_id
        except SweepNotFound:
            return None

    def _save_state(self, state: SweepState, *, outcomes: Mapping[str, Recorded] | None = None,
                    cancelled: bool | None = None, parent_run_id: str | None = None) -> None:
        """Record outcomes (the complete set: a trial left out is forgotten and runs again) and flags."""
        self.store.save(state, self._order(state), outcomes=outcomes, cancelled=cancelled,
                        parent_run_id=parent_run_id)

    def _write(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Every write request to the API goes through here (the operator guards and times each one)."""
        self.writes += 1
        return self._call(fn, *args, **kwargs)

    def _apply(self, patch_fn: Callable[..., Any], body: Mapping[str, Any]) -> None:
        discard(self._write(patch_fn, body["metadata"]["name"], self.namespace, body, field_manager=FIELD_MANAGER,
                            force=True, _content_type=APPLY, _preload_content=False))

    def _create_job(self, job: Mapping[str, Any]) -> None:
        """Create a trial's Job, which has none yet. A create costs the API server less than an apply (no merge
        with a live object); a Job of that name already there (409: a cache behind, another writer) is the
        trial's Job, left as it is."""
        def create(body: Mapping[str, Any], **kwargs: Any) -> None:
            try:
                discard(self.batch.create_namespaced_job(self.namespace, body, field_manager=FIELD_MANAGER,
                                                         _preload_content=False, **kwargs))
            except self.ApiException as exc:
                if exc.status in REFUSALS:  # the same Job is refused again on every try: say why, where seen
                    raise JobRefused(f"the API server refused trial Job {job['metadata']['name']}: HTTP "
                                     f"{exc.status} {api_message(exc)}") from None
                if exc.status != 409:
                    raise

        self._write(create, job)

    def _owner(self, state: SweepState) -> dict[str, Any] | None:
        """The ownerReference put on a sweep's Jobs (the operator: its Sweep, so deleting it cascades)."""
        return self.store.owner(state.sweep.name)

    def _tracking_for(self, state: SweepState) -> TrackingEnv | None:
        """Where a sweep's trials log (the operator: each Sweep's own experiment and parent run)."""
        tracking = self.tracking
        if tracking is not None and not tracking.parent_run_id and state.parent_run_id:
            tracking = replace(tracking, parent_run_id=state.parent_run_id)
        return tracking

    def _order(self, state: SweepState) -> dict[str, int]:
        """trial id → its position in the plan (which decides its trial slice)."""
        p = self._plan_for(state)
        cached = self._orders.get(state.sweep.name)
        if cached is None or cached[0] is not p:
            cached = self._orders[state.sweep.name] = (p, {t.id: i for i, t in enumerate(p.trials)})
        return cached[1]

    def _plan_for(self, state: SweepState) -> Plan:
        cached = self._plans.get(state.sweep.name)
        if cached is None or cached.sweep.to_document() != state.sweep.to_document():
            # admitted at submission (`sweep submit`'s --max-trials, the operator's check): planned without a limit
            cached = self._plans[state.sweep.name] = self._with_added(plan(state.sweep, max_trials=None))
        return cached

    # -- trials added while the sweep runs (a search's suggestions): ConfigMap <state>-search ---------------

    def _search_name(self, sweep: str) -> str:
        return f"{STATE_PREFIX}{sweep}{SEARCH_SUFFIX}"

    def _added(self, sweep: str) -> list[dict[str, Any]]:
        try:
            cm = self._call(self.core.read_namespaced_config_map, self._search_name(sweep), self.namespace)
        except self.ApiException:
            return []
        added = json.loads((cm.data or {}).get("trials.json", "[]"))
        return added if isinstance(added, list) else []

    def _with_added(self, base: Plan) -> Plan:
        if not self.reads_search_trials or not base.sweep.spec.search.adaptive:
            return base
        added = self._added(base.sweep.name)
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

    def _add_trials_impl(self, plan: Plan, trials: list[Trial]) -> None:
        sweep = plan.sweep
        try:
            state = self._load_state(sweep.name)
        except SweepNotFound:
            self._submit_impl(plan)
            state = self._load_state(sweep.name)
        if state.sweep.to_document() != sweep.to_document():
            raise SweepConflict(f"a sweep named {sweep.name!r} already exists in namespace {self.namespace} with a "
                                "different spec")
        current = self._plan_for(state)
        known = {t.id for t in current.trials}
        new = [t for t in trials if t.id not in known]
        if not new:
            return
        added = self._added(sweep.name) + [{"axes": t.axes, "repeat": t.repeat} for t in new]
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": self._search_name(sweep.name), "namespace": self.namespace,
                             "labels": sweep_labels(sweep.name)},
                "data": {"trials.json": json.dumps(added, sort_keys=True)}}
        self._apply(self.core.patch_namespaced_config_map, body)
        self._plans[sweep.name] = replace(current, trials=[*current.trials, *new])
        self.reconcile(sweep.name)

    def _stop_trial_impl(self, sweep: str, trial: TrialStatus, reason: str) -> None:
        """Record the trial stopped, then delete its Job (its pods go with it: background propagation)."""
        state = self._load_state(sweep)
        stopped = Recorded(Outcome.STOPPED, reason, trial.started_at, time.time())
        self._save_state(state, outcomes={**state.outcomes, trial.trial_id: stopped})
        self._delete_jobs(sweep, {trial.trial_id})

    # -- observing ----------------------------------------------------------------------------------------

    def _informers(self, sweep: str) -> tuple[Informer, Informer] | None:
        """Synced caches of the sweep's Jobs and pods, if any (a follower's; the operator's are per namespace)."""
        follower = self._followers.get(sweep)
        if follower is not None and follower.jobs.synced.is_set() and follower.pods.synced.is_set():
            return follower.jobs, follower.pods
        return None

    def _objects(self, sweep: str) -> tuple[list[Obj], list[Obj]]:
        cached = self._informers(sweep)
        if cached is not None:
            return cached[0].of_sweep(self.namespace, sweep), cached[1].of_sweep(self.namespace, sweep)
        return self._labelled(self.batch.list_namespaced_job, sweep), self._labelled(self.core.list_namespaced_pod,
                                                                                     sweep)

    def _jobs(self, sweep: str) -> list[Obj]:
        """The sweep's Jobs: from the cache when there is one, else as the API server lists them now."""
        cached = self._informers(sweep)
        if cached is not None:
            return cached[0].of_sweep(self.namespace, sweep)
        return self._labelled(self.batch.list_namespaced_job, sweep)

    def _labelled(self, list_fn: Callable[..., Any], sweep: str) -> list[Obj]:
        resp = self._call(list_fn, self.namespace, label_selector=f"{LABEL_SWEEP}={sweep}", _preload_content=False)
        return json.loads(resp.data)["items"]  # type: ignore[no-any-return]

    def _observe(self, state: SweepState, p: Plan) -> dict[str, tuple[Observed, bool]]:
        """trial id → (what the cluster says, whether its Job exists). A Job applied here that the cache has
        not shown yet counts as existing (Pending), so a lagging cache never makes it applied again."""
        name = state.sweep.name
        jobs, pods = self._objects(name)
        jobs_by_trial = {j["metadata"]["labels"].get(LABEL_TRIAL): j for j in jobs}
        pods_by_trial: dict[str, list[Obj]] = {}
        for pod in pods:
            pods_by_trial.setdefault(pod["metadata"].get("labels", {}).get(LABEL_TRIAL, ""), []).append(pod)
        applied = self._applied.get(name, {})
        now = time.monotonic()
        for tid in [t for t, at in applied.items() if t in jobs_by_trial or now - at > APPLIED_GRACE]:
            del applied[tid]
        queued = self.kueue.waiting(state.sweep.name, state.sweep.spec.queue, jobs_by_trial)
        if evicted := k8s_kueue.not_noted(queued, jobs_by_trial):
            self._evicted_by_kueue(state, evicted)
        out = {}
        for trial in p.trials:
            job = jobs_by_trial.get(trial.id)
            seen = observe(job, pods_by_trial.get(trial.id, []))
            if trial.id in queued and not seen.phase.terminal:
                seen = replace(seen, reason=queued[trial.id].reason)
            out[trial.id] = (seen, job is not None or trial.id in applied)
        return out

    def _evicted_by_kueue(self, state: SweepState,
                          evicted: Mapping[str, tuple[Mapping[str, Any], k8s_kueue.Admission]]) -> None:
        """Trials evicted by Kueue since their Jobs last noted it: status shows it; the operator also tags runs."""

    def _statuses(self, state: SweepState, p: Plan, seen: Mapping[str, tuple[Observed, bool]]) -> list[TrialStatus]:
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

    def _status_impl(self, sweep: str) -> SweepStatus:
        state = self._load_state(sweep)
        p = self._plan_for(state)
        trials = self._statuses(state, p, self._observe(state, p))
        return SweepStatus(sweep, self.name, trials, message=f"namespace {self.namespace}")

    # -- driving ----------------------------------------------------------------------------------------

    def _submit_impl(self, plan: Plan) -> None:
        sweep = plan.sweep
        try:
            resolve_image(sweep, allow_unpinned=self.allow_unpinned)
        except RenderError as exc:
            raise BackendError(str(exc)) from None
        try:
            existing = self._load_state(sweep.name)
        except SweepNotFound:
            existing = None
        if existing is not None and existing.sweep.to_document() != sweep.to_document():
            raise SweepConflict(f"a sweep named {sweep.name!r} already exists in namespace {self.namespace} with a "
                                f"different spec; `sweep resume {sweep.name}` continues it, `sweep delete` removes it")
        if existing is None:
            try:
                self.store.create(sweep, self.tracking.parent_run_id if self.tracking else None)
            except self.ApiException as exc:  # 404: the only answer `_call` passes on as it is
                raise BackendError(f"namespace {self.namespace!r} not found on the cluster: create it (`kubectl "
                                   f"create namespace {self.namespace}`) or name another with -n") from exc
        self._plans[sweep.name] = plan
        self.reconcile(sweep.name)

    def reconcile(self, sweep: str) -> SweepStatus:
        """Observe, record newly finished outcomes, and start the trials the limits allow. Idempotent."""
        state = self._load_state(sweep)
        p = self._plan_for(state)
        seen = self._observe(state, p)
        newly = {tid: Recorded(o.outcome, o.reason, o.started_at, o.finished_at)
                 for tid, (o, _) in seen.items()
                 if o.phase.terminal and o.outcome and tid not in state.outcomes}
        if newly:
            self._save_state(state, outcomes={**state.outcomes, **newly})
        statuses = self._statuses(state, p, seen)
        if not state.cancelled and not state.sweep.spec.suspend and self._start_next(state, p, statuses):
            statuses = self._statuses(state, p, self._observe(state, p))
        return SweepStatus(sweep, self.name, statuses, message=f"namespace {self.namespace}")

    def _start_next(self, state: SweepState, p: Plan, statuses: list[TrialStatus]) -> int:
        """Create the Jobs of the next trials the limits allow; returns how many."""
        spec = state.sweep.spec
        active = [s for s in statuses if s.phase in (Phase.RUNNING, Phase.UNSCHEDULABLE)
                  or (s.phase == Phase.PENDING and s.attempts)]
        room = spec.concurrency.max_parallel - len(active)
        per_type = Counter(s.gpu for s in active)
        chosen: list[Trial] = []
        trials = p.by_id()
        if self.max_starts_per_step:
            room = min(room, self.max_starts_per_step)
        for s in statuses:
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
        capped = self.max_starts_per_step is not None and len(chosen) >= self.max_starts_per_step
        (self._capped.add if capped else self._capped.discard)(state.sweep.name)
        if not chosen:
            return 0
        image = resolve_image(state.sweep, allow_unpinned=True)
        tracking = self._tracking_for(state)
        queued_at = time.time() if state.sweep.spec.queue else None  # the job measures its wait from here
        objects = []
        for trial in chosen:
            extra = dict(self.pod_annotations(trial)) if self.pod_annotations else None
            for obj in render_trial(trial, state.sweep, image=image, namespace=self.namespace, tracking=tracking,
                                    owner=self._owner(state), queued_at=queued_at):
                if obj["kind"] == "Job":
                    if extra:
                        obj["spec"]["template"]["metadata"]["annotations"].update(extra)
                    self._protect(obj)
                objects.append(obj)
        self._apply_all(objects)
        return len(chosen)

    def _protect(self, job: dict[str, Any]) -> None:
        """Keep a trial's Job until its outcome is recorded: with `job_finalizers` (the operator), the Job carries
        them until the outcome is recorded; without (nothing may be left to remove a finalizer), its TTL is at
        least `UNGUARDED_TTL_FLOOR`."""
        if self.job_finalizers:
            job["metadata"]["finalizers"] = list(self.job_finalizers)
        else:
            spec = job["spec"]
            spec["ttlSecondsAfterFinished"] = max(spec.get("ttlSecondsAfterFinished") or 0, UNGUARDED_TTL_FLOOR)

    def _release(self, job: Mapping[str, Any]) -> None:
        """Remove this backend's finalizers from a Job (a strategic merge patch: finalizers of others, such as
        the garbage collector's `foregroundDeletion`, stay). Call it only once the trial's outcome is recorded,
        or when the Job's outcome no longer matters (its Sweep is going away)."""
        mine = [f for f in self.job_finalizers if f in (job["metadata"].get("finalizers") or [])]
        key = job["metadata"].get("uid") or job["metadata"]["name"]
        now = time.monotonic()
        if not mine or now - self._released.get(key, -APPLIED_GRACE) < APPLIED_GRACE:  # a cache behind our patch
            return
        with contextlib.suppress(self.ApiException):  # 404: gone already
            discard(self._write(self.batch.patch_namespaced_job, job["metadata"]["name"], self.namespace,
                                {"metadata": {"$deleteFromPrimitiveList/finalizers": mine}}, _content_type=STRATEGIC,
                                _preload_content=False))
        self._released[key] = now
        if len(self._released) > 4 * len(self._applied) + 10_000:  # keep it bounded: drop expired entries
            self._released = {k: t for k, t in self._released.items() if now - t < APPLIED_GRACE}

    def _release_all(self, jobs: list[Obj]) -> None:
        """`_release` each Job, `WRITE_THREADS` at a time (a step may release a thousand)."""
        if len(jobs) <= 1:
            for job in jobs:
                self._release(job)
            return
        with ThreadPoolExecutor(max_workers=min(WRITE_THREADS, len(jobs))) as pool:
            list(pool.map(self._release, jobs))

    def _apply_all(self, objects: list[dict[str, Any]]) -> None:
        def apply(obj: dict[str, Any]) -> None:
            if obj["kind"] != "Job":
                self._apply(self.core.patch_namespaced_service, obj)
                return
            self._create_job(obj)
            labels = obj["metadata"]["labels"]
            self._applied.setdefault(labels[LABEL_SWEEP], {})[labels[LABEL_TRIAL]] = time.monotonic()

        with ThreadPoolExecutor(max_workers=min(WRITE_THREADS, len(objects))) as pool:
            list(pool.map(apply, objects))

    def _follow(self, sweep: str) -> _Follower:
        follower = self._followers.get(sweep)
        if follower is None:
            changed = threading.Event()
            selector = f"{LABEL_SWEEP}={sweep}"
            jobs = Informer(self.batch.list_namespaced_job, self.namespace, selector, trim=trim_job, changed=changed,
                            name="jobs").start()
            pods = Informer(self.core.list_namespaced_pod, self.namespace, selector, trim=trim_pod, changed=changed,
                            name="pods").start()
            follower = self._followers[sweep] = _Follower(changed, jobs, pods)
            jobs.wait_synced(10)
            pods.wait_synced(10)
        return follower

    def _wait_step(self, sweep: str, interval: float) -> SweepStatus:
        follower = self._follow(sweep)
        follower.changed.wait(interval)
        follower.changed.clear()
        status = self.reconcile(sweep)
        if status.done:
            self._unfollow(sweep)
        return status

    def _unfollow(self, sweep: str) -> None:
        follower = self._followers.pop(sweep, None)
        if follower is not None:
            follower.jobs.stop()
            follower.pods.stop()

    def close(self) -> None:
        for sweep in list(self._followers):
            self._unfollow(sweep)

    # -- cancel / resume / delete -------------------------------------------------------------------------

    def _delete_jobs(self, sweep: str, trial_ids: set[str] | None = None) -> None:
        jobs, _ = self._objects(sweep)
        for job in jobs:
            if trial_ids is None or job["metadata"]["labels"].get(LABEL_TRIAL) in trial_ids:
                self._delete_job(job)

    def _delete_job(self, job: Mapping[str, Any]) -> None:
        """Delete one Job (its pods go with it: background propagation), then remove our finalizer so the
        deletion completes: whoever deletes a trial's Job on purpose has recorded its outcome first."""
        try:
            self._write(self.batch.delete_namespaced_job, job["metadata"]["name"], self.namespace,
                        propagation_policy="Background")
        except self.ApiException:  # 404: gone already
            return
        self._deleted(job)
        self._release(job)

    def _deleted(self, job: Mapping[str, Any]) -> None:
        """Called between a Job's deletion and the removal of its finalizer (the operator's test hooks)."""

    def _cancel_impl(self, sweep: str) -> None:
        state = self._load_state(sweep)
        p = self._plan_for(state)
        statuses = self._statuses(state, p, self._observe(state, p))
        now = time.time()
        for s in statuses:
            if not s.phase.terminal or s.trial_id not in state.outcomes:
                if s.outcome in (Outcome.SUCCEEDED, Outcome.OOM, Outcome.GPU_MISMATCH, Outcome.FAILED):
                    state.outcomes[s.trial_id] = Recorded(s.outcome, s.reason, s.started_at, s.finished_at)
                else:
                    state.outcomes[s.trial_id] = Recorded(Outcome.CANCELLED, "cancelled", s.started_at, now)
        self._save_state(state, outcomes=state.outcomes, cancelled=True)
        unfinished = {s.trial_id for s in statuses if not s.phase.terminal}
        self._delete_jobs(sweep, unfinished)

    def _resume_impl(self, sweep: str) -> None:
        state = self._load_state(sweep)
        p = self._plan_for(state)
        statuses = self._statuses(state, p, self._observe(state, p))
        rerun = {s.trial_id for s in statuses if s.phase.terminal and not s.settled}
        outcomes = {k: v for k, v in state.outcomes.items() if k not in rerun}
        self._delete_jobs(sweep, rerun)
        self._wait_gone(sweep, rerun)
        for tid in rerun:
            self._applied.get(sweep, {}).pop(tid, None)
        self._save_state(state, outcomes=outcomes, cancelled=False)
        self.reconcile(sweep)

    def _wait_gone(self, sweep: str, trial_ids: set[str], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while trial_ids and time.monotonic() < deadline:
            jobs, _ = self._objects(sweep)
            if not any(j["metadata"]["labels"].get(LABEL_TRIAL) in trial_ids for j in jobs):
                return
            time.sleep(0.2)

    def _delete_impl(self, sweep: str) -> None:
        self._load_state(sweep)
        self._unfollow(sweep)
        self._delete_jobs(sweep)
        with contextlib.suppress(self.ApiException):  # 404: gone already
            self._write(self.core.delete_namespaced_config_map, self._search_name(sweep), self.namespace)
        self.store.delete(sweep)
        self._forget(sweep)

    def _forget(self, sweep: str) -> None:
        """Drop everything this process remembers of a sweep."""
        for cache in (self._plans, self._orders, self._applied):
            cache.pop(sweep, None)  # type: ignore[attr-defined]
        self._capped.discard(sweep)
        self.kueue.forget(sweep)
        self.store.forget(sweep)

    def _list_impl(self) -> list[str]:
        return self.store.names()

    # -- logs --------------------------------------------------------------------------------------------

    def _logs_impl(self, sweep: str, trial: TrialStatus, follow: bool) -> Iterator[str]:
        _, pods = self._objects(sweep)
        mine = sorted((p for p in pods if p["metadata"].get("labels", {}).get(LABEL_TRIAL) == trial.trial_id),
                      key=lambda p: p["metadata"].get("creationTimestamp") or "")
        if not mine:
            raise BackendError(f"trial {trial.name} has no pod ({trial.phase.value}"
                               f"{': ' + trial.reason if trial.reason else ''}); no log yet")
        name = mine[-1]["metadata"]["name"]
        try:
            if follow:
                resp = self.core.read_namespaced_pod_log(name, self.namespace, follow=True, _preload_content=False)
                for chunk in resp.stream(4096):
                    yield chunk.decode(errors="replace")
            else:
                yield self.core.read_namespaced_pod_log(name, self.namespace)
        except self.ApiException as exc:
            raise BackendError(f"cannot read the log of pod {name}: {api_error(exc)}") from None
