"""The GEMM probe (kubesweep/jobs/probe.py): its arithmetic on a tiny CPU matmul, and that a CPU trial skips it.
The real probe on a GPU is tests/jobs/test_train_gpu.py's."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kubesweep.jobs import probe  # noqa: E402


def test_a_cpu_trial_does_not_probe() -> None:
    assert not probe.should_probe("cpu")
    assert probe.should_probe("cuda:0") and probe.should_probe("cuda")
    assert probe.probe_trial("bf16", "cpu") == (None, None)


def test_the_probe_counts_2n3_flops_a_matmul_over_its_best_timing() -> None:
    out = probe.gemm_probe("fp32", "cpu", size=64, warmup=1, repeats=3, inner=2)
    assert (out["size"], out["repeats"], out["matmuls_per_repeat"], out["dtype"]) == (64, 3, 2, "float32")
    assert out["tflops_per_s"] == pytest.approx(2 * 2 * 64**3 / out["best_s"] / 1e12)
    assert 0 < out["best_s"] <= out["seconds"]


@pytest.mark.parametrize(("precision", "dtype"), [("bf16", "bfloat16"), ("tf32", "float32")])
def test_the_probe_runs_in_the_trials_precision_and_puts_tf32_back(precision: str, dtype: str) -> None:
    before = torch.backends.cuda.matmul.allow_tf32
    out = probe.gemm_probe(precision, "cpu", size=32, warmup=0, repeats=1, inner=1)
    assert out["dtype"] == dtype and out["precision"] == precision
    assert torch.backends.cuda.matmul.allow_tf32 == before


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine whose CUDA device cannot be used")
def test_a_probe_that_cannot_run_is_a_note_not_a_failure() -> None:
    """Asked for a CUDA device this machine does not have, the probe fails for real: a note, no figure."""
    result, note = probe.probe_trial("bf16", "cuda:0")
    assert result is None and note is not None and note.startswith("GEMM probe not run: ")
