"""What a trial's MLflow logging costs its process: the REST client against mlflow's own, in the same run.

Each sample is a fresh `python` that does what a trial's logger does for a short trial (open the child run under
a parent, params, 50 steps of two metrics, tags, two artifacts, end the run) into a real `mlflow server` on
127.0.0.1, then reports its own CPU time and wall time (process start to the last request answered). The two
clients alternate, after one untimed run of each:

  rest     `kubesweep.jobs.mlflow_client.RestClient` (what a trial uses for an http(s) server), mlflow never
           imported;
  package  `PackageClient`, mlflow's `MlflowClient` (what every trial used before, and still uses for a
           `sqlite:///` or `file:` store).

    .venv/bin/python bench/trial_logging.py                 # writes bench/results/trial_logging.json
    .venv/bin/python bench/trial_logging.py --repeats 10

Reported per client: mean and the 95% interval's half-width (Student's t, `kubesweep.tracking.intervals`) of CPU
s and wall s over repeats.
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
sys.path.insert(0, str(ROOT))

from kubesweep.tracking.intervals import half_width  # noqa: E402
from tests.support.mlflow_fixtures import free_port, mlflow_executable, quiet_mlflow_env, stop, wait_http  # noqa: E402

TRIAL = """
import json, os, resource, sys, time
from pathlib import Path
from kubesweep.jobs.mlflow_client import PackageClient, RestClient
from kubesweep.jobs.mlflow_logger import MlflowTrialLogger
uri, kind, work, parent, n = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4], sys.argv[5]
log = MlflowTrialLogger(uri=uri, trial_id=f"{kind}-{n}", run_name=f"{kind}-{n}", parent_run_id=parent,
                        tags={"kubesweep.sweep": "bench"})
log._client = RestClient(uri) if kind == "rest" else PackageClient(uri)
log.start()
log.log_params({"batch_size": 16, "precision": "bf16"})
for step in range(1, 51):
    log.log_metrics({"train/loss": 1.0 / step, "train/samples_per_s": 100.0 + step}, step)
log.set_tags({"kubesweep.outcome": "succeeded"})
log.log_artifact(work / "results.json")
log.log_artifact(work / "model", "model")
stats = log.close("FINISHED")
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"cpu_s": usage.ru_utime + usage.ru_stime, "dropped": stats.dropped, "run": log.run_id,
                  "mlflow_imported": "mlflow" in sys.modules}))
"""


def interval(values: list[float]) -> dict[str, float]:
    """Mean and the 95% interval's half-width (`kubesweep.tracking.intervals`, as the results table reports)."""
    return {"mean": round(statistics.fmean(values), 3), "ci95": round(half_width(values) or 0.0, 3), "n": len(values)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "trial_logging.json")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="trial-logging-") as tmp:
        work = Path(tmp)
        (work / "model").mkdir()
        (work / "model" / "config.json").write_text('{"layers": 2}')
        (work / "results.json").write_text('{"outcome": "succeeded"}')
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log = work / "server.log"
        with log.open("wb") as out:
            server = subprocess.Popen(
                [*mlflow_executable(), "server", "--backend-store-uri", f"sqlite:///{work / 'mlflow.db'}",
                 "--artifacts-destination", str(work / "artifacts"), "--serve-artifacts", "--host", "127.0.0.1",
                 "--port", str(port), "--workers", "1"], stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, env={**os.environ, **quiet_mlflow_env()})
        try:
            wait_http(f"{url}/health", server, log)
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=url)
            parent = client.create_run(client.create_experiment("bench"), run_name="sweep").info.run_id
            samples: dict[str, dict[str, list[float]]] = {k: {"cpu_s": [], "wall_s": []} for k in ("rest", "package")}
            for n in range(args.repeats + 1):
                for kind in ("rest", "package"):
                    t0 = time.monotonic()
                    proc = subprocess.run([sys.executable, "-c", TRIAL, url, kind, str(work), parent, str(n)],
                                          capture_output=True, text=True, timeout=300, check=True,
                                          env={**os.environ, "PYTHONPATH": str(ROOT)})
                    wall = time.monotonic() - t0
                    found: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
                    assert found["dropped"] == 0 and found["mlflow_imported"] == (kind == "package"), found
                    if n:  # the first of each is a warm-up (the OS's file cache)
                        samples[kind]["cpu_s"].append(found["cpu_s"])
                        samples[kind]["wall_s"].append(wall)
                    print(f"{kind:8s} #{n}: cpu {found['cpu_s']:.2f} s, wall {wall:.2f} s", flush=True)
        finally:
            stop(server)
    result = {
        "what": "one short trial's MLflow logging in a fresh process (bench/trial_logging.py)",
        "command": f"python bench/trial_logging.py --repeats {args.repeats}",
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "clients": {kind: {k: interval(v) for k, v in s.items()} for kind, s in samples.items()},
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["clients"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
