"""Two processes under torchrun, DDP over gloo on the CPU."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kubesweep.wire.outcomes import ExitCode
from kubesweep.wire.results import Results
from tests.support.job_fixtures import run_job, tiny_args


@pytest.mark.slow
def test_two_process_gloo_ddp(sst2: Path, token_cache: Path, tmp_path: Path) -> None:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m"]
    run = run_job(
        tiny_args(sst2, token_cache, "--max-steps", "8"),
        tmp_path,
        launcher=launcher,
        env={"OMP_NUM_THREADS": "1"},
    )
    assert run.returncode == ExitCode.OK, run.stdout
    results = Results.read(tmp_path / "results.json")
    assert results.world_size == 2 and results.outcome == "succeeded"
    assert results.train is not None and results.train.steps == 8
    assert results.train.samples == 8 * 16 * 2  # both ranks' batches
    assert results.eval[-1].samples == 128  # the dev rows split over the ranks, each counted once
    assert results.environment.world_size == 2
