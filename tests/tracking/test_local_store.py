"""The default store: with no tracking URI anywhere, a local sweep logs to sqlite:///<home>/mlflow.db with
artifacts under <home>/mlartifacts, and `sweep ui` serves that store (a real `mlflow server` on 127.0.0.1).
The workload is tests/support/tracked_job.py (the job's own MLflow logger, no training)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from kubesweep.tracking.ui import free_port
from tests.support.mlflow_fixtures import TRACKED_JOB, make_runner, quiet_mlflow_env, wait_http

SPEC = """\
apiVersion: kubesweep.io/v1alpha1
kind: Sweep
metadata: {name: local-one}
spec:
  job: {epochs: 1, train_samples: 320}
  matrix: {batch_size: [16]}
  resources: {gpus_per_trial: 0, retries: 0}
"""


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        body = response.read()
    return json.loads(body) if body.startswith(b"{") else body


def search(base: str, experiment: str, filter_string: str) -> list[Any]:
    request = urllib.request.Request(f"{base}/api/2.0/mlflow/runs/search", method="POST",
                                     headers={"Content-Type": "application/json"},
                                     data=json.dumps({"experiment_ids": [experiment],
                                                      "filter": filter_string}).encode())
    with urllib.request.urlopen(request, timeout=30) as response:
        return list(json.loads(response.read()).get("runs", []))


def test_default_local_store_and_sweep_ui(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "KUBESWEEP_NO_TRACKING")}
    env.update({**quiet_mlflow_env(), "KUBESWEEP_HOME": str(home), "KUBESWEEP_LOCAL_GPUS": "[]",
                "KUBESWEEP_JOB_COMMAND": json.dumps([sys.executable, str(TRACKED_JOB)])})
    env.pop("MLFLOW_SERVER_ENABLE_JOB_EXECUTION")  # `sweep ui` turns it off by itself
    (tmp_path / "local-one.yaml").write_text(SPEC)
    run = make_runner(env, tmp_path)
    out = run("submit", "local-one.yaml").stdout
    assert f"tracking: MLflow at sqlite:///{home.resolve()}/mlflow.db (from local store)" in out
    assert (home / "mlflow.db").exists()
    results = json.loads(next((home / "sweeps/local-one/trials").glob("*/results.json")).read_text())

    port = free_port()
    log = tmp_path / "ui.log"
    with log.open("wb") as sink:
        ui = subprocess.Popen([sys.executable, "-m", "kubesweep", "ui", "--port", str(port)], env=env,
                              stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/health", ui, log)  # type: ignore[arg-type]
        experiment = get(f"{base}/api/2.0/mlflow/experiments/get-by-name?experiment_name=local-one")["experiment"]
        assert experiment["artifact_location"] == (home / "mlartifacts" / "local-one").resolve().as_uri()
        parent = search(base, experiment["experiment_id"], "tags.`kubesweep.role` = 'parent'")
        assert len(parent) == 1
        parent_id = parent[0]["info"]["run_id"]
        child = search(base, experiment["experiment_id"], f"tags.`mlflow.parentRunId` = '{parent_id}'")
        assert len(child) == 1
        run_id = child[0]["info"]["run_id"]
        # the UI server reads the artifacts the trial wrote straight into <home>/mlartifacts
        served = get(f"{base}/get-artifact?path=results.json&run_uuid={run_id}")
        assert served == results
        assert "MLflow UI: http://127.0.0.1:" in log.read_text()
    finally:
        os.killpg(ui.pid, signal.SIGINT)
        assert ui.wait(timeout=60) == 0, log.read_text()[-2000:]
