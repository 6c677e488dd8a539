"""Who shared a node with a trial while it was measured, what that did to its numbers, and how busy each GPU was.

A trial records its own measured window (`train`/`inference` `measured_from` and `measured_until`, Unix times),
the node it ran on (`environment.node_name`) and its GPUs as NVML names them inside its container (`nvml_uuid`,
`pci_bus_id`). It cannot know who came after it, so its neighbours are read here, from the results of every
trial in view: another trial is a neighbour when its process (start-up included: imports and data loading load
the host too) overlaps the measured window on the same node. A trial whose results lack the window (older
results) is judged by its whole process span.

- `annotate`: each record's `neighbours` (names), None where the trial has no results to judge by;
- `interference`: per cell with repeats both alone and shared, whether the two groups' 95% intervals of
  samples/s are apart (then neighbours moved the number beyond its noise);
- `device_busy`: the busy fraction of each GPU of each node: measured training on that GPU over the sweep's wall.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kubesweep.tracking import intervals
from kubesweep.tracking.busy import environment_gpus, gpu_trials, measured_train_s, node_name, trial_span
from kubesweep.tracking.records import TrialRecord
from kubesweep.wire.flags import finite
from kubesweep.wire.results import Results


def measured_window(results: Results) -> tuple[float, float] | None:
    """The trial's measured steps in Unix seconds; its process span where the results do not say."""
    stats = results.train or results.inference
    if stats is not None:
        start, end = finite(stats.measured_from), finite(stats.measured_until)
        if start is not None and end is not None and end >= start:
            return start, end
    return trial_span(results)





def annotate(records: Iterable[TrialRecord]) -> None:
    """Set each record's `neighbours`: the trials on its node whose processes overlap its measured window."""
    spans: list[tuple[TrialRecord, str, tuple[float, float]]] = []
    judged: list[tuple[TrialRecord, str, tuple[float, float]]] = []
    for record in records:
        res = record.results
        node = node_name(res) if res is not None else None
        span = trial_span(res) if res is not None else None
        window = measured_window(res) if res is not None else None
        if node is None or span is None or window is None:
            record.neighbours = None
            continue
        spans.append((record, node, span))
        judged.append((record, node, window))
    by_node: dict[str, list[tuple[float, float, TrialRecord]]] = {}
    for other, other_node, (s, e) in spans:
        by_node.setdefault(other_node, []).append((s, e, other))
    for node_spans in by_node.values():
        node_spans.sort(key=lambda span: span[0])
    starts = {node: [span[0] for span in node_spans] for node, node_spans in by_node.items()}
    for record, node, (start, end) in judged:
        # only the spans of its node that start before its window ends (sorted by start: one bisect)
        candidates = by_node[node][:bisect.bisect_left(starts[node], end)]
        record.neighbours = sorted(other.name for s, e, other in candidates if other is not record and start < e)


def measured_text(record: TrialRecord) -> str:
    """`alone`, `shared with 3: a, b, c`, or `-` where the trial has no results to judge by."""
    if record.neighbours is None:
        return "-"
    if not record.neighbours:
        return "alone"
    return f"shared with {len(record.neighbours)}: {', '.join(record.neighbours)}"


@dataclass(frozen=True)
class Interference:
    """A cell's samples/s alone and beside neighbours, and whether their 95% intervals are apart."""

    alone: list[float]
    shared: list[float]

    @property
    def apart(self) -> bool:
        a, s = intervals.interval(self.alone), intervals.interval(self.shared)
        return a is not None and s is not None and not a.overlaps(s)

    @property
    def change(self) -> float:
        """Shared over alone, less one (the mean's change beside neighbours)."""
        alone = sum(self.alone) / len(self.alone)
        return sum(self.shared) / len(self.shared) / alone - 1 if alone else 0.0

    def flag(self) -> str | None:
        if not self.apart:
            return None
        return f"neighbours moved samples/s {self.change:+.0%} (shared vs alone, 95% intervals apart)"


def samples_per_s(record: TrialRecord) -> float | None:
    res = record.results
    if res is None or record.outcome != "succeeded":
        return None
    inference = finite(res.inference.samples_per_s) if res.inference is not None else None
    return inference or (finite(res.train.samples_per_s) if res.train is not None else None)


def interference(trials: Iterable[TrialRecord]) -> Interference | None:
    """A cell's repeats split into alone and shared; None unless it has at least one of each."""
    alone: list[float] = []
    shared: list[float] = []
    for trial in trials:
        rate = samples_per_s(trial)
        if rate is None or trial.neighbours is None:
            continue
        (shared if trial.neighbours else alone).append(rate)
    return Interference(alone, shared) if alone and shared else None


def device_busy(records: Iterable[TrialRecord]) -> list[dict[str, Any]]:
    """Each GPU (node, NVML UUID) the trials ran on: its measured training seconds, its trials, and its busy
    fraction over the wall time of all the trials in view (first process start to last results file)."""
    devices: dict[tuple[str, str], dict[str, Any]] = {}
    starts: list[float] = []
    ends: list[float] = []
    for res, span in gpu_trials(records):
        starts.append(span[0])
        ends.append(span[1])
        measured = measured_train_s(res)
        for gpu in environment_gpus(res):
            uuid = gpu.nvml_uuid or gpu.uuid or gpu.index
            key = (str(node_name(res)), str(uuid))
            entry = devices.setdefault(key, {"node": key[0], "uuid": key[1], "pci_bus_id": gpu.pci_bus_id,
                                             "measured_train_s": 0.0, "trials": 0})
            entry["measured_train_s"] += measured
            entry["trials"] += 1
    wall = max(ends) - min(starts) if starts else 0.0
    out = []
    for entry in devices.values():
        entry["measured_train_s"] = round(entry["measured_train_s"], 2)
        entry["wall_s"] = round(wall, 2)
        entry["fraction"] = entry["measured_train_s"] / wall if wall > 0 else None
        out.append(entry)
    return sorted(out, key=lambda e: (e["node"], e["pci_bus_id"] or "", e["uuid"]))


def sharing_rows(records: list[TrialRecord]) -> list[list[str]]:
    """One row per trial judged by `annotate`: trial, node, GPU (PCI bus id), how it was measured, samples/s."""
    rows = []
    for record in sorted(records, key=lambda r: r.name):
        res = record.results
        if res is None or record.neighbours is None:
            continue
        gpus = environment_gpus(res)
        where = ", ".join(str(g.pci_bus_id or g.nvml_uuid or g.index) for g in gpus) or "cpu"
        rate = samples_per_s(record)
        rows.append([record.name, str(node_name(res) or "-"), where, measured_text(record),
                     f"{rate:,.0f}" if rate is not None else "-"])
    return rows


def busy_rows(devices: list[dict[str, Any]]) -> list[list[str]]:
    return [[d["node"], str(d["pci_bus_id"] or "-"), d["uuid"], str(d["trials"]), f"{d['measured_train_s']:,.1f}",
             f"{d['fraction']:.1%}" if d["fraction"] is not None else "-"] for d in devices]
