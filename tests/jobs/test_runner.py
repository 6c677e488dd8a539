"""Outcomes other than success, and the other tasks/engines.

The cheap cases run `cli.main` (the command's entry point) inside the test process, sparing a torch import;
the command itself runs as a subprocess in the other test modules.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kubesweep.jobs.results import Results
from kubesweep.outcomes import ExitCode
from tests.support.job_fixtures import run_job, run_job_in_process, tiny_args


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


def test_bad_model_path_is_a_one_line_usage_error(sst2: Path, tmp_path: Path) -> None:
    run = run_job(["--model", "./no/such/model", "--dataset", str(sst2)], tmp_path)
    assert run.returncode == ExitCode.USAGE
    assert run.stdout.strip() == "error: model path './no/such/model' does not exist or is not a directory"
    assert not (tmp_path / "results.json").exists()  # rejected before the trial started


def test_invalid_setting_is_a_usage_error(tmp_path: Path) -> None:
    run = run_job(["--precision", "fp8"], tmp_path)
    assert run.returncode == ExitCode.USAGE
    assert "precision" in run.stdout


def test_step_graph_on_cpu_is_a_usage_error(
    sst2: Path, token_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = run_job_in_process(tiny_args(sst2, token_cache, "--step-graph"), tmp_path, monkeypatch)
    assert run.returncode == ExitCode.USAGE
    assert "step_graph needs a CUDA GPU" in run.stdout


def test_inference_benchmark(
    sst2: Path, token_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = tiny_args(
        sst2, token_cache, "--task", "inference", "--batch-size", "8", "--padding", "max_length",
        "--inference-batches", "12", "--warmup-batches", "2", "--precision", "bf16",
    )  # fmt: skip
    run = run_job_in_process(args, tmp_path, monkeypatch)
    assert run.returncode == ExitCode.OK, run.stdout
    inference = Results.read(tmp_path / "results.json").inference
    assert inference is not None
    assert inference.batches == 12 and inference.latency_s.n == 12 and inference.dtype == "bfloat16"
    assert inference.samples_per_s > 0
    assert inference.padded_tokens_per_s == pytest.approx(inference.samples_per_s * 64)


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


def test_cuda_only_attention_kernels_on_cpu_are_a_usage_error(
    sst2: Path, token_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = run_job_in_process(tiny_args(sst2, token_cache, "--sdpa-backend", "efficient"), tmp_path, monkeypatch)
    assert run.returncode == ExitCode.USAGE
    assert "sdpa_backend efficient needs a CUDA GPU" in run.stdout
