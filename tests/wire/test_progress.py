"""The job's step line and its reading back (kubesweep/wire/progress.py)."""

from __future__ import annotations

from kubesweep.wire.progress import StepProgress, last_progress, step_line


def test_the_line_the_job_prints_reads_back() -> None:
    line = step_line(120, 400, 0.3, 0.6931, 2e-5, 8123.4)
    assert line == "step 120/400 epoch 0.30 loss 0.6931 lr 2e-05 8,123 samples/s"
    assert last_progress([line]) == StepProgress(120, 400, 8123.0)
    assert last_progress([step_line(3, 400, 0.01, 0.7, 2e-5, None)]) == StepProgress(3, 400, None)  # warm-up


def test_the_last_step_line_wins_among_other_lines() -> None:
    lines = ["loading model", "step 20/24 epoch 0.83 loss 0.6 lr 1e-05 412 samples/s", "eval epoch 1.00 step 24: "
             "accuracy 0.8", "step 24/24 loss 0.5000", "done"]
    assert last_progress(lines) == StepProgress(24, 24, None)  # HF Trainer's line has no rate
    assert last_progress(["no steps here", "a step 3 of 4"]) is None
    assert StepProgress(30, 24).fraction == 1.0 and StepProgress(1, 0).fraction == 0.0
