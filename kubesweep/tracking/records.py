"""Trials as the results views see them: one `TrialRecord` per trial, from MLflow or from results files.

- `from_mlflow`: the child runs of the sweep's parent run; measurements come from each run's `results.json`
  artifact (the same file the job writes locally), the cell from its tags and params; trials the backend knows
  but MLflow has no run for yet (pending, skipped) are added from the backend's status.
- `from_backend`: the backend's own view: results files of the local backend (`<home>/sweeps/<sweep>/trials/
  <trial>/results.json`), or only phases and outcomes where the backend keeps no files (kubernetes).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kubesweep.backends.base import Backend, BackendError, TrialStatus
from kubesweep.wire import tags
from kubesweep.wire.config import JobConfig, gpu_type_of
from kubesweep.wire.results import Results
from kubesweep.wire.results_file import (  # the one validated, bounded reader; re-exported for its readers here
    MAX_MAGNITUDE,
    MAX_RESULTS_BYTES,
    ResultsFileError,
    parse_results,
    read_results_file,
)

__all__ = ["MAX_MAGNITUDE", "MAX_RESULTS_BYTES", "ResultsFileError", "parse_results", "read_results_file"]

# params the job logs that are not job settings
_TRIAL_PARAMS = frozenset({"sweep", "trial_id", "repeat", "gpu", "gpus_per_trial"})
# a trial's axes that are not job settings
_AXES_NOT_JOB = frozenset({"gpu", "gpus_per_trial", "num_nodes"})


@dataclass
class TrialRecord:
    trial_id: str
    name: str
    repeat: int
    gpu: str | None
    gpus: int
    outcome: str  # an Outcome value, or a phase (pending, running) for trials without one yet
    job: JobConfig = field(default_factory=JobConfig)  # its settings; those it named are `settings`
    results: Results | None = None
    reason: str = ""
    run_id: str | None = None
    # the trials on its node while it was measured (kubesweep.tracking.sharing.annotate); None: not judged
    neighbours: list[str] | None = None


    @property
    def settings(self) -> dict[str, Any]:
        """The job settings this trial named (as JSON values): what tells its cell apart; the rest are defaults."""
        return self.job.model_dump(mode="json", exclude_unset=True)


def job_of(settings: Mapping[str, Any]) -> JobConfig:
    """The job settings read back from a trial file, MLflow params or a status's axes, typed. A setting this version
    does not know, or whose value it cannot read (a run logged by another version), is left out rather than losing
    the record; settings each valid but no longer valid together are kept as they were logged."""
    named = dict(settings)
    while True:
        try:
            return JobConfig.model_validate(named)
        except ValidationError as exc:
            bad = {str(e["loc"][0]) for e in exc.errors() if e["loc"]} & named.keys()
            if not bad:
                return JobConfig.model_construct(**named)
            for key in bad:
                del named[key]


def axes_job(axes: Mapping[str, Any], named: Mapping[str, Any] | None = None) -> JobConfig:
    """The job settings of a trial known only by its axes (less those that are not job settings), and the
    settings a trial file `named` over them."""
    return job_of({**{k: v for k, v in axes.items() if k not in _AXES_NOT_JOB}, **(named or {})})


def _outcome_of(status: TrialStatus) -> str:
    return status.outcome.value if status.outcome else status.phase.value.lower()


MAX_TRIAL_FILE_BYTES = 2**20  # a trial's resolved config is a few KiB


def _trial_file(trial_file: Path | None) -> dict[str, Any]:
    """The trial file the backend wrote in the trial's folder, where the trial can write too: none where it is
    missing, larger than a trial file is, nested past Python's parser or not a JSON object."""
    if trial_file is None or not trial_file.is_file():
        return {}
    try:
        with trial_file.open("rb") as handle:
            raw = handle.read(MAX_TRIAL_FILE_BYTES + 1)
        data = json.loads(raw) if len(raw) <= MAX_TRIAL_FILE_BYTES else None
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def record_from_status(status: TrialStatus, results: Results | None = None,
                       trial_file: Path | None = None) -> TrialRecord:
    """A record from the backend's status of a trial, its results (if it has them) and its trial file: the job
    settings from the results, else the trial file, else the status's axes."""
    trial = _trial_file(trial_file) if results is None else {}
    if results is not None:
        job = results.config
    elif isinstance(trial.get("job"), dict) and trial["job"]:
        job = job_of(trial["job"])
    else:
        job = axes_job(status.axes)
    gpus: Any = (results.trial.gpus_per_trial if results is not None
                 else status.axes.get("gpus_per_trial", trial.get("gpus_per_trial")))
    outcome = results.outcome.value if results is not None else _outcome_of(status)
    if status.outcome is not None and status.outcome.value in ("stopped", "cancelled"):
        outcome = status.outcome.value  # the job saw only a SIGTERM; the backend knows who sent it, and why
    reason = status.reason if outcome != "succeeded" else ""
    if results is not None and results.error is not None and outcome != "succeeded":
        reason = results.error.message or reason
    return TrialRecord(trial_id=status.trial_id, name=status.name,
                       repeat=results.trial.repeat if results is not None else 0,
                       gpu=status.gpu, gpus=int(gpus if gpus is not None else 1), outcome=outcome, job=job,
                       results=results, reason=reason)


def from_backend(backend: Backend, sweep: str) -> list[TrialRecord]:
    """Records from the backend's state and results files (no MLflow); a results file that is not valid is read as
    none (the record then says what the backend knows: its driver recorded the trial failed, with the reason)."""
    out = []
    for status, results in backend.results(sweep):
        where = backend.trial_dir(sweep, status.name)
        trial_file = where / "trial.json" if where is not None else None
        out.append(record_from_status(status, results, trial_file))
    return out


def _parse_param(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return {"True": True, "False": False, "None": None}.get(value, value)


def record_from_child(child: Any, read: Results | ResultsFileError | None) -> TrialRecord:
    """A record from an MLflow child run (`runs.ChildRun`) and its results.json (if it has one): the results
    name the cell and the outcome, else the run's tags and params do; a results file that is not valid (the error
    `SweepRuns.results_file` gave) makes the trial failed, with that error's line as its reason."""
    invalid = read if isinstance(read, ResultsFileError) else None
    results = read if isinstance(read, Results) else None
    run_tags, params = child.tags, child.params
    trial_id = run_tags.get(tags.TRIAL_ID) or params.get("trial_id") or child.run_id
    if results is not None:
        job = results.config
        gpu: Any = results.trial.gpu
        gpus: Any = results.trial.gpus_per_trial
        repeat: Any = results.trial.repeat
        outcome = results.outcome.value
    else:
        job = job_of({k: _parse_param(v) for k, v in params.items() if k not in _TRIAL_PARAMS})
        gpu = run_tags.get(tags.GPU)
        gpus = _parse_param(params.get("gpus_per_trial", "1"))
        repeat = _parse_param(run_tags.get(tags.REPEAT, params.get("repeat", "0")))
        outcome = run_tags.get(tags.OUTCOME) or {"RUNNING": "running", "SCHEDULED": "pending",
                                                  "FINISHED": "succeeded", "KILLED": "cancelled"}.get(
            child.status, "failed")
    gpu = gpu_type_of(gpu)
    reason = ""
    if results is not None and results.error is not None and outcome != "succeeded":
        reason = results.error.message
    if invalid is not None:
        outcome, reason = "failed", str(invalid)
    return TrialRecord(trial_id=trial_id, name=run_tags.get(tags.TRIAL) or child.name, repeat=int(repeat or 0),
                       gpu=gpu, gpus=int(gpus if isinstance(gpus, int) else 1), outcome=outcome, job=job,
                       results=results, reason=reason, run_id=child.run_id)


def from_mlflow(runs: Any, parent_run_id: str, backend: Backend | None, sweep: str) -> list[TrialRecord]:
    """Records from the child runs of the parent run (`runs` is a `runs.SweepRuns`)."""
    children = runs.children(parent_run_id)
    files = runs.all_results(children)
    records = {}
    for child in children:
        record = record_from_child(child, files.get(child.run_id))
        records[record.trial_id] = record
    if backend is not None:
        try:
            statuses = backend.status(sweep).trials
        except BackendError:
            statuses = []
        order = {t.trial_id: i for i, t in enumerate(statuses)}
        for status in statuses:
            if status.trial_id not in records:
                records[status.trial_id] = record_from_status(status)
            elif status.outcome is None and not status.phase.terminal:
                records[status.trial_id].outcome = status.phase.value.lower()
        return sorted(records.values(), key=lambda r: (order.get(r.trial_id, len(order)), r.name))
    return sorted(records.values(), key=lambda r: r.name)


RESULTS_FILE = "results.json"
MAX_RESULTS_FILES = 100_000  # a directory of more results files than any sweep has is a mistake, not a sweep


class ResultsDirError(ValueError):
    """A directory of results files that cannot be read at all: no such directory, too many files, none valid."""


def names_a_directory(name: str) -> bool:
    """Whether a NAME given to `sweep results`/`report` is a directory of results files rather than a sweep: it has
    a `/` or starts with `.` or `~` (a sweep's name never does: it is a DNS label)."""
    return "/" in name or name.startswith((".", "~"))


def from_results_dir(directory: Path, skipped: Callable[[str], None] | None = None) -> list[TrialRecord]:
    """Records from every `results.json` under `directory` (a local sweep's directory, a whole home, or results
    copied from another machine), in path order. The cell of each comes from the file alone: its `trial` block
    and its `config`. Symbolic links are not followed out of the directory. A file that is not a valid results
    file is left out and told to `skipped` in one line (without `skipped`: `ResultsFileError`); none valid of
    several is a `ResultsDirError`."""
    root = directory.expanduser().resolve()
    if not root.is_dir():
        raise ResultsDirError(f"{directory}: no such directory (a name with a '/' is read as a directory of results "
                              "files)")
    files = sorted(p for p in root.rglob(RESULTS_FILE) if p.is_file() and not p.is_symlink()
                   and p.resolve().is_relative_to(root))
    if len(files) > MAX_RESULTS_FILES:
        raise ResultsDirError(f"{directory}: {len(files):,} results files, more than {MAX_RESULTS_FILES:,}")
    out = []
    for path in files:
        try:
            results = read_results_file(path)
        except ResultsFileError as exc:
            if skipped is None:
                raise
            skipped(f"skipped {exc}")
            continue
        trial = results.trial
        out.append(TrialRecord(
            trial_id=trial.trial_id or path.parent.name, name=trial.name or path.parent.name,
            repeat=trial.repeat, gpu=trial.gpu or None, gpus=trial.gpus_per_trial,
            outcome=results.outcome.value, job=results.config, results=results,
            reason=results.error.message if results.error is not None else ""))
    if files and not out:
        raise ResultsDirError(f"{directory}: none of its {len(files):,} results files is valid (each skipped above)")
    return out
