"""`sweep ui`: the MLflow UI over the local store, or directions to the cluster's tracking server."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType

from kubesweep.tracking.target import LOCAL_ARTIFACTS, local_store_uri

CLUSTER_SERVICE = "kubesweep-mlflow"
CLUSTER_PORT = 5000


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def mlflow_executable() -> list[str]:
    """`mlflow` next to this interpreter (the same environment), else on PATH, else `python -m mlflow`."""
    beside = Path(sys.executable).with_name("mlflow")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("mlflow")
    return [found] if found else [sys.executable, "-m", "mlflow"]


def server_command(home: Path, port: int, host: str = "127.0.0.1", workers: int = 1,
                   backend_uri: str | None = None) -> list[str]:
    """`mlflow server` over the kubesweep home's store: sqlite runs, artifacts served from <home>/mlartifacts."""
    artifacts = (home / LOCAL_ARTIFACTS).resolve()
    artifacts.mkdir(parents=True, exist_ok=True)
    return [*mlflow_executable(), "server", "--backend-store-uri", backend_uri or local_store_uri(home),
            "--artifacts-destination", str(artifacts), "--serve-artifacts", "--host", host, "--port", str(port),
            "--workers", str(workers)]


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


def run_server(command: list[str], env: Mapping[str, str]) -> int | None:
    """Run `command` as the head of a process group this process owns: stopping `sweep ui` (Ctrl-C, SIGTERM,
    SIGHUP) stops the server and every worker it started, and a `sweep ui` killed outright takes the server
    with it. Returns the server's exit code, or None when `sweep ui` was stopped."""

    def stop(signum: int, frame: FrameType | None) -> None:
        raise Stopped(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    proc = None
    try:
        proc = subprocess.Popen(command, env=dict(env), preexec_fn=_die_with_parent)
        return proc.wait()
    except Stopped:
        return None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if proc is not None:
            stop_group(proc)


def serve(home: Path, port: int | None, backend_uri: str | None, say: Callable[[str], None]) -> int | None:
    """The MLflow UI over the local store of `home` (or `backend_uri`) on 127.0.0.1:`port` (default: a free
    port) until it is stopped; where to open it (and each sweep's runs view) goes to `say`. Returns what
    `run_server` returns."""
    chosen = port or free_port()
    command = server_command(home, chosen, backend_uri=backend_uri)
    store = command[command.index("--backend-store-uri") + 1]
    base = f"http://127.0.0.1:{chosen}"
    say(f"MLflow UI: {base}  (store {store}; Ctrl-C or SIGTERM stops it and its workers)")
    views = sweep_views(store, base)
    if views:
        say("each sweep's runs, best samples/s first, with the comparison columns:")
        for experiment, url in views:
            say(f"  {experiment}: {url}")
    # a UI-only server: no background job runner (MLflow's GenAI jobs), unless asked for in the environment
    return run_server(command, {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ})


def sweep_views(store_uri: str, base: str) -> list[tuple[str, str]]:
    """(experiment name, its runs view URL) for each experiment in the store that kubesweep tagged."""
    from mlflow.tracking import MlflowClient

    from kubesweep.tracking.runs import quiet
    from kubesweep.tracking.view import VIEW_TAG, runs_url

    quiet()

    try:
        experiments = MlflowClient(tracking_uri=store_uri).search_experiments(max_results=1000)
    except Exception:  # an empty or unreadable store: the server says what is wrong when it starts
        return []
    return [(e.name, runs_url(base, e.experiment_id)) for e in experiments if VIEW_TAG in e.tags]


def cluster_directions(namespace: str, uri: str | None) -> str:
    lines = []
    if uri:
        lines.append(f"tracking URI in use: {uri}")
    lines += [
        f"The cluster's MLflow server is the Service `{CLUSTER_SERVICE}` in namespace `{namespace}`. "
        "From this machine:",
        f"  kubectl -n {namespace} port-forward svc/{CLUSTER_SERVICE} {CLUSTER_PORT}:{CLUSTER_PORT}",
        f"  then open http://127.0.0.1:{CLUSTER_PORT}",
        f"and, for `sweep results/report`, pass --tracking-uri http://127.0.0.1:{CLUSTER_PORT} "
        "(or set MLFLOW_TRACKING_URI).",
    ]
    return "\n".join(lines)
