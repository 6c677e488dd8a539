"""`sweep ui`: the MLflow UI over the local store, or directions to the cluster's tracking server.

The local server's output (MLflow's start-up messages, warnings and its request log) goes to `<home>/ui.log`;
the terminal gets where to open the UI once the server answers HTTP: a sweep's runs view (`sweep ui NAME`), or
the server with a link to each sweep's.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType

from kubesweep.backends.base import SweepNotFound
from kubesweep.tracking.runs import TrackingError, quiet
from kubesweep.tracking.target import LOCAL_ARTIFACTS, local_store_uri, sqlite_path
from kubesweep.tracking.view import SERVED_PATH, VIEW_TAG, runs_url
from kubesweep.wire import tags

CLUSTER_SERVICE = "kubesweep-mlflow"
CLUSTER_PORT = 5000
LOG_FILE = "ui.log"  # in the kubesweep home
APP_NAME = "kubesweep"  # the `mlflow.app` entry point (pyproject.toml): kubesweep/tracking/ui_app.py
START_TIMEOUT_S = 300.0  # a first start on a busy machine takes tens of seconds (imports, store migrations)
PROGRESS_EVERY_S = 5.0


class ServerFailed(TrackingError):
    """The MLflow server exited, or did not answer, before it served the UI; the message names its log."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def mlflow_executable() -> list[str]:
    """`mlflow` next to this interpreter, else `python -m mlflow`: the MLflow of this environment, where kubesweep's
    app (`APP_NAME`) is installed beside it (an `mlflow` from elsewhere on PATH would not find it)."""
    beside = Path(sys.executable).with_name("mlflow")
    return [str(beside)] if beside.exists() else [sys.executable, "-m", "mlflow"]


# What `mlflow server` hands the server process it starts, in MLflow 3.17's names (mlflow/server/__init__.py
# `_run_server`; tests/tracking/test_ui.py holds them to MLflow's own constants). `mlflow server` is a Python
# process that imports MLflow's whole command line and opens the store, then starts uvicorn in a second one,
# which imports MLflow again: on this 2-core machine, busy, 16 s until it answered, where uvicorn started
# directly on the same app answered in 3.5 s. `sweep ui` starts uvicorn itself; the store is opened (made, for a
# fresh home) by the server's first request that reads it.
STORE_ENV = "_MLFLOW_SERVER_FILE_STORE"
ARTIFACT_ROOT_ENV = "_MLFLOW_SERVER_ARTIFACT_ROOT"
ARTIFACTS_DESTINATION_ENV = "_MLFLOW_SERVER_ARTIFACT_DESTINATION"
SERVE_ARTIFACTS_ENV = "_MLFLOW_SERVER_SERVE_ARTIFACTS"
SGI_ENV = "_MLFLOW_SGI_NAME"  # which server runs the app: ui_app.create_app wraps it for uvicorn
BOOT_ID_ENV = "_MLFLOW_SERVER_BOOT_ID"
IN_JOB_EXECUTOR_ENV = "_MLFLOW_IN_JOB_EXECUTOR"
JOB_EXECUTION_ENV = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"
SERVED_ARTIFACT_ROOT = "mlflow-artifacts:/"  # runs' artifacts through the server's proxy (`--serve-artifacts`)
APP = "kubesweep.tracking.ui_app:create_app"  # the `mlflow.app` entry point `APP_NAME`, a factory


def server_command(home: Path, port: int, host: str = "127.0.0.1", workers: int = 1,
                   backend_uri: str | None = None) -> tuple[list[str], dict[str, str]]:
    """The command and environment of an MLflow server over the kubesweep home's store (sqlite runs, artifacts
    served from <home>/mlartifacts), as `mlflow server --serve-artifacts --app-name kubesweep` runs it: uvicorn
    on kubesweep's app (`APP_NAME`: MLflow's own plus the page the runs-view links go through)."""
    artifacts = (home / LOCAL_ARTIFACTS).resolve()
    artifacts.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "uvicorn", "--host", host, "--port", str(port), "--workers", str(workers),
               "--factory", APP]
    env = {STORE_ENV: backend_uri or local_store_uri(home), ARTIFACT_ROOT_ENV: SERVED_ARTIFACT_ROOT,
           ARTIFACTS_DESTINATION_ENV: str(artifacts), SERVE_ARTIFACTS_ENV: "true", SGI_ENV: "uvicorn",
           BOOT_ID_ENV: uuid.uuid4().hex, IN_JOB_EXECUTOR_ENV: "false"}
    return command, env


class Stopped(Exception):
    """`sweep ui` was asked to stop (SIGINT, SIGTERM or SIGHUP)."""


def _die_with_parent() -> None:
    """In the child, before exec: its own process group, and SIGTERM when `sweep ui` dies, even by SIGKILL."""
    os.setsid()
    if sys.platform == "linux":
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def stop_group(proc: subprocess.Popen[bytes], grace: float = 20.0) -> None:
    """SIGTERM the server's whole process group (the server and its workers); SIGKILL what outlives `grace`."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        with contextlib.suppress(ProcessLookupError):  # workers that outlived the server
            os.killpg(proc.pid, signal.SIGKILL)
        return


def run_server(command: list[str], env: Mapping[str, str], *, log: Path | None = None,
               ready: Callable[[subprocess.Popen[bytes]], None] | None = None) -> int | None:
    """Run `command` as the head of a process group this process owns: stopping `sweep ui` (Ctrl-C, SIGTERM,
    SIGHUP) stops the server and every worker it started, and a `sweep ui` killed outright takes the server
    with it. Its output is appended to `log` (default: this process's). `ready(proc)` runs once it has started
    (it may raise: the server is stopped). Returns the server's exit code, or None when `sweep ui` was
    stopped."""

    def stop(signum: int, frame: FrameType | None) -> None:
        raise Stopped(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    proc = None
    try:
        with contextlib.ExitStack() as files:
            sink = files.enter_context(log.open("ab")) if log is not None else None
            proc = subprocess.Popen(command, env=dict(env), preexec_fn=_die_with_parent, stdin=subprocess.DEVNULL,
                                    stdout=sink, stderr=subprocess.STDOUT if sink is not None else None)
        if ready is not None:
            ready(proc)
        return proc.wait()
    except Stopped:
        return None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if proc is not None:
            stop_group(proc)


def answers(url: str, timeout: float = 2.0) -> bool:
    """Whether `url` answers HTTP 200 (straight to it: no proxy for a server on this machine)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as response:
            return int(response.status) == 200
    except OSError:
        return False


def wait_until_served(proc: subprocess.Popen[bytes], base: str, log: Path, say: Callable[[str], None], *,
                      offset: int = 0, timeout: float = START_TIMEOUT_S) -> float:
    """Seconds until the server at `base` answers HTTP, saying every few seconds that it is still waiting.
    `ServerFailed` (with the end of its log, from `offset`) when it exits first or does not answer in
    `timeout` seconds."""
    start = time.monotonic()
    said = start
    while not answers(f"{base}/health"):
        code = proc.poll()
        now = time.monotonic()
        if code is not None or now - start > timeout:
            why = (f"exited with code {code}" if code is not None else f"did not answer in {timeout:.0f} s")
            raise ServerFailed(f"the MLflow server {why} before it served the UI; its log, {log}, ends:\n"
                               + _tail(log, offset))
        if now - said >= PROGRESS_EVERY_S:
            said = now
            say(f"  still waiting for the MLflow server to answer ({now - start:.0f} s)")
        time.sleep(0.2)
    return time.monotonic() - start


def _tail(log: Path, offset: int, chars: int = 3000) -> str:
    try:
        with log.open("rb") as handle:
            handle.seek(offset)
            text = handle.read().decode(errors="replace")
    except OSError:
        return "(unreadable)"
    return text[-chars:].rstrip() or "(empty)"


def serve(home: Path, port: int | None, backend_uri: str | None, say: Callable[[str], None], *,
          sweep: str | None = None, experiment: str | None = None) -> int | None:
    """The MLflow UI over the local store of `home` (or `backend_uri`) on 127.0.0.1:`port` (default: a free
    port) until it is stopped. The server's output goes to `<home>/ui.log`; where to open the UI goes to `say`
    once the server answers: the runs view of `experiment` (the sweep `sweep`'s), or the server with a link to
    each sweep's runs view. Returns what `run_server` returns; `SweepNotFound` when the store has no
    `experiment`, `ServerFailed` when the server does not come up."""
    chosen = port or free_port()
    command, server_env = server_command(home, chosen, backend_uri=backend_uri)
    store = server_env[STORE_ENV]
    base = f"http://127.0.0.1:{chosen}"
    target = None
    if experiment is not None:
        target = experiment_view(store, experiment, base)
        if target is None:
            known = ", ".join(name for name, _ in sweep_views(store, base)) or "none"
            raise SweepNotFound(f"sweep {sweep or experiment!r}: no MLflow experiment {experiment!r} in the store "
                                f"{store} (experiments of sweeps there: {known})")
    answer = answer_view(store, target, sweep) if target is not None and sweep is not None else None
    views = [] if target is not None else sweep_views(store, base)
    log = home / LOG_FILE
    log.parent.mkdir(parents=True, exist_ok=True)
    offset = log.stat().st_size if log.exists() else 0
    say(f"starting the MLflow server on {base} (store {store}); its output goes to {log}")

    def ready(proc: subprocess.Popen[bytes]) -> None:
        took = wait_until_served(proc, base, log, say, offset=offset)
        if target is not None:
            say(f"MLflow UI, the runs of sweep {sweep or experiment!r} (best samples/s first): {target}")
            if answer is not None:
                say(f"its answer in full (the parent run's description): {answer}")
        else:
            say(f"MLflow UI: {base}")
            if views:
                say("each sweep's runs, best samples/s first, with the comparison columns:")
                for name, url in views:
                    say(f"  {name}: {url}")
        say(f"(the server answered after {took:.0f} s; Ctrl-C or SIGTERM stops it and its workers)")

    # a UI-only server: no background job runner (MLflow's GenAI jobs)
    return run_server(command, {**os.environ, JOB_EXECUTION_ENV: "false", **server_env}, log=log, ready=ready)


def _sqlite_experiments(store_uri: str) -> list[tuple[str, str, bool]] | None:
    """(name, id, whether kubesweep tagged it) of each active experiment of a `sqlite:///` store, read from the
    file as it is (read only, no MLflow import: that import alone took `sweep ui` seconds before it printed a
    link); [] for a store not made yet; None for another kind of store, or a file whose tables are not MLflow's
    as this reader knows them (MLflow's client reads it then)."""
    db = sqlite_path(store_uri)
    if db is None:
        return None
    if not db.exists():
        return []
    try:
        with contextlib.closing(sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=30)) as conn:
            rows = conn.execute(
                "SELECT e.name, e.experiment_id, EXISTS (SELECT 1 FROM experiment_tags t "
                "WHERE t.experiment_id = e.experiment_id AND t.key = ?) FROM experiments e "
                "WHERE e.lifecycle_stage = 'active' ORDER BY e.creation_time DESC, e.experiment_id DESC",
                (VIEW_TAG,)).fetchall()
    except sqlite3.Error:
        return None
    return [(str(name), str(eid), bool(tagged)) for name, eid, tagged in rows]


def answer_view(store_uri: str, experiment_url: str, sweep: str) -> str | None:
    """The page of the sweep's parent run, whose description is its answer in full (the runs view's Description
    column has room for its first words), in a `sqlite:///` store, read as `_sqlite_experiments` reads; None
    where there is none, or another kind of store. `experiment_url`: the runs view's URL `experiment_view` gave."""
    db = sqlite_path(store_uri)
    base, _, experiment_id = experiment_url.rpartition(SERVED_PATH)
    if db is None or not db.exists() or not experiment_id:
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=30)) as conn:
            row = conn.execute(
                "SELECT r.run_uuid FROM runs r "
                "JOIN tags a ON a.run_uuid = r.run_uuid AND a.key = ? AND a.value = ? "
                "JOIN tags b ON b.run_uuid = r.run_uuid AND b.key = ? AND b.value = ? "
                "WHERE r.experiment_id = ? AND r.lifecycle_stage = 'active' ORDER BY r.start_time DESC LIMIT 1",
                (tags.ROLE, tags.PARENT_ROLE, tags.SWEEP, sweep, experiment_id)).fetchone()
    except sqlite3.Error:
        return None
    return f"{base}/#/experiments/{experiment_id}/runs/{row[0]}?workflowType=machine_learning" if row else None


def experiment_view(store_uri: str, experiment: str, base: str) -> str | None:
    """The runs view URL of the experiment named `experiment` in the store, on `sweep ui`'s server at `base`;
    None when there is none."""
    listed = _sqlite_experiments(store_uri)
    if listed is not None:
        found_id = next((eid for name, eid, _ in listed if name == experiment), None)
        return runs_url(base, found_id, served=True) if found_id is not None else None
    from mlflow.tracking import MlflowClient

    quiet()
    try:
        found = MlflowClient(tracking_uri=store_uri).get_experiment_by_name(experiment)
    except Exception:  # an empty or unreadable store
        return None
    return runs_url(base, found.experiment_id, served=True) if found is not None else None


def sweep_views(store_uri: str, base: str) -> list[tuple[str, str]]:
    """(experiment name, its runs view URL on `sweep ui`'s server at `base`) for each experiment in the store
    that kubesweep tagged."""
    listed = _sqlite_experiments(store_uri)
    if listed is not None:
        return [(name, runs_url(base, eid, served=True)) for name, eid, tagged in listed if tagged]
    from mlflow.tracking import MlflowClient

    quiet()
    try:
        experiments = MlflowClient(tracking_uri=store_uri).search_experiments(max_results=1000)
    except Exception:  # an empty or unreadable store: the server says what is wrong when it starts
        return []
    return [(e.name, runs_url(base, e.experiment_id, served=True)) for e in experiments if VIEW_TAG in e.tags]


def cluster_directions(uri: str | None) -> str:
    """How to reach the chart's MLflow server from a workstation. It is the Service `<release>-mlflow` in the
    namespace the chart was installed in, which the sweeps' namespaces need not be."""
    lines = []
    if uri:
        lines.append(f"tracking URI in use: {uri}")
    lines += [
        f"The chart's MLflow server is the Service `{CLUSTER_SERVICE}` in the namespace the chart was installed in "
        "(`kubesweep` as the README installs it; `kubectl get svc -A -l app.kubernetes.io/component=mlflow` "
        "finds it). From this machine:",
        f"  kubectl -n kubesweep port-forward svc/{CLUSTER_SERVICE} {CLUSTER_PORT}:{CLUSTER_PORT}",
        f"  then open http://127.0.0.1:{CLUSTER_PORT}",
        f"and pass --tracking-uri http://127.0.0.1:{CLUSTER_PORT} (or set MLFLOW_TRACKING_URI) to `sweep ui NAME` "
        "for a sweep's runs view and to `sweep results/report`.",
    ]
    return "\n".join(lines)
