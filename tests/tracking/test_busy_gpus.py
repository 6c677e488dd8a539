"""GPU busy of sweeps whose trials hold more than one GPU: a trial's measured time counts once per GPU it held, and
the sweep's GPUs are the distinct devices its trials ran on (at least the widest trial)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from pydantic import ValidationError

from kubesweep.tracking.busy import (
    busy_text,
    environment_gpus,
    gpu_busy,
    gpu_trials,
    measured_train_s,
    node_name,
    trial_span,
)
from kubesweep.tracking.records import TrialRecord
from kubesweep.wire.results import EnvironmentGpu
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


def test_a_trial_without_measured_steps_counts_nothing_and_a_cpu_trial_does_not_hide_the_gpu_ones() -> None:
    untrained = make_results(train=None)
    assert measured_train_s(untrained) == 0.0
    assert measured_train_s(make_results(train={"measured_time_s": float("nan")})) == 0.0
    records = [record("cpu", 0, 10, 5.0, [], device="cpu"), record("gpu", 0, 10, 5.0, ["GPU-a"])]
    assert [span for _, span in gpu_trials(records)] == [(T0, T0 + 10)]  # after a CPU trial, the GPU one


def test_gpus_named_by_index_alone_are_told_apart_and_a_world_of_zero_is_one_gpu() -> None:
    by_index = [record("a", 0, 10, 5.0, ["GPU-x"]), record("b", 0, 10, 5.0, ["GPU-y"])]
    for r, index in zip(by_index, (0, 1), strict=True):
        assert r.results is not None
        r.results.environment.gpus = [EnvironmentGpu(index=index)]
    assert gpu_busy(by_index) == {"fraction": 0.5, "measured_train_s": 10.0, "wall_s": 10.0, "gpus": 2, "trials": 2,
                                  "wall_per_trial_s": 5.0}
    zero = record("z", 0, 10, 5.0, [])
    assert zero.results is not None
    zero.results.world_size = 0  # an old results file: one process
    assert gpu_busy([zero]) == {"fraction": 0.5, "measured_train_s": 5.0, "wall_s": 10.0, "gpus": 1, "trials": 1,
                                "wall_per_trial_s": 10.0}


def test_a_short_sweep_has_an_answer_rounded_to_hundredths() -> None:
    busy = gpu_busy([record("a", 0, 0.5, 0.123456, ["GPU-a"]), record("b", 0.25, 0.753, 0.1, ["GPU-a"])])
    assert busy is not None
    assert (busy["wall_s"], busy["measured_train_s"], busy["wall_per_trial_s"]) == (0.75, 0.22, 0.38)


def test_the_text_names_the_gpus_only_past_one_and_a_full_share_is_a_share() -> None:
    base = {"measured_train_s": 10.0, "wall_s": 10.0, "trials": 1, "wall_per_trial_s": 10.0}
    assert busy_text({**base, "fraction": 1.0}).startswith("GPU busy 100.0%: 10.0 s of measured training in 10.0 s "
                                                           "of sweep wall (1 GPU trials")
    assert " on 2 GPUs " in busy_text({**base, "fraction": 0.5, "gpus": 2})
    assert busy_text({**base, "fraction": 1.5}).startswith("GPU busy not known")
    assert busy_text({**base, "fraction": None}).startswith("GPU busy -: ")


def test_a_trial_with_either_clock_unreadable_has_no_span_and_gpus_are_read_typed() -> None:
    """The environment's GPUs are typed where the results are read: a value of another shape is refused there
    (tests/tracking/test_records.py: one line naming the field), and a field a newer job adds is kept."""
    assert trial_span(make_results(started_at="not a time")) is None
    assert trial_span(make_results(finished_at="not a time")) is None
    (gpu,) = environment_gpus(make_results(environment={"gpus": [{"index": 0, "mig_profile": "1g.10gb"}]}))
    assert (gpu.index, gpu.uuid, gpu.model_extra) == (0, None, {"mig_profile": "1g.10gb"})
    for hostile in (5, [{"index": 0}, "GPU-1"], [{"uuid": 7}]):
        with pytest.raises(ValidationError):
            make_results(environment={"gpus": hostile})
