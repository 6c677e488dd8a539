"""A trial's outcomes other than success: what the runner records when the run stops early.

The cases run `cli.main` (the command's entry point) inside the test process, sparing a torch import; the command
itself runs as a subprocess in the other test modules.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kubesweep.wire.outcomes import ExitCode
from kubesweep.wire.results import Results
from tests.support.job_fixtures import run_job_in_process, tiny_args


def test_oom_is_recorded_with_its_settings(
    sst2: Path, token_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test hook raises torch.OutOfMemoryError in the first forward (batch 16 > 8)."""
    run = run_job_in_process(
        tiny_args(sst2, token_cache, "--precision", "bf16"),
        tmp_path,
        monkeypatch,
        env={"KUBESWEEP_TEST_OOM_ABOVE_BATCH": "8"},
    )
    assert run.returncode == ExitCode.OOM
    results = Results.read(tmp_path / "results.json")
    assert results.outcome == "oom" and results.exit_code == 3
    assert results.error is not None and results.error.type == "OutOfMemoryError"
    assert results.config.batch_size == 16 and results.config.precision == "bf16"
    assert results.train is None


def test_gpu_mismatch_stops_before_training(
    sst2: Path, token_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KUBESWEEP_TEST_GPU_NAME stands in for the NVML name of a real GPU (there is none in CI)."""
    run = run_job_in_process(
        [*tiny_args(sst2, token_cache), "--gpu", "h100-80gb", "--gpu-product", "NVIDIA-H100-80GB-HBM3"],
        tmp_path,
        monkeypatch,
        env={"KUBESWEEP_TEST_GPU_NAME": "NVIDIA A100-SXM4-40GB"},
    )
    assert run.returncode == ExitCode.GPU_MISMATCH
    results = Results.read(tmp_path / "results.json")
    assert results.outcome == "gpu_mismatch"
    assert results.error is not None and "NVIDIA-A100-SXM4-40GB" in results.error.message
    assert results.trial.gpu == "h100-80gb"
    assert results.model is None and results.train is None  # nothing was loaded or trained


def test_a_queued_trial_records_its_wait_from_its_jobs_creation_to_its_start(
    sst2: Path, token_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KUBESWEEP_QUEUED_AT (set on a queued trial's Job) 30 s before this process started: a 30 s queue wait."""
    from kubesweep.jobs.runner import process_start_time

    queued_at = process_start_time() - 30.0
    run = run_job_in_process(
        [*tiny_args(sst2, token_cache), "--gpu", "h100-80gb", "--gpu-product", "NVIDIA-H100-80GB-HBM3"],
        tmp_path,
        monkeypatch,
        env={"KUBESWEEP_TEST_GPU_NAME": "NVIDIA A100-SXM4-40GB", "KUBESWEEP_QUEUED_AT": f"{queued_at:.3f}"},
    )
    assert run.returncode == ExitCode.GPU_MISMATCH  # the quickest way through: the timings are written all the same
    wait = Results.read(tmp_path / "results.json").timings.queue_wait_s
    assert wait is not None and abs(wait - 30.0) < 0.01, wait
    monkeypatch.delenv("KUBESWEEP_QUEUED_AT")
    unqueued = tmp_path / "unqueued"
    run_job_in_process([*tiny_args(sst2, token_cache), "--gpu", "h100-80gb", "--gpu-product", "NVIDIA-H100-80GB-HBM3"],
                       unqueued, monkeypatch, env={"KUBESWEEP_TEST_GPU_NAME": "NVIDIA A100-SXM4-40GB"})
    assert Results.read(unqueued / "results.json").timings.queue_wait_s is None


@pytest.mark.parametrize(("in_pod", "checkpoint_every", "said"), [
    (False, None, "stopped by SIGTERM (cancelled, or a search stopped it); the next attempt starts from the beginning"),
    (True, 50, "stopped by SIGTERM (its pod evicted or deleted, or a search stopped it); the next attempt resumes "
               "from its last checkpoint"),
])
def test_a_stopped_trial_says_what_stopped_it_and_where_it_resumes_as_it_is_here(
        monkeypatch: pytest.MonkeyPatch, in_pod: bool, checkpoint_every: int | None, said: str) -> None:
    """A local trial cancelled with no checkpoints is not told of a pod or a checkpoint it does not have."""
    from types import SimpleNamespace

    from kubesweep.jobs.runner import TrialRun
    from kubesweep.wire.config import JobConfig

    if in_pod:
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    else:
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    run = SimpleNamespace(cfg=JobConfig(checkpoint_every=checkpoint_every))
    assert TrialRun._stopped_reason(run) == said  # type: ignore[arg-type]
