"""The inference benchmark: latency and throughput at batch_size x max_seq_len, eager or compiled.

Batches are dev-set sentences padded per `padding` (the seed's case: batch 8, `max_length` 128). They are
moved to the device before timing, so the figures are the model's: each batch is timed from launch to a
completed result (a device sync per batch, which latency needs). fp16/bf16 cast the weights (what "FP16
inference" means in deployment); tf32 allows TF32 matmuls; fp32 is strict.
"""

from __future__ import annotations

import logging
import time
from itertools import cycle, islice
from typing import Any

import torch

from kubesweep.jobs import data, runtime
from kubesweep.jobs.data import TokenizedSplit
from kubesweep.jobs.distributed import Dist
from kubesweep.jobs.energy import EnergyMeter, EnergyWindow, energy_stats
from kubesweep.jobs.metrics import percentiles
from kubesweep.wire.config import JobConfig

log = logging.getLogger(__name__)


def run(cfg: JobConfig, model: Any, eval_data: TokenizedSplit, dist: Dist,
        energy: EnergyMeter | None = None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The measured batches' figures (`Results.inference`) and their GPU energy (`Results.energy`, None without
    a meter). The energy counter is read after the warm-up batches and after the last measured one, each
    synchronized."""
    device = torch.device(dist.device)
    runtime.limit_threads()
    runtime.setup_precision(cfg)
    dtype = runtime.autocast_dtype(cfg) or torch.float32
    model = model.to(device=device, dtype=dtype).eval()
    module = runtime.compile_model(model, cfg)
    plan = data.plan_batches(
        eval_data.lengths,
        cfg.batch_size,
        padding=cfg.padding,
        max_seq_len=cfg.max_seq_len,
        bucket_multiple=cfg.bucket_multiple,
        shuffle=True,
        seed=cfg.seed,
        epoch=0,
    )
    plan = [b for b in plan if len(b) == cfg.batch_size] or plan
    distinct = min(len(plan), cfg.warmup_batches + cfg.inference_batches)
    dataset = data.BatchDataset(eval_data, plan[:distinct], cfg.padding, cfg.max_seq_len, cfg.bucket_multiple)
    batches = [
        {k: dataset[i][k].to(device) for k in ("input_ids", "attention_mask")} | {"n": dataset[i]["n_tokens"]}
        for i in range(distinct)
    ]
    runtime.oom_hook(cfg.batch_size)
    latencies: list[float] = []
    rows = tokens = padded = 0
    warmup_s = 0.0
    measured_from: float | None = None
    total = cfg.warmup_batches + cfg.inference_batches
    meter = EnergyWindow(energy) if energy is not None else None
    if meter is not None and cfg.warmup_batches == 0:
        meter.mark()
    with torch.inference_mode():
        for i, batch in enumerate(islice(cycle(batches), total)):
            if i == cfg.warmup_batches:
                measured_from = time.time()
            t0 = time.perf_counter()
            logits = module(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            if dist.cuda:
                torch.cuda.synchronize()
            del logits
            elapsed = time.perf_counter() - t0
            if i < cfg.warmup_batches:
                warmup_s += elapsed
                if i == cfg.warmup_batches - 1 and meter is not None:
                    meter.mark()
                continue
            latencies.append(elapsed)
            shape = batch["input_ids"].shape
            rows += shape[0]
            tokens += batch["n"]
            padded += shape[0] * shape[1]
    measured = sum(latencies)
    measured_until = time.time()
    joules = None
    if meter is not None:
        meter.close(measured=True, samples=rows, seconds=measured)
        joules = energy_stats(meter.joules, meter.seconds, meter.samples, None)
    stats: dict[str, Any] = {
        "batch_size": cfg.batch_size,
        "seq_len": cfg.max_seq_len,
        "dtype": str(dtype).removeprefix("torch."),
        "compiled": cfg.compile,
        "warmup_batches": cfg.warmup_batches,
        "warmup_s": warmup_s,
        "batches": len(latencies),
        "latency_s": percentiles(latencies),
        "samples_per_s": rows / measured,
        "tokens_per_s": tokens / measured,
        "padded_tokens_per_s": padded / measured,
        "measured_from": measured_from,
        "measured_until": measured_until,
    }
    if dist.is_main:
        lat = stats["latency_s"]
        assert lat is not None
        print(
            f"inference batch {cfg.batch_size} seq {cfg.max_seq_len} {stats['dtype']}: "
            f"p50 {lat['p50'] * 1000:.2f} ms p99 {lat['p99'] * 1000:.2f} ms, "
            f"{stats['samples_per_s']:,.0f} samples/s",
            flush=True,
        )
    return stats, joules
