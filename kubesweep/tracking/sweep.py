"""What the CLI asks of tracking, in a few calls: open the sweep's parent run, read a sweep's trial records."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kubesweep.tracking.records import TrialRecord, from_backend, from_mlflow
from kubesweep.tracking.target import TrackingTarget

if TYPE_CHECKING:
    from kubesweep.backends.base import Backend
    from kubesweep.manifests import TrackingEnv


@dataclass
class Opened:
    env: TrackingEnv | None
    message: str
    warning: bool = False


def open_parent(target: TrackingTarget, sweep: str, *, backend: str, trials: int,
                spec: dict[str, Any] | None) -> Opened:
    """Find or create the sweep's parent run; the env its trials need. Never raises for tracking trouble."""
    from kubesweep.manifests import TrackingEnv
    from kubesweep.tracking.runs import SweepRuns, TrackingError

    if not target.enabled:
        return Opened(None, target.describe(), warning=target.source != "off" or "installed" in target.off_reason)
    assert target.uri is not None
    try:
        run_id, created = SweepRuns(target, sweep).ensure_parent(backend=backend, trials=trials, spec=spec)
    except TrackingError as exc:
        return Opened(None, f"tracking: off for this run: {exc}", warning=True)
    state = "created" if created else "found"
    return Opened(TrackingEnv(uri=target.uri, experiment=target.experiment, parent_run_id=run_id),
                  f"{target.describe()}, parent run {run_id} ({state})")


def finish_parent(env: TrackingEnv | None, target: TrackingTarget, sweep: str, failed: bool) -> None:
    from kubesweep.tracking.runs import SweepRuns, TrackingError

    if env is None or env.parent_run_id is None:
        return
    with contextlib.suppress(TrackingError):  # the trials' runs are what matter; the parent's end state is cosmetic
        SweepRuns(target, sweep).finish_parent(env.parent_run_id, "FAILED" if failed else "FINISHED")


@dataclass
class Loaded:
    records: list[TrialRecord]
    source: str
    note: str
    parent_run_id: str | None = None


def load_records(target: TrackingTarget, sweep: str, backend: Backend | None) -> Loaded:
    """The sweep's trials from MLflow (child runs of its parent run), else from the backend's results files.

    Raises `runs.TrackingError` when MLflow is configured but cannot be read, and `BackendError` when neither
    MLflow nor the backend knows the sweep.
    """
    from kubesweep.backends.base import SweepNotFound

    if target.enabled:
        from kubesweep.tracking.runs import SweepRuns

        runs = SweepRuns(target, sweep)
        parent = runs.find_parent()
        if parent is not None:
            records = from_mlflow(runs, parent, backend, sweep)
            return Loaded(records, f"MLflow {target.uri}, experiment {target.experiment!r}, parent run {parent}",
                          "", parent)
        note = (f"no MLflow parent run for sweep {sweep!r} in experiment {target.experiment!r} at {target.uri}; "
                "reading the backend's results files")
    else:
        note = f"{target.describe()}; reading the backend's results files"
    if backend is None:
        raise SweepNotFound(f"sweep {sweep!r}: {note.split(';')[0]}, and no backend to read it from")
    return Loaded(from_backend(backend, sweep), f"results files ({backend.name} backend)", note)
