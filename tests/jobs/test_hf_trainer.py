"""The HF Trainer engine, run as the job command."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubesweep.wire.outcomes import ExitCode
from kubesweep.wire.results import Results
from tests.support.job_fixtures import run_job, tiny_args


@pytest.mark.slow
def test_hf_trainer_engine(sst2: Path, token_cache: Path, tmp_path: Path) -> None:
    args = tiny_args(sst2, token_cache, "--engine", "hf-trainer", "--epochs", "1", "--padding", "max_length")
    run = run_job(args, tmp_path)
    assert run.returncode == ExitCode.OK, run.stdout
    results = Results.read(tmp_path / "results.json")
    assert results.train is not None and results.train.steps == 32  # 512 rows / 16
    assert results.train.samples_per_s and results.train.measured_steps == 29
    assert results.eval and results.eval[-1].step == 32
    assert results.loss_curve and results.loss_curve[-1].step == 32
