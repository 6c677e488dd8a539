"""Trials as the results views see them: one `TrialRecord` per trial, from MLflow or from results files.

- `from_mlflow`: the child runs of the sweep's parent run; measurements come from each run's `results.json`
  artifact (the same file the job writes locally), the cell from its tags and params; trials the backend knows
  but MLflow has no run for yet (pending, skipped) are added from the backend's status.
- `from_backend`: the backend's own view: results files of the local backend (`<home>/sweeps/<sweep>/trials/
  <trial>/results.json`), or only phases and outcomes where the backend keeps no files (kubernetes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubesweep.backends.base import Backend, BackendError, TrialStatus

# params the job logs that are not job settings
_TRIAL_PARAMS = frozenset({"sweep", "trial_id", "repeat", "gpu", "gpus_per_trial"})


def dig(data: Any, *path: str) -> Any:
    """`data[path[0]][path[1]]...` of a parsed results file, or None where a key is missing."""
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


@dataclass
class TrialRecord:
    trial_id: str
    name: str
    repeat: int
    gpu: str | None
    gpus: int
    outcome: str  # an Outcome value, or a phase (pending, running) for trials without one yet
    job: dict[str, Any] = field(default_factory=dict)
    results: dict[str, Any] | None = None
    reason: str = ""
    run_id: str | None = None
    # the trials on its node while it was measured (kubesweep.tracking.sharing.annotate); None: not judged
    neighbours: list[str] | None = None


def _outcome_of(status: TrialStatus) -> str:
    return status.outcome.value if status.outcome else status.phase.value.lower()


def _job_from_results_or_file(results: dict[str, Any] | None, trial_file: Path | None) -> dict[str, Any]:
    if results and isinstance(results.get("config"), dict):
        return dict(results["config"])
    if trial_file is not None and trial_file.exists():
        try:
            data = json.loads(trial_file.read_text())
        except (OSError, ValueError):
            return {}
        if isinstance(data, dict) and isinstance(data.get("job"), dict):
            return dict(data["job"])
    return {}


def record_from_status(status: TrialStatus, results: dict[str, Any] | None = None,
                       trial_file: Path | None = None) -> TrialRecord:
    job = _job_from_results_or_file(results, trial_file)
    if not job:
        job = {k: v for k, v in status.axes.items() if k not in ("gpu", "gpus_per_trial", "num_nodes")}
    info = (results or {}).get("trial") or {}
    gpus = info.get("gpus_per_trial", status.axes.get("gpus_per_trial"))
    if gpus is None and trial_file is not None and trial_file.exists():
        try:
            gpus = json.loads(trial_file.read_text()).get("gpus_per_trial")
        except (OSError, ValueError):
            gpus = None
    outcome = (results or {}).get("outcome") or _outcome_of(status)
    if status.outcome is not None and status.outcome.value in ("stopped", "cancelled"):
        outcome = status.outcome.value  # the job saw only a SIGTERM; the backend knows who sent it, and why
    reason = status.reason if outcome != "succeeded" else ""
    if results and isinstance(results.get("error"), dict) and outcome != "succeeded":
        reason = str(results["error"].get("message") or reason)
    return TrialRecord(trial_id=status.trial_id, name=status.name, repeat=int(info.get("repeat") or 0),
                       gpu=status.gpu, gpus=int(gpus if gpus is not None else 1), outcome=str(outcome), job=job,
                       results=results, reason=reason)


def from_backend(backend: Backend, sweep: str) -> list[TrialRecord]:
    """Records from the backend's state and results files (no MLflow)."""
    reader = getattr(backend, "results", None)
    if reader is None:
        return [record_from_status(t) for t in backend.status(sweep).trials]
    out = []
    for status, results in reader(sweep):
        where = backend.trial_dir(sweep, status.name)
        trial_file = where / "trial.json" if where is not None else None
        out.append(record_from_status(status, results, trial_file))
    return out


def _parse_param(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return {"True": True, "False": False, "None": None}.get(value, value)


def record_from_child(child: Any, results: dict[str, Any] | None) -> TrialRecord:
    """A record from an MLflow child run (`runs.ChildRun`) and its results.json (if it has one)."""
    tags, params = child.tags, child.params
    trial_id = tags.get("kubesweep.trial_id") or params.get("trial_id") or child.run_id
    info = (results or {}).get("trial") or {}
    job = dict(results["config"]) if results and isinstance(results.get("config"), dict) else {
        k: _parse_param(v) for k, v in params.items() if k not in _TRIAL_PARAMS}
    gpu = info.get("gpu", tags.get("kubesweep.gpu"))
    gpu = None if gpu in (None, "", "any", "None") else str(gpu)
    gpus = info.get("gpus_per_trial", _parse_param(params.get("gpus_per_trial", "1")))
    repeat = info.get("repeat", _parse_param(tags.get("kubesweep.repeat", params.get("repeat", "0"))))
    if results and results.get("outcome"):
        outcome = str(results["outcome"])
    elif tags.get("kubesweep.outcome"):
        outcome = tags["kubesweep.outcome"]
    else:
        outcome = {"RUNNING": "running", "SCHEDULED": "pending", "FINISHED": "succeeded", "KILLED": "cancelled"}.get(
            child.status, "failed")
    reason = ""
    if results and isinstance(results.get("error"), dict) and outcome != "succeeded":
        reason = str(results["error"].get("message") or "")
    return TrialRecord(trial_id=trial_id, name=tags.get("kubesweep.trial") or child.name, repeat=int(repeat or 0),
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
MAX_RESULTS_BYTES = 64 * 2**20  # one results file; a trial's loss curve of a long run is a few MiB


class ResultsDirError(ValueError):
    """A directory of results files that cannot be read: the file and what is wrong with it."""


def names_a_directory(name: str) -> bool:
    """Whether a NAME given to `sweep results`/`report` is a directory of results files rather than a sweep: it has
    a `/` or starts with `.` or `~` (a sweep's name never does: it is a DNS label)."""
    return "/" in name or name.startswith((".", "~"))


def from_results_dir(directory: Path) -> list[TrialRecord]:
    """Records from every `results.json` under `directory` (a local sweep's directory, a whole home, or results
    copied from another machine), in path order. The cell of each comes from the file alone: its `trial` block
    and its `config`. Symbolic links are not followed out of the directory."""
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
        if path.stat().st_size > MAX_RESULTS_BYTES:
            raise ResultsDirError(f"{path}: {path.stat().st_size:,} bytes, more than a results file has "
                                  f"({MAX_RESULTS_BYTES:,})")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ResultsDirError(f"{path}: not a results file: {exc}") from None
        trial = data.get("trial") if isinstance(data, dict) else None
        if not isinstance(trial, dict) or not isinstance(data.get("config"), dict):
            raise ResultsDirError(f"{path}: not a results file: expected the keys 'trial' and 'config' "
                                  "(docs/results-schema.md)")
        gpus = trial.get("gpus_per_trial")
        repeat = trial.get("repeat")
        out.append(TrialRecord(
            trial_id=str(trial.get("trial_id") or path.parent.name), name=str(trial.get("name") or path.parent.name),
            repeat=repeat if isinstance(repeat, int) else 0,
            gpu=str(trial["gpu"]) if trial.get("gpu") else None, gpus=gpus if isinstance(gpus, int) else 1,
            outcome=str(data.get("outcome") or "failed"), job=dict(data["config"]), results=data,
            reason=str((data.get("error") or {}).get("message") or "") if isinstance(data.get("error"), dict) else ""))
    return out
