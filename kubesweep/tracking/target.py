"""Where a sweep is tracked: the MLflow tracking URI, the experiment and the artifact location.

Resolution, first match wins (the same for `submit`, `resume`, `results`, `report` and `ui`):

1. `--tracking-uri` on the command line;
2. the environment variable `MLFLOW_TRACKING_URI`;
3. the sweep spec's `tracking.uri`;
4. the local store under the kubesweep home: `sqlite:///<home>/mlflow.db`, artifacts in `<home>/mlartifacts`
   (only where the trials are processes of this machine, `Backend.runs_here`: a Kubernetes trial cannot write to
   this machine's disk).

`--no-tracking` (env `KUBESWEEP_NO_TRACKING=1`) turns tracking off. This module imports nothing from mlflow.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path

URI_ENV = "MLFLOW_TRACKING_URI"
NO_TRACKING_ENV = "KUBESWEEP_NO_TRACKING"
LOCAL_DB = "mlflow.db"
LOCAL_ARTIFACTS = "mlartifacts"


@dataclass(frozen=True)
class TrackingTarget:
    """A resolved tracking destination. `uri` is None when tracking is off; `off_reason` then says why."""

    uri: str | None
    experiment: str
    source: str  # flag | env | spec | local-store | off
    artifact_root: Path | None = None  # for file-based stores: where experiments we create keep artifacts
    off_reason: str = ""

    @property
    def enabled(self) -> bool:
        return self.uri is not None

    def describe(self) -> str:
        if self.uri is None:
            return f"tracking: off ({self.off_reason})"
        return f"tracking: MLflow at {self.uri} (from {self.source}), experiment {self.experiment!r}"


def mlflow_installed() -> bool:
    return importlib.util.find_spec("mlflow") is not None


def local_store_uri(home: Path) -> str:
    return f"sqlite:///{(home / LOCAL_DB).resolve()}"


def sqlite_path(uri: str) -> Path | None:
    """The database file of a `sqlite:///...` URI (None for any other scheme)."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri[len("sqlite:///"):]).resolve()  # sqlite:////abs/file.db or sqlite:///relative.db


def sqlite_experiments(uri: str | None) -> list[str] | None:
    """The active experiments' names of a `sqlite:///` store, read without MLflow and without writing: [] when the
    file does not exist (nothing is created), None where that cannot be said here (another kind of store, a file
    that is not MLflow's). A read-only command answers "no such sweep" from this at once, where opening the store
    through MLflow would take seconds and create the database."""
    db = sqlite_path(uri) if uri else None
    if db is None:
        return None
    if not db.exists():
        return []
    try:
        with contextlib.closing(sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=5)) as conn:
            rows = conn.execute("SELECT name FROM experiments WHERE lifecycle_stage = 'active'").fetchall()
    except sqlite3.Error:
        return None
    return [str(name) for (name,) in rows]


def artifact_dir(root: Path, experiment: str) -> Path:
    """Where an experiment created on a file-based store keeps its artifacts (one folder per experiment)."""
    return root / (re.sub(r"[^A-Za-z0-9._-]+", "_", experiment).strip("._") or "experiment")


def resolve(
    *,
    experiment: str,
    home: Path,
    flag: str | None = None,
    spec_uri: str | None = None,
    backend: str = "local",
    runs_here: bool = True,
    disabled: bool = False,
    require_mlflow: bool = True,
) -> TrackingTarget:
    """The tracking destination for a sweep; see the module docstring for the order. `runs_here`: the backend's
    trials are processes of this machine (`Backend.runs_here`), so the local store is theirs to write to;
    `backend`: its name, for the message where it is not."""
    if disabled:
        return TrackingTarget(None, experiment, "off", off_reason=f"--no-tracking / {NO_TRACKING_ENV}")
    if require_mlflow and not mlflow_installed():
        return TrackingTarget(None, experiment, "off",
                              off_reason="mlflow is not installed: pip install 'kubesweep[tracking]'")
    env_uri = os.environ.get(URI_ENV) or None
    for uri, source in ((flag, "--tracking-uri"), (env_uri, URI_ENV), (spec_uri, "spec tracking.uri")):
        if uri:
            db = sqlite_path(uri)
            root = db.parent / LOCAL_ARTIFACTS if db is not None else None
            if uri.startswith("file:") or "://" not in uri:
                root = None  # a file store keeps artifacts beside the runs by itself
            return TrackingTarget(uri, experiment, source, artifact_root=root)
    if not runs_here:
        return TrackingTarget(None, experiment, "off", off_reason=(
            f"no tracking URI for the {backend} backend: pass --tracking-uri, set {URI_ENV} or the spec's "
            "tracking.uri to the cluster's MLflow server (`sweep ui --backend kubernetes` shows how to reach it)"))
    return TrackingTarget(local_store_uri(home), experiment, "local store", artifact_root=home / LOCAL_ARTIFACTS)
