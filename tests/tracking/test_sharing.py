"""Neighbours on a node, the alone-vs-shared flag and per-GPU busy, from results files as the job writes them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubesweep.tracking import sharing
from kubesweep.tracking.aggregate import aggregate
from kubesweep.tracking.records import TrialRecord
from kubesweep.tracking.report import build
from kubesweep.wire.config import JobConfig
from tests.support.results_docs import make_results

T0 = 1_800_000_000.0


def iso(t: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat()


def trial(name: str, *, start: float, end: float, node: str = "node-a", uuid: str = "GPU-1", rate: float = 1000.0,
          window: tuple[float, float] | None = None, repeat: int = 0, batch: int = 256,
          measured_s: float = 10.0, boot: str | None = None) -> TrialRecord:
    """A GPU trial whose process ran from `start` to `end` (Unix seconds), measured in `window`."""
    w_start, w_end = window or (start + 5, end - 1)
    results: dict[str, Any] = {
        "outcome": "succeeded", "device": "cuda", "world_size": 1, "config": {"batch_size": batch},
        "started_at": iso(start + 2), "finished_at": iso(end), "timings": {"startup_s": 2.0, "total_s": end - start},
        "train": {"samples_per_s": rate, "measured_time_s": measured_s, "measured_from": w_start,
                  "measured_until": w_end},
        "environment": {"node_name": node, "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "nvml_uuid": uuid,
                                                     "pci_bus_id": f"00000000:{uuid[-1]}0:00.0"}]},
    }
    if boot is not None:
        results["environment"]["boot_id"] = boot
    return TrialRecord(trial_id=name, name=name, repeat=repeat, gpu="h100-80gb", gpus=1, outcome="succeeded",
                       job=JobConfig(task="finetune", batch_size=batch, precision="bf16"),
                       results=make_results(**results))


def test_a_neighbour_is_a_trial_on_the_same_node_during_the_measured_window() -> None:
    a = trial("a", start=T0, end=T0 + 60, window=(T0 + 20, T0 + 50))
    during = trial("during", start=T0 + 40, end=T0 + 100, uuid="GPU-2")
    before = trial("before", start=T0 - 30, end=T0 + 15, uuid="GPU-3")  # ended in a's warm-up: not a neighbour
    elsewhere = trial("elsewhere", start=T0, end=T0 + 60, node="node-b")
    sharing.annotate([a, during, before, elsewhere])
    assert a.neighbours == ["during"]
    assert elsewhere.neighbours == []
    assert sharing.measured_text(a) == "shared with 1: during"
    assert sharing.measured_text(elsewhere) == "alone"


def test_two_machines_of_one_hostname_are_not_neighbours() -> None:
    """VMs of one image may all be called `vm`: the kernel's boot id tells them apart (`busy.node_name`)."""
    a = trial("a", start=T0, end=T0 + 60, node="vm", boot="aaaaaaaa-1")
    other_vm = trial("other-vm", start=T0, end=T0 + 60, node="vm", boot="bbbbbbbb-2")
    same_vm = trial("same-vm", start=T0 + 10, end=T0 + 60, node="vm", boot="aaaaaaaa-1", uuid="GPU-2")
    sharing.annotate([a, other_vm, same_vm])
    assert a.neighbours == ["same-vm"] and other_vm.neighbours == []
    assert [row[1] for row in sharing.sharing_rows([a, other_vm])] == ["vm (aaaaaaaa)", "vm (bbbbbbbb)"]


def test_a_trial_without_results_is_not_judged() -> None:
    pending = TrialRecord(trial_id="p", name="p", repeat=0, gpu=None, gpus=1, outcome="pending")
    sharing.annotate([pending])
    assert pending.neighbours is None and sharing.measured_text(pending) == "-"


def test_results_without_a_window_are_judged_by_their_process_span() -> None:
    a = trial("a", start=T0, end=T0 + 60)
    assert a.results is not None and a.results.train is not None
    a.results.train.measured_from = None
    b = trial("b", start=T0 + 1, end=T0 + 4, uuid="GPU-2")  # overlaps a's start-up only
    sharing.annotate([a, b])
    assert a.neighbours == ["b"]


def cell_of(records: list[TrialRecord]) -> Any:
    cells = aggregate(records)
    assert len(cells) == 1
    return cells[0]


def test_a_cell_whose_shared_repeats_differ_beyond_their_intervals_is_flagged() -> None:
    alone = [trial(f"alone-{i}", start=T0 + 100 * i, end=T0 + 100 * i + 60, rate=r, repeat=i)
             for i, r in enumerate((1000.0, 1010.0, 990.0))]
    shared = [trial(f"shared-{i}", start=T0 + 1000, end=T0 + 1060, uuid=f"GPU-{i}", rate=r, repeat=3 + i)
              for i, r in enumerate((800.0, 790.0, 810.0))]
    flags = cell_of(alone + shared).flags
    assert "neighbours moved samples/s -20% (shared vs alone, 95% intervals apart)" in flags


def test_a_cell_whose_shared_repeats_stay_within_the_noise_is_not_flagged() -> None:
    alone = [trial(f"alone-{i}", start=T0 + 100 * i, end=T0 + 100 * i + 60, rate=r, repeat=i)
             for i, r in enumerate((1000.0, 900.0, 1100.0))]
    shared = [trial(f"shared-{i}", start=T0 + 1000, end=T0 + 1060, uuid=f"GPU-{i}", rate=r, repeat=3 + i)
              for i, r in enumerate((980.0, 1050.0, 930.0))]
    assert not any("neighbours" in f for f in cell_of(alone + shared).flags)


def test_busy_is_read_per_gpu_of_each_node() -> None:
    records = [trial("a", start=T0, end=T0 + 100, uuid="GPU-1", measured_s=50.0),
               trial("b", start=T0, end=T0 + 50, uuid="GPU-2", measured_s=20.0),
               trial("c", start=T0 + 50, end=T0 + 100, uuid="GPU-2", measured_s=20.0)]
    busy = {d["uuid"]: d for d in sharing.device_busy(records)}
    assert busy["GPU-1"]["fraction"] == 0.5 and busy["GPU-1"]["trials"] == 1
    assert busy["GPU-2"]["fraction"] == 0.4 and busy["GPU-2"]["trials"] == 2
    assert busy["GPU-2"]["pci_bus_id"] == "00000000:20:00.0"


def test_the_report_says_for_every_trial_whether_it_was_measured_alone(tmp_path: Path) -> None:
    records = [trial("a", start=T0, end=T0 + 60, uuid="GPU-1"), trial("b", start=T0, end=T0 + 60, uuid="GPU-2"),
               trial("c", start=T0 + 100, end=T0 + 160, uuid="GPU-1", batch=512)]
    report = build(aggregate(records), tmp_path, sweep="s", source="files", target=0.8, best_by="samples_per_s")
    tables = {t.title: t for t in report.tables}
    measured = {row[0]: row[3] for row in tables["Measured alone or beside other trials"].rows}
    assert measured == {"a": "shared with 1: b", "b": "shared with 1: a", "c": "alone"}
    busy = tables["GPU busy per device"].rows
    assert [row[2] for row in busy] == ["GPU-1", "GPU-2"]
    assert "Measured alone or beside other trials" in (tmp_path / "report.html").read_text()
