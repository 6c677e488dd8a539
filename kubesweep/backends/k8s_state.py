"""Where the Kubernetes backend keeps a sweep's state: the `StateStore` interface and its ConfigMap store.

A sweep's state is its spec, whether a cancel was carried out, its MLflow parent run, and one entry per trial:
its outcome once recorded (`final`), which outlives the trial's Job, and (written by the operator, which users
read instead of Jobs) its last seen phase. No object grows with the sweep: the entries live in **trial slices**
of at most `SLICE_SIZE` trials each (the trial's position in the plan decides its slice), every entry bounded
(`REASON_BYTES`), and a slice is written only when one of its entries changed. So a 10,000-trial sweep is 20
slices of at most ~200 KiB, however long it runs, and recording an outcome rewrites one slice, not the sweep.

- `ConfigMapStore` (the backend used directly, `sweep submit --direct`, and search tuners): the spec in the
  ConfigMap `kubesweep-sweep-<sweep>`, the slices in ConfigMaps `kubesweep-sweep-<sweep>-trials-<k>`.
- `kubesweep.operator.store.SweepResourceStore` (the operator): the spec in the Sweep resource, flags in its
  status, the slices in `TrialSlice` resources owned by the Sweep.

The trials a search adds while its sweep runs (its tuner's suggestions) are in one more ConfigMap,
`kubesweep-sweep-<sweep>-search` (`SearchTrials`), read by the backend that drives the search.

Both store slices as a map of trial id → one encoded entry (`TrialEntry.encode`), written by server-side apply:
keys left out of an apply are removed, so forgetting an outcome (`sweep resume`) is an apply too.
"""

from __future__ import annotations

import contextlib
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubesweep.backends.base import BackendError, Phase, SweepNotFound
from kubesweep.manifests import FIELD_MANAGER, LABEL_SWEEP, sweep_labels
from kubesweep.sweep_spec import SpecError, Sweep, parse_sweep
from kubesweep.wire.outcomes import Outcome

SLICE_SIZE = 500
REASON_BYTES = 240  # an entry's reason is cut to this many bytes (UTF-8): a slice's size is bounded
STATE_PREFIX = "kubesweep-sweep-"
SEARCH_SUFFIX = "-search"  # the ConfigMap of the trials a search added while the sweep runs
STATE_COMPONENT = "sweep-state"
SLICE_COMPONENT = "trial-slice"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_SLICE = "kubesweep.io/slice"
APPLY = "application/apply-patch+yaml"


def discard(resp: Any) -> None:
    """Read out and release a response whose body is not wanted (a request made with `_preload_content=False`):
    an unread response keeps its connection out of the pool, and the next request opens a new TLS connection."""
    resp.drain_conn()
    resp.release_conn()


@dataclass
class Recorded:
    """A finished trial's outcome as recorded in the sweep's state."""

    outcome: Outcome
    reason: str = ""
    started_at: float | None = None
    finished_at: float | None = None


@dataclass
class SweepState:
    sweep: Sweep
    outcomes: dict[str, Recorded] = field(default_factory=dict)
    cancelled: bool = False
    parent_run_id: str | None = None


@dataclass(frozen=True)
class TrialEntry:
    """One trial in a slice: its phase, and its outcome; `final` once the outcome is recorded."""

    phase: Phase
    outcome: Outcome | None = None
    reason: str = ""
    started_at: float | None = None
    finished_at: float | None = None
    final: bool = False

    @classmethod
    def of(cls, rec: Recorded) -> TrialEntry:
        return cls(phase_for(rec.outcome), rec.outcome, rec.reason, rec.started_at, rec.finished_at, True)

    def recorded(self) -> Recorded | None:
        if not self.final or self.outcome is None:
            return None
        return Recorded(self.outcome, self.reason, self.started_at, self.finished_at)

    def encode(self) -> str:
        """`phase|outcome|started|finished|final|reason` (epoch seconds; the reason last, it may hold `|`)."""
        reason = clip_reason(self.reason).replace("\n", " ")
        return "|".join([self.phase.value, self.outcome.value if self.outcome else "", _num(self.started_at),
                         _num(self.finished_at), "1" if self.final else "", reason])

    @classmethod
    def decode(cls, text: str) -> TrialEntry:
        phase, outcome, started, finished, final, reason = text.split("|", 5)
        return cls(Phase(phase), Outcome(outcome) if outcome else None, reason,
                   float(started) if started else None, float(finished) if finished else None, final == "1")


def clip_reason(text: str) -> str:
    """A reason cut to `REASON_BYTES` of UTF-8, on a character boundary (what bounds slices and status)."""
    return text.encode()[:REASON_BYTES].decode(errors="ignore")


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.0f}"


def phase_for(outcome: Outcome) -> Phase:
    return {Outcome.SUCCEEDED: Phase.SUCCEEDED, Outcome.CANCELLED: Phase.CANCELLED,
            Outcome.SKIPPED: Phase.SKIPPED, Outcome.STOPPED: Phase.STOPPED}.get(outcome, Phase.FAILED)


# -- slices ------------------------------------------------------------------------------------------------

class SliceKind(ABC):
    """How one kind of object holds a slice (a ConfigMap's `data`, a TrialSlice's `trials`)."""

    @abstractmethod
    def list(self, namespace: str, sweep: str) -> list[dict[str, Any]]: ...

    @abstractmethod
    def body(self, namespace: str, sweep: str, index: int, entries: Mapping[str, str],
             owner: dict[str, Any] | None) -> dict[str, Any]: ...

    @abstractmethod
    def apply(self, body: dict[str, Any]) -> None: ...

    @abstractmethod
    def delete(self, namespace: str, name: str) -> None: ...

    @abstractmethod
    def entries_of(self, obj: Mapping[str, Any]) -> Mapping[str, str]: ...


class TrialSlices:
    """A sweep's trial entries, kept in slices of `SLICE_SIZE` trials. It remembers what each slice holds (as
    last read or written), so `write` sends only the slices whose entries changed."""

    def __init__(self, kind: SliceKind, namespace: str):
        self.kind = kind
        self.namespace = namespace
        self._held: dict[str, dict[int, dict[str, str]]] = {}  # sweep -> slice -> trial id -> encoded entry
        self._decoded: dict[str, dict[str, TrialEntry]] = {}  # sweep -> trial id -> entry, as `_held` holds
        self._recorded: dict[str, dict[str, Recorded]] = {}  # sweep -> the final entries' outcomes, as `_held`

    def read(self, sweep: str) -> dict[str, TrialEntry]:
        """Every entry of the sweep, read from the cluster (and remembered)."""
        held: dict[int, dict[str, str]] = {}
        out: dict[str, TrialEntry] = {}
        for obj in self.kind.list(self.namespace, sweep):
            index = int((obj["metadata"].get("labels") or {}).get(LABEL_SLICE, "0"))
            entries = dict(self.kind.entries_of(obj))
            held[index] = entries
            for tid, text in entries.items():
                try:
                    out[tid] = TrialEntry.decode(text)
                except ValueError as exc:
                    raise BackendError(f"sweep {sweep!r}: trial slice {obj['metadata']['name']} holds an "
                                       f"unreadable entry for {tid}: {exc}") from None
        self._held[sweep] = held
        self._decoded[sweep] = out
        self._recorded.pop(sweep, None)
        return dict(out)

    def held(self, sweep: str) -> dict[str, TrialEntry] | None:
        """The entries as last read or written here (None: never read in this process)."""
        held = self._held.get(sweep)
        if held is None:
            return None
        decoded = self._decoded.get(sweep)
        if decoded is None:
            decoded = self._decoded[sweep] = {tid: TrialEntry.decode(text) for entries in held.values()
                                              for tid, text in entries.items()}
        return dict(decoded)

    def recorded(self, sweep: str) -> dict[str, Recorded] | None:
        """`recorded_in(held(sweep))`, worked out once per change of what is held (a step asks several times;
        the `Recorded` objects are shared: do not modify them)."""
        if sweep not in self._held:
            return None
        cached = self._recorded.get(sweep)
        if cached is None:
            cached = self._recorded[sweep] = recorded_in(self.held(sweep) or {})
        return dict(cached)

    def write(self, sweep: str, entries: Mapping[str, TrialEntry], order: Mapping[str, int],
              owner: dict[str, Any] | None = None, *, replace: bool = False) -> int:
        """Set these entries (trial id → entry; `order`: trial id → position in the plan, which fixes each
        trial's slice). With `replace`, the sweep's entries are exactly these (others are removed). Returns the
        number of slices written."""
        held = self._held.setdefault(sweep, {})
        wanted: dict[int, dict[str, str]] = {}
        for tid, entry in entries.items():
            if tid not in order:
                continue
            index = order[tid] // SLICE_SIZE
            if index not in wanted:
                wanted[index] = {} if replace else dict(held.get(index, {}))
            wanted[index][tid] = entry.encode()
        written = 0
        for index in sorted(set(wanted) | (set(held) if replace else set())):
            new = wanted.get(index, {})
            if new == held.get(index, {}):
                continue
            self.kind.apply(self.kind.body(self.namespace, sweep, index, new, owner))
            held[index] = new
            written += 1
        if written:
            self._decoded.pop(sweep, None)
            self._recorded.pop(sweep, None)
        return written

    def count(self, sweep: str) -> int:
        """How many slices of the sweep exist, as last read or written here."""
        return sum(1 for entries in self._held.get(sweep, {}).values() if entries)

    def forget(self, sweep: str) -> None:
        self._held.pop(sweep, None)
        self._decoded.pop(sweep, None)
        self._recorded.pop(sweep, None)

    def delete(self, sweep: str) -> None:
        for obj in self.kind.list(self.namespace, sweep):
            self.kind.delete(self.namespace, obj["metadata"]["name"])
        self.forget(sweep)


# -- the interface -----------------------------------------------------------------------------------------

class StateStore(ABC):
    """A sweep's state in the cluster. `write` is the backend's write path (every write request goes through
    it: the operator guards and times each one)."""

    #: whether trials' live phases are written to the slices too (the operator's: users read them)
    publishes_phases = False

    @abstractmethod
    def load(self, sweep: str) -> SweepState: ...

    @abstractmethod
    def create(self, sweep: Sweep, parent_run_id: str | None) -> None: ...

    @abstractmethod
    def save(self, state: SweepState, order: Mapping[str, int], *, outcomes: Mapping[str, Recorded] | None = None,
             cancelled: bool | None = None, parent_run_id: str | None = None) -> None:
        """Record outcomes (the complete set: a recorded trial left out is forgotten, to run again), flags."""

    @abstractmethod
    def delete(self, sweep: str) -> None: ...

    @abstractmethod
    def names(self) -> list[str]: ...

    def owner(self, sweep: str) -> dict[str, Any] | None:
        """The ownerReference put on a sweep's Jobs and slices (deleting the owner deletes them)."""
        return None

    @abstractmethod
    def forget(self, sweep: str) -> None:
        """Drop what this process remembers of the sweep."""


def final_entries(outcomes: Mapping[str, Recorded]) -> dict[str, TrialEntry]:
    return {tid: TrialEntry.of(rec) for tid, rec in outcomes.items()}


def recorded_in(entries: Mapping[str, TrialEntry]) -> dict[str, Recorded]:
    out = {}
    for tid, entry in entries.items():
        rec = entry.recorded()
        if rec is not None:
            out[tid] = rec
    return out


class ConfigMapSlices(SliceKind):
    def __init__(self, core: Any, call: Callable[..., Any], write: Callable[..., Any]):
        self.core = core
        self.call = call
        self.write = write

    def list(self, namespace: str, sweep: str) -> list[dict[str, Any]]:
        selector = f"{LABEL_SWEEP}={sweep},{LABEL_COMPONENT}={SLICE_COMPONENT}"
        resp = self.call(self.core.list_namespaced_config_map, namespace, label_selector=selector,
                         _preload_content=False)
        return json.loads(resp.data)["items"]  # type: ignore[no-any-return]

    def body(self, namespace: str, sweep: str, index: int, entries: Mapping[str, str],
             owner: dict[str, Any] | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": f"{STATE_PREFIX}{sweep}-trials-{index}", "namespace": namespace,
                                "labels": {**sweep_labels(sweep), LABEL_COMPONENT: SLICE_COMPONENT,
                                           LABEL_SLICE: str(index)}}
        if owner:
            meta["ownerReferences"] = [owner]
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": dict(entries)}

    def apply(self, body: dict[str, Any]) -> None:
        discard(self.write(self.core.patch_namespaced_config_map, body["metadata"]["name"],
                           body["metadata"]["namespace"], body, field_manager=FIELD_MANAGER, force=True,
                           _content_type=APPLY, _preload_content=False))

    def delete(self, namespace: str, name: str) -> None:
        self.write(self.core.delete_namespaced_config_map, name, namespace)

    def entries_of(self, obj: Mapping[str, Any]) -> Mapping[str, str]:
        return obj.get("data") or {}


class SearchTrials:
    """The trials a search added to a sweep while it runs (its tuner's suggestions): the ConfigMap
    `kubesweep-sweep-<sweep>-search`, a list of {axes, repeat} in the order they were added."""

    def __init__(self, core: Any, namespace: str, *, call: Callable[..., Any], write: Callable[..., Any],
                 not_found: type[Exception]):
        self.core = core
        self.namespace = namespace
        self.call = call
        self.write = write
        self.not_found = not_found

    def name_of(self, sweep: str) -> str:
        return f"{STATE_PREFIX}{sweep}{SEARCH_SUFFIX}"

    def added(self, sweep: str) -> list[dict[str, Any]]:
        try:
            cm = self.call(self.core.read_namespaced_config_map, self.name_of(sweep), self.namespace)
        except self.not_found:
            return []
        added = json.loads((cm.data or {}).get("trials.json", "[]"))
        return added if isinstance(added, list) else []

    def save(self, sweep: str, added: list[dict[str, Any]]) -> None:
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap",
                                "metadata": {"name": self.name_of(sweep), "namespace": self.namespace,
                                             "labels": sweep_labels(sweep)},
                                "data": {"trials.json": json.dumps(added, sort_keys=True)}}
        discard(self.write(self.core.patch_namespaced_config_map, self.name_of(sweep), self.namespace, body,
                           field_manager=FIELD_MANAGER, force=True, _content_type=APPLY, _preload_content=False))

    def delete(self, sweep: str) -> None:
        with contextlib.suppress(self.not_found):  # gone already
            self.write(self.core.delete_namespaced_config_map, self.name_of(sweep), self.namespace)


class ConfigMapStore(StateStore):
    """The spec and flags in the ConfigMap `kubesweep-sweep-<sweep>`, the trial slices in ConfigMaps
    `kubesweep-sweep-<sweep>-trials-<k>`. Every `load` reads both again: any shell may drive the sweep."""

    def __init__(self, core: Any, namespace: str, *, call: Callable[..., Any], write: Callable[..., Any],
                 not_found: type[Exception]):
        self.core = core
        self.namespace = namespace
        self.call = call
        self.write = write
        self.not_found = not_found
        self.slices = TrialSlices(ConfigMapSlices(core, call, write), namespace)

    def name_of(self, sweep: str) -> str:
        return f"{STATE_PREFIX}{sweep}"

    def _read(self, sweep: str) -> tuple[Sweep, dict[str, str]]:
        try:
            cm = self.call(self.core.read_namespaced_config_map, self.name_of(sweep), self.namespace)
        except self.not_found:
            raise SweepNotFound(f"no sweep named {sweep!r} in namespace {self.namespace}") from None
        data = cm.data or {}
        try:
            parsed = parse_sweep(json.loads(data["sweep.json"]), source=f"configmap/{cm.metadata.name}",
                                 allow_unpinned=True)
        except (KeyError, ValueError, SpecError) as exc:
            raise BackendError(f"the state of sweep {sweep!r} is unreadable: {exc}") from None
        return parsed, data

    def load(self, sweep: str) -> SweepState:
        parsed, data = self._read(sweep)
        # kubesweep before trial slices kept every outcome in the state ConfigMap itself: read those too
        legacy = {tid: Recorded(Outcome(v["outcome"]), v.get("reason", ""), v.get("started"), v.get("finished"))
                  for tid, v in json.loads(data.get("outcomes.json", "{}")).items()}
        outcomes = {**legacy, **recorded_in(self.slices.read(sweep))}
        return SweepState(parsed, outcomes, data.get("cancelled") == "true", data.get("parent_run_id") or None)

    def spec_of(self, sweep: str) -> Sweep:
        return self._read(sweep)[0]

    def _save_main(self, sweep: Sweep, *, cancelled: bool, parent_run_id: str | None) -> None:
        data = {"sweep.json": json.dumps(sweep.to_document(), sort_keys=True),
                "cancelled": "true" if cancelled else "false"}
        if parent_run_id:
            data["parent_run_id"] = parent_run_id
        body: dict[str, Any] = {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": self.name_of(sweep.name), "namespace": self.namespace,
                         "labels": {**sweep_labels(sweep.name), LABEL_COMPONENT: STATE_COMPONENT}},
            "data": data}
        discard(self.write(self.core.patch_namespaced_config_map, body["metadata"]["name"], self.namespace, body,
                           field_manager=FIELD_MANAGER, force=True, _content_type=APPLY, _preload_content=False))

    def create(self, sweep: Sweep, parent_run_id: str | None) -> None:
        self._save_main(sweep, cancelled=False, parent_run_id=parent_run_id)

    def save(self, state: SweepState, order: Mapping[str, int], *, outcomes: Mapping[str, Recorded] | None = None,
             cancelled: bool | None = None, parent_run_id: str | None = None) -> None:
        if outcomes is not None:
            self.slices.write(state.sweep.name, final_entries(outcomes), order, replace=True)
            state.outcomes = dict(outcomes)
        if cancelled is not None or parent_run_id:
            state.cancelled = state.cancelled if cancelled is None else cancelled
            state.parent_run_id = parent_run_id or state.parent_run_id
            self._save_main(state.sweep, cancelled=state.cancelled, parent_run_id=state.parent_run_id)

    def delete(self, sweep: str) -> None:
        self.slices.delete(sweep)
        with contextlib.suppress(self.not_found):  # gone already
            self.write(self.core.delete_namespaced_config_map, self.name_of(sweep), self.namespace)

    def names(self) -> list[str]:
        selector = f"{LABEL_COMPONENT}={STATE_COMPONENT}"
        items = self.call(self.core.list_namespaced_config_map, self.namespace, label_selector=selector).items
        return sorted(cm.metadata.labels.get(LABEL_SWEEP, "") for cm in items)

    def forget(self, sweep: str) -> None:
        self.slices.forget(sweep)
