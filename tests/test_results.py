"""`sweep results` per trial: the headline figures read from a results file (docs/results-schema.md), and the rows
the local backend gives for a sweep run with the stand-in job."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from kubesweep.backends.base import Phase, TrialStatus
from kubesweep.backends.local import LocalBackend
from kubesweep.results import ResultRow, row_of
from kubesweep.tracking.aggregate import aggregate
from kubesweep.tracking.records import from_backend, record_from_status
from kubesweep.wire.metrics import GIB
from kubesweep.wire.outcomes import Outcome
from kubesweep.wire.results import Results
from tests.backends.contract import CRASH_LR, make_plan
from tests.support.results_docs import make_results

STAND_IN = Path(__file__).parent / "support" / "stand_in_job.py"


def finished(outcome: Outcome = Outcome.SUCCEEDED, reason: str = "", **axes: Any) -> TrialStatus:
    phase = Phase.SUCCEEDED if outcome == Outcome.SUCCEEDED else Phase.FAILED
    return TrialStatus("id", "t-1", "cell", "h100-80gb", phase, outcome, reason, axes=axes)


def row_from(status: TrialStatus, results: Results | None, trial_file: Path | None = None) -> ResultRow:
    return row_of(record_from_status(status, results, trial_file))


TRAINING = {
    "outcome": "succeeded",
    "config": {"batch_size": 64, "precision": "bf16", "compile": "default"},
    "trial": {"repeat": 2},
    "train": {"samples_per_s": 1500.0, "step_time_s": {"p50": 0.0425}},
    "memory": {"torch_peak_allocated_bytes": 3 * GIB},
    "final_accuracy": 0.912,
    "timings": {"train_s": 120.5, "compile_warmup_s": 30},
}


def test_a_training_trial_gives_rate_step_time_in_ms_memory_in_gib_accuracy_and_timings() -> None:
    row = row_from(finished(reason="ignored on success"), make_results(**TRAINING))
    assert (row.trial, row.gpu, row.batch_size, row.precision, row.compile, row.repeat, row.outcome) == (
        "t-1", "h100-80gb", 64, "bf16", "default", 2, "succeeded")
    m = row.metrics
    assert m["samples_per_s"] == 1500.0 and m["step_p50_ms"] == 42.5 and m["peak_mem_gib"] == 3.0
    assert (m["accuracy"], row.train_s, m["warmup_s"]) == (0.912, 120.5, 30.0)
    assert row.reason == ""


def test_an_inference_trial_gives_its_rate_and_batch_latency() -> None:
    results = make_results(config={"batch_size": 8},
                           inference={"samples_per_s": 1670.0, "latency_s": {"p50": 0.00479}})
    row = row_from(finished(), results)
    m = row.metrics
    assert m["samples_per_s"] == 1670.0 and round(m["step_p50_ms"] or 0, 6) == 4.79
    assert m["accuracy"] is None and m["peak_mem_gib"] is None


def test_a_cpu_trial_row_gives_its_peak_memory_as_the_aggregate_does() -> None:
    """A trial's row and its setting's cell read peak memory by the one definition (`kubesweep.wire.metrics`): a
    CPU trial's is its process's peak RSS, not nothing (the row read the CUDA allocator's peak alone)."""
    cpu = TrialStatus("id", "t-1", "cell", None, Phase.SUCCEEDED, Outcome.SUCCEEDED)
    results = make_results(device="cpu", config={"batch_size": 8}, train={"samples_per_s": 40.0},
                           memory={"host_peak_rss_bytes": 2 * GIB})
    record = record_from_status(cpu, results, None)
    assert row_of(record).metrics["peak_mem_gib"] == 2.0
    (cell,) = aggregate([record])
    assert cell.value("peak_mem_gib") == 2.0


def test_without_a_results_file_the_cell_comes_from_the_trial_file_or_axes_and_the_outcome_from_the_backend(
        tmp_path: Path) -> None:
    oom = finished(Outcome.OOM, "CUDA out of memory", batch_size=512, precision="fp16")
    row = row_from(oom, None)
    assert (row.batch_size, row.precision, row.outcome, row.reason) == (512, "fp16", "oom", "CUDA out of memory")
    assert row.metrics["samples_per_s"] is None and row.repeat == 0
    trial_file = tmp_path / "trial.json"
    trial_file.write_text(json.dumps({"job": {"batch_size": 256, "precision": "bf16", "compile": False}}))
    from_file = row_from(oom, None, trial_file)
    assert (from_file.batch_size, from_file.precision, from_file.compile) == (256, "bf16", False)
    running = TrialStatus("id", "t-2", "cell", None, Phase.RUNNING)
    assert row_from(running, None).outcome == "running"


def test_numbers_that_are_not_finite_or_null_are_left_out() -> None:
    nan = float("nan")
    results = make_results(**{**TRAINING, "train": {"samples_per_s": nan, "step_time_s": {"p50": float("inf")}},
                              "final_accuracy": None})
    row = row_from(finished(), results)
    assert row.metrics["samples_per_s"] is None and row.metrics["step_p50_ms"] is None
    assert row.metrics["accuracy"] is None


def test_rows_of_a_local_sweep_follow_the_plan_with_each_trials_outcome(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path, job_command=[sys.executable, str(STAND_IN)], cpu_slots=4, devices=[])
    p = make_plan("rows", {"batch_size": [8, 256], "learning_rate": [1e-4, CRASH_LR]})
    backend.submit(p)
    backend.wait("rows", timeout=60)
    rows = [row_of(r) for r in from_backend(backend, "rows")]
    assert [r.trial for r in rows] == [t.name for t in p.trials]
    by_cell = {(r.batch_size, t.job.learning_rate): r for r, t in zip(rows, p.trials, strict=True)}
    assert by_cell[8, 1e-4].outcome == "succeeded" and by_cell[8, 1e-4].metrics["samples_per_s"] == 800.0
    assert by_cell[256, 1e-4].outcome == "oom" and by_cell[256, 1e-4].metrics["samples_per_s"] is None
    crashed = by_cell[8, CRASH_LR]  # no results file: the backend's outcome and reason
    assert crashed.outcome == "failed" and crashed.reason and crashed.batch_size == 8
