"""Fixtures for the tracking and browser tests: a real `mlflow server` on 127.0.0.1 and a real local sweep
logged to it.

The sweep's workload is `tests/support/tracked_job.py`: it logs through the job's own MLflow logger
(`kubesweep.jobs.mlflow_logger`) and writes results files validated by the job's schema, without training,
so the matrix (GPU types x batch sizes, compile, an OOM cell, a GPU-mismatch cell, DDP, inference on CPU and GPU,
two repeats) runs in about a minute. GPUs are declared through KUBESWEEP_LOCAL_GPUS; nothing runs on a GPU.
`marked_sweep` is a smaller sweep in a kubesweep home's local store, served by `sweep ui`, with a setting at
chance accuracy (the fastest), an OOM and a GPU mismatch: what the runs view and the report mark.
`tests/tracking/test_sweep_real_job.py` runs the real job once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kubesweep.tracking.ui import free_port, mlflow_executable

ROOT = Path(__file__).parents[2]
TRACKED_JOB = ROOT / "tests" / "support" / "tracked_job.py"
SERVER_START_TIMEOUT_S = 240.0
FAKE_GPUS = ["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", "NVIDIA L40S", "Tesla V100-SXM2-32GB"]

SWEEP_NAME = "tracked"
SWEEP_SPEC = """\
apiVersion: kubesweep.io/v1alpha1
kind: Sweep
metadata: {name: tracked}
spec:
  job: {precision: fp16, epochs: 2, train_samples: 67349}
  matrix:
    gpu: [h100-80gb, l40s]
    batch_size: [16, 64]
  include:
    - {gpu: h100-80gb, batch_size: 16, compile: true}
    - {gpu: h100-80gb, batch_size: 256}
    - {gpu: v100-32gb, batch_size: 16}
    - {gpu: h100-80gb, batch_size: 16, gpus_per_trial: 2}
    - {task: inference, gpus_per_trial: 0, precision: fp32, batch_size: 16}
    - {task: inference, gpu: h100-80gb, precision: fp32, batch_size: 16}
    - {task: inference, gpu: h100-80gb, precision: fp16, batch_size: 16}
  repeats: 2
  resources: {gpus_per_trial: 1, retries: 0}
  tracking: {experiment: kubesweep-tracked}
"""
SWEEP_TRIALS = 22
SWEEP_CELLS = 11


def quiet_mlflow_env() -> dict[str, str]:
    """No telemetry (no network here) and no background job runner in servers we start."""
    return {"MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = SERVER_START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"mlflow server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"mlflow server not up at {url} after {timeout:.0f}s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@dataclass
class MlflowServer:
    url: str
    root: Path


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """`mlflow server`: sqlite backend and served artifacts in a temporary directory, on 127.0.0.1. Experiments may
    keep their artifacts on other hosts (`http:`, `mlflow-artifacts://host:port`), as on a server whose admin allows
    it (MLFLOW_ALLOWED_HOST_ADDRESSED_ARTIFACT_SCHEMES): what a trial's client must not follow with its
    credentials (tests/jobs/test_mlflow_client.py)."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    log = root / "server.log"
    command = [*mlflow_executable(), "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
               "--artifacts-destination", str(root / "artifacts"), "--serve-artifacts", "--host", "127.0.0.1",
               "--port", str(port), "--workers", "1"]
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **quiet_mlflow_env(),
                                     "MLFLOW_ALLOWED_HOST_ADDRESSED_ARTIFACT_SCHEMES": "http,https,mlflow-artifacts"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/health", proc, log)
        yield MlflowServer(url, root)
    finally:
        stop(proc)


Runner = Callable[..., subprocess.CompletedProcess[str]]


@dataclass
class TrackedSweep:
    name: str
    home: Path
    spec: Path
    server: MlflowServer
    env: dict[str, str]
    sweep: Runner
    submit_output: str

    def trial_dirs(self) -> list[Path]:
        return sorted((self.home / "sweeps" / self.name / "trials").iterdir())

    def results_files(self) -> dict[str, dict[str, object]]:
        """trial id -> results.json, read straight from the trials' directories."""
        out = {}
        for d in self.trial_dirs():
            if (d / "results.json").exists():
                data = json.loads((d / "results.json").read_text())
                out[data["trial"]["trial_id"]] = data
        return out


def make_runner(env: dict[str, str], cwd: Path) -> Runner:
    def run(*args: str, check: int | None = 0, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, "-m", "kubesweep", *args], capture_output=True, text=True, env=env,
                              cwd=cwd, timeout=timeout)
        if check is not None:
            assert proc.returncode == check, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        return proc

    return run


@pytest.fixture(scope="session")
def tracked_sweep(mlflow_server: MlflowServer, tmp_path_factory: pytest.TempPathFactory) -> TrackedSweep:
    """The test matrix submitted with `sweep submit` on the local backend, tracked in `mlflow_server`."""
    work = tmp_path_factory.mktemp("tracked-sweep")
    spec = work / "tracked.yaml"
    spec.write_text(SWEEP_SPEC)
    env = {**os.environ, **quiet_mlflow_env(), "KUBESWEEP_HOME": str(work / "home"),
           "KUBESWEEP_LOCAL_GPUS": json.dumps(FAKE_GPUS),
           "KUBESWEEP_JOB_COMMAND": json.dumps([sys.executable, str(TRACKED_JOB)]),
           "MLFLOW_TRACKING_URI": mlflow_server.url, "COLUMNS": "220"}
    env.pop("KUBESWEEP_NO_TRACKING", None)
    run = make_runner(env, work)
    proc = run("submit", str(spec), timeout=900)
    return TrackedSweep(SWEEP_NAME, work / "home", spec, mlflow_server, env, run, proc.stdout + proc.stderr)


MARKS_NAME = "marks"
MARKS_SPEC = """\
apiVersion: kubesweep.io/v1alpha1
kind: Sweep
metadata: {name: marks}
spec:
  job: {precision: fp16, epochs: 2, train_samples: 67349}
  matrix:
    gpu: [h100-80gb, l40s]
    batch_size: [16, 64]
  include:
    - {gpu: h100-80gb, batch_size: 128, learning_rate: 1.0e-3}  # the fastest, and its training diverges: chance
    - {gpu: h100-80gb, batch_size: 256}                         # OOM
    - {gpu: v100-32gb, batch_size: 16}                          # GPU mismatch
  repeats: 2
  resources: {gpus_per_trial: 1, retries: 0}
"""
MARKS_TRIALS = 14
# fine-tuning and inference in one sweep, in the same home: ranked by samples/s alone, an inference run would sit
# between the fine-tuning runs (2,729, 2,216, 1,800 and 32 samples/s: fine-tuning, inference, fine-tuning, inference)
TASKS_NAME = "tasks"
TASKS_SPEC = """\
apiVersion: kubesweep.io/v1alpha1
kind: Sweep
metadata: {name: tasks}
spec:
  job: {precision: fp16, epochs: 2, train_samples: 67349}
  matrix:
    gpu: [h100-80gb]
    batch_size: [16, 64]
  include:
    - {task: inference, gpu: h100-80gb, batch_size: 32}
    - {task: inference, gpus_per_trial: 0, precision: fp32, batch_size: 8}
  resources: {gpus_per_trial: 1, retries: 0}
"""
TASKS_TRIALS = 4


@dataclass
class MarkedSweep:
    """A sweep with a chance-accuracy, an OOM and a GPU-mismatch setting in the local store of `home`, its
    report made, and `sweep ui` serving that store at `base`; `runs_view` is the URL `sweep ui` printed for it.
    The same home holds the sweep TASKS_SPEC, of two tasks, whose link is `tasks_view`."""

    home: Path
    report: Path
    base: str
    runs_view: str
    sweep: Runner
    tasks_view: str


@pytest.fixture(scope="session")
def marked_sweep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MarkedSweep]:
    """`sweep submit` of MARKS_SPEC (the stand-in job, local store), `sweep report`, then `sweep ui` until the
    session ends."""
    work = tmp_path_factory.mktemp("marked-sweep")
    home = work / "home"
    (work / "marks.yaml").write_text(MARKS_SPEC)
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "KUBESWEEP_NO_TRACKING")}
    env.update({**quiet_mlflow_env(), "KUBESWEEP_HOME": str(home), "KUBESWEEP_LOCAL_GPUS": json.dumps(FAKE_GPUS),
                "KUBESWEEP_JOB_COMMAND": json.dumps([sys.executable, str(TRACKED_JOB)]), "COLUMNS": "220"})
    run = make_runner(env, work)
    run("submit", "marks.yaml", timeout=900)
    (work / "tasks.yaml").write_text(TASKS_SPEC)
    run("submit", "tasks.yaml", timeout=900)
    report = work / "report"
    run("report", MARKS_NAME, "--output", str(report))
    port = free_port()
    log = work / "ui.log"
    with log.open("wb") as sink:
        ui = subprocess.Popen([sys.executable, "-m", "kubesweep", "ui", "--port", str(port)], env=env, cwd=work,
                              stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/health", ui, log)
        deadline = time.monotonic() + 60  # the links may follow the server's first answer

        def links() -> dict[str, str]:
            return dict(line[2:].split(": ", 1) for line in log.read_text().splitlines()
                        if line.startswith((f"  {MARKS_NAME}: ", f"  {TASKS_NAME}: ")))

        while len(printed := links()) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert len(printed) == 2, log.read_text()
        yield MarkedSweep(home, report / "report.html", base, printed[MARKS_NAME], run, printed[TASKS_NAME])
    finally:
        stop(ui)
