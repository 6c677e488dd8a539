"""The local backend's files under the kubesweep home, besides its database.

- `<home>/sweeps/<sweep>/tracking.json`: the MLflow env the sweep's trials start with (absent: not tracked), kept
  so a detached driver or a later resume passes the same;
- `<home>/sweeps/<sweep>/forkserver.json`: the sweep's fork server while it runs (pid and socket, written by
  `jobs.forkserver_handle.Handle`);
- `<home>/sweeps/<sweep>/trials/<trial>/`: the trial's `trial.json` (its resolved config), `results.json` (the
  job's last word) and `log.txt` (its output, every attempt).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kubesweep.backends.base import BackendError, Phase, TrialStatus
from kubesweep.wire.config import PATH_SETTINGS, local_path
from kubesweep.wire.results import Results
from kubesweep.wire.results_file import read_results_file

TRACKING_FILE = "tracking.json"
FORKSERVER_RECORD = "forkserver.json"  # the sweep's fork server while it runs: pid and socket
TRIAL_FILE = "trial.json"
RESULTS_FILE = "results.json"
LOG_FILE = "log.txt"


def resolve_paths(job: dict[str, Any], base: Path) -> dict[str, Any]:
    """Relative dataset/model paths in a spec are relative to the spec file's directory (`wire.config.local_path`,
    which `kubesweep.preflight` checks the same paths with)."""
    out = dict(job)
    for key in PATH_SETTINGS:
        value = out.get(key)
        path = local_path(value, base) if isinstance(value, str) else None
        if path is not None:
            out[key] = str(path)
    return out


def write_trial_file(trial_dir: Path, config: dict[str, Any]) -> Path:
    """The trial's resolved config, as the job reads it (`--config`)."""
    trial_dir.mkdir(parents=True, exist_ok=True)
    path = trial_dir / TRIAL_FILE
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path


def read_results(path: Path) -> Results | None:
    """A trial's results file, read as every results file is (`kubesweep.wire.results_file`: bounded in size and
    depth, validated); None where there is none. `ResultsFileError`: it is not valid, in one line that starts with
    the file's name (`results.json: outcome: ...`: a trial's reason, read beside its folder)."""
    if not path.exists() and not path.is_symlink():
        return None
    return read_results_file(path, path.name)


def record_tracking(sweep_dir: Path, env: dict[str, str] | None) -> None:
    """Keep the MLflow env the sweep's trials start with (None: trials are not tracked)."""
    path = sweep_dir / TRACKING_FILE
    if env is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(env) + "\n")


def recorded_tracking(sweep_dir: Path) -> dict[str, str]:
    """The MLflow env recorded for the sweep (empty when it is not tracked)."""
    try:
        data = json.loads((sweep_dir / TRACKING_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def trial_log(trial_dir: Path, trial: TrialStatus, follow: bool, ended: Callable[[], bool]) -> Iterator[str]:
    """The trial's log, line by line; with `follow`, new lines as they come until `ended()` says the trial is
    over (the rest is read then)."""
    path = trial_dir / LOG_FILE
    if not path.exists():
        if trial.phase in (Phase.PENDING, Phase.SKIPPED):
            raise BackendError(f"trial {trial.name} has not started ({trial.phase.value}); no log yet")
        raise BackendError(f"no log for trial {trial.name} at {path}")
    with path.open(errors="replace") as handle:
        while True:
            line = handle.readline()
            if line:
                yield line
                continue
            if not follow or ended():
                rest = handle.read()
                if rest:
                    yield rest
                return
            time.sleep(0.25)
