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

import time
import uuid
from typing import Any

from kubesweep.backends.base import BackendError, Phase, SweepConflict, SweepNotFound, SweepStatus, TrialStatus
from kubesweep.backends.k8s_client import import_client, unreachable
from kubesweep.backends.k8s_state import SweepState, TrialEntry
from kubesweep.backends.kubernetes import KubernetesBackend
from kubesweep.crd import CRD_NAME, GROUP, PLURAL, VERSION
from kubesweep.manifests import RenderError, resolve_image
from kubesweep.operator.store import (
    ANNOTATION_CANCEL,
    ANNOTATION_RESUME,
    APPLY,
    CLIENT_MANAGER,
    MERGE,
    InvalidSweep,
    SweepResourceStore,
    epoch,
    resource_body,
    sweep_from_resource,
)
from kubesweep.plan import Plan, Trial

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


class SweepClient(KubernetesBackend):
    """The Kubernetes backend as seen by a user of the operator: it writes only the Sweep resource (and the
    requests on it); the operator does everything else. Reads need get/list on sweeps and trialslices."""

    name = "kubernetes"
    reads_search_trials = False  # a search sweep's trials belong to its tuner Job

    def __init__(self, *args: Any, poll: float = 1.0, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.poll = poll
        self.custom = import_client().client.CustomObjectsApi(self.client)
        self.sweeps = SweepResourceStore(self.custom, self.namespace, call=self._call, write=self._write,
                                         not_found=self.ApiException, allow_unpinned=self.allow_unpinned)
        self.store = self.sweeps

    def get_resource(self, name: str) -> dict[str, Any]:
        return self.sweeps.get(name)

    def patch_metadata(self, name: str, metadata: dict[str, Any]) -> None:
        self._write(self.custom.patch_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL, name,
                    {"metadata": metadata}, field_manager=CLIENT_MANAGER, _content_type=MERGE)

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
        self.writes += 1
        self._call(self.custom.patch_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL, sweep.name,
                   body, field_manager=CLIENT_MANAGER, force=True, _content_type=APPLY)
        self._plans[sweep.name] = plan

    # -- status -----------------------------------------------------------------------------------------

    def _status_impl(self, sweep: str) -> SweepStatus:
        try:
            state = self._load_state(sweep)  # the resource and its slices, read now
        except InvalidSweep as exc:
            raise BackendError(str(exc)) from None
        body = self.sweeps.resources[sweep]
        p = self._plan_for(state)
        entries = self.sweeps.slices.held(sweep) or {}
        trials = []
        for trial in p.trials:
            e = entries.get(trial.id) or TrialEntry(Phase.PENDING)
            trials.append(TrialStatus(trial.id, trial.name, trial.label(), trial.gpu, e.phase, e.outcome, e.reason,
                                      1 if e.started_at or e.phase != Phase.PENDING else 0, e.started_at,
                                      e.finished_at, axes=trial.axes))
        return SweepStatus(sweep, self.name, trials, message=self._message(body))

    def _message(self, body: dict[str, Any]) -> str:
        status = body.get("status") or {}
        parts = [f"namespace {self.namespace}", f"Sweep {body['metadata']['name']}"]
        if status.get("phase"):
            parts.append(f"operator: {status['phase']}" + (f" ({status['message']})" if status.get("message")
                                                           else ""))
        else:
            created = epoch(body["metadata"].get("creationTimestamp")) or time.time()
            if time.time() - created > OPERATOR_GRACE:
                parts.append("no status from the operator yet: is it running? "
                             "(kubectl get deploy -A -l app.kubernetes.io/name=kubesweep)")
            else:
                parts.append("waiting for the operator")
        if status.get("mlflowParentRunId"):
            parts.append(f"MLflow parent run {status['mlflowParentRunId']}")
        return "; ".join(parts)

    def _wait_step(self, sweep: str, interval: float) -> SweepStatus:
        status = self._status_impl(sweep)
        body = self.sweeps.resources.get(sweep) or {}
        if (body.get("status") or {}).get("phase") == "Invalid":
            raise BackendError(f"the operator rejected sweep {sweep!r}: {body['status'].get('message', '')}")
        if not status.done:
            time.sleep(max(interval, self.poll))
        return status

    # -- requests -----------------------------------------------------------------------------------------

    def _await(self, sweep: str, what: str, done: Any, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if done(self.get_resource(sweep).get("status") or {}):
                return
            time.sleep(self.poll)
        raise BackendError(f"the operator has not {what} sweep {sweep!r} after {timeout:.0f}s; the request stays "
                           "on the Sweep and is carried out when the operator runs")

    def _cancel_impl(self, sweep: str) -> None:
        self.get_resource(sweep)
        self.patch_metadata(sweep, {"annotations": {ANNOTATION_CANCEL: "true"}})
        self._await(sweep, "cancelled", lambda s: s.get("cancelled"))

    def _resume_impl(self, sweep: str) -> None:
        self.get_resource(sweep)
        request = uuid.uuid4().hex[:12]
        self.patch_metadata(sweep, {"annotations": {ANNOTATION_CANCEL: None, ANNOTATION_RESUME: request}})
        self._await(sweep, "resumed", lambda s: s.get("resumeHandled") == request)

    def _delete_impl(self, sweep: str) -> None:
        self.get_resource(sweep)
        self.sweeps.delete(sweep)  # its Jobs and TrialSlices go with it (ownerReferences)

    def _add_trials_impl(self, plan: Plan, trials: list[Trial]) -> None:
        raise BackendError(f"sweep {plan.sweep.name!r} is run by the operator, which alone adds trials: a search "
                           "(spec.search) adds them from its tuner Job; to run other settings, submit a sweep "
                           "that names them")

    def _stop_trial_impl(self, sweep: str, trial: TrialStatus, reason: str) -> None:
        raise BackendError(f"sweep {sweep!r} is run by the operator, which alone stops trials (a search's early "
                           f"stopping, from its tuner Job); `sweep cancel {sweep}` stops the whole sweep")

    def reconcile(self, sweep: str) -> SweepStatus:  # the operator reconciles; a client only reads
        return self._status_impl(sweep)

    def _owner(self, state: SweepState) -> dict[str, Any] | None:
        return None
