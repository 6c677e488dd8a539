"""`sweep ui`: the MLflow UI over the local store, or directions to the cluster's tracking server."""

from __future__ import annotations

import shutil
import socket
import sys
from pathlib import Path

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
