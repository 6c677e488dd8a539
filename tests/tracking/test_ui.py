"""The default store: with no tracking URI anywhere, a local sweep logs to sqlite:///<home>/mlflow.db with
artifacts under <home>/mlartifacts, and `sweep ui` serves that store (a real `mlflow server` on 127.0.0.1) and owns
it: stopping `sweep ui`, or killing it, stops the server and its workers.
The workload is tests/support/tracked_job.py (the job's own MLflow logger, no training)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from kubesweep.tracking.ui import answers, free_port
from kubesweep.tracking.view import runs_url
from tests.support.mlflow_fixtures import (
    SERVER_START_TIMEOUT_S,
    TRACKED_JOB,
    make_runner,
    quiet_mlflow_env,
    wait_http,
)

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

    ui, base, log = start_ui(env, tmp_path)
    try:
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
        assert f"  local-one: {runs_url(base, experiment['experiment_id'])}" in log.read_text()  # the runs view
        server = descendants(ui.pid)
        assert server, "no mlflow server process under `sweep ui`"
        # SIGTERM to `sweep ui` alone (not its group: the server runs in a group of its own) stops the server
        # and every worker it started, and the port stops answering
        ui.send_signal(signal.SIGTERM)
        assert ui.wait(timeout=60) == 0, log.read_text()[-2000:]
        assert "stopped the MLflow UI" in log.read_text()
        assert_gone(server, base)
    finally:
        if ui.poll() is None:
            os.killpg(ui.pid, signal.SIGKILL)


def test_sweep_ui_killed_outright_takes_its_server_along(tmp_path: Path) -> None:
    env = {**os.environ, **quiet_mlflow_env(), "KUBESWEEP_HOME": str(tmp_path / "home")}
    env.pop("MLFLOW_TRACKING_URI", None)
    ui, base, _ = start_ui(env, tmp_path)
    try:
        server = descendants(ui.pid)
        ui.kill()  # no handler runs: the server learns of it from the kernel (parent-death signal)
        ui.wait(timeout=30)
        assert_gone(server, base)
    finally:
        if ui.poll() is None:
            ui.kill()


def test_sweep_ui_names_its_sweeps_runs_view_once_the_server_answers(tmp_path: Path) -> None:
    """`sweep ui NAME`: the server's output (its start-up, warnings, request log) goes to <home>/ui.log, which
    the terminal is told; the URL comes only once the server answers HTTP, and it opens the sweep's runs view.
    A sweep the store does not know is exit 3 with no server started."""
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "KUBESWEEP_NO_TRACKING")}
    env.update({**quiet_mlflow_env(), "KUBESWEEP_HOME": str(home), "KUBESWEEP_LOCAL_GPUS": "[]",
                "KUBESWEEP_JOB_COMMAND": json.dumps([sys.executable, str(TRACKED_JOB)]), "COLUMNS": "300"})
    (tmp_path / "local-one.yaml").write_text(SPEC)
    run = make_runner(env, tmp_path)
    run("submit", "local-one.yaml")
    unknown = run("ui", "no-such-sweep", check=3)
    assert "sweep 'no-such-sweep': no MLflow experiment 'no-such-sweep'" in unknown.stderr
    assert "local-one" in unknown.stderr and "Traceback" not in unknown.stderr

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    terminal = tmp_path / "terminal.txt"
    with terminal.open("wb") as sink:
        ui = subprocess.Popen([sys.executable, "-m", "kubesweep", "ui", "local-one", "--port", str(port)], env=env,
                              stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while "MLflow UI" not in terminal.read_text():
            assert ui.poll() is None and time.monotonic() < deadline, terminal.read_text()
            time.sleep(0.05)
        assert answers(f"{base}/health"), "the URL was printed before the server answered"
        said = terminal.read_text()
        log = home / "ui.log"
        assert f"starting the MLflow server on {base} (store sqlite:///{home.resolve()}/mlflow.db); its output " \
               f"goes to {log}" in said
        experiment = get(f"{base}/api/2.0/mlflow/experiments/get-by-name?experiment_name=local-one")["experiment"]
        url = runs_url(base, experiment["experiment_id"])
        assert f"MLflow UI, the runs of sweep 'local-one' (best samples/s first): {url}" in said
        assert search(base, experiment["experiment_id"], "tags.`kubesweep.role` = 'parent'")
        ui.send_signal(signal.SIGTERM)
        assert ui.wait(timeout=60) == 0
    finally:
        if ui.poll() is None:
            os.killpg(ui.pid, signal.SIGKILL)
    # the request log and MLflow's start-up chatter are in the file, not on the terminal
    served = log.read_text()
    assert '"GET /health HTTP/1.1" 200' in served and "Uvicorn running" in served
    said = terminal.read_text()
    assert "HTTP/1.1" not in said and "Uvicorn" not in said and "Warning" not in said, said


def test_sweep_ui_says_why_when_the_server_dies_before_answering(tmp_path: Path) -> None:
    """A server that cannot serve (its port is taken) is an error naming its log and its last lines, exit 4;
    no URL is printed."""
    env = {**os.environ, **quiet_mlflow_env(), "KUBESWEEP_HOME": str(tmp_path / "home")}
    env.pop("MLFLOW_TRACKING_URI", None)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = make_runner(env, tmp_path)("ui", "--port", str(port), check=4)
    log = tmp_path / "home" / "ui.log"
    # uvicorn ends with code 0 or 1 on a port it cannot bind, by version: the code is reported as it is
    assert re.search(rf"error: the MLflow server exited with code \d+ before it served the UI; its log, "
                     rf"{re.escape(str(log))}, ends:", proc.stderr), proc.stderr
    assert "address already in use" in proc.stderr.lower() and "address already in use" in log.read_text().lower()
    assert "MLflow UI" not in proc.stdout


def start_ui(env: dict[str, str], tmp_path: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    """`sweep ui` on a free port, in a session of its own, once its server answers: (process, base URL, log)."""
    port = free_port()
    log = tmp_path / "ui.log"
    with log.open("wb") as sink:
        ui = subprocess.Popen([sys.executable, "-m", "kubesweep", "ui", "--port", str(port)], env=env,
                              stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/health", ui, log)
    except BaseException:
        ui.kill()
        raise
    return ui, base, log


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def assert_gone(pids: list[int], base: str, timeout: float = 30) -> None:
    """Each of `pids` has exited (or is a zombie) and nothing answers at `base` any more."""
    def alive(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [p for p in pids if alive(p)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"server processes outlived `sweep ui`: {left}"
    try:
        urllib.request.urlopen(f"{base}/health", timeout=5)
    except OSError:
        return
    raise AssertionError(f"{base} still answers after `sweep ui` stopped")
