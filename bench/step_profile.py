"""Where a step's time goes on the GPU: the job's own training step (or inference forward) replayed under
torch.profiler, its kernels summed by kind.

    python3 bench/step_profile.py --tokenizer DIR --out DIR/bs1024 --set batch_size=1024 [--set ...]

The job's pieces, not a copy of them: the model and data come from `kubesweep.jobs.model.load` and
`data.load_split`, the step from `train.FineTuner` (its step graph, compile, fused AdamW and autocast as a trial
sets them up), the inference forward from `inference.GraphForward`/`EagerForward`. The first `--steps` batches of
the epoch's plan are built on the host first, then replayed: twice to compile and capture every shape, three
times timed with the GPU synchronized at both ends (the best pass gives the replay's TFLOP/s and MFU, which leave
out the data loader, the clock's reads and the logging a trial does), and once more under the profiler.

Written to --out: `trace.json.gz` (the profiler's Chrome trace: open it in Perfetto), `summary.json` and
`summary.md`: the replay's figures; the GPU's kernel time by kind (matmuls, attention, Inductor's fused kernels,
norms, the optimizer, other element-wise kernels, copies) with each kind's share of the profiled window; the
window's GPU busy share (the union of kernel intervals over the window's span); the largest kernels by time.

The peak is the GPU catalog's (`kubesweep/data/gpus.yaml`) for the product NVML names; MFU = the replay's model
FLOPs (`kubesweep.jobs.flops`, counted from the padded batch shapes) over its seconds, over that peak.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import re
import shutil
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("attention", re.compile(r"flash|fmha|attention|mem_eff|cudnn.*sdpa", re.I)),
    ("matmul", re.compile(r"gemm|nvjet|cutlass|xmma|sm\d+_|cublas|matmul|splitk", re.I)),
    ("optimizer", re.compile(r"adam|multi_tensor|foreach", re.I)),
    ("norm", re.compile(r"layer_?norm|rms_?norm", re.I)),
    ("fused (Inductor)", re.compile(r"^triton_", re.I)),
    ("copy", re.compile(r"memcpy|memset|copy", re.I)),
)


def kind_of(name: str) -> str:
    for kind, pattern in KINDS:
        if pattern.search(name):
            return kind
    return "other element-wise"


def busy_union(spans: list[tuple[float, float]]) -> float:
    """The length of the union of [start, end) spans: the time at least one kernel ran."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def summarize_trace(trace: dict[str, Any], *, top: int = 15) -> dict[str, Any]:
    """The GPU side of a Chrome trace: kernel (and copy) time by kind, the busy share of the span from the first
    kernel's start to the last one's end, the largest kernels by total time."""
    gpu = [e for e in trace.get("traceEvents", [])
           if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not gpu:
        return {"kernels": 0}
    spans = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in gpu]
    start, end = min(a for a, _ in spans), max(b for _, b in spans)
    by_kind: dict[str, float] = defaultdict(float)
    by_name: dict[str, list[float]] = defaultdict(list)
    for e in gpu:
        name = str(e.get("name", ""))
        by_kind[kind_of(name) if e["cat"] == "kernel" else "copy"] += float(e.get("dur", 0))
        by_name[name].append(float(e.get("dur", 0)))
    window = end - start
    kernel_us = sum(by_kind.values())
    return {
        "kernels": len(gpu),
        "window_us": round(window, 1),
        "kernel_us": round(kernel_us, 1),
        "busy_pct": round(100 * busy_union(spans) / window, 1) if window else None,
        "by_kind": {k: {"us": round(v, 1), "pct_of_kernel_time": round(100 * v / kernel_us, 1),
                        "pct_of_window": round(100 * v / window, 1) if window else None}
                    for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "top": [{"name": n[:160], "kind": kind_of(n), "calls": len(d), "us": round(sum(d), 1),
                 "mean_us": round(sum(d) / len(d), 2)}
                for n, d in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]],
    }


def parse_sets(sets: list[str]) -> dict[str, Any]:
    """`--set KEY=VALUE` job settings, each value read as the CLI's `--set` reads one (`load_value`)."""
    from kubesweep.sweep_spec.file import load_value

    out: dict[str, Any] = {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: expected KEY=VALUE")
        out[key.strip()] = load_value(value, f"--set {item}")
    return out


def host_batches(cfg: Any, split: Any, plan: list[Any], n: int, *, pin: bool) -> list[dict[str, Any]]:
    from kubesweep.jobs import data

    dataset = data.BatchDataset(split, plan[:n], cfg.padding, cfg.max_seq_len, cfg.bucket_multiple)
    return [{k: (v.pin_memory() if pin and hasattr(v, "pin_memory") else v) for k, v in dataset[i].items()}
            for i in range(len(dataset))]


def finetune_replay(cfg: Any, loaded: Any, train: Any, evals: Any, dist: Any, n: int) -> tuple[Any, list[Any],
                                                                                             float]:
    """The trial's FineTuner set up as a trial sets it up; a function that runs one step on a host batch; the
    batches; the model FLOPs of one pass over them."""
    from kubesweep.jobs.train import FineTuner

    tuner = FineTuner(cfg, loaded.model, train, evals, dist, None, lambda metrics, step: None)
    tuner.train_module.train()
    batches = host_batches(cfg, train, tuner._plan(0), n, pin=dist.cuda)
    assert tuner.shape is not None

    def step(batch: dict[str, Any]) -> None:
        if tuner.graphs is not None:
            tuner.graphs.step(batch, non_blocking=tuner.pin)
        else:
            tuner._forward_backward(batch, sync=True)
            tuner._optimizer_step()

    flops = sum(tuner.shape.train_flops(*b["input_ids"].shape, samples=len(b["labels"])) for b in batches)
    return step, batches, flops


def inference_replay(cfg: Any, loaded: Any, evals: Any, dist: Any, n: int) -> tuple[Any, list[Any], float]:
    import torch

    from kubesweep.jobs import data, inference, runtime
    from kubesweep.jobs.flops import ModelShape

    device = torch.device(dist.device)
    shape = ModelShape.from_config(loaded.model.config)
    assert shape is not None
    runtime.setup_precision(cfg)
    dtype = runtime.autocast_dtype(cfg) or torch.float32
    module = runtime.compile_model(loaded.model.to(device=device, dtype=dtype).eval(), cfg)
    plan = data.plan_batches(evals.lengths, cfg.batch_size, padding=cfg.padding, max_seq_len=cfg.max_seq_len,
                             bucket_multiple=cfg.bucket_multiple, shuffle=True, seed=cfg.seed, epoch=0)
    plan = [b for b in plan if len(b) == cfg.batch_size] or plan
    batches = [{k: b[k].to(device) for k in ("input_ids", "attention_mask")}
               for b in host_batches(cfg, evals, plan, n, pin=False)]
    forward = inference.GraphForward(module, device) if cfg.step_graph else inference.EagerForward(module)
    with torch.inference_mode():
        for b in batches:
            forward.prepare(b["input_ids"], b["attention_mask"])

    def step(batch: dict[str, Any]) -> None:
        with torch.inference_mode():
            forward(batch["input_ids"], batch["attention_mask"])

    flops = sum(shape.forward_flops(*b["input_ids"].shape) for b in batches)
    return step, batches, flops


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokenizer", required=True, help="a tokenizer directory (bert-base-uncased's vocabulary)")
    parser.add_argument("--sst2", default=str(ROOT / "data" / "sst2"))
    parser.add_argument("--steps", type=int, default=20, help="batches replayed (each pass)")
    parser.add_argument("--set", dest="sets", action="append", default=[], help="a job setting, KEY=VALUE")
    args = parser.parse_args(argv)

    import torch
    from torch.profiler import ProfilerActivity, profile

    from kubesweep.gpus import load_catalog, product_from_device_name
    from kubesweep.jobs import data, distributed, model, runtime
    from kubesweep.jobs.flops import ModelShape
    from kubesweep.wire.config import JobConfig

    base = {"model": "bert-base-uncased", "random_init": True, "dataset": args.sst2, "tokenizer": args.tokenizer,
            "precision": "bf16", "compile": True, "compile_scope": "layers", "step_graph": True,
            "padding": "bucketed", "bucket_multiple": 16, "batch_size": 256, "eval_every_epoch": False}
    cfg = JobConfig(**{**base, **parse_sets(args.sets)})
    args.out.mkdir(parents=True, exist_ok=True)
    dist = distributed.init()
    loaded = model.load(cfg)
    evals, _ = data.load_split(cfg, loaded.tokenizer, "validation")
    t0 = time.perf_counter()
    with runtime.attention_kernels(cfg):
        if cfg.task == "finetune":
            train, _ = data.load_split(cfg, loaded.tokenizer, "train")
            step, batches, flops = finetune_replay(cfg, loaded, train, evals, dist, args.steps)
        else:
            step, batches, flops = inference_replay(cfg, loaded, evals, dist, args.steps)

        def sync() -> None:
            if dist.cuda:
                torch.cuda.synchronize()

        def replay() -> float:
            sync()
            start = time.perf_counter()
            for b in batches:
                step(b)
            sync()
            return time.perf_counter() - start

        warm = [replay(), replay()]  # compile and capture every shape
        timed = [replay() for _ in range(3)]
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            profiled = replay()
    trace_path = args.out / "trace.json"
    prof.export_chrome_trace(str(trace_path))
    trace = json.loads(trace_path.read_text())
    with trace_path.open("rb") as src, gzip.open(args.out / "trace.json.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    trace_path.unlink()

    product = torch.cuda.get_device_name(0) if dist.cuda else "cpu"
    gpu = load_catalog().by_product(product_from_device_name(product))
    _, peak = load_catalog().price_and_peak(gpu, cfg.precision)
    best = min(timed)
    rows = sum(len(b["labels"]) if "labels" in b else int(b["input_ids"].shape[0]) for b in batches)  # samples
    padded = sum(int(b["input_ids"].shape[0] * b["input_ids"].shape[1]) for b in batches)
    tflops = flops / best / 1e12
    summary = {
        "gpu": {"product": product, "type": gpu, "peak_tflops": peak, "uuid": _uuid() if dist.cuda else None},
        "torch": torch.__version__,
        "config": cfg.model_dump(mode="json"),
        "shape": dataclasses.asdict(shape) if (shape := ModelShape.from_config(loaded.model.config)) else None,
        "batches": len(batches), "rows": rows, "padded_tokens_per_sample": round(padded / rows, 2),
        "setup_s": round(time.perf_counter() - t0 - sum(warm) - sum(timed) - profiled, 1),
        "warm_pass_s": [round(w, 3) for w in warm],
        "timed_pass_s": [round(t, 4) for t in timed],
        "samples_per_s": round(rows / best, 1),
        "tflops_per_s": round(tflops, 1),
        "mfu_pct": round(100 * tflops / peak, 1) if peak else None,
        "profiled_pass_s": round(profiled, 4),
        "gpu_side": summarize_trace(trace),
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (args.out / "summary.md").write_text(markdown(summary))
    print(markdown(summary))
    return 0


def _uuid() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return str(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0)))
    except Exception:  # the UUID is a label: the figures stand without it
        return None


def markdown(s: dict[str, Any]) -> str:
    c, g = s["config"], s["gpu_side"]
    lines = [
        f"# {c['task']} {c['model']} batch {c['batch_size']} {c['precision']} compile {c['compile']} "
        f"({c['compile_scope']}) step graph {c['step_graph']} padding {c['padding']}",
        "",
        f"GPU {s['gpu']['product']} ({s['gpu']['uuid']}), torch {s['torch']}. {s['batches']} batches, "
        f"{s['padded_tokens_per_sample']} padded tokens a sample.",
        "",
        f"Replay (best of {len(s['timed_pass_s'])}: {s['timed_pass_s']} s): {s['samples_per_s']:,} samples/s, "
        f"{s['tflops_per_s']} TFLOP/s, MFU {s['mfu_pct']}% of {s['gpu']['peak_tflops']} TFLOP/s.",
        "",
        f"Under the profiler ({s['profiled_pass_s']} s): {g.get('kernels')} kernels, GPU busy {g.get('busy_pct')}% "
        f"of the {g.get('window_us', 0) / 1e3:.1f} ms from the first kernel to the last.",
        "",
        "| kind | ms | share of kernel time | share of the window |",
        "|---|---|---|---|",
    ]
    for kind, v in g.get("by_kind", {}).items():
        lines.append(f"| {kind} | {v['us'] / 1e3:.2f} | {v['pct_of_kernel_time']}% | {v['pct_of_window']}% |")
    lines += ["", "| kernel | kind | calls | ms | mean us |", "|---|---|---|---|---|"]
    for k in g.get("top", []):
        name = k["name"].replace("|", "/")
        lines.append(f"| `{name[:90]}` | {k['kind']} | {k['calls']} | {k['us'] / 1e3:.2f} | {k['mean_us']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
