"""The inference benchmark: latency and throughput at batch_size x max_seq_len, eager or compiled.

Batches are dev-set sentences padded per `padding` (the seed's case: batch 8, `max_length` 128). They are
moved to the device before timing, so the figures are the model's: each batch is timed from launch to a
completed result (a device sync per batch, which latency needs). fp16/bf16 cast the weights (what "FP16
inference" means in deployment); tf32 allows TF32 matmuls; fp32 is strict.

At batch 8 an eager bert-base forward pass is a few hundred kernel launches that take the host longer than the
GPU takes to run them: the figure is then the host's (its Python, its clocks, whatever else runs on it), and it
spreads. Each batch's issuing time is recorded beside its latency (`launch_s`, and `host_share`: issuing time
over latency, near 1 when the GPU waited for the host). `step_graph: true` captures the forward pass as one CUDA
graph per batch shape, before the warm-up batches, and replays it: a batch is then two input copies and one
launch, and the latency is the GPU's.
"""

from __future__ import annotations

import logging
import time
from itertools import cycle, islice
from typing import Any, Protocol

import torch

from kubesweep.jobs import data, runtime
from kubesweep.jobs.data import TokenizedSplit
from kubesweep.jobs.distributed import Dist
from kubesweep.jobs.energy import EnergyMeter, EnergyWindow, energy_stats
from kubesweep.jobs.errors import UsageError
from kubesweep.jobs.flops import ModelShape, measured_figures
from kubesweep.jobs.metrics import percentiles
from kubesweep.wire.config import JobConfig

log = logging.getLogger(__name__)


def run(cfg: JobConfig, model: Any, eval_data: TokenizedSplit, dist: Dist,
        energy: EnergyMeter | None = None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The measured batches' figures (`Results.inference`) and their GPU energy (`Results.energy`, None without
    a meter). The energy counter is read after the warm-up batches and after the last measured one, each
    synchronized."""
    device = torch.device(dist.device)
    shape = ModelShape.from_config(getattr(model, "config", None))  # None: FLOPs not counted
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
    graphs = cfg.step_graph
    if graphs and not dist.cuda:
        raise UsageError("step_graph needs a CUDA GPU (it captures the forward pass as a CUDA graph)")
    latencies: list[float] = []
    launches: list[float] = []
    rows = tokens = padded = 0
    flops = 0.0
    warmup_s = 0.0
    measured_from: float | None = None
    total = cfg.warmup_batches + cfg.inference_batches
    meter = EnergyWindow(energy) if energy is not None else None
    with torch.inference_mode():
        forward: Forward = GraphForward(module, device) if graphs else EagerForward(module)
        t0 = time.perf_counter()
        for batch in batches:  # every shape captured before anything is timed (a no-op eager)
            forward.prepare(batch["input_ids"], batch["attention_mask"])
        warmup_s += time.perf_counter() - t0
        if meter is not None and cfg.warmup_batches == 0:
            meter.mark()
        for i, batch in enumerate(islice(cycle(batches), total)):
            if i == cfg.warmup_batches:
                measured_from = time.time()
            t0 = time.perf_counter()
            logits = forward(batch["input_ids"], batch["attention_mask"])
            issued = time.perf_counter() - t0
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
            launches.append(issued)
            size = batch["input_ids"].shape
            rows += size[0]
            tokens += batch["n"]
            padded += size[0] * size[1]
            flops += shape.forward_flops(size[0], size[1]) if shape is not None else 0.0
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
        **measured_figures(flops if shape is not None else None, measured, samples=rows, tokens=tokens,
                           padded=padded, count=len(latencies), per="batch"),
        "measured_from": measured_from,
        "measured_until": measured_until,
        "graph": graphs,
        # on the CPU a forward pass returns once it is computed: issuing is the whole latency, and says nothing
        "launch_s": percentiles(launches) if dist.cuda else None,
        "host_share": sum(launches) / measured if dist.cuda and measured > 0 else None,
    }
    if dist.is_main:
        lat = stats["latency_s"]
        assert lat is not None
        print(
            f"inference batch {cfg.batch_size} seq {cfg.max_seq_len} {stats['dtype']}: "
            f"p50 {lat['p50'] * 1000:.2f} ms p99 {lat['p99'] * 1000:.2f} ms, "
            f"{stats['samples_per_s']:,.0f} samples/s"
            + (f", host {stats['host_share']:.0%} of each batch issuing it" if stats["host_share"] is not None
               else "")
            + (" (CUDA graph)" if graphs else ""),
            flush=True,
        )
    return stats, joules


class Forward(Protocol):
    def prepare(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None: ...

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor: ...


class EagerForward:
    """The module called as it is (eager, or compiled by `compile`): every kernel launched from Python."""

    def __init__(self, module: Any) -> None:
        self.module = module

    def prepare(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        return None

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.module(input_ids=input_ids, attention_mask=attention_mask).logits
        return logits


class GraphForward:
    """The forward pass as one CUDA graph per input shape, replayed: two device-to-device input copies and one
    launch a batch. Warm-up and capture share one side stream (cuBLAS sets up its per-stream workspace in the
    warm-up, never under capture); every shape's graph draws on one memory pool, safe because they replay one
    at a time on one stream and the logits are read before the next replay."""

    WARM_CALLS = 2  # compiles the shape under torch.compile; cuBLAS/cuDNN pick and set up their kernels

    def __init__(self, module: Any, device: torch.device) -> None:
        self.module = module
        cuda: Any = torch.cuda  # Stream() is untyped
        self.stream = cuda.Stream(device)
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[tuple[int, ...], tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def prepare(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        shape = tuple(input_ids.shape)
        if shape in self.graphs:
            return
        ids, mask = input_ids.clone(), attention_mask.clone()
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            for _ in range(self.WARM_CALLS):
                self.module(input_ids=ids, attention_mask=mask)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream, capture_error_mode="thread_local"):
            logits = self.module(input_ids=ids, attention_mask=mask).logits
        torch.cuda.current_stream().wait_stream(self.stream)
        self.graphs[shape] = (graph, ids, mask, logits)

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        self.prepare(input_ids, attention_mask)  # a shape not seen before: captured now
        graph, ids, mask, logits = self.graphs[tuple(input_ids.shape)]
        ids.copy_(input_ids, non_blocking=True)
        mask.copy_(attention_mask, non_blocking=True)
        graph.replay()
        return logits
