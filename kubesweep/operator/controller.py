"""One idempotent step per Sweep: carry out requests, reconcile with the planner and renderer, publish status.

`OperatorBackend` is `SweepStore` (state in the Sweep resource) plus a write guard: every write to the cluster
first checks that this replica still holds the Lease (`may_write`), so a replica that lost it stops acting
before another may have started. A step can be interrupted at any point (SIGKILL included) and the next step,
in this process or another, observes the same Jobs and finishes the work; Jobs are named after their trial and
created by server-side apply only for trials that have none, so no trial is started twice.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from kubesweep.backends.base import BackendError, SweepNotFound, SweepStatus
from kubesweep.backends.kubernetes import Recorded, SweepState
from kubesweep.manifests import LABEL_TRIAL, TrackingEnv, render_tuner_job, resolve_image, tuner_name
from kubesweep.operator import testhooks
from kubesweep.operator.mlflow_rest import MlflowError, MlflowRest
from kubesweep.operator.store import (
    ANNOTATION_CANCEL,
    ANNOTATION_RESUME,
    InvalidSweep,
    SweepStore,
    recorded_outcomes,
)
from kubesweep.outcomes import Outcome
from kubesweep.plan import Trial
from kubesweep.spec import Sweep

log = logging.getLogger("kubesweep.operator")


class NotLeader(BackendError):
    """This replica does not hold the Lease (any more): it must not write."""


class OperatorBackend(SweepStore):
    def __init__(self, namespace: str, *, api_client: Any, may_write: Callable[[], bool],
                 mlflow_uri: str | None = None, test_hooks: bool = False, allow_unpinned: bool = False):
        super().__init__(namespace=namespace, api_client=api_client, allow_unpinned=allow_unpinned,
                         pod_annotations=self._hook_annotations if test_hooks else None)
        self.may_write = may_write
        self.mlflow_uri = mlflow_uri
        self.test_hooks = test_hooks
        self._hook_rules: dict[str, list[tuple[dict[str, Any], dict[str, str]]]] = {}
        self._status_extra: dict[str, dict[str, Any]] = {}

    # -- every write is guarded ----------------------------------------------------------------------

    def _guard(self) -> None:
        if not self.may_write():
            raise NotLeader("this replica does not hold the leader Lease; it makes no change")

    def _apply(self, patch_fn: Callable[..., Any], body: Mapping[str, Any]) -> None:
        self._guard()
        super()._apply(patch_fn, body)

    def patch_status(self, name: str, patch: Mapping[str, Any]) -> None:
        self._guard()
        super().patch_status(name, {**patch, **self._status_extra.pop(name, {})})

    def _delete_jobs(self, sweep: str, trial_ids: set[str] | None = None) -> None:
        self._guard()
        super()._delete_jobs(sweep, trial_ids)

    # -- per-sweep hooks -----------------------------------------------------------------------------

    def _load_state(self, sweep: str) -> SweepState:
        state = super()._load_state(sweep)
        if self.test_hooks:
            annotations = self._resources[sweep]["metadata"].get("annotations") or {}
            try:
                self._hook_rules[sweep] = testhooks.parse_rules(annotations.get(testhooks.ANNOTATION))
            except testhooks.TestHookError as exc:
                raise InvalidSweep(str(exc)) from None
        return state

    def _hook_annotations(self, trial: Trial) -> Mapping[str, str]:
        return testhooks.annotations_for(trial, self._hook_rules.get(trial.config.sweep, []))

    def _tracking_for(self, state: SweepState) -> TrackingEnv | None:
        uri = state.sweep.spec.tracking.uri or self.mlflow_uri
        return TrackingEnv(uri, state.sweep.experiment, state.parent_run_id) if uri else None

    # -- the step ------------------------------------------------------------------------------------

    def step(self, name: str) -> SweepStatus | None:
        """Bring one Sweep forward. Returns its status, or None when it is gone, invalid or waiting."""
        try:
            state = self._load_state(name)
        except SweepNotFound:
            self._forget(name)
            return None
        except InvalidSweep as exc:
            self._publish_message(name, "Invalid", str(exc))
            return None
        body = self._resources[name]
        annotations = body["metadata"].get("annotations") or {}
        current = body.get("status") or {}

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
                run_id = MlflowRest(tracking.uri).parent_run(state.sweep.experiment, name,
                                                             body["metadata"]["uid"])
            except MlflowError as exc:
                self._publish_message(name, "Pending", f"waiting for MLflow (no trial starts without the "
                                                      f"sweep's parent run): {exc}")
                return None
            self._save_state(state.sweep, parent_run_id=run_id)

        if state.sweep.spec.search.strategy in ("tune", "max_batch"):
            message = self._ensure_tuner(state, tracking)
        status = self.reconcile(name)
        self._record_late(state.sweep, status)
        if state.sweep.spec.suspend and not status.done:
            message = "suspended: running trials finish, no new trial starts"
        elif self._status_extra.get(name):  # a resume request with nothing to forget
            self.patch_status(name, {})
        self.publish(name, state.sweep, status, message)
        return status

    def _ensure_tuner(self, state: SweepState, tracking: TrackingEnv | None) -> str:
        """A search sweep's trials are made by its tuner Job (`python -m kubesweep.tune`), which drives them
        with the kubernetes backend; the operator creates that Job once."""
        name = tuner_name(state.sweep.name)
        jobs, _ = self._objects(state.sweep.name)
        if not any(j["metadata"]["name"] == name for j in jobs):
            image = resolve_image(state.sweep, allow_unpinned=self.allow_unpinned)
            if tracking is not None and state.parent_run_id and not tracking.parent_run_id:
                tracking = replace(tracking, parent_run_id=state.parent_run_id)
            self._apply(self.batch.patch_namespaced_job,
                        render_tuner_job(state.sweep, image=image, namespace=self.namespace, tracking=tracking,
                                         owner=self._owner(state)))
        return f"{state.sweep.spec.search.strategy} search: tuner Job {name} makes and runs the trials"

    def _record_late(self, sweep: Sweep, status: SweepStatus) -> None:
        """Record outcomes that finished between reconcile's two looks at the cluster, so a published terminal
        phase always has its outcome recorded."""
        recorded = recorded_outcomes((self._resources.get(sweep.name) or {}).get("status") or {})
        late = {t.trial_id: Recorded(t.outcome, t.reason, t.started_at, t.finished_at) for t in status.trials
                if t.phase.terminal and t.outcome and t.trial_id not in recorded}
        if late:
            self._save_state(sweep, outcomes={**recorded, **late})

    def _finish_cancel(self, state: SweepState) -> None:
        """A cancel was recorded: make sure no Job of a cancelled trial still runs (a process killed between
        recording and deleting left some)."""
        p = self._plan_for(state)
        jobs, _ = self._objects(state.sweep.name)
        cancelled = {tid for tid, rec in state.outcomes.items() if rec.outcome == Outcome.CANCELLED}
        running = {j["metadata"]["labels"].get(LABEL_TRIAL) for j in jobs if not _job_finished(j)}
        stale = (cancelled & running) & set(p.by_id())
        if stale:
            self._delete_jobs(state.sweep.name, stale)

    def publish(self, name: str, sweep: Sweep, status: SweepStatus, message: str = "") -> None:
        body = self._resources.get(name) or {}
        view = self.status_view(status, sweep, message=message,
                                generation=body.get("metadata", {}).get("generation"))
        if _changed(view, body.get("status") or {}):
            view["updatedAt"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            self.patch_status(name, view)

    def _publish_message(self, name: str, phase: str, message: str) -> None:
        current = (self._resources.get(name) or {}).get("status") or {}
        if current.get("phase") != phase or current.get("message") != message:
            log.warning("sweep %s/%s: %s", self.namespace, name, message)
            self.patch_status(name, {"phase": phase, "message": message})

    def _forget(self, name: str) -> None:
        for cache in (self._resources, self._plans, self._hook_rules, self._status_extra):
            cache.pop(name, None)  # type: ignore[attr-defined]


def _job_finished(job: Mapping[str, Any]) -> bool:
    return any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
               for c in job.get("status", {}).get("conditions") or [])


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if v is not None}
    return value


def _changed(view: Mapping[str, Any], current: Mapping[str, Any]) -> bool:
    """Whether a merge patch of `view` would change `current` (null values delete; absent keys stay)."""
    for key, value in view.items():
        have = current.get(key)
        if isinstance(value, dict):
            if key == "trials":
                have_trials = have or {}
                for tid, entry in value.items():
                    old = have_trials.get(tid) or {}
                    if any(old.get(k) != v for k, v in entry.items()):
                        return True
            elif _strip(value) != _strip(have or {}):
                return True
        elif value != have:
            return True
    return False


class SweepController:
    """The operator's business logic, kopf-free: one `OperatorBackend` per namespace, one step at a time per
    sweep (steps of different sweeps may run in parallel threads)."""

    def __init__(self, api_client: Any, *, may_write: Callable[[], bool], mlflow_uri: str | None = None,
                 test_hooks: bool = False, allow_unpinned: bool = False):
        self.api_client = api_client
        self.may_write = may_write
        self.options: dict[str, Any] = {"mlflow_uri": mlflow_uri, "test_hooks": test_hooks,
                                        "allow_unpinned": allow_unpinned}
        self._backends: dict[str, OperatorBackend] = {}
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._guard = threading.Lock()

    def backend(self, namespace: str) -> OperatorBackend:
        with self._guard:
            if namespace not in self._backends:
                self._backends[namespace] = OperatorBackend(namespace, api_client=self.api_client,
                                                            may_write=self.may_write, **self.options)
            return self._backends[namespace]

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
