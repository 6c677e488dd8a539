"""GPU busy of sweeps whose trials hold more than one GPU: a trial's measured time counts once per GPU it held, and
the sweep's GPUs are the distinct devices its trials ran on (at least the widest trial)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from kubesweep.tracking.busy import gpu_busy, gpu_trials, node_name, trial_span
from kubesweep.tracking.records import TrialRecord
from tests.support.results_docs import make_results

T0 = 1_800_000_000.0


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(T0 + t, dt.UTC).isoformat()


def record(name: str, start: float, end: float, measured: float, gpus: list[str], *, world: int | None = None,
           node: str = "n1", startup: float = 0.0, device: str = "cuda") -> TrialRecord:
    env: dict[str, Any] = {"node_name": node, "gpus": [{"uuid": u, "index": i} for i, u in enumerate(gpus)]}
    res = make_results(device=device, world_size=world or max(len(gpus), 1), started_at=_iso(start),
                       finished_at=_iso(end), timings={"startup_s": startup}, train={"measured_time_s": measured},
                       environment=env)
    return TrialRecord(name, name, 0, "h100-80gb", world or len(gpus), "succeeded", results=res)


def test_a_two_gpu_trial_counts_its_measured_time_on_both_gpus() -> None:
    records = [record("wide", 0, 100, 50.0, ["GPU-a", "GPU-b"]), record("narrow", 0, 100, 40.0, ["GPU-c"])]
    busy = gpu_busy(records)
    assert busy is not None
    assert (busy["gpus"], busy["trials"], busy["wall_s"]) == (3, 2, 100.0)
    assert busy["measured_train_s"] == 140.0  # 50 s on two GPUs and 40 s on one
    assert busy["fraction"] == pytest.approx(140.0 / 300.0)
    assert busy["wall_per_trial_s"] == 50.0


def test_the_widest_trial_sets_the_gpus_when_the_results_name_fewer() -> None:
    # a 4-GPU trial whose environment names one device (NVML saw one inside its container): still four GPUs
    busy = gpu_busy([record("four", 10, 60, 25.0, ["GPU-a"], world=4)])
    assert busy is not None
    assert busy["gpus"] == 4 and busy["measured_train_s"] == 100.0
    assert busy["fraction"] == pytest.approx(100.0 / (50.0 * 4))


def test_the_same_gpu_on_two_nodes_is_two_gpus_and_on_one_node_is_one() -> None:
    one_node = [record("a", 0, 10, 5.0, ["GPU-0"]), record("b", 10, 20, 5.0, ["GPU-0"])]
    two_nodes = [record("a", 0, 10, 5.0, ["GPU-0"], node="n1"), record("b", 10, 20, 5.0, ["GPU-0"], node="n2")]
    assert gpu_busy(one_node)["gpus"] == 1  # type: ignore[index]
    assert gpu_busy(two_nodes)["gpus"] == 2  # type: ignore[index]


def test_the_wall_runs_from_the_first_process_start_to_the_last_results_file() -> None:
    # the process started its start-up (5 s) before the job's start; a CPU trial is no GPU's time
    records = [record("a", 20, 50, 10.0, ["GPU-a"], startup=5.0), record("b", 40, 90, 10.0, ["GPU-a"]),
               record("cpu", 0, 200, 100.0, [], device="cpu")]
    busy = gpu_busy(records)
    assert busy is not None
    assert busy["wall_s"] == 75.0 and busy["trials"] == 2 and busy["measured_train_s"] == 20.0
    assert trial_span(records[0].results) == (T0 + 15.0, T0 + 50.0)  # type: ignore[arg-type]
    assert [r.trial.name for r, _ in gpu_trials(records)] == ["t", "t"]
    assert gpu_busy([records[2]]) is None  # no GPU trial: no answer


def test_a_node_is_named_with_its_boot_id_where_the_job_recorded_it() -> None:
    res = make_results(environment={"node_name": "vm", "boot_id": "5275ba46-1111-2222"})
    assert node_name(res) == "vm (5275ba46)"
    assert node_name(make_results(environment={"node_name": "vm"})) == "vm"
    assert node_name(make_results()) is None
