"""The Kubernetes backend: each trial a Job (rendered by `kubesweep.manifests`), followed by watches.

State lives in the cluster, so any shell (or the operator) can pick a sweep up:
- the sweep's spec, flags and per-trial outcomes in ConfigMaps (`k8s_state.ConfigMapStore`:
  `kubesweep-sweep-<name>` and its trial slices); outcomes survive the Jobs' `ttlSecondsAfterFinished`, and no
  object grows with the sweep;
- the trials themselves as Jobs labelled `kubesweep.io/sweep` and `kubesweep.io/trial`, read through
  watch-backed caches (`k8s_watch.Followers`) while a sweep is followed, by a LIST otherwise.

`KubernetesBackend` is the `Backend` contract over a `k8s_reconcile.JobReconciler` built with those parts, no
write guard and no eviction notes; its Jobs carry no finalizer (nothing may be left to remove one), so their TTL
is raised to at least `UNGUARDED_TTL_FLOOR`. Whoever waits on a sweep drives it: each step reconciles whenever a
watch reports a change. It is used directly (`sweep submit --direct`) and by a search's tuner Job; the operator
composes the same reconciler with its own parts (`kubesweep.operator.controller`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from kubesweep.backends.base import Backend, BackendError, SweepConflict, SweepNotFound, SweepStatus, TrialStatus
from kubesweep.backends.k8s_client import Api
from kubesweep.backends.k8s_reconcile import JobPolicy, JobReconciler, PodAnnotations
from kubesweep.backends.k8s_state import ConfigMapStore, SearchTrials, SweepState
from kubesweep.backends.k8s_watch import Followers
from kubesweep.manifests import RenderError, resolve_image
from kubesweep.plan import Plan, Trial
from kubesweep.sweep_spec import Sweep
from kubesweep.wire.env import TrackingEnv


class KubernetesBackend(Backend):
    name = "kubernetes"

    def __init__(self, namespace: str | None = None, kubeconfig: str | Path | None = None, *,
                 api_client: Any = None, tracking: TrackingEnv | None = None, allow_unpinned: bool = False,
                 pod_annotations: PodAnnotations | None = None):
        self.api = api = Api.connect(namespace, kubeconfig, api_client=api_client)
        self.client, self.core, self.batch, self.namespace = api.client, api.core, api.batch, api.namespace
        self.tracking = tracking
        self.allow_unpinned = allow_unpinned
        self.store = ConfigMapStore(api.core, api.namespace, call=api.call, write=api.write,
                                    not_found=api.ApiException)
        self.search = SearchTrials(api.core, api.namespace, call=api.call, write=api.write,
                                   not_found=api.ApiException)
        self.followers = Followers(api.batch, api.core, api.namespace)
        self.jobs = JobReconciler(api, store=self.store, source=self.followers, tracking=self._tracking_for,
                                  jobs=JobPolicy(pod_annotations=pod_annotations, search=self.search))

    @property
    def writes(self) -> int:
        """API write requests made, for benchmarks."""
        return self.api.writes

    def _tracking_for(self, state: SweepState) -> TrackingEnv | None:
        """Where a sweep's trials log: this backend's MLflow env, under the parent run the state records."""
        tracking = self.tracking
        if tracking is not None and not tracking.parent_run_id and state.parent_run_id:
            tracking = replace(tracking, parent_run_id=state.parent_run_id)
        return tracking

    # -- state --------------------------------------------------------------------------------------------

    def sweep_of(self, sweep: str) -> Sweep | None:
        """The sweep as submitted (None for an unknown sweep)."""
        try:
            return self.store.load(sweep).sweep
        except SweepNotFound:
            return None

    def parent_run_id(self, sweep: str) -> str | None:
        """The MLflow parent run the sweep's trials log under, as recorded in its state (None: none yet)."""
        try:
            return self.store.load(sweep).parent_run_id
        except SweepNotFound:
            return None

    # -- driving ------------------------------------------------------------------------------------------

    def _submit_impl(self, plan: Plan) -> None:
        sweep = plan.sweep
        try:
            resolve_image(sweep, allow_unpinned=self.allow_unpinned)
        except RenderError as exc:
            raise BackendError(str(exc)) from None
        try:
            existing = self.store.load(sweep.name)
        except SweepNotFound:
            existing = None
        if existing is not None and existing.sweep.to_document() != sweep.to_document():
            raise SweepConflict(f"a sweep named {sweep.name!r} already exists in namespace {self.namespace} with a "
                                f"different spec; `sweep resume {sweep.name}` continues it, `sweep delete` removes it")
        if existing is None:
            try:
                self.store.create(sweep, self.tracking.parent_run_id if self.tracking else None)
            except self.api.ApiException as exc:  # 404: the only answer `call` passes on as it is
                raise BackendError(f"namespace {self.namespace!r} not found on the cluster: create it (`kubectl "
                                   f"create namespace {self.namespace}`) or name another with -n") from exc
        self.jobs.remember(plan)
        self.reconcile(sweep.name)

    def reconcile(self, sweep: str) -> SweepStatus:
        """Observe, record newly finished outcomes, and start the trials the limits allow. Idempotent."""
        return self.jobs.reconcile(self.store.load(sweep))

    def _status_impl(self, sweep: str) -> SweepStatus:
        return self.jobs.status(self.store.load(sweep))

    def _wait_step(self, sweep: str, interval: float) -> SweepStatus:
        changed = self.followers.follow(sweep)
        changed.wait(interval)
        changed.clear()
        status = self.reconcile(sweep)
        if status.done:
            self.followers.unfollow(sweep)
        return status

    def close(self) -> None:
        self.followers.close()

    # -- trials added while the sweep runs (a search's suggestions) ----------------------------------------

    def _add_trials_impl(self, plan: Plan, trials: list[Trial]) -> None:
        sweep = plan.sweep
        try:
            state = self.store.load(sweep.name)
        except SweepNotFound:
            self._submit_impl(plan)
            state = self.store.load(sweep.name)
        if state.sweep.to_document() != sweep.to_document():
            raise SweepConflict(f"a sweep named {sweep.name!r} already exists in namespace {self.namespace} with a "
                                "different spec")
        current = self.jobs.plan_for(state)
        known = {t.id for t in current.trials}
        new = [t for t in trials if t.id not in known]
        if not new:
            return
        self.search.save(sweep.name, self.search.added(sweep.name) + [{"axes": t.axes, "repeat": t.repeat}
                                                                      for t in new])
        self.jobs.remember(replace(current, trials=[*current.trials, *new]))
        self.reconcile(sweep.name)

    def _stop_trial_impl(self, sweep: str, trial: TrialStatus, reason: str) -> None:
        self.jobs.stop(self.store.load(sweep), trial, reason)

    # -- cancel / resume / delete / list / logs ------------------------------------------------------------

    def _cancel_impl(self, sweep: str) -> None:
        self.jobs.cancel(self.store.load(sweep))

    def _resume_impl(self, sweep: str) -> None:
        state = self.store.load(sweep)
        self.jobs.resume(state)
        self.jobs.reconcile(state)

    def _delete_impl(self, sweep: str) -> None:
        self.store.load(sweep)
        self.followers.unfollow(sweep)
        self.jobs.delete(sweep)

    def _list_impl(self) -> list[str]:
        return self.store.names()

    def _logs_impl(self, sweep: str, trial: TrialStatus, follow: bool) -> Iterator[str]:
        return self.jobs.logs(sweep, trial, follow)
