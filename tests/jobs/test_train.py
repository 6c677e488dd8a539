"""Fine-tuning a tiny random-init BERT end to end, and exact resume after a crash."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kubesweep.wire.outcomes import ExitCode
from kubesweep.wire.results import Results
from tests.support.job_fixtures import FULL_RUN_ARGS, JobRun, run_job, tiny_args

RESUME_ARGS = FULL_RUN_ARGS


def test_succeeds_with_complete_results(full_run: JobRun) -> None:
    assert full_run.returncode == ExitCode.OK, full_run.stdout
    results = Results.read(full_run.output_dir / "results.json")  # validates against the pydantic schema
    assert results.outcome == "succeeded" and results.exit_code == 0
    assert results.train is not None
    assert results.train.steps == 12
    assert results.train.warmup_steps == 3 and results.train.measured_steps == 9
    assert results.train.samples_per_s and results.train.samples_per_s > 0
    assert results.train.tokens_per_s and results.train.padded_tokens_per_s
    assert results.train.tokens_per_s <= results.train.padded_tokens_per_s
    assert results.train.step_time_s is not None and results.train.step_time_s.n == 9
    # the measured window: from the first measured step (after the 3 warm-up ones) to the last, less the
    # checkpoints at steps 4 and 8 (the one at 12 comes after it), is the measured steps' time
    train = results.train
    assert train.measured_from is not None and train.measured_until is not None and train.measured_pauses
    assert len(train.measured_pauses) == 2
    assert all(train.measured_from < a < b < train.measured_until for a, b in train.measured_pauses)
    paused = sum(b - a for a, b in train.measured_pauses)
    excess = train.measured_until - train.measured_from - paused - train.measured_time_s
    assert -0.05 < excess < max(0.08, train.warmup_time_s / 2), (excess, train.warmup_time_s)
    assert [p.step for p in results.loss_curve] == list(range(1, 13))
    assert results.eval and results.eval[-1].step == 12 and 0 <= results.eval[-1].accuracy <= 1
    assert results.final_accuracy == results.eval[-1].accuracy
    t = results.timings
    for part in (t.startup_s, t.data_s, t.model_s, t.compile_warmup_s, t.train_s, t.eval_s, t.export_s):
        assert part is not None and part >= 0
    assert t.total_s >= t.train_s  # type: ignore[operator]
    assert results.memory.host_peak_rss_bytes and results.memory.host_peak_rss_bytes > 0
    assert results.device == "cpu" and results.world_size == 1
    assert results.environment.packages["torch"]
    assert results.model and results.model["parameters"] < 5_000_000
    # model FLOPs of the measured steps: 3 x (2N per padded token + the head per sample) plus the attention term
    # of each batch's own width (dynamic padding: widths vary, so at least the mean width's, at most 64's)
    from kubesweep.jobs.flops import ModelShape

    shape = ModelShape(hidden=64, layers=2, intermediate=128, heads=2, labels=2)
    assert (results.model["intermediate_size"], results.model["num_attention_heads"]) == (128, 2)
    assert train.measured_flops is not None and train.tflops_per_s is not None and train.padded_tokens_per_s
    assert train.tokens_per_s is not None
    samples, padded = train.measured_samples, train.padded_tokens_per_s * train.measured_time_s
    attention = train.measured_flops - 3 * (2 * shape.matmul_weights * padded + 2 * samples * (64 * 64 + 64 * 2))
    width = padded / samples
    assert 3 * 4 * 2 * 64 * samples * width**2 * 0.999 <= attention <= 3 * 4 * 2 * 64 * samples * 64**2
    assert train.tflops_per_s == pytest.approx(train.measured_flops / train.measured_time_s / 1e12)
    assert train.flops_per_step == pytest.approx(train.measured_flops / train.measured_steps)
    assert train.padded_tokens_per_sample == pytest.approx(width)
    assert train.tokens_per_sample == pytest.approx(train.tokens_per_s * train.measured_time_s / samples)
    assert results.probe is None  # a CPU trial: no GEMM probe
    assert re.search(r"^train: 12 steps in .* samples/s, [\d.]+ TFLOP/s \([\d.]+ padded tokens a sample\)",
                     full_run.stdout, re.M), full_run.stdout
    assert "tracking: off" in full_run.stdout
    # progress from the first step (a warm-up step), then every log_every steps and at the end
    steps = [int(n) for n in re.findall(r"^step (\d+)/12 ", full_run.stdout, re.M)]
    assert steps[0] == 1 and steps[-1] == 12, full_run.stdout


def test_writes_files_and_verified_exports(full_run: JobRun) -> None:
    out = full_run.output_dir
    for name in ("results.json", "environment.json", "trial.json", "loss_curve.png"):
        assert (out / name).is_file(), name
    assert (out / "loss_curve.png").read_bytes()[:4] == b"\x89PNG"
    exports = {e["format"]: e for e in full_run.results["exports"]}
    assert set(exports) == {"weights", "onnx", "torchscript"}
    for record in exports.values():
        assert record["verified"], record
        assert Path(record["path"]).exists()
    assert sorted(Path(p).name for p in full_run.results["checkpoints"]) == ["step-00000008", "step-00000012"]


@pytest.mark.slow
def test_resume_after_crash_gives_identical_weights(
    full_run: JobRun, sst2: Path, token_cache: Path, tmp_path: Path
) -> None:
    """Die after step 6 (checkpoint at 4), restart: the same 12-step weights as the uninterrupted run."""
    safetensors = pytest.importorskip("safetensors.torch")
    args = tiny_args(sst2, token_cache, *RESUME_ARGS)
    crashed = run_job(args, tmp_path, env={"KUBESWEEP_TEST_CRASH_AFTER_STEP": "6"})
    assert crashed.returncode == 137
    assert (tmp_path / "checkpoints" / "step-00000004").is_dir()
    assert not (tmp_path / "results.json").exists()

    resumed = run_job(args, tmp_path)
    assert resumed.returncode == ExitCode.OK, resumed.stdout
    results = resumed.results
    assert results["train"]["resumed_from_step"] == 4
    assert results["train"]["steps"] == 12
    assert [p["step"] for p in results["loss_curve"]] == list(range(1, 13))
    assert [p["loss"] for p in results["loss_curve"]] == [p["loss"] for p in full_run.results["loss_curve"]]

    expected = safetensors.load_file(full_run.output_dir / "export" / "model" / "model.safetensors")
    got = safetensors.load_file(tmp_path / "export" / "model" / "model.safetensors")
    assert expected.keys() == got.keys()
    for name, tensor in expected.items():
        assert (got[name] == tensor).all(), name


def test_warmup_steps_between_measured_ones_are_left_out_of_the_window() -> None:
    """A shape first seen after measuring began (compile, graph capture: a later epoch's last partial batch, a
    bucket not met before) runs warm-up steps inside the measured window: their spans become pauses, so the GPU's
    busy share is read over measured steps alone (a MiniLM run's window held 3.9 s of measured steps in 12.5 s)."""
    from kubesweep.jobs.train import warmup_spans

    # five steps ending at t=100: 1 s, a 2 s and a 3 s warm-up step back to back, 1 s, a 0.5 s warm-up step
    spans = warmup_spans([False, True, True, False, True], [1.0, 2.0, 3.0, 1.0, 0.5], 100.0)
    assert spans == [(93.5, 98.5), (99.5, 100.0)]
    assert warmup_spans([False, False], [1.0, 1.0], 10.0) == []
    assert warmup_spans([], [], 10.0) == []
