"""`engine: hf-trainer`: the same trial through Hugging Face's Trainer, the peer baseline.

Same model, tokenized data, batch size, precision, compile mode, learning rate, schedule (linear, warm-up),
weight decay, clipping, workers and seed; the optimizer is Trainer's `adamw_torch_fused`. Padding maps to
Trainer's usual recipes: `max_length` pre-pads every row (run_glue), `dynamic` uses DataCollatorWithPadding,
`bucketed` adds the length-grouped sampler and pads to a multiple of `bucket_multiple`.

Measured the way the kubesweep engine measures: a StepClock mark at every `on_step_end` (CUDA events, no
extra syncs), evaluation excluded, the first `measure_skip_steps` steps as warm-up. Padded tokens and model FLOPs
are each batch's own, read from its shape as Trainer hands it to `training_step` (no sync); real tokens are the
measured samples times the mean sentence length, since counting a batch's would read its mask on the GPU.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from transformers import (
    DataCollatorWithPadding,
    PrinterCallback,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from kubesweep.jobs import runtime
from kubesweep.jobs.data import TokenizedSplit
from kubesweep.jobs.distributed import Dist
from kubesweep.jobs.flops import ModelShape
from kubesweep.jobs.metrics import StepClock
from kubesweep.jobs.model import LoadedModel
from kubesweep.jobs.train import MetricSink, TrainOutcome
from kubesweep.wire.config import JobConfig


class RowDataset:
    """Rows as Trainer features; pre-padded to max_seq_len for `max_length`, unpadded otherwise."""

    def __init__(self, split: TokenizedSplit, pad_to: int | None) -> None:
        self.split = split
        self.pad_to = pad_to

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, i: int) -> dict[str, Any]:
        start, end = int(self.split.offsets[i]), int(self.split.offsets[i + 1])
        ids = self.split.ids[start:end].tolist()
        mask = [1] * len(ids)
        if self.pad_to is not None:
            extra = self.pad_to - len(ids)
            ids, mask = ids + [0] * extra, mask + [0] * extra
        return {"input_ids": ids, "attention_mask": mask, "labels": int(self.split.labels[i])}


class Measure(TrainerCallback):  # type: ignore[misc]  # transformers ships no type information
    """Trainer's events into the outcome: a StepClock mark per step, warm-up and measured steps (read every
    `log_every` steps and at each evaluation) with their batches' padded tokens and FLOPs (`counting`),
    evaluation points and the loss curve, each logged to the sink."""

    def __init__(
        self,
        cfg: JobConfig,
        dist: Dist,
        sink: MetricSink,
        out: TrainOutcome,
        clock: StepClock,
        *,
        samples_per_step: int,
        eval_rows: int,
        shape: ModelShape | None,
    ) -> None:
        self.cfg = cfg
        self.dist = dist
        self.sink = sink
        self.out = out
        self.clock = clock
        self.samples_per_step = samples_per_step
        self.eval_rows = eval_rows
        self.shape = shape
        self.steps_this_run = 0
        self.batch_padded, self.batch_flops = 0, 0.0  # the batches of the step under way
        self.step_figures: deque[tuple[int, float]] = deque()  # steps ended, not yet read: padded tokens, FLOPs
        out.measured_flops = 0.0 if shape is not None else None

    def counting(self, training_step: Callable[..., Any]) -> Callable[..., Any]:
        """Trainer's `training_step`, first counting its batch: rows x padded width (the tensor's shape, no
        sync) and their FLOPs, times the ranks (each runs a batch of its own)."""

        def counted(model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            rows, width = (int(n) for n in inputs["input_ids"].shape)
            ranks = self.dist.world_size
            self.batch_padded += rows * width * ranks
            if self.shape is not None:
                self.batch_flops += self.shape.train_flops(rows, width) * ranks
            return training_step(model, inputs, *args, **kwargs)

        return counted

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.out.resumed_from_step = state.global_step or None
        self.clock.mark()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.clock.mark()
        self.step_figures.append((self.batch_padded, self.batch_flops))
        self.batch_padded, self.batch_flops = 0, 0.0
        self.steps_this_run += 1
        if self.steps_this_run % self.cfg.log_every == 0:
            self.collect()

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any) -> None:
        out = self.out
        self.collect()
        self.clock.reset()
        self.clock.mark()
        if metrics and "eval_accuracy" in metrics:
            point = {
                "epoch": round(state.global_step / out.steps_per_epoch, 4),
                "step": state.global_step,
                "accuracy": float(metrics["eval_accuracy"]),
                "loss": float(metrics["eval_loss"]),
                "samples": self.eval_rows,
            }
            out.eval_points.append(point)
            out.eval_s += float(metrics.get("eval_runtime", 0.0))
            self.sink({"eval/accuracy": point["accuracy"], "eval/loss": point["loss"]}, state.global_step)
            if self.dist.is_main:
                print(
                    f"eval epoch {point['epoch']:.2f} step {point['step']}: accuracy {point['accuracy']:.4f}",
                    flush=True,
                )

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if logs and "loss" in logs:
            point = {
                "step": state.global_step,
                "loss": float(logs["loss"]),
                "learning_rate": float(logs.get("learning_rate", 0.0)),
            }
            self.out.loss_curve.append(point)
            self.sink(
                {"train/loss": point["loss"], "train/learning_rate": point["learning_rate"]},
                state.global_step,
            )
            if self.dist.is_main:
                print(f"step {state.global_step}/{self.out.target_steps} loss {point['loss']:.4f}", flush=True)

    def collect(self) -> None:
        """Read the step times marked so far into the outcome: the first `measure_skip_steps` are warm-up."""
        out, samples_per_step = self.out, self.samples_per_step
        for dt_s in self.clock.drain():
            padded, flops = self.step_figures.popleft()  # the step whose end closed this interval
            out.samples += samples_per_step
            if out.warmup_steps + out.measured_steps < self.cfg.measure_skip_steps:
                out.warmup_steps += 1
                out.warmup_time_s += dt_s
                continue
            out.measured_steps += 1
            out.measured_time_s += dt_s
            out.measured_samples += samples_per_step
            out.measured_padded_tokens += padded
            if out.measured_flops is not None:
                out.measured_flops += flops
            out.step_times.append(dt_s)


def accuracy(pred: Any) -> dict[str, float]:
    """Trainer's `compute_metrics`: the share of rows whose arg-max logit is the label."""
    return {"accuracy": float((np.argmax(pred.predictions, axis=-1) == pred.label_ids).mean())}


def training_arguments(cfg: JobConfig, dist: Dist, target: int, checkpoint_dir: Path | None) -> Any:
    """The trial's settings as Trainer's `TrainingArguments`; without a checkpoint directory Trainer writes into
    a temporary one."""
    work_dir = checkpoint_dir or Path(tempfile.mkdtemp(prefix="kubesweep-hf-"))
    options: dict[str, Any] = {
        "output_dir": str(work_dir),
        "per_device_train_batch_size": cfg.batch_size,
        "per_device_eval_batch_size": cfg.eval_batch_size or cfg.batch_size,
        "learning_rate": cfg.learning_rate,
        "weight_decay": cfg.weight_decay,
        "warmup_steps": int(cfg.warmup_ratio * target),
        "num_train_epochs": cfg.epochs,
        "max_steps": cfg.max_steps or -1,
        "gradient_accumulation_steps": cfg.grad_accum,
        "max_grad_norm": cfg.max_grad_norm or 0.0,
        "fp16": cfg.precision == "fp16",
        "bf16": cfg.precision == "bf16",
        "optim": "adamw_torch_fused",
        "torch_compile": bool(cfg.compile),
        "dataloader_num_workers": cfg.num_workers,
        "dataloader_pin_memory": cfg.pin_memory,
        "seed": cfg.seed,
        "eval_strategy": "epoch" if cfg.eval_every_epoch else "no",
        "save_strategy": "steps" if checkpoint_dir is not None else "no",
        "save_steps": cfg.checkpoint_every or 500,
        "save_total_limit": cfg.keep_checkpoints,
        "logging_steps": cfg.log_every,
        "report_to": [],
        "disable_tqdm": True,
        "use_cpu": not dist.cuda,
    }
    if cfg.precision == "tf32":
        options["tf32"] = True
    if cfg.compile:
        options["torch_compile_mode"] = None if cfg.compile == "default" else str(cfg.compile)
    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    if cfg.padding == "bucketed":
        if "train_sampling_strategy" in fields:
            options["train_sampling_strategy"] = "group_by_length"
        else:
            options["group_by_length"] = True
    return TrainingArguments(**options)


def make_trainer(
    cfg: JobConfig,
    loaded: LoadedModel,
    train_data: TokenizedSplit,
    eval_data: TokenizedSplit,
    args: Any,
    pad_to: int | None,
    measure: Measure,
) -> Any:
    """The Trainer over the trial's rows, padded as `cfg.padding` says, reporting through `measure` only."""
    collator = None
    if pad_to is None:
        multiple = cfg.bucket_multiple if cfg.padding == "bucketed" else None
        collator = DataCollatorWithPadding(loaded.tokenizer, pad_to_multiple_of=multiple)
    trainer = Trainer(
        model=loaded.model,
        args=args,
        data_collator=collator,
        train_dataset=RowDataset(train_data, pad_to),  # type: ignore[arg-type]
        eval_dataset=RowDataset(eval_data, pad_to),  # type: ignore[arg-type]
        compute_metrics=accuracy,
        callbacks=[measure],
    )
    trainer.remove_callback(PrinterCallback)  # progress is printed by Measure, in the job's format
    # wrapped, not subclassed: each batch is counted as Trainer hands it over
    trainer.training_step = measure.counting(trainer.training_step)  # type: ignore[method-assign]
    return trainer


def train(cfg: JobConfig, trainer: Any, measure: Measure, checkpoint_dir: Path | None) -> None:
    """Run the training (resuming from the latest checkpoint when asked), then evaluate the final weights unless
    the last epoch's evaluation already did."""
    out = measure.out
    resume = None
    if checkpoint_dir is not None and cfg.resume and any(checkpoint_dir.glob("checkpoint-*")):
        resume = True
    t1 = time.perf_counter()
    trainer.train(resume_from_checkpoint=resume)
    measure.collect()
    out.train_s = time.perf_counter() - t1 - out.eval_s
    out.steps = trainer.state.global_step
    if not out.eval_points or out.eval_points[-1]["step"] != out.steps:
        trainer.evaluate()  # recorded by Measure.on_evaluate


def extract_results(out: TrainOutcome, mean_tokens: float, checkpoint_dir: Path | None) -> None:
    """What Measure did not count: real tokens, the measured samples times the mean sentence length, and the
    checkpoints left behind."""
    out.measured_tokens = int(out.measured_samples * mean_tokens)
    if checkpoint_dir is not None:
        out.checkpoints = sorted(str(p) for p in checkpoint_dir.glob("checkpoint-*"))


def run(
    cfg: JobConfig,
    loaded: LoadedModel,
    train_data: TokenizedSplit,
    eval_data: TokenizedSplit,
    dist: Dist,
    checkpoint_dir: Path | None,
    sink: MetricSink,
) -> tuple[TrainOutcome, float]:
    """Train with Trainer; returns the outcome (same shape as the kubesweep engine's) and the set-up time."""
    t0 = time.perf_counter()
    runtime.limit_threads()
    runtime.setup_precision(cfg)
    pad_to = cfg.max_seq_len if cfg.padding == "max_length" else None
    per_rank_batches = math.ceil(len(train_data) / (cfg.batch_size * dist.world_size))
    steps_per_epoch = max(1, math.ceil(per_rank_batches / cfg.grad_accum))
    target = cfg.max_steps or math.ceil(cfg.epochs * steps_per_epoch)
    out = TrainOutcome(steps=0, target_steps=target, steps_per_epoch=steps_per_epoch)
    clock = StepClock(dist.cuda)
    samples_per_step = cfg.batch_size * cfg.grad_accum * dist.world_size
    mean_tokens = float(train_data.lengths.mean())
    args = training_arguments(cfg, dist, target, checkpoint_dir)
    measure = Measure(cfg, dist, sink, out, clock, samples_per_step=samples_per_step, eval_rows=len(eval_data),
                      shape=ModelShape.from_config(getattr(loaded.model, "config", None)))
    trainer = make_trainer(cfg, loaded, train_data, eval_data, args, pad_to, measure)
    setup_s = time.perf_counter() - t0
    train(cfg, trainer, measure, checkpoint_dir)
    extract_results(out, mean_tokens, checkpoint_dir)
    return out, setup_s
