"""The Kubernetes backend with its state in the Sweep custom resource instead of a ConfigMap.

- the spec is the resource's `.spec`, validated by the same model as a spec file (`parse_sweep`);
- recorded outcomes are `.status.trials[<id>]` entries with `final: true` (they outlive the Jobs' TTL);
- a carried-out cancel is `.status.cancelled`, the MLflow parent run `.status.mlflowParentRunId`;
- the trials' Jobs are owned by the Sweep (`ownerReferences`), so deleting it deletes them;
- each trial Job carries the finalizer `kubesweep.io/outcome` until its outcome is recorded, so a Job deleted
  early (its TTL, or by hand) is still there to be read: the operator records, then removes the finalizer.

Everything else (which Jobs exist, their pods, their outcomes) is read from the cluster on every step, so a
process that dies at any point loses nothing: the next one observes the same Jobs and writes the same status.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from kubesweep.backends.base import BackendError, SweepNotFound, SweepStatus
from kubesweep.backends.kubernetes import KubernetesBackend, Recorded, SweepState, _api_error, _import_client
from kubesweep.crd import GROUP, KIND, PLURAL, VERSION, Counts, SweepStatusBody, TrialState
from kubesweep.outcomes import Outcome
from kubesweep.spec import SpecError, Sweep, parse_sweep

API_VERSION = f"{GROUP}/{VERSION}"
MERGE = "application/merge-patch+json"
APPLY = "application/apply-patch+yaml"
CLIENT_MANAGER = "kubesweep-cli"
OPERATOR_MANAGER = "kubesweep-operator"
# Requests from `sweep cancel` / `sweep resume`, carried out by the operator (the only writer of status).
ANNOTATION_CANCEL = f"{GROUP}/cancel"
ANNOTATION_RESUME = f"{GROUP}/resume"
# On the operator's trial Jobs until their outcome is recorded in the Sweep's status (then removed).
FINALIZER_OUTCOME = f"{GROUP}/outcome"


class InvalidSweep(BackendError):
    """The resource's spec does not validate against the model (the CRD cannot check everything, e.g. GPU
    names against the catalog)."""


def rfc3339(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if ts is not None else None


def epoch(value: str | None) -> float | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else None


def resource_body(sweep: Sweep, namespace: str) -> dict[str, Any]:
    """The Sweep resource for a validated spec: the spec with every default resolved, nulls left out."""
    document = sweep.model_dump(mode="json", by_alias=True, exclude_none=True)
    metadata: dict[str, Any] = {"name": sweep.name, "namespace": namespace}
    if sweep.metadata.labels:
        metadata["labels"] = dict(sweep.metadata.labels)
    if sweep.metadata.annotations:
        metadata["annotations"] = dict(sweep.metadata.annotations)
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": document["spec"]}


def sweep_from_resource(body: Mapping[str, Any], *, allow_unpinned: bool = False) -> Sweep:
    """The `Sweep` a resource holds; raises `SpecError` (naming the resource) when it does not validate."""
    meta = body.get("metadata", {})
    source = f"sweeps.{GROUP}/{meta.get('name')} in namespace {meta.get('namespace')}"
    document = {"apiVersion": body.get("apiVersion", API_VERSION), "kind": body.get("kind", KIND),
                "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace")},
                "spec": body.get("spec") or {}}
    return parse_sweep(document, source=source, allow_unpinned=allow_unpinned)


def recorded_outcomes(status: Mapping[str, Any]) -> dict[str, Recorded]:
    """The outcomes a Sweep's status has recorded (its `final` trial entries)."""
    outcomes = {}
    for tid, entry in (status.get("trials") or {}).items():
        if entry.get("final") and entry.get("outcome"):
            outcomes[tid] = Recorded(Outcome(entry["outcome"]), entry.get("reason") or "",
                                     epoch(entry.get("startedAt")), epoch(entry.get("finishedAt")))
    return outcomes


def counts_for(status: SweepStatus) -> Counts:
    from kubesweep.backends.base import Phase

    c = Counts(total=len(status.trials))
    for t in status.trials:
        c.done += t.phase.terminal
        c.running += t.phase == Phase.RUNNING
        c.pending += t.phase == Phase.PENDING
        c.unschedulable += t.phase == Phase.UNSCHEDULABLE
        c.succeeded += t.outcome == Outcome.SUCCEEDED
        c.failed += t.outcome == Outcome.FAILED
        c.oom += t.outcome == Outcome.OOM
        c.gpuMismatch += t.outcome == Outcome.GPU_MISMATCH
        c.cancelled += t.outcome == Outcome.CANCELLED
    return c


class SweepStore(KubernetesBackend):
    """`KubernetesBackend` whose `_load_state`/`_save_state` read and write the Sweep resource."""

    reads_search_trials = False  # a search sweep's trials belong to its tuner Job

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        k8s = _import_client()
        self.custom = k8s.client.CustomObjectsApi(self.client)
        self._resources: dict[str, dict[str, Any]] = {}  # the last body read, per sweep

    # -- the resource ---------------------------------------------------------------------------------

    def get_resource(self, name: str) -> dict[str, Any]:
        try:
            resp = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name,
                                                            _preload_content=False)
        except self.ApiException as exc:
            if exc.status == 404:
                raise SweepNotFound(f"no sweep named {name!r} in namespace {self.namespace}") from None
            raise BackendError(_api_error(exc)) from None
        except Exception as exc:
            raise BackendError(f"cannot reach the Kubernetes API: {exc}") from None
        body: dict[str, Any] = json.loads(resp.data)
        self._resources[name] = body
        return body

    def patch_status(self, name: str, patch: Mapping[str, Any]) -> None:
        self._write(self.custom.patch_namespaced_custom_object_status, GROUP, VERSION, self.namespace, PLURAL,
                    name, {"status": dict(patch)}, field_manager=OPERATOR_MANAGER, _content_type=MERGE)

    def patch_metadata(self, name: str, metadata: Mapping[str, Any]) -> None:
        self._write(self.custom.patch_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL, name,
                    {"metadata": dict(metadata)}, field_manager=CLIENT_MANAGER, _content_type=MERGE)

    # -- the backend's state hooks ----------------------------------------------------------------------

    def _load_state(self, sweep: str) -> SweepState:
        body = self.get_resource(sweep)
        try:
            parsed = sweep_from_resource(body, allow_unpinned=self.allow_unpinned)
        except SpecError as exc:
            raise InvalidSweep(str(exc)) from None
        status = body.get("status") or {}
        return SweepState(parsed, recorded_outcomes(status), bool(status.get("cancelled")),
                          status.get("mlflowParentRunId"))

    def _save_state(self, sweep: Sweep, *, outcomes: Mapping[str, Recorded] | None = None,
                    cancelled: bool | None = None, parent_run_id: str | None = None) -> None:
        patch: dict[str, Any] = {}
        if outcomes is not None:
            current = ((self._resources.get(sweep.name) or {}).get("status") or {}).get("trials") or {}
            trials = self._plan_for(SweepState(sweep)).by_id()
            entries: dict[str, Any] = {}
            for tid, rec in outcomes.items():
                if tid in trials:
                    entries[tid] = {"name": trials[tid].name, "final": True, "outcome": rec.outcome.value,
                                    "reason": rec.reason or None, "startedAt": rfc3339(rec.started_at),
                                    "finishedAt": rfc3339(rec.finished_at)}
            for tid, entry in current.items():
                if entry.get("final") and tid not in outcomes:  # forgotten by resume: to be run again
                    entries[tid] = {"final": False, "outcome": None, "reason": None, "phase": "Pending",
                                    "finishedAt": None}
            if entries:
                patch["trials"] = entries
        if cancelled is not None:
            patch["cancelled"] = cancelled
        if parent_run_id:
            patch["mlflowParentRunId"] = parent_run_id
        if patch:
            self.patch_status(sweep.name, patch)
            status = self._resources.setdefault(sweep.name, {}).setdefault("status", {}) or {}
            for key, value in patch.items():
                if key == "trials":
                    trials_now = status.setdefault("trials", {})
                    for tid, entry in value.items():
                        trials_now[tid] = {**trials_now.get(tid, {}), **entry}
                else:
                    status[key] = value

    def _owner(self, state: SweepState) -> dict[str, Any] | None:
        body = self._resources.get(state.sweep.name)
        if not body:
            return None
        return {"apiVersion": API_VERSION, "kind": KIND, "name": body["metadata"]["name"],
                "uid": body["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}

    def _list_impl(self) -> list[str]:
        body = self._call(self.custom.list_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL)
        return sorted(item["metadata"]["name"] for item in body.get("items", []))

    # -- status ----------------------------------------------------------------------------------------

    @staticmethod
    def status_view(status: SweepStatus, sweep: Sweep, *, message: str = "",
                    generation: int | None = None) -> dict[str, Any]:
        """The `.status` view of a SweepStatus, JSON-ready. It leaves out each trial's `final` flag, which only
        `_save_state` writes, so a merge patch of the view never unrecords an outcome."""
        counts = counts_for(status)
        phase = status.phase
        if sweep.spec.suspend and not status.done:
            phase = "Suspended"
        trials = {
            t.trial_id: TrialState(name=t.name, cell=t.label, gpu=t.gpu, phase=t.phase.value,
                                   outcome=t.outcome.value if t.outcome else None, reason=t.reason or None,
                                   startedAt=rfc3339(t.started_at), finishedAt=rfc3339(t.finished_at),
                                   ).model_dump(mode="json", exclude={"final"})
            for t in status.trials
        }
        body = SweepStatusBody(phase=phase, message=message, progress=f"{counts.done}/{counts.total}",
                               counts=counts, observedGeneration=generation)
        view = body.model_dump(mode="json", include={"phase", "message", "progress", "counts",
                                                     "observedGeneration"})
        view["trials"] = trials
        return view
