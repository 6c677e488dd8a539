"""How busy a sweep keeps its GPU: `sweep submit` of a one-GPU matrix on the local backend, then the GPU-busy
fraction `sweep results` prints (the trials' measured training time over the sweep's wall time).

The matrix is the seed's axes: batch size x precision (fp32, fp16, bf16) x compile (off, on), one epoch of SST-2
on bert-base shapes (random init), `--repeats` runs per cell. `--engine hf-trainer` runs the same cells as
separate HF Trainer runs (the peer: a fresh interpreter per trial, none started early), so the two fractions
compare.

    python bench/gpu_busy.py --sst2 DIR --tokenizer DIR --out bench/results/gpu_busy-h100.json
    python bench/gpu_busy.py --sst2 DIR --tokenizer DIR --engine hf-trainer --repeats 1 --out ...-hf.json

Each run writes the sweep spec it submitted, `sweep results -f json` and the whole CLI output beside --out.

`--wait-s N` submits the sweep detached (`sweep submit --detach`) and waits at most N seconds for it: run the same
command again (same --home) to go on waiting; it writes --out once the sweep has ended (exit 3 until then). The
sweep runs on between the two commands, so its wall time is the sweep's own.

`--combine A.json B.json ... --out X.json` adds up sweeps that ran one after another (the peer, split by batch size
where one machine's time cannot hold it): measured training and wall time summed over the parts, so the fraction
is the one of the parts run back to back.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]


def spec(args: argparse.Namespace) -> dict[str, Any]:
    hf = args.engine == "hf-trainer"
    job: dict[str, Any] = {
        "task": "finetune", "engine": args.engine, "model": "bert-base-uncased", "random_init": True,
        "dataset": str(args.sst2.resolve()), "epochs": 1, "max_seq_len": 128, "learning_rate": 1e-4,
        "warmup_ratio": 0.06, "padding": "dynamic" if hf else "bucketed", "num_workers": 2,
        "eval_every_epoch": False,
    }
    if args.tokenizer:
        job["tokenizer"] = str(Path(args.tokenizer).resolve())
    if not hf:
        job.update({"compile_scope": "layers", "sdpa_backend": "efficient", "bucket_multiple": 8})
    return {
        "apiVersion": "kubesweep.io/v1alpha1",
        "kind": "Sweep",
        "metadata": {"name": args.name or ("gpu-busy-hf" if hf else "gpu-busy")},
        "spec": {
            "job": job,
            "matrix": {"batch_size": args.batch_sizes, "precision": args.precisions, "compile": [False, True]},
            "repeats": args.repeats,
            "resources": {"gpus_per_trial": 1, "cpu": "8", "memory": "32Gi"},
            "concurrency": {"max_parallel": 1},
            **({"tracking": {"experiment": args.name or "gpu-busy"}} if not args.no_tracking else {}),
        },
    }


def sweep(*argv: str, env: dict[str, str], log: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "kubesweep", *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    with log.open("a") as handle:
        handle.write(f"$ sweep {' '.join(argv)}  (exit {proc.returncode})\n{proc.stdout}{proc.stderr}\n")
    return proc


def combine(paths: list[Path]) -> dict[str, Any]:
    """One report over sweeps run one after another: each part's report kept, the GPU-busy figures summed."""
    parts = [json.loads(p.read_text()) for p in paths]
    busy = [p["gpu_busy"] for p in parts]
    if any(not b for b in busy):
        missing = [str(path) for path, b in zip(paths, busy, strict=True) if not b]
        raise SystemExit(f"no GPU-busy figures in {', '.join(missing)}")
    train = sum(b["measured_train_s"] for b in busy)
    wall = sum(b["wall_s"] for b in busy)
    trials = sum(b["trials"] for b in busy)
    return {
        "command": " ".join(sys.argv),
        "parts": [{"file": p.name, **part} for p, part in zip(paths, parts, strict=True)],
        "gpu_busy": {"fraction": train / wall, "measured_train_s": round(train, 2), "wall_s": round(wall, 2),
                     "gpus": busy[0]["gpus"], "trials": trials, "wall_per_trial_s": round(wall / trials, 2)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sst2", type=Path, help="directory of SST-2's train.tsv/dev.tsv (required to run)")
    parser.add_argument("--tokenizer", help="tokenizer directory (bert-base-uncased's vocabulary)")
    parser.add_argument("--engine", choices=["kubesweep", "hf-trainer"], default="kubesweep")
    parser.add_argument("--batch-sizes", type=lambda v: [int(x) for x in v.split(",")], default=[64, 128, 256])
    parser.add_argument("--precisions", type=lambda v: v.split(","), default=["fp32", "fp16", "bf16"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--name", help="sweep name (default gpu-busy, gpu-busy-hf)")
    parser.add_argument("--home", type=Path, help="kubesweep home (default: a new directory beside --out)")
    parser.add_argument("--no-tracking", action="store_true", help="no MLflow (default: the local MLflow store)")
    parser.add_argument("--wait-s", type=float, help="submit detached and wait at most this long (see above)")
    parser.add_argument("--combine", type=Path, nargs="+", metavar="REPORT", help="sum these reports (see above)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.combine:
        combined = combine(args.combine)
        args.out.write_text(json.dumps(combined, indent=2) + "\n")
        b = combined["gpu_busy"]
        print(f"GPU busy: {b['fraction']:.1%} ({b['measured_train_s']} s of measured training in {b['wall_s']} s, "
              f"{b['trials']} trials, {b['wall_per_trial_s']} s per trial); wrote {args.out}")
        return
    if args.sst2 is None:
        parser.error("--sst2 is required to run a sweep")

    out_dir = args.out.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = args.out.stem
    home = args.home or out_dir / f"{stem}-home"
    document = spec(args)
    name = document["metadata"]["name"]
    going_on = args.wait_s is not None and (home / "sweeps" / name).is_dir()
    if args.home is None and not going_on:
        shutil.rmtree(home, ignore_errors=True)
    spec_path = out_dir / f"{stem}.yaml"
    spec_path.write_text(yaml.safe_dump(document, sort_keys=False))
    env = {**os.environ, "KUBESWEEP_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    if args.engine == "hf-trainer":
        # the peer: separate runs, one after another, each a fresh interpreter
        env |= {"KUBESWEEP_LOCAL_PRESTART": "0", "KUBESWEEP_LOCAL_FORKSERVER": "0"}
    log = out_dir / f"{stem}.log"
    if not going_on:
        log.write_text("")
    tracking = ["--no-tracking"] if args.no_tracking else []
    t0 = time.time()
    if args.wait_s is None:
        submitted = sweep("submit", str(spec_path), "--backend", "local", "--yes", *tracking, env=env, log=log)
        print(submitted.stdout[-4000:], submitted.stderr[-2000:], sep="\n")
    else:
        if not going_on:
            submitted = sweep("submit", str(spec_path), "--backend", "local", "--yes", "--detach", *tracking,
                              env=env, log=log)
            print(submitted.stdout[-2000:], submitted.stderr[-2000:], sep="\n")
        while True:
            state = json.loads(sweep("status", name, "-o", "json", env=env, log=Path(os.devnull)).stdout)
            phases = [t["phase"] for t in state["trials"]]
            ended = sum(p in ("Succeeded", "Failed", "Cancelled", "Skipped", "Stopped") for p in phases)
            print(f"{time.time() - t0:6.0f}s: {ended}/{len(phases)} trials ended", flush=True)
            if ended == len(phases):
                break
            if time.time() - t0 > args.wait_s:
                print("still running: run the same command again to go on waiting")
                sys.exit(3)
            time.sleep(10)
        submitted = subprocess.CompletedProcess([], 0, "", "")
    wall = time.time() - t0
    table = sweep("results", name, "--backend", "local", *tracking, env=env, log=log)
    print(table.stdout)
    doc = sweep("results", name, "--backend", "local", "-f", "json", *tracking, env=env, log=log)
    results = json.loads(doc.stdout) if doc.returncode == 0 else {"error": doc.stderr[-2000:]}
    report = {
        "command": " ".join(sys.argv),
        "spec": document,
        "submit_exit": submitted.returncode,
        "submit_wall_s": round(wall, 1),
        "gpu_busy": results.get("gpu_busy"),
        "results": results,
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    busy = report["gpu_busy"] or {}
    if busy:
        print(f"GPU busy: {busy.get('fraction', 0):.1%} ({busy.get('measured_train_s')} s of measured training in "
              f"{busy.get('wall_s')} s of sweep wall, {busy.get('trials')} trials); `sweep submit` took {wall:.1f} s")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
