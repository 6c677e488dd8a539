"""The operator's notes on trials Kueue evicted (`k8s_reconcile.EvictionNotes`): their MLflow runs tagged with
`kueue.evictions` and `kueue.last_eviction` (Kueue's words), then the count noted on their Jobs
(`kubesweep.io/kueue-evictions`), so a restarted operator tags nothing twice.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

from kubesweep.backends import k8s_kueue
from kubesweep.backends.k8s_client import Api
from kubesweep.backends.k8s_reconcile import Evicted, TrackingFor
from kubesweep.backends.k8s_state import SweepState, discard
from kubesweep.operator.mlflow_rest import MlflowError, MlflowRest

log = logging.getLogger("kubesweep.operator")
TAG_RETRY_S = 30.0  # seconds before MLflow is asked again to tag runs after it failed to


class EvictionTags:
    """Tags the runs of evicted trials through `mlflow(uri)`, writes the notes through `api`."""

    def __init__(self, api: Api, *, tracking: TrackingFor, mlflow: Callable[[str], MlflowRest]):
        self.api = api
        self.tracking = tracking
        self.mlflow = mlflow
        self._noted: dict[str, dict[str, int]] = {}  # sweep -> Job UID -> Kueue evictions noted on it
        self._retry_at: dict[str, float] = {}  # sweep -> when MLflow may be asked again to tag its runs

    def evicted(self, state: SweepState, evicted: Evicted) -> None:
        """Tag the runs of trials evicted since their Jobs last noted it, then note the count on their Jobs. A
        trial evicted before its job made a run has nothing to tag; an MLflow error leaves the notes unwritten,
        tried again `TAG_RETRY_S` later while the trials wait."""
        name, namespace = state.sweep.name, self.api.namespace
        noted = self._noted.setdefault(name, {})
        fresh = {tid: (job, adm) for tid, (job, adm) in evicted.items()
                 if noted.get(job["metadata"].get("uid", ""), 0) < adm.evictions}  # else: the cache is behind
        if not fresh or time.monotonic() < self._retry_at.get(name, 0.0):
            return
        tracking = self.tracking(state)
        if tracking and state.parent_run_id:
            try:
                missing = self.mlflow(tracking.uri).tag_trial_runs(state.parent_run_id, {
                    tid: k8s_kueue.eviction_tags(adm) for tid, (_, adm) in fresh.items()})
            except MlflowError as exc:
                log.warning("sweep %s/%s: %d trial(s) evicted by Kueue; their MLflow runs not tagged (again in "
                            "%.0f s): %s", namespace, name, len(fresh), TAG_RETRY_S, exc)
                self._retry_at[name] = time.monotonic() + TAG_RETRY_S
                return
            if missing:
                log.info("sweep %s/%s: evicted by Kueue before making an MLflow run: %s", namespace, name,
                         ", ".join(sorted(missing)))
        for job, adm in fresh.values():
            with contextlib.suppress(self.api.ApiException):  # 404: gone meanwhile
                discard(self.api.write(self.api.batch.patch_namespaced_job, job["metadata"]["name"], namespace,
                                       {"metadata": {"annotations": {k8s_kueue.EVICTIONS_NOTED: str(adm.evictions)}}},
                                       _preload_content=False))
            noted[job["metadata"].get("uid", "")] = adm.evictions

    def forget(self, sweep: str) -> None:
        self._noted.pop(sweep, None)
        self._retry_at.pop(sweep, None)
