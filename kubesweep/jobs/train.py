"""kubesweep's fine-tuning loop: measured honestly, no host syncs per step, exactly resumable.

Per optimizer step the loop only enqueues work: the loss is added into a device buffer, step boundaries are
CUDA events (`StepClock`), token counts come from the host-side batch. Every `log_every` steps one sync reads
the buffer and the clock; that is when metrics are logged and progress printed.

A step is *warm-up* (timed apart, not in samples/s) when it is among the first `measure_skip_steps` steps of
this process, or, under torch.compile, when one of its batches has a shape not seen before (a compilation) or,
under `reduce-overhead` or `step_graph`, seen only once (its CUDA graph is recorded then).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from kubesweep.jobs import checkpoint, data, packed, runtime, step_graph
from kubesweep.jobs.data import TokenizedSplit
from kubesweep.jobs.distributed import Dist
from kubesweep.jobs.energy import EnergyMeter, EnergyWindow, energy_stats
from kubesweep.jobs.errors import UsageError
from kubesweep.jobs.flops import ModelShape, measured_figures
from kubesweep.jobs.metrics import StepClock, percentiles
from kubesweep.wire.config import JobConfig
from kubesweep.wire.progress import step_line

log = logging.getLogger(__name__)

MetricSink = Callable[[dict[str, float], int], None]
# Settings that do not change the trained weights; a checkpoint written under other values still resumes.
RESUME_NEUTRAL = frozenset(
    {
        "checkpoint_every",
        "checkpoint_dir",
        "keep_checkpoints",
        "resume",
        "export",
        "log_every",
        "num_workers",
        "pin_memory",
        "cache_dir",
        "compile_cache_dir",
        "nvml_interval_s",
        "measure_skip_steps",
        "eval_batch_size",
        "eval_every_epoch",
        "compile",
        "compile_scope",
        "sdpa_backend",
        "step_graph",
    }
)


def resume_fingerprint(cfg: JobConfig) -> str:
    relevant = {k: v for k, v in cfg.model_dump(mode="json").items() if k not in RESUME_NEUTRAL}
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]


def warmup_spans(warmup: list[bool], times: list[float], end: float) -> list[tuple[float, float]]:
    """The (start, end) Unix times of the warm-up steps among steps that ran back to back for `times` seconds each
    and ended at `end`, adjacent ones joined: time inside the measured window that no measured step used, which
    the GPU monitor leaves out of it (`TrainOutcome.measured_pauses`)."""
    spans: list[tuple[float, float]] = []
    t = end - sum(times)
    for is_warmup, dt in zip(warmup, times, strict=True):
        if is_warmup:
            if spans and spans[-1][1] == t:
                spans[-1] = (spans[-1][0], t + dt)
            else:
                spans.append((t, t + dt))
        t += dt
    return spans


@dataclass
class StepMeta:
    warmup: bool
    samples: int
    tokens: int
    padded_tokens: int
    flops: float = 0.0  # model FLOPs of the step's batches (kubesweep/jobs/flops.py), all ranks


@dataclass
class TrainOutcome:
    steps: int
    target_steps: int
    steps_per_epoch: int
    samples: int = 0
    warmup_steps: int = 0
    warmup_time_s: float = 0.0
    measured_steps: int = 0
    measured_samples: int = 0
    measured_tokens: int = 0
    measured_padded_tokens: int = 0
    measured_flops: float | None = None  # None: the model's FLOPs are not counted (its shapes unknown)
    measured_time_s: float = 0.0
    measured_from: float | None = None  # Unix times: the first measured step's start, the last one's end
    measured_until: float | None = None
    # Unix times the clock stood still between measured steps (an evaluation, a checkpoint): not measured
    measured_pauses: list[tuple[float, float]] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)
    loss_curve: list[dict[str, Any]] = field(default_factory=list)
    eval_points: list[dict[str, Any]] = field(default_factory=list)
    train_s: float = 0.0
    eval_s: float = 0.0
    resumed_from_step: int | None = None
    checkpoints: list[str] = field(default_factory=list)
    energy: dict[str, Any] | None = None

    def stats(self) -> dict[str, Any]:
        t = self.measured_time_s
        return {
            "steps": self.steps,
            "target_steps": self.target_steps,
            "epochs_completed": round(self.steps / self.steps_per_epoch, 4),
            "samples": self.samples,
            "warmup_steps": self.warmup_steps,
            "warmup_time_s": self.warmup_time_s,
            "measured_steps": self.measured_steps,
            "measured_samples": self.measured_samples,
            "measured_time_s": t,
            "samples_per_s": self.measured_samples / t if t > 0 else None,
            "tokens_per_s": self.measured_tokens / t if t > 0 else None,
            "padded_tokens_per_s": self.measured_padded_tokens / t if t > 0 else None,
            **measured_figures(self.measured_flops, t, samples=self.measured_samples, tokens=self.measured_tokens,
                               padded=self.measured_padded_tokens, count=self.measured_steps, per="step"),
            "step_time_s": percentiles(self.step_times),
            "final_loss": self.loss_curve[-1]["loss"] if self.loss_curve else None,
            "resumed_from_step": self.resumed_from_step,
            "measured_from": self.measured_from,
            "measured_until": self.measured_until,
            "measured_pauses": [list(p) for p in self.measured_pauses
                                if self.measured_until is not None and p[0] < self.measured_until] or None,
        }


@dataclass
class LogWindow:
    """The steps since the last read (`log_every` at most): their losses summed in a device buffer, their
    boundaries on the clock, their metadata and learning rates on the host."""

    clock: StepClock
    loss_buf: Any  # a device tensor of `log_every` losses
    start: int  # the last step before the window
    pending: list[StepMeta] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    last_print: float = 0.0
    paused_at: float | None = None  # Unix time the clock was paused after steps had been measured


@dataclass
class LoopState:
    """The training loop's host-side state for this process: shapes seen (compilation and CUDA graph warm-up),
    steps taken, and the step being accumulated."""

    warm_calls: int  # a shape's steps that are warm-up: 1, or 2 where its second step records a CUDA graph
    seen_shapes: dict[tuple[tuple[int, ...], ...], int] = field(default_factory=dict)
    steps_this_run: int = 0
    micro_in_step: int = 0
    step_meta: StepMeta = field(default_factory=lambda: StepMeta(False, 0, 0, 0))


class FineTuner:
    def __init__(
        self,
        cfg: JobConfig,
        model: Any,
        train_data: TokenizedSplit,
        eval_data: TokenizedSplit,
        dist: Dist,
        checkpoint_dir: Path | None,
        sink: MetricSink,
        energy: EnergyMeter | None = None,
    ) -> None:
        self.cfg = cfg
        self.dist = dist
        self.device = torch.device(dist.device)
        self.train_data = train_data
        self.eval_data = eval_data
        self.checkpoint_dir = checkpoint_dir
        self.sink = sink
        self.energy = EnergyWindow(energy) if energy is not None else None
        self.raw = model
        self.pin = cfg.pin_memory and dist.cuda
        self.shape = ModelShape.from_config(getattr(model, "config", None))  # None: FLOPs not counted

        per_rank = len(self._plan(0)) // dist.world_size
        if per_rank == 0:
            raise UsageError(
                f"{len(train_data)} training rows give no batch of {cfg.batch_size} per rank "
                f"(world size {dist.world_size})"
            )
        self.micro_per_epoch = per_rank
        self.steps_per_epoch = math.ceil(per_rank / cfg.grad_accum)
        self.target_steps = cfg.max_steps or math.ceil(cfg.epochs * self.steps_per_epoch)

        runtime.limit_threads()
        runtime.setup_precision(cfg)
        if cfg.step_graph:
            step_graph.check_supported(cuda=dist.cuda)
        self.state = checkpoint.latest(checkpoint_dir) if checkpoint_dir is not None and cfg.resume else None
        restored = checkpoint.load(self.state) if self.state is not None else None
        if restored is not None:
            if restored["fingerprint"] != resume_fingerprint(cfg):
                raise UsageError(
                    f"checkpoint {self.state} was written with different settings; refusing to resume"
                )
            self.raw.load_state_dict(restored["model"])
        self.raw.to(self.device)
        runtime.store_residual(self.raw, cfg)
        # packed rows: the model called on them by the packed classifier, its parameters the model's own
        self.train_module: Any = packed.PackedClassifier(self.raw) if cfg.padding == "packed" else self.raw
        if dist.enabled and cfg.step_graph:
            # No DDP wrapper: the step graphs average the flat gradient buffer themselves (step_graph.py).
            step_graph.sync_from_rank0(self.raw)
        elif dist.enabled:
            self.train_module = DistributedDataParallel(
                self.train_module,
                device_ids=[self.device.index] if dist.cuda else None,
                broadcast_buffers=False,  # BERT's buffers (position ids) are constants
                # gradients live in the all-reduce buckets: no copy into the buckets and back per step
                gradient_as_bucket_view=True,
            )
        self.train_module = runtime.compile_model(self.train_module, cfg)
        # Evaluation runs eager (the raw model; under compile_scope layers, whose layers are compiled in place,
        # with compilation switched off): a few batches per epoch would each pay a compilation of their own.
        self.eval_module = self.raw
        self.optimizer = self._optimizer()
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_lambda)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=cfg.precision == "fp16")
        self.graphs = (
            step_graph.StepGraphs(cfg, self.train_module, self._params(), self.optimizer, self.device,
                                  world_size=dist.world_size)
            if cfg.step_graph
            else None
        )
        self.out = TrainOutcome(steps=0, target_steps=self.target_steps, steps_per_epoch=self.steps_per_epoch,
                                measured_flops=0.0 if self.shape is not None else None)
        self.epoch = 0
        self.micro_in_epoch = 0
        if restored is not None:
            self._restore(restored)

    # ---------------------------------------------------------------------------------------------- set-up

    def _plan(self, epoch: int) -> list[data.IntArray]:
        cfg = self.cfg
        return data.plan_batches(
            self.train_data.lengths,
            cfg.batch_size,
            padding=cfg.padding,
            max_seq_len=cfg.max_seq_len,
            bucket_multiple=cfg.bucket_multiple,
            shuffle=True,
            seed=cfg.seed,
            epoch=epoch,
            world_size=self.dist.world_size,
        )

    def _params(self) -> list[Any]:
        return [p for p in self.raw.parameters() if p.requires_grad]

    def _optimizer(self) -> Any:
        decay: list[Any] = []
        no_decay: list[Any] = []
        for name, param in self.raw.named_parameters():
            if not param.requires_grad:
                continue
            (
                no_decay if name.endswith("bias") or "LayerNorm" in name or "layernorm" in name else decay
            ).append(param)
        groups: list[dict[str, Any]] = [
            {"params": decay, "weight_decay": self.cfg.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        if self.cfg.step_graph:
            # Captured steps read the learning rate from device memory, which the scheduler fills in place.
            for group in groups:
                group["lr"] = torch.tensor(self.cfg.learning_rate, dtype=torch.float32, device=self.device)
            return torch.optim.AdamW(groups, lr=self.cfg.learning_rate, fused=True, capturable=True)
        return torch.optim.AdamW(groups, lr=self.cfg.learning_rate, fused=True)

    def _current_lr(self) -> float:
        """The scheduler's current learning rate, computed on the host: under step_graph the optimizer's is a
        device tensor, and reading it would sync."""
        return self.cfg.learning_rate * self._lr_lambda(self.scheduler.last_epoch)

    def _lr_lambda(self, step: int) -> float:
        """Linear warm-up then linear decay to zero (HF's get_linear_schedule_with_warmup)."""
        warmup = int(self.cfg.warmup_ratio * self.target_steps)
        if step < warmup:
            return step / max(1, warmup)
        return max(0.0, (self.target_steps - step) / max(1, self.target_steps - warmup))

    def _restore(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if self.cfg.step_graph:  # a checkpoint of an eager run holds the learning rates as numbers
            for group in self.optimizer.param_groups:
                if not isinstance(group["lr"], torch.Tensor):
                    group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32, device=self.device)
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.out.steps = state["step"]
        self.out.resumed_from_step = state["step"]
        self.out.loss_curve = list(state["loss_curve"])
        self.out.eval_points = list(state["eval_points"])
        self.epoch = state["epoch"]
        self.micro_in_epoch = state["micro_in_epoch"]
        rng = state["rng"]
        checkpoint.set_rng_state(rng[self.dist.rank] if self.dist.rank < len(rng) else rng[0])
        if self.dist.is_main:
            log.info("resumed from %s (step %d, epoch %d)", self.state, state["step"], self.epoch)

    def _save_checkpoint(self) -> None:
        assert self.checkpoint_dir is not None
        rng = self.dist.gather_objects(checkpoint.rng_state())
        if self.dist.is_main:
            state = {
                "fingerprint": resume_fingerprint(self.cfg),
                "model": self.raw.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict(),
                "step": self.out.steps,
                "epoch": self.epoch,
                "micro_in_epoch": self.micro_in_epoch,
                "rng": rng,
                "loss_curve": self.out.loss_curve,
                "eval_points": self.out.eval_points,
            }
            path = checkpoint.save(self.checkpoint_dir, self.out.steps, state, self.cfg.keep_checkpoints)
            log.info("checkpoint %s", path)
        self.dist.barrier()

    # ------------------------------------------------------------------------------------------------ loop

    def run(self) -> TrainOutcome:
        cfg, out = self.cfg, self.out
        window = LogWindow(StepClock(self.dist.cuda), torch.zeros(cfg.log_every, device=self.device), out.steps)
        # Under compile a new shape compiles; under CUDA graphs (reduce-overhead, step_graph) its second step
        # records the graph too. Those steps are warm-up.
        loop = LoopState(warm_calls=2 if cfg.compile == "reduce-overhead" or cfg.step_graph else 1)
        t_start = time.perf_counter()
        self.train_module.train()
        self._resume_clock(window)
        while out.steps < self.target_steps:
            plan = self._plan(self.epoch)[self.dist.rank :: self.dist.world_size][: self.micro_per_epoch]
            batches = data.loader(cfg, self.train_data, plan[self.micro_in_epoch :], pin_memory=self.pin)
            for batch in batches:
                if not self._micro_step(batch, window, loop):
                    continue
                if self._end_step(window, loop):
                    break
        self._flush(window)
        out.train_s = time.perf_counter() - t_start - out.eval_s
        out.energy = self._energy_stats()
        if not out.eval_points or out.eval_points[-1]["step"] != out.steps:
            self._evaluate()
        if self.checkpoint_dir is not None and cfg.checkpoint_every:
            if out.steps % cfg.checkpoint_every:
                self._save_checkpoint()
            out.checkpoints = [str(p) for p in checkpoint.list_checkpoints(self.checkpoint_dir)]
        return out

    def _micro_step(self, batch: dict[str, Any], window: LogWindow, loop: LoopState) -> bool:
        """One micro-batch: counted into the step's `StepMeta`, forward and backward into the window's loss
        buffer; on the step's last micro-batch, the optimizer step. True when an optimizer step was taken."""
        cfg, out, world_size = self.cfg, self.out, self.dist.world_size
        step_meta = loop.step_meta
        shape = data.batch_shape(batch)
        if (cfg.compile or cfg.step_graph) and loop.seen_shapes.get(shape, 0) < loop.warm_calls:
            step_meta.warmup = True
        loop.seen_shapes[shape] = loop.seen_shapes.get(shape, 0) + 1
        rows, width = batch["input_ids"].shape  # packed: rows hold several samples each
        samples = len(batch["labels"])
        step_meta.samples += samples * world_size
        step_meta.tokens += batch["n_tokens"] * world_size
        step_meta.padded_tokens += rows * width * world_size
        step_meta.flops += (self.shape.train_flops(rows, width, samples=samples) * world_size
                            if self.shape is not None else 0.0)
        self.micro_in_epoch += 1
        loop.micro_in_step += 1
        last_micro = loop.micro_in_step == cfg.grad_accum or self.micro_in_epoch == self.micro_per_epoch
        if loop.steps_this_run == 0 and loop.micro_in_step == 1:
            runtime.oom_hook(samples)
        if self.graphs is not None:
            window.loss_buf[out.steps - window.start] += self.graphs.step(batch, non_blocking=self.pin)
            self.scheduler.step()
            return True
        loss = self._forward_backward(batch, sync=last_micro)
        window.loss_buf[out.steps - window.start] += loss
        if not last_micro:
            return False
        self._optimizer_step()
        return True

    def _end_step(self, window: LogWindow, loop: LoopState) -> bool:
        """After an optimizer step: its clock mark and metadata into the window, a flush when the window is full,
        the end of an epoch (with its evaluation), a checkpoint when one is due. True when the epoch or the
        training has ended."""
        cfg, out = self.cfg, self.out
        out.steps += 1
        loop.steps_this_run += 1
        loop.micro_in_step = 0
        window.clock.mark()
        step_meta = loop.step_meta
        step_meta.warmup = step_meta.warmup or loop.steps_this_run <= cfg.measure_skip_steps
        window.pending.append(step_meta)
        out.samples += step_meta.samples
        loop.step_meta = StepMeta(False, 0, 0, 0)
        window.lrs.append(self._current_lr())
        # a progress line at this run's first step when it is a warm-up step (its sync charges no measured step),
        # then every `log_every` steps: a slow trial says where it is from its start
        first = loop.steps_this_run == 1 and step_meta.warmup
        if first or out.steps - window.start >= cfg.log_every or out.steps >= self.target_steps:
            self._flush(window)
        epoch_done = self.micro_in_epoch == self.micro_per_epoch
        if epoch_done:
            self.epoch += 1
            self.micro_in_epoch = 0
            if cfg.eval_every_epoch and out.steps < self.target_steps:
                self._pause_clock(window)
                self._evaluate()
                self._resume_clock(window)
        if self.checkpoint_dir is not None and cfg.checkpoint_every and out.steps % cfg.checkpoint_every == 0:
            self._pause_clock(window)
            self._save_checkpoint()
            self._resume_clock(window)
        runtime.crash_hook(out.steps)
        return out.steps >= self.target_steps or epoch_done

    def _flush(self, window: LogWindow) -> None:
        """Read the window: one host sync for its losses, the clock's step times into warm-up or measured steps,
        each step's metrics to the sink, and a progress line at most every 5 s (and at the end)."""
        out = self.out
        n = out.steps - window.start
        if n <= 0:
            return
        losses = window.loss_buf[:n].clone()
        if self.dist.enabled:
            torch.distributed.all_reduce(losses)
            losses /= self.dist.world_size
        loss_values = losses.tolist()  # the one host sync of the window
        window.loss_buf.zero_()
        times = window.clock.drain()
        ended = time.time()  # the window's steps ran back to back, the last one ending about now
        pending = window.pending
        metas, pending[:] = pending[: len(times)], pending[len(times) :]
        window_samples = window_time = 0.0
        measuring = out.measured_from is not None
        for i, (meta, dt_s) in enumerate(zip(metas, times, strict=True)):
            if meta.warmup:
                out.warmup_steps += 1
                out.warmup_time_s += dt_s
                continue
            if out.measured_from is None:  # the first measured step began after the window's warm-up steps
                out.measured_from = ended - sum(times[i:])
            out.measured_steps += 1
            out.measured_time_s += dt_s
            out.measured_samples += meta.samples
            out.measured_tokens += meta.tokens
            out.measured_padded_tokens += meta.padded_tokens
            out.measured_flops = out.measured_flops + meta.flops if out.measured_flops is not None else None
            out.step_times.append(dt_s)
            window_samples += meta.samples
            window_time += dt_s
        if window_time > 0:
            out.measured_until = ended
        if out.measured_from is not None:  # a shape's first steps (compile, graph capture) between measured ones
            first = 0 if measuring else next(i for i, m in enumerate(metas) if not m.warmup)
            out.measured_pauses += warmup_spans([m.warmup for m in metas[first:]], times[first:], ended)
        if self.energy is not None:  # after the window's host sync: its steps have run
            measured = len(metas) == n and not any(m.warmup for m in metas)
            self.energy.close(measured=measured, samples=int(window_samples), seconds=window_time)
        for i, (loss, lr) in enumerate(zip(loss_values, window.lrs, strict=True)):
            step = window.start + i + 1
            out.loss_curve.append({"step": step, "loss": loss, "learning_rate": lr})
            metrics = {"train/loss": loss, "train/learning_rate": lr}
            if step == out.steps and window_time > 0:
                metrics["train/samples_per_s"] = window_samples / window_time
            self.sink(metrics, step)
        last_lr = window.lrs[-1]
        window.lrs.clear()
        window.start = out.steps
        now = time.perf_counter()
        if self.dist.is_main and (now - window.last_print > 5 or out.steps >= self.target_steps):
            window.last_print = now
            rate = window_samples / window_time if window_time > 0 else None
            print(step_line(out.steps, self.target_steps, out.steps / self.steps_per_epoch, loss_values[-1], last_lr,
                            rate), flush=True)

    def _pause_clock(self, window: LogWindow) -> None:
        """Read everything up to here, so eval/checkpoint time is not charged to the next step; once steps have
        been measured, the pause is noted (`measured_pauses`: the GPU monitor leaves it out of their window)."""
        self._flush(window)
        window.pending.clear()
        window.clock.reset()
        window.paused_at = time.time() if self.out.measured_from is not None else None

    def _resume_clock(self, window: LogWindow) -> None:
        """Start timing (and metering) steps again: what ran since the last read is not charged to them."""
        if window.paused_at is not None:
            self.out.measured_pauses.append((window.paused_at, time.time()))
            window.paused_at = None
        window.clock.mark()
        if self.energy is not None:
            self.energy.mark()

    def _energy_stats(self) -> dict[str, Any] | None:
        """The measured windows' energy, summed over ranks (each rank meters its own GPU)."""
        if self.energy is None:
            return None
        joules = self.energy.joules
        if self.dist.enabled:
            total = torch.tensor([joules], dtype=torch.float64, device=self.device)
            torch.distributed.all_reduce(total)
            joules = float(total.item())
        return energy_stats(joules, self.energy.seconds, self.energy.samples, len(self.train_data))

    def _forward_backward(self, batch: dict[str, Any], *, sync: bool) -> Any:
        cfg = self.cfg
        inputs = {k: v.to(self.device, non_blocking=self.pin) for k, v in data.model_inputs(batch).items()}
        # DDP: reduce gradients only on the last micro-batch of an accumulated step
        no_sync = getattr(self.train_module, "no_sync", None)
        ctx = (
            no_sync()
            if (self.dist.enabled and not sync and no_sync is not None)
            else contextlib.nullcontext()
        )
        with ctx:
            with runtime.autocast(cfg, self.device.type):
                loss = self.train_module(**inputs).loss / cfg.grad_accum
            self.scaler.scale(loss).backward()
        return loss.detach().float()

    def _optimizer_step(self) -> None:
        if self.cfg.max_grad_norm is not None:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.raw.parameters(), self.cfg.max_grad_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        # under DDP the gradients are views into its buckets: zeroed in place, kept
        self.optimizer.zero_grad(set_to_none=not self.dist.enabled)
        self.scheduler.step()

    # ------------------------------------------------------------------------------------------------ eval

    def _evaluate(self) -> None:
        cfg, out = self.cfg, self.out
        t0 = time.perf_counter()
        padding = data.eval_padding(cfg.padding)
        plan = data.plan_batches(
            self.eval_data.lengths,
            cfg.eval_batch_size or cfg.batch_size,
            padding=padding,
            max_seq_len=cfg.max_seq_len,
            bucket_multiple=cfg.bucket_multiple,
            shuffle=False,
            seed=cfg.seed,
            epoch=0,
            world_size=self.dist.world_size,
            drop_uneven=False,
        )[self.dist.rank :: self.dist.world_size]
        totals = torch.zeros(3, dtype=torch.float64, device=self.device)  # correct, loss sum, rows
        self.raw.eval()
        with torch.no_grad(), runtime.eager():
            for batch in data.loader(cfg, self.eval_data, plan, pin_memory=self.pin, workers=0, padding=padding):
                ids = batch["input_ids"].to(self.device, non_blocking=self.pin)
                mask = batch["attention_mask"].to(self.device, non_blocking=self.pin)
                labels = batch["labels"].to(self.device, non_blocking=self.pin)
                with runtime.autocast(cfg, self.device.type):
                    logits = self.eval_module(input_ids=ids, attention_mask=mask).logits.float()
                totals[0] += (logits.argmax(-1) == labels).sum()
                totals[1] += torch.nn.functional.cross_entropy(logits, labels, reduction="sum")
                totals[2] += labels.numel()
        self.raw.train()
        correct, loss_sum, rows = self.dist.all_sum(totals.tolist())
        point = {
            "epoch": round(out.steps / self.steps_per_epoch, 4),
            "step": out.steps,
            "accuracy": correct / rows,
            "loss": loss_sum / rows,
            "samples": int(rows),
        }
        out.eval_points.append(point)
        out.eval_s += time.perf_counter() - t0
        self.sink({"eval/accuracy": point["accuracy"], "eval/loss": point["loss"]}, out.steps)
        if self.dist.is_main:
            print(
                f"eval epoch {point['epoch']:.2f} step {out.steps}: accuracy {point['accuracy']:.4f} "
                f"loss {point['loss']:.4f} ({rows:.0f} rows, {time.perf_counter() - t0:.1f}s)",
                flush=True,
            )
