"""The operator's `StateStore`: a sweep's state in its Sweep resource and the TrialSlices it owns.

- the spec is the resource's `.spec`, validated by the same model as a spec file (`parse_sweep`);
- `.status` is bounded: phase, counts, progress, the trials that need a look (`attention`), flags (a carried-out
  cancel, the last resume request handled, the MLflow parent run);
- every trial's phase and outcome are in `TrialSlice` resources (`<sweep>-<k>`, at most `SLICE_SIZE` trials each,
  owned by the Sweep, so deleting it deletes them); an entry with `final` is a recorded outcome, which outlives
  the trial's Job;
- each trial Job carries the finalizer `kubesweep.io/outcome` until its outcome is recorded, so a Job deleted
  early (its TTL, or by hand) is still there to be read: the operator records, then removes the finalizer.

The operator is the only writer of status and slices, and only while it holds the Lease, so what it wrote in this
term is what the cluster has: the slices are read once per sweep and term (`remember`), then kept in memory.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from kubesweep.backends.base import BackendError, Phase, SweepNotFound, SweepStatus, TrialStatus
from kubesweep.backends.k8s_state import (
    LABEL_COMPONENT,
    LABEL_SLICE,
    SLICE_COMPONENT,
    Recorded,
    SliceKind,
    StateStore,
    SweepState,
    TrialEntry,
    TrialSlices,
    clip_reason,
    discard,
    recorded_in,
)
from kubesweep.crd import GROUP, KIND, PLURAL, SLICE_KIND, SLICE_PLURAL, VERSION, Counts, SweepStatusBody, TrialNote
from kubesweep.manifests import LABEL_SWEEP, sweep_labels
from kubesweep.sweep_spec import SpecError, Sweep, parse_sweep
from kubesweep.wire.outcomes import Outcome

API_VERSION = f"{GROUP}/{VERSION}"
MERGE = "application/merge-patch+json"
APPLY = "application/apply-patch+yaml"
CLIENT_MANAGER = "kubesweep-cli"
OPERATOR_MANAGER = "kubesweep-operator"
# Requests from `sweep cancel` / `sweep resume`, carried out by the operator (the only writer of status).
ANNOTATION_CANCEL = f"{GROUP}/cancel"
ANNOTATION_RESUME = f"{GROUP}/resume"
# On the operator's trial Jobs until their outcome is recorded (then removed).
FINALIZER_OUTCOME = f"{GROUP}/outcome"
ATTENTION = 10  # trials named in status.attention (failed, OOM, GPU mismatch, unschedulable), newest first


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


def counts_for(status: SweepStatus) -> Counts:
    c = Counts(total=len(status.trials))
    for t in status.trials:
        c.done += t.phase.terminal
        c.running += t.phase == Phase.RUNNING
        c.pending += t.phase == Phase.PENDING
        c.unschedulable += t.phase == Phase.UNSCHEDULABLE or t.outcome == Outcome.UNSCHEDULABLE
        c.succeeded += t.outcome == Outcome.SUCCEEDED
        c.failed += t.outcome == Outcome.FAILED
        c.oom += t.outcome == Outcome.OOM
        c.gpuMismatch += t.outcome == Outcome.GPU_MISMATCH
        c.cancelled += t.outcome == Outcome.CANCELLED
    return c


def attention(status: SweepStatus, limit: int = ATTENTION) -> list[dict[str, Any]]:
    """The trials a person should look at (failed, OOM, GPU mismatch, unschedulable), newest first, at most
    `limit`: `kubectl get sweep -o yaml` shows why a sweep is not green without reading every slice."""
    flagged = [t for t in status.trials if t.phase == Phase.UNSCHEDULABLE
               or t.outcome in (Outcome.FAILED, Outcome.OOM, Outcome.GPU_MISMATCH, Outcome.UNSCHEDULABLE)]
    flagged.sort(key=lambda t: t.finished_at or t.started_at or 0, reverse=True)
    return [TrialNote(name=t.name, phase=t.phase.value, outcome=t.outcome.value if t.outcome else None,
                      reason=clip_reason(t.reason or "") or None
                      ).model_dump(mode="json") for t in flagged[:limit]]


def entry_of(trial: TrialStatus) -> TrialEntry:
    """A trial's live entry in its slice (not final: its outcome is recorded by `save`)."""
    return TrialEntry(trial.phase, trial.outcome, trial.reason, trial.started_at, trial.finished_at)


class TrialSliceKind(SliceKind):
    """Slices as `TrialSlice` resources (`trials`: trial id → entry), applied by the operator."""

    def __init__(self, custom: Any, call: Callable[..., Any], write: Callable[..., Any]):
        self.custom = custom
        self.call = call
        self.write = write

    def list(self, namespace: str, sweep: str) -> list[dict[str, Any]]:
        body = self.call(self.custom.list_namespaced_custom_object, GROUP, VERSION, namespace, SLICE_PLURAL,
                         label_selector=f"{LABEL_SWEEP}={sweep}")
        return body.get("items", [])  # type: ignore[no-any-return]

    def body(self, namespace: str, sweep: str, index: int, entries: Mapping[str, str],
             owner: dict[str, Any] | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": f"{sweep}-{index}", "namespace": namespace,
                                "labels": {**sweep_labels(sweep), LABEL_COMPONENT: SLICE_COMPONENT,
                                           LABEL_SLICE: str(index)}}
        if owner:
            meta["ownerReferences"] = [owner]
        return {"apiVersion": API_VERSION, "kind": SLICE_KIND, "metadata": meta, "sweep": sweep, "slice": index,
                "trials": dict(entries)}

    def apply(self, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        discard(self.write(self.custom.patch_namespaced_custom_object, GROUP, VERSION, meta["namespace"],
                           SLICE_PLURAL, meta["name"], body, field_manager=OPERATOR_MANAGER, force=True,
                           _content_type=APPLY, _preload_content=False))

    def delete(self, namespace: str, name: str) -> None:
        self.write(self.custom.delete_namespaced_custom_object, GROUP, VERSION, namespace, SLICE_PLURAL, name)

    def entries_of(self, obj: Mapping[str, Any]) -> Mapping[str, str]:
        return obj.get("trials") or {}


class SweepResourceStore(StateStore):
    """State in the Sweep resource and its TrialSlices. `remember`: keep the slices read in memory (the
    operator, the only writer while it leads); without, every `load` reads them again (a client)."""

    publishes_phases = True

    def __init__(self, custom: Any, namespace: str, *, call: Callable[..., Any], write: Callable[..., Any],
                 not_found: type[Exception], remember: bool = False, allow_unpinned: bool = False):
        self.custom = custom
        self.namespace = namespace
        self.call = call
        self.write = write
        self.not_found = not_found
        self.remember = remember
        self.allow_unpinned = allow_unpinned
        self.slices = TrialSlices(TrialSliceKind(custom, call, write), namespace)
        self.resources: dict[str, dict[str, Any]] = {}  # the last body read or written, per sweep

    # -- the resource ---------------------------------------------------------------------------------

    def get(self, name: str) -> dict[str, Any]:
        try:
            resp = self.call(self.custom.get_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL, name,
                             _preload_content=False)
        except self.not_found:
            raise self._gone(name) from None
        body: dict[str, Any] = json.loads(resp.data)
        self.resources[name] = body
        return body

    def _gone(self, name: str) -> SweepNotFound:
        return SweepNotFound(f"no sweep named {name!r} in namespace {self.namespace}")

    def patch_status(self, name: str, patch: Mapping[str, Any]) -> None:
        """Merge `patch` into the Sweep's status; SweepNotFound where the Sweep was deleted since it was read."""
        try:
            resp = self.write(self.custom.patch_namespaced_custom_object_status, GROUP, VERSION, self.namespace,
                              PLURAL, name, {"status": dict(patch)}, field_manager=OPERATOR_MANAGER,
                              _content_type=MERGE, _preload_content=False)
        except self.not_found:
            self.resources.pop(name, None)
            raise self._gone(name) from None
        self.resources[name] = json.loads(resp.data)

    def status_of(self, name: str) -> SweepStatusBody:
        """The Sweep's status as last read or written here, typed."""
        return SweepStatusBody.read((self.resources.get(name) or {}).get("status"))

    # -- StateStore --------------------------------------------------------------------------------------

    def entries(self, sweep: str) -> dict[str, TrialEntry]:
        held = self.slices.held(sweep) if self.remember else None
        return held if held is not None else self.slices.read(sweep)

    def recorded(self, sweep: str) -> dict[str, Recorded]:
        """The sweep's recorded outcomes (as remembered, when this store remembers)."""
        held = self.slices.recorded(sweep) if self.remember else None
        return held if held is not None else recorded_in(self.entries(sweep))

    def load(self, sweep: str) -> SweepState:
        body = self.get(sweep)
        try:
            parsed = sweep_from_resource(body, allow_unpinned=self.allow_unpinned)
        except SpecError as exc:
            raise InvalidSweep(str(exc)) from None
        status = SweepStatusBody.read(body.get("status"))
        return SweepState(parsed, self.recorded(sweep), status.cancelled, status.mlflowParentRunId)

    def create(self, sweep: Sweep, parent_run_id: str | None) -> None:
        raise BackendError("a Sweep resource is created by `sweep submit` or `kubectl apply`, not by the operator")

    def save(self, state: SweepState, order: Mapping[str, int], *, outcomes: Mapping[str, Recorded] | None = None,
             cancelled: bool | None = None, parent_run_id: str | None = None) -> None:
        name = state.sweep.name
        if outcomes is not None:
            known, before = self.entries(name), state.outcomes
            # outcomes carried over from the state are the ones its slices hold: only new ones are encoded
            changed = {tid: TrialEntry.of(rec) for tid, rec in outcomes.items() if before.get(tid) is not rec}
            # forgotten (a resume): to be run again
            changed.update({tid: TrialEntry(Phase.PENDING) for tid, e in known.items()
                            if e.final and tid not in outcomes})
            self.slices.write(name, changed, order, self.owner(name))
            state.outcomes = dict(outcomes)
        patch: dict[str, Any] = {}
        if cancelled is not None:
            patch["cancelled"] = state.cancelled = cancelled
        if parent_run_id:
            patch["mlflowParentRunId"] = state.parent_run_id = parent_run_id
        if patch:
            self.patch_status(name, patch)

    def publish(self, sweep: str, trials: list[TrialStatus], order: Mapping[str, int]) -> int:
        """Write the trials' live phases (the slices that changed; recorded outcomes are never overwritten).
        Returns the number of slices written."""
        known = self.entries(sweep)
        live = {t.trial_id: entry_of(t) for t in trials if not (known.get(t.trial_id) or TrialEntry(Phase.PENDING)
                                                                ).final}
        return self.slices.write(sweep, live, order, self.owner(sweep))

    def delete(self, sweep: str) -> None:
        with contextlib.suppress(self.not_found):  # gone already
            self.write(self.custom.delete_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL, sweep,
                       propagation_policy="Background")
        self.forget(sweep)

    def names(self) -> list[str]:
        body = self.call(self.custom.list_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL)
        return sorted(item["metadata"]["name"] for item in body.get("items", []))

    def owner(self, sweep: str) -> dict[str, Any] | None:
        body = self.resources.get(sweep)
        if not body:
            return None
        return {"apiVersion": API_VERSION, "kind": KIND, "name": body["metadata"]["name"],
                "uid": body["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}

    def forget(self, sweep: str) -> None:
        self.resources.pop(sweep, None)
        self.slices.forget(sweep)


MAX_MESSAGE = 4096  # characters of a Sweep's status.message


def clip_message(message: str) -> str:
    """At most MAX_MESSAGE characters: whatever a Sweep makes the operator say, its status stays small."""
    if len(message) <= MAX_MESSAGE:
        return message
    tail = f" ... ({len(message) - MAX_MESSAGE + 40:,} more characters)"
    return message[:MAX_MESSAGE - 40] + tail


def status_view(status: SweepStatus, sweep: Sweep, *, message: str = "", generation: int | None = None,
                slices: int = 0) -> dict[str, Any]:
    """The `.status` of a Sweep for a SweepStatus, JSON-ready and bounded (no per-trial list)."""
    counts = counts_for(status)
    phase = status.phase
    if sweep.spec.suspend and not status.done:
        phase = "Suspended"
    body = SweepStatusBody(phase=phase, message=clip_message(message), progress=f"{counts.done}/{counts.total}",
                           counts=counts, observedGeneration=generation, trialSlices=slices)
    view = body.model_dump(mode="json", include={"phase", "message", "progress", "counts", "observedGeneration",
                                                 "trialSlices"})
    view["attention"] = attention(status)
    return view
