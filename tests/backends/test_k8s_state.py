"""Trial slices (`kubesweep.backends.k8s_state`): entries round-trip, slices stay bounded, and only the slices
whose entries changed are written. The slice kind here keeps objects in a dict: the same code runs against the
API server in the cluster tests (ConfigMaps for the direct backend, TrialSlices for the operator)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kubesweep.backends.base import Phase
from kubesweep.backends.k8s_state import (
    LABEL_SLICE,
    REASON_BYTES,
    SLICE_SIZE,
    SliceKind,
    TrialEntry,
    TrialSlices,
)
from kubesweep.wire.outcomes import Outcome


class DictSlices(SliceKind):
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.applies = 0

    def list(self, namespace: str, sweep: str) -> list[dict[str, Any]]:
        return [o for o in self.objects.values() if o["sweep"] == sweep]

    def body(self, namespace: str, sweep: str, index: int, entries: Mapping[str, str],
             owner: dict[str, Any] | None) -> dict[str, Any]:
        return {"metadata": {"name": f"{sweep}-{index}", "labels": {LABEL_SLICE: str(index)}}, "sweep": sweep,
                "trials": dict(entries)}

    def apply(self, body: dict[str, Any]) -> None:
        self.applies += 1
        self.objects[body["metadata"]["name"]] = json.loads(json.dumps(body))

    def delete(self, namespace: str, name: str) -> None:
        del self.objects[name]

    def entries_of(self, obj: Mapping[str, Any]) -> Mapping[str, str]:
        return obj["trials"]


def test_an_entry_round_trips_and_its_reason_is_bounded() -> None:
    entry = TrialEntry(Phase.FAILED, Outcome.OOM, "exit 3 | CUDA out of memory\nat step 4", 1700000000.4, 1700000009.0,
                       True)
    back = TrialEntry.decode(entry.encode())
    assert back == TrialEntry(Phase.FAILED, Outcome.OOM, "exit 3 | CUDA out of memory at step 4", 1700000000.0,
                              1700000009.0, True)
    assert back.recorded() is not None and TrialEntry(Phase.RUNNING).recorded() is None
    long = TrialEntry(Phase.FAILED, Outcome.FAILED, "é" * 1000, None, None, True).encode()
    assert len(long.encode()) <= REASON_BYTES + 40
    assert TrialEntry.decode(long).reason == "é" * (REASON_BYTES // 2)  # cut on a character boundary


def test_slices_hold_500_trials_each_and_only_changed_slices_are_written() -> None:
    kind = DictSlices()
    slices = TrialSlices(kind, "ns")
    order = {f"t{i}": i for i in range(1200)}
    pending = {tid: TrialEntry(Phase.PENDING) for tid in order}
    assert slices.write("s", pending, order) == 3
    assert sorted(len(o["trials"]) for o in kind.objects.values()) == [200, SLICE_SIZE, SLICE_SIZE]
    assert slices.write("s", pending, order) == 0  # nothing changed: nothing written

    done = TrialEntry(Phase.SUCCEEDED, Outcome.SUCCEEDED, "", 1.0, 2.0, True)
    assert slices.write("s", {"t3": done, "t4": done}, order) == 1  # both in slice 0
    assert slices.write("s", {"t600": done, "t1100": done}, order) == 2
    worst = TrialEntry(Phase.FAILED, Outcome.FAILED, "x" * 10_000, 1e9, 1e9, True)
    slices.write("s", {tid: worst for tid in order}, order)
    assert max(len(json.dumps(o)) for o in kind.objects.values()) < 200 * 1024  # bounded whatever the reasons

    fresh = TrialSlices(kind, "ns").read("s")  # another process reads what was written
    assert len(fresh) == 1200 and fresh["t3"] == TrialEntry.decode(worst.encode())
    assert TrialSlices(kind, "ns").read("other") == {}


def test_replace_removes_entries_left_out() -> None:
    kind = DictSlices()
    slices = TrialSlices(kind, "ns")
    order = {"a": 0, "b": 1, "c": 600}
    done = TrialEntry(Phase.FAILED, Outcome.FAILED, "boom", None, None, True)
    slices.write("s", {"a": done, "b": done, "c": done}, order)
    assert slices.write("s", {"a": done}, order, replace=True) == 2
    assert TrialSlices(kind, "ns").read("s") == {"a": done}
