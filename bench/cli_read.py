"""How fast the read commands answer, as a person runs them (`python -m kubesweep` in a subprocess, wall time):

  (a) `sweep results NAME` on a finished local sweep of 100 trials tracked in the local MLflow store (goal <= 2 s),
      read from this machine's results files (the default), and the peer in the same run: the same command with
      `--from mlflow` (the sweep's child runs and their results.json artifacts, as every read went before);
  (b) `sweep plan SPEC -o json` of a 10,000-trial spec (goal <= 3 s), and the table (first 50 rows).

    .venv/bin/python bench/cli_read.py                    # writes bench/results/cli_read.json
    .venv/bin/python bench/cli_read.py --repeats 3 --trials 100

The sweep's trials run tests/support/tracked_job.py (the job's results schema and MLflow logging, no training),
CPU-only, `--parallel 2`, into a temporary home. Each command is timed `--repeats` times after one untimed run;
the median, min and max are reported, and stderr is checked to be empty for the default `results`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GOAL_RESULTS_S = 2.0
GOAL_PLAN_JSON_S = 3.0


def spec_text(name: str, batches: list[int], rates: list[float]) -> str:
    return (f"apiVersion: kubesweep.io/v1alpha1\nkind: Sweep\nmetadata: {{name: {name}}}\nspec:\n"
            f"  job: {{epochs: 1, train_samples: 640}}\n"
            f"  matrix: {{batch_size: {batches}, learning_rate: {rates}}}\n"
            f"  resources: {{gpus_per_trial: 0, retries: 0}}\n")


def cpu_model() -> str:
    try:
        return next(ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "?"


def timed(argv: list[str], env: dict[str, str], cwd: Path, repeats: int) -> dict[str, Any]:
    runs = []
    stderr = ""
    for i in range(repeats + 1):
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "kubesweep", *argv], env=env, cwd=cwd, capture_output=True,
                              text=True, timeout=600)
        took = time.perf_counter() - started
        if proc.returncode != 0:
            raise SystemExit(f"sweep {' '.join(argv)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
        if i:  # the first run warms the page cache
            runs.append(took)
        stderr = proc.stderr
    return {"command": "sweep " + " ".join(argv), "median_s": round(statistics.median(runs), 3),
            "min_s": round(min(runs), 3), "max_s": round(max(runs), 3), "repeats": repeats,
            "stderr_bytes": len(stderr), "stdout_bytes": len(proc.stdout)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=100, help="trials of the sweep `results` reads (x10)")
    parser.add_argument("--plan-trials", type=int, default=10_000, help="trials of the spec `plan` expands")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "cli_read.json")
    args = parser.parse_args()
    if args.trials % 10 or args.plan_trials % 100:
        raise SystemExit("--trials must be a multiple of 10, --plan-trials of 100")

    with tempfile.TemporaryDirectory(prefix="cli-read-") as tmp_name:
        tmp = Path(tmp_name)
        home = tmp / "home"
        env = {**os.environ, "KUBESWEEP_HOME": str(home), "KUBESWEEP_LOCAL_GPUS": "[]", "COLUMNS": "200",
               "MLFLOW_DISABLE_TELEMETRY": "true",
               "KUBESWEEP_JOB_COMMAND": json.dumps([sys.executable, str(ROOT / "tests/support/tracked_job.py")])}
        for var in ("MLFLOW_TRACKING_URI", "KUBESWEEP_NO_TRACKING"):
            env.pop(var, None)
        spec = tmp / "reads.yaml"
        spec.write_text(spec_text("reads", [8, 16, 32, 64, 128], [1e-5 * (i + 1) for i in range(args.trials // 5)]))
        print(f"running a local sweep of {args.trials} trials into {home} (tracked, local MLflow store)",
              file=sys.stderr)
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "kubesweep", "submit", str(spec), "--parallel", "2"], env=env,
                              cwd=tmp, capture_output=True, text=True, timeout=3600)
        if proc.returncode != 0:
            raise SystemExit(f"submit exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        submit_s = time.perf_counter() - started

        print("timing sweep results", file=sys.stderr)
        files = timed(["results", "reads"], env, tmp, args.repeats)
        mlflow = timed(["results", "reads", "--from", "mlflow"], env, tmp, max(1, args.repeats // 2))
        big = tmp / "big.yaml"
        big.write_text(spec_text("big", [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096],
                                 [1e-6 * (i + 1) for i in range(args.plan_trials // 10)]))
        print("timing sweep plan", file=sys.stderr)
        plan_json = timed(["plan", str(big), "-o", "json", "--confirm-over", str(args.plan_trials)], env, tmp,
                          args.repeats)
        plan_table = timed(["plan", str(big), "--confirm-over", str(args.plan_trials)], env, tmp, args.repeats)

    speedup = round(mlflow["median_s"] / files["median_s"], 1)
    result: dict[str, Any] = {
        "benchmark": "bench/cli_read.py", "command": " ".join([".venv/bin/python", "bench/cli_read.py",
                                                               *sys.argv[1:]]),
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {"cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                 check=False).stdout.strip(),
        "sweep": {"trials": args.trials, "submit_s": round(submit_s, 1)},
        "results": {"default_files": files, "peer_from_mlflow": mlflow,
                    "speedup": speedup,
                    "goal": f"<= {GOAL_RESULTS_S:g} s for {args.trials} trials, nothing on stderr",
                    "pass": files["median_s"] <= GOAL_RESULTS_S and files["stderr_bytes"] == 0},
        "plan": {"trials": args.plan_trials, "json": plan_json, "table": plan_table,
                 "goal": f"json <= {GOAL_PLAN_JSON_S:g} s", "pass": plan_json["median_s"] <= GOAL_PLAN_JSON_S},
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"sweep results, {args.trials} trials: {files['median_s']} s from the results files "
          f"(min {files['min_s']}, max {files['max_s']}); {mlflow['median_s']} s from MLflow "
          f"({speedup}x); stderr {files['stderr_bytes']} bytes")
    print(f"sweep plan -o json, {args.plan_trials:,} trials: {plan_json['median_s']} s "
          f"(min {plan_json['min_s']}, max {plan_json['max_s']}); table: {plan_table['median_s']} s")
    print(f"results: {args.output}")
    return 0 if result["results"]["pass"] and result["plan"]["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
