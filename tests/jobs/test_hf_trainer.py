"""The HF Trainer engine, run as the job command."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from kubesweep.jobs.distributed import Dist
from kubesweep.jobs.flops import ModelShape
from kubesweep.jobs.hf_trainer import Measure
from kubesweep.jobs.metrics import StepClock
from kubesweep.jobs.train import TrainOutcome
from kubesweep.wire.config import JobConfig
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


def test_trainer_batches_are_counted_at_their_own_width_and_warm_up_apart() -> None:
    """Each step's padded tokens and FLOPs are its own batches' (rows x width from the tensor Trainer hands to
    `training_step`, every micro-batch of an accumulated step, times the ranks), paired with that step's time;
    the warm-up step's batches are left out with its time."""
    import torch

    shape = ModelShape(hidden=64, layers=2, intermediate=128, heads=2, labels=2)
    cfg = JobConfig(measure_skip_steps=1, log_every=1000, grad_accum=2)
    out = TrainOutcome(steps=0, target_steps=3, steps_per_epoch=3)
    measure = Measure(cfg, Dist(world_size=2), lambda metrics, step: None, out, StepClock(False),
                      samples_per_step=16, eval_rows=0, shape=shape)
    seen: list[tuple[int, ...]] = []
    step = measure.counting(lambda model, inputs, *rest: seen.append(tuple(inputs["input_ids"].shape)))
    measure.on_train_begin(None, SimpleNamespace(global_step=0), None)
    for widths in ([40, 40], [10, 24], [8, 8]):  # a warm-up step, then two measured ones, two micro-batches each
        for width in widths:
            step(None, {"input_ids": torch.zeros(4, width, dtype=torch.long)}, 4)
        measure.on_step_end(None, None, None)
    measure.collect()
    assert seen == [(4, 40), (4, 40), (4, 10), (4, 24), (4, 8), (4, 8)]
    assert (out.warmup_steps, out.measured_steps, out.measured_samples) == (1, 2, 32)
    assert out.measured_padded_tokens == 2 * 4 * (10 + 24 + 8 + 8)
    assert out.measured_flops == 2 * sum(shape.train_flops(4, w) for w in (10, 24, 8, 8))
    assert out.measured_flops > shape.train_flops(16, 50 / 4) * 2  # not the mean width's: attention is quadratic


@pytest.mark.slow
def test_hf_trainer_with_dynamic_padding_counts_its_padded_batches(sst2: Path, token_cache: Path, tmp_path: Path
                                                                    ) -> None:
    """Dynamic padding pads each batch to its longest sentence: more padded tokens than real ones are counted,
    and no more than the longest sentence's width allows."""
    args = tiny_args(sst2, token_cache, "--engine", "hf-trainer", "--max-steps", "8", "--measure-skip-steps", "2",
                     "--no-eval-every-epoch")
    run = run_job(args, tmp_path)
    assert run.returncode == ExitCode.OK, run.stdout
    train = Results.read(tmp_path / "results.json").train
    assert train is not None and train.measured_steps == 6
    assert train.tokens_per_sample and train.padded_tokens_per_sample and train.measured_flops
    assert train.tokens_per_sample < train.padded_tokens_per_sample <= 64
