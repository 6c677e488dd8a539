"""Inference at the seed's shape (bert-base, batch 8, sequence 128) on one GPU: eager against the forward pass
replayed as a CUDA graph (`step_graph: true`), on a quiet host and beside busy host processes.

Each repeat is one run of the job (`python -m kubesweep.jobs --task inference`) in a fresh process, as a sweep's
trial is; a setting's repeats are interleaved with the other settings' (round-robin), so drift of the machine
spreads over all of them. Per setting: the mean of the repeats' samples/s with its 95% interval (Student t), the
latency p50, and the host's share of each batch (time to issue it / its latency; near 1: host-bound).

    python3 bench/inference_graph.py --sst2 data/sst2 --tokenizer TOKENIZER_DIR --repeats 5 --out OUT.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# two-sided 95% Student t quantiles by degrees of freedom
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def interval(values: list[float]) -> dict[str, float]:
    mean = statistics.fmean(values)
    if len(values) < 2:
        return {"mean": mean, "half_width": float("nan"), "pct": float("nan"), "n": len(values)}
    half = T95.get(len(values) - 1, 1.96) * statistics.stdev(values) / len(values) ** 0.5
    return {"mean": mean, "half_width": half, "pct": 100 * half / mean, "n": len(values)}


def spin(stop_at: float) -> None:
    """Busy host work: pure Python arithmetic until `stop_at`."""
    x = 0
    while time.time() < stop_at:
        for i in range(100_000):
            x += i * i


def run_once(args: argparse.Namespace, precision: str, graph: bool, out: Path) -> dict[str, Any]:
    command = [sys.executable, "-m", "kubesweep.jobs", "--output-dir", str(out), "--task", "inference",
               "--model", "bert-base-uncased", "--random-init", "--tokenizer", args.tokenizer,
               "--dataset", args.sst2, "--batch-size", "8", "--max-seq-len", "128", "--padding", "max_length",
               "--precision", precision, "--inference-batches", str(args.batches), "--warmup-batches", "10",
               "--cache-dir", str(out.parent / "cache"), *(["--step-graph"] if graph else [])]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "KUBESWEEP_NO_TRACKING": "1"}
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)}: exit {proc.returncode}\n{(proc.stdout + proc.stderr)[-3000:]}")
    results = json.loads((out / "results.json").read_text())
    inference = results["inference"]
    return {"samples_per_s": inference["samples_per_s"], "p50_ms": 1000 * inference["latency_s"]["p50"],
            "p99_ms": 1000 * inference["latency_s"]["p99"], "host_share": inference["host_share"],
            "gpu": results["environment"]["gpus"][0]["product"] if results["environment"]["gpus"] else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sst2", required=True)
    parser.add_argument("--tokenizer", required=True, help="a bert-base-uncased vocabulary (tokenizer directory)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batches", type=int, default=300, help="measured batches per run")
    parser.add_argument("--precisions", default="fp32,fp16,bf16")
    parser.add_argument("--busy", type=int, default=4, help="busy host processes in the loaded rounds (0: none)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    loads = [0, args.busy] if args.busy else [0]
    settings = [(p, g, load) for load in loads for p in args.precisions.split(",") for g in (False, True)]
    runs: dict[str, list[dict[str, Any]]] = {}
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for repeat, (precision, graph, load) in itertools.product(range(args.repeats), settings):
            key = f"{precision} {'graph' if graph else 'eager'} busy={load}"
            workers = [multiprocessing.Process(target=spin, args=(time.time() + 600,), daemon=True)
                       for _ in range(load)]
            for w in workers:
                w.start()
            try:
                run = run_once(args, precision, graph, Path(tmp) / f"{repeat}-{key.replace(' ', '_')}")
            finally:
                for w in workers:
                    w.terminate()
            runs.setdefault(key, []).append(run)
            print(f"repeat {repeat} {key}: {run['samples_per_s']:,.0f} samples/s, p50 {run['p50_ms']:.2f} ms, "
                  f"host share {run['host_share']:.2f}", flush=True)
    cells: dict[str, dict[str, Any]] = {key: {"samples_per_s": interval([r["samples_per_s"] for r in rs]),
                   "p50_ms": interval([r["p50_ms"] for r in rs]),
                   "host_share": statistics.fmean(r["host_share"] for r in rs)} for key, rs in runs.items()}
    print(f"\n{'setting':<28} {'samples/s':>10} {'±95%':>7} {'p50 ms':>8} {'±95%':>7} {'host':>5}")
    for key, cell in cells.items():
        s, p = cell["samples_per_s"], cell["p50_ms"]
        print(f"{key:<28} {s['mean']:>10,.0f} {s['pct']:>6.1f}% {p['mean']:>8.2f} {p['pct']:>6.1f}% "
              f"{cell['host_share']:>5.2f}")
    doc = {"benchmark": "bench/inference_graph.py", "command": " ".join([sys.executable, *sys.argv]),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)), "wall_s": round(time.time() - started),
           "machine": {"gpu": next(iter(runs.values()))[0]["gpu"], "cpu_cores": os.cpu_count(),
                       "python": platform.python_version()},
           "settings": {"model": "bert-base-uncased shapes, random init", "batch_size": 8, "seq_len": 128,
                        "padding": "max_length", "measured_batches": args.batches, "warmup_batches": 10,
                        "repeats": args.repeats, "order": "round-robin over settings", "busy_processes": args.busy},
           "cells": cells, "runs": runs}
    Path(args.out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
