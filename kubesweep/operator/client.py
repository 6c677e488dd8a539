"""What the CLI uses on a cluster with the Sweep CRD: the Sweep resource is the interface, the operator acts.

- `submit` applies the Sweep (server-side apply, field manager `kubesweep-cli`);
- `status`/`wait` read `.status` and the sweep's TrialSlices (both written by the operator), trials in plan
  order;
- `cancel`/`resume` annotate the Sweep (`kubesweep.io/cancel`, `kubesweep.io/resume`) and wait until the
  operator has carried the request out; `delete` deletes the Sweep, and its Jobs go with it;
- `logs` reads the trial's pod log directly;
- trials are added and stopped only by the operator (a search's tuner Job): `add_trials` and `stop_trial` refuse.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kubesweep.backends.base import (
    Backend,
    BackendError,
    Phase,
    SweepConflict,
    SweepNotFound,
    SweepStatus,
    TrialStatus,
)
from kubesweep.backends.k8s_client import Api, unreachable
from kubesweep.backends.k8s_reconcile import trial_log
from kubesweep.backends.k8s_state import TrialEntry, TrialSlices
from kubesweep.crd import CRD_NAME, GROUP, PLURAL, VERSION, SweepStatusBody
from kubesweep.manifests import LABEL_SWEEP, RenderError, resolve_image
from kubesweep.operator.store import (
    ANNOTATION_CANCEL,
    ANNOTATION_RESUME,
    APPLY,
    CLIENT_MANAGER,
    MERGE,
    InvalidSweep,
    TrialSliceKind,
    epoch,
    resource_body,
    sweep_from_resource,
)
from kubesweep.plan import Plan, Trial, plan
from kubesweep.sweep_spec import SpecError, Sweep
from kubesweep.wire.env import TrackingEnv

INSTALL_HINT = ("install the chart (helm install kubesweep charts/kubesweep -n kubesweep --create-namespace, "
                "see docs/operator.md), or pass --direct to run the sweep from this shell without the operator")
OPERATOR_GRACE = 30.0  # seconds without any status before `status` says the operator seems absent


def crd_installed(api_client: Any) -> bool:
    """Whether the API server serves sweeps.kubesweep.io/v1alpha1 (discovery; needs no special rights)."""
    import kubernetes

    try:
        resources = kubernetes.client.CustomObjectsApi(api_client).get_api_resources(GROUP, VERSION)
    except kubernetes.client.exceptions.ApiException as exc:
        if exc.status == 404:
            return False
        raise BackendError(f"cannot ask the API server for {CRD_NAME}: {exc.status} {exc.reason}") from None
    except Exception as exc:
        raise BackendError(unreachable(exc, api_client.configuration.host)) from None
    return any(r.name == PLURAL for r in resources.resources or [])


class SweepClient(Backend):
    """The Kubernetes backend as seen by a user of the operator: it writes only the Sweep resource (and the
    requests on it) and reads the Sweep, its TrialSlices and its trials' pod logs; the operator does everything
    else. Reads need get/list on sweeps and trialslices."""

    name = "kubernetes"
    opens_parent_run = True  # the operator opens the sweep's parent run and records it in the Sweep's status
    driven_by_waiter = False  # the operator drives the sweep; a client that waits only reads it

    def __init__(self, namespace: str | None = None, kubeconfig: str | Path | None = None, *,
                 api_client: Any = None, tracking: TrackingEnv | None = None, allow_unpinned: bool = False,
                 poll: float = 1.0):
        self.api = Api.connect(namespace, kubeconfig, api_client=api_client)
        self.client, self.namespace = self.api.client, self.api.namespace
        self.tracking = tracking
        self.allow_unpinned = allow_unpinned
        self.poll = poll
        self.slices = TrialSlices(TrialSliceKind(self.api.custom, self.api.call, self.api.write), self.namespace)
        self._plans: dict[str, Plan] = {}

    @property
    def writes(self) -> int:
        return self.api.writes

    def close(self) -> None:
        """Nothing to stop: the client holds no watch and no thread."""

    # -- the Sweep resource -------------------------------------------------------------------------------

    def get_resource(self, name: str) -> dict[str, Any]:
        try:
            resp = self.api.call(self.api.custom.get_namespaced_custom_object, GROUP, VERSION, self.namespace,
                                 PLURAL, name, _preload_content=False)
        except self.api.ApiException:  # 404
            raise SweepNotFound(f"no sweep named {name!r} in namespace {self.namespace}") from None
        body: dict[str, Any] = json.loads(resp.data)
        return body

    def _sweep(self, body: dict[str, Any]) -> Sweep:
        try:
            return sweep_from_resource(body, allow_unpinned=self.allow_unpinned)
        except SpecError as exc:
            raise InvalidSweep(str(exc)) from None

    def patch_metadata(self, name: str, metadata: dict[str, Any]) -> None:
        self.api.write(self.api.custom.patch_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL, name,
                       {"metadata": metadata}, field_manager=CLIENT_MANAGER, _content_type=MERGE)

    def sweep_of(self, sweep: str) -> Sweep | None:
        """The sweep as its resource holds it (None: no Sweep of that name)."""
        try:
            return self._sweep(self.get_resource(sweep))
        except SweepNotFound:
            return None

    def parent_run_id(self, sweep: str) -> str | None:
        """The MLflow parent run the operator opened for the sweep (None: none yet, or no such sweep)."""
        try:
            body = self.get_resource(sweep)
        except SweepNotFound:
            return None
        return SweepStatusBody.read(body.get("status")).mlflowParentRunId or None

    def _plan_for(self, sweep: Sweep) -> Plan:
        cached = self._plans.get(sweep.name)
        if cached is None or cached.sweep.to_document() != sweep.to_document():
            # admitted at submission and by the operator: planned without a limit
            cached = self._plans[sweep.name] = plan(sweep, max_trials=None)
        return cached

    # -- submit -----------------------------------------------------------------------------------------

    def _submit_impl(self, plan: Plan) -> None:
        sweep = plan.sweep
        try:
            resolve_image(sweep, allow_unpinned=self.allow_unpinned)
        except RenderError as exc:
            raise BackendError(str(exc)) from None
        body = resource_body(sweep, self.namespace)
        try:
            existing = self.get_resource(sweep.name)
        except SweepNotFound:
            existing = None
        if existing is not None:
            try:
                current = sweep_from_resource(existing, allow_unpinned=True)
            except Exception:
                current = None
            if current is None or current.to_document()["spec"] != sweep.to_document()["spec"]:
                raise SweepConflict(
                    f"a sweep named {sweep.name!r} already exists in namespace {self.namespace} with a different "
                    f"spec; `sweep resume {sweep.name}` continues it, `sweep delete {sweep.name}` removes it")
        self.api.write(self.api.custom.patch_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL,
                       sweep.name, body, field_manager=CLIENT_MANAGER, force=True, _content_type=APPLY)
        self._plans[sweep.name] = plan

    # -- status -----------------------------------------------------------------------------------------

    def _status(self, sweep: str) -> tuple[SweepStatus, dict[str, Any]]:
        """The sweep's status (the resource and its slices, read now) and the resource."""
        body = self.get_resource(sweep)
        try:
            p = self._plan_for(self._sweep(body))
        except InvalidSweep as exc:
            raise BackendError(str(exc)) from None
        entries = self.slices.read(sweep)
        trials = []
        for trial in p.trials:
            e = entries.get(trial.id) or TrialEntry(Phase.PENDING)
            trials.append(TrialStatus(trial.id, trial.name, trial.label(), trial.gpu, e.phase, e.outcome, e.reason,
                                      1 if e.started_at or e.phase != Phase.PENDING else 0, e.started_at,
                                      e.finished_at, axes=trial.axes))
        return SweepStatus(sweep, self.name, trials, message=self._message(body)), body

    def _status_impl(self, sweep: str) -> SweepStatus:
        return self._status(sweep)[0]

    def _message(self, body: dict[str, Any]) -> str:
        status = SweepStatusBody.read(body.get("status"))
        parts = [f"namespace {self.namespace}", f"Sweep {body['metadata']['name']}"]
        if "phase" in status.model_fields_set:  # the operator has written one
            parts.append(f"operator: {status.phase}" + (f" ({status.message})" if status.message else ""))
        else:
            created = epoch(body["metadata"].get("creationTimestamp")) or time.time()
            if time.time() - created > OPERATOR_GRACE:
                parts.append("no status from the operator yet: is it running? "
                             "(kubectl get deploy -A -l app.kubernetes.io/name=kubesweep)")
            else:
                parts.append("waiting for the operator")
        if status.mlflowParentRunId:
            parts.append(f"MLflow parent run {status.mlflowParentRunId}")
        return "; ".join(parts)

    def _wait_step(self, sweep: str, interval: float) -> SweepStatus:
        status, body = self._status(sweep)
        written = SweepStatusBody.read(body.get("status"))
        if written.phase == "Invalid":
            raise BackendError(f"the operator rejected sweep {sweep!r}: {written.message}")
        if not status.done:
            time.sleep(max(interval, self.poll))
        return status

    # -- requests -----------------------------------------------------------------------------------------

    def _await(self, sweep: str, what: str, done: Callable[[SweepStatusBody], bool],
               timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if done(SweepStatusBody.read(self.get_resource(sweep).get("status"))):
                return
            time.sleep(self.poll)
        raise BackendError(f"the operator has not {what} sweep {sweep!r} after {timeout:.0f}s; the request stays "
                           "on the Sweep and is carried out when the operator runs")

    def _cancel_impl(self, sweep: str) -> None:
        self.get_resource(sweep)
        self.patch_metadata(sweep, {"annotations": {ANNOTATION_CANCEL: "true"}})
        self._await(sweep, "cancelled", lambda s: s.cancelled)

    def _resume_impl(self, sweep: str) -> None:
        self.get_resource(sweep)
        request = uuid.uuid4().hex[:12]
        self.patch_metadata(sweep, {"annotations": {ANNOTATION_CANCEL: None, ANNOTATION_RESUME: request}})
        self._await(sweep, "resumed", lambda s: s.resumeHandled == request)

    def _delete_impl(self, sweep: str) -> None:
        self.get_resource(sweep)
        with contextlib.suppress(self.api.ApiException):  # 404: gone already
            # its Jobs and TrialSlices go with it (ownerReferences)
            self.api.write(self.api.custom.delete_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL,
                           sweep, propagation_policy="Background")

    def _add_trials_impl(self, plan: Plan, trials: list[Trial]) -> None:
        raise BackendError(f"sweep {plan.sweep.name!r} is run by the operator, which alone adds trials: a search "
                           "(spec.search) adds them from its tuner Job; to run other settings, submit a sweep "
                           "that names them")

    def _stop_trial_impl(self, sweep: str, trial: TrialStatus, reason: str) -> None:
        raise BackendError(f"sweep {sweep!r} is run by the operator, which alone stops trials (a search's early "
                           f"stopping, from its tuner Job); `sweep cancel {sweep}` stops the whole sweep")

    def _list_impl(self) -> list[str]:
        body = self.api.call(self.api.custom.list_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL)
        return sorted(item["metadata"]["name"] for item in body.get("items", []))

    def _logs_impl(self, sweep: str, trial: TrialStatus, follow: bool) -> Iterator[str]:
        resp = self.api.call(self.api.core.list_namespaced_pod, self.namespace,
                             label_selector=f"{LABEL_SWEEP}={sweep}", _preload_content=False)
        return trial_log(self.api, json.loads(resp.data)["items"], trial, follow)
