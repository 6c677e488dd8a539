"""What the CLI asks of tracking, in a few calls: open the sweep's parent run and end it with its answer, read a
sweep's trial records."""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kubesweep.backends.base import SweepNotFound
from kubesweep.tracking.aggregate import Cell
from kubesweep.tracking.records import TrialRecord, from_backend, from_mlflow
from kubesweep.tracking.report_answer import answer_lines, best_settings, setting_text, value_text
from kubesweep.tracking.runs import ServerAway, SweepRuns, TrackingError, UnusableStore
from kubesweep.tracking.target import TrackingTarget
from kubesweep.wire import tags
from kubesweep.wire.env import TrackingEnv
from kubesweep.wire.trial_metrics import DEFAULT_TARGET_ACCURACY

if TYPE_CHECKING:
    from kubesweep.backends.base import Backend


@dataclass
class Opened:
    env: TrackingEnv | None
    message: str
    warning: bool = False


def open_parent(target: TrackingTarget, sweep: str, *, backend: str, trials: int,
                spec: dict[str, Any] | None) -> Opened:
    """Find or create the sweep's parent run; the env its trials need. Tracking trouble turns tracking off
    (said in the message), except a sqlite store file that cannot be read (`UnusableStore`), which is raised."""
    if not target.enabled:
        return Opened(None, target.describe(), warning=target.source != "off" or "installed" in target.off_reason)
    assert target.uri is not None
    try:
        run_id, created = SweepRuns(target, sweep).ensure_parent(backend=backend, trials=trials, spec=spec)
    except UnusableStore:
        raise  # a damaged store file is the user's to move aside: every trial would fail on it
    except TrackingError as exc:
        return Opened(None, f"tracking: off for this run: {exc}", warning=True)
    state = "created" if created else "found"
    return Opened(TrackingEnv(uri=target.uri, experiment=target.experiment, parent_run_id=run_id),
                  f"{target.describe()}, parent run {run_id} ({state})")


def finish_parent(env: TrackingEnv | None, target: TrackingTarget, sweep: str, failed: bool,
                  cells: list[Cell] | None = None, target_accuracy: float = DEFAULT_TARGET_ACCURACY) -> None:
    """End the sweep's parent run, with the answer its `cells` give (`log_answer`; time to accuracy to
    `target_accuracy`)."""
    if env is None or env.parent_run_id is None:
        return
    runs = SweepRuns(target, sweep)
    # the trials' runs are what matter; the parent's answer and end state are cosmetic, and each is tried
    if cells:
        with contextlib.suppress(TrackingError):
            log_answer(runs, env.parent_run_id, cells, target_accuracy)
    with contextlib.suppress(TrackingError):
        runs.finish_parent(env.parent_run_id, "FAILED" if failed else "FINISHED")


def kill_running(runs: SweepRuns) -> int:
    """End the sweep's runs still RUNNING (its parent run and its trials' runs) as KILLED: what a deleted sweep
    leaves. Reads the store only where the sweep has a parent run there. Returns how many were ended."""
    parent = runs.find_parent()
    if parent is None:
        return 0
    ended = 0
    for child in runs.children(parent):
        if child.status == "RUNNING":
            runs.end_run(child.run_id, "KILLED")
            ended += 1
    if runs.status(parent) == "RUNNING":
        runs.end_run(parent, "KILLED")
        ended += 1
    return ended


def answer_tags(cells: list[Cell], target: float) -> dict[str, str]:
    """`kubesweep.best.finetune.cpu.samples_per_s`: `bs16 bf16 eager: 55.23 samples/s ±11.5% (n=4)`, per task, GPU
    type and objective the sweep measured (why none, where no setting answers it)."""
    return {f"{tags.BEST}.{b.task}.{_key_part(b.gpu)}.{b.metric}":
            f"{setting_text(b.cell)}: {value_text(b.cell, b.metric)} (n={b.cell.metrics[b.metric].n})"
            if b.cell is not None else f"none: {b.why_none}"
            for b in best_settings(cells, target) if b.measured}


def _key_part(name: str) -> str:
    """A GPU type as a part of a tag key: a name the catalog does not know comes from the trial's NVML report, so
    whatever MLflow refuses in a key is replaced and its length bounded."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64] or "_"


def log_answer(runs: SweepRuns, parent_run_id: str, cells: list[Cell], target: float) -> None:
    """The answer on the parent run: tags (`answer_tags`), and its sentences as the run's description and
    `answer.txt`."""
    lines = answer_lines(cells, target, measured_only=True)
    runs.log_answer(parent_run_id, answer_tags(cells, target), "\n".join(lines) + "\n")


@dataclass
class Loaded:
    records: list[TrialRecord]
    source: str
    note: str
    parent_run_id: str | None = None


def load_records(target: TrackingTarget, sweep: str, backend: Backend | None, *, source: str = "auto") -> Loaded:
    """The sweep's trials. `auto`: the backend's own results files when it keeps them on this machine (the local
    backend: the same results.json its MLflow runs hold, without a round trip) or when tracking is off, else
    MLflow (the child runs of the sweep's parent run: where the backend's controller owns that run, the one it
    records and never one found by its tags), else the backend's status. `files` and `mlflow` insist.

    Raises `runs.TrackingError` when MLflow is asked for but cannot be read, and `BackendError` (`SweepNotFound`)
    when what is asked for does not know the sweep.
    """
    keeps_files = backend is not None and backend.keeps_results
    if source == "files" or (source == "auto" and (keeps_files or not target.enabled)):
        off = "" if target.enabled else f"{target.describe()}; reading the backend's results files"
        if backend is None:
            raise SweepNotFound(f"sweep {sweep!r}: {off.split(';')[0] or 'no backend'}, and no backend to read "
                                "it from")
        try:
            return _from_files(backend, sweep, off)
        except SweepNotFound:
            if source == "files" or not target.enabled:
                raise
            # auto: this machine does not know the sweep; its MLflow runs may
    if not target.enabled:
        raise TrackingError(f"{target.describe()}: no MLflow to read the sweep's results from")
    runs = SweepRuns(target, sweep)
    if backend is not None and backend.opens_parent_run:
        # the operator owns the parent run: its record alone says which run is the sweep's, never a run found by
        # its tags in the experiment (which anyone who may write to it can make)
        loaded, missing = _from_record(runs, target, backend, sweep)
        if loaded is not None:
            return loaded
        if source == "mlflow":
            raise SweepNotFound(f"sweep {sweep!r}: {missing}")
        return Loaded(from_backend(backend, sweep), f"results files ({backend.name} backend)",
                      f"{missing}; reading the backend's results files" + _no_figures(backend))
    parent = runs.find_parent()
    if parent is not None:
        return Loaded(from_mlflow(runs, parent, backend, sweep),
                      f"MLflow {target.uri}, experiment {target.experiment!r}, parent run {parent}", "", parent)
    # the backend's record of the sweep's parent run: where its experiment is not the name asked for (the
    # operator's, on a server with a user per namespace, is `<namespace>/<experiment>`)
    loaded, _ = _from_record(runs, target, backend, sweep)
    if loaded is not None:
        return loaded
    missing = f"no MLflow parent run for sweep {sweep!r} in experiment {target.experiment!r} at {target.uri}"
    if source == "mlflow" or backend is None:
        raise SweepNotFound(f"sweep {sweep!r}: {missing}" + ("" if source == "mlflow" else
                                                              ", and no backend to read it from"))
    return Loaded(from_backend(backend, sweep), f"results files ({backend.name} backend)",
                  f"{missing}; reading the backend's results files")


def _from_record(runs: SweepRuns, target: TrackingTarget, backend: Backend | None,
                 sweep: str) -> tuple[Loaded | None, str]:
    """The sweep's runs under the parent run the backend records for it; else None and why not (no record, or a
    run this server does not give: the record names another server's, or the server refused or failed, in its
    words)."""
    parent = backend.parent_run_id(sweep) if backend is not None else None
    if parent is None or backend is None:
        who = f"the {backend.name} backend" if backend is not None else "no backend"
        return None, f"{who} records no MLflow parent run for sweep {sweep!r}"
    try:
        return Loaded(from_mlflow(runs, parent, backend, sweep),
                      f"MLflow {target.uri}, parent run {parent} (the {backend.name} backend's record)", "",
                      parent), ""
    except ServerAway as exc:
        # not "does not give": the server said nothing; the backend's outcomes without the figures would read as
        # a sweep that measured nothing
        raise ServerAway(f"{exc}; the figures of sweep {sweep!r} are in its MLflow runs (parent run {parent}): run "
                         f"this again once the server answers (`sweep status {sweep}` shows the trials' outcomes "
                         "meanwhile)") from None
    except TrackingError as exc:
        return None, (f"the {backend.name} backend records MLflow parent run {parent} for sweep {sweep!r}, which "
                      f"{target.uri} does not give ({exc})")


def _no_figures(backend: Backend) -> str:
    return "" if backend.keeps_results else (
        f" (the {backend.name} backend keeps trials' outcomes, not their figures: those are in the MLflow runs)")


def _from_files(backend: Backend, sweep: str, note: str) -> Loaded:
    if not backend.keeps_results:
        note = (f"{note.split(';')[0]}; " if note else "") + (
            f"the {backend.name} backend keeps no results files on this machine: trials' outcomes only, no figures "
            "(its trials' MLflow runs hold them: --tracking-uri URI)")
    return Loaded(from_backend(backend, sweep), f"results files ({backend.name} backend)", note,
                  backend.parent_run_id(sweep))
