"""step_graph's CPU-side rules: it refuses to run without CUDA, directly and as the job command.

Its CUDA graphs themselves are tested on a GPU (tests/jobs/test_train_gpu.py); the settings it refuses are
JobConfig's rules (tests/jobs/test_config.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kubesweep.jobs import step_graph
from kubesweep.jobs.errors import UsageError
from kubesweep.wire.outcomes import ExitCode
from tests.support.job_fixtures import run_job_in_process, tiny_args


def test_check_supported_needs_cuda() -> None:
    with pytest.raises(UsageError, match="step_graph needs a CUDA GPU"):
        step_graph.check_supported(cuda=False)
    step_graph.check_supported(cuda=True)


def test_step_graph_on_cpu_is_a_usage_error(
    sst2: Path, token_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = run_job_in_process(tiny_args(sst2, token_cache, "--step-graph"), tmp_path, monkeypatch)
    assert run.returncode == ExitCode.USAGE
    assert "step_graph needs a CUDA GPU" in run.stdout
