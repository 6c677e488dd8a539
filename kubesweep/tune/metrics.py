"""What a tune `metric` reads, how trials' metrics reach the tuner, and constraints.

Each tune metric has an intermediate MLflow key (logged while the trial runs: ASHA and the median rule judge
trials on it), a final MLflow key (logged once at the end) and a place in `results.json`. A metric given as an
MLflow key (with a "/") is both its intermediate and its final key. A metric of the catalogue that every trial's
run logs at its end (`kubesweep.wire.metrics`, `Metric.logged`: `peak_mem_gib`, `tflops_per_s`, `mfu_pct`, ...)
has no intermediate key; its final key is its name, and results.json gives it by its definition.

A trial that breaks a constraint, or that ended without a value (OOM, failed), reports `PENALTY` in the
direction that makes it the worst for the searcher, so the search learns to avoid it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubesweep.sweep_spec import Constraint, TuneSearch
from kubesweep.tracking.records import ResultsFileError, read_results_file
from kubesweep.wire import tags
from kubesweep.wire.flags import finite
from kubesweep.wire.metrics import METRICS, TuneSource, tune_source
from kubesweep.wire.results import Results
from kubesweep.wire.trial_metrics import DEFAULT_TARGET_ACCURACY, trial_metrics

PENALTY = 1.0e12


def source(metric: str) -> TuneSource:
    """Where a tune metric's value comes from (`kubesweep.wire.metrics.tune_source`)."""
    return tune_source(metric)


def worst(mode: str) -> float:
    return -PENALTY if mode == "max" else PENALTY


def from_results(metric: str, results: Results | None) -> float | None:
    """The metric's number in the trial's results (None where they do not have it, or it is not finite). A metric
    of the catalogue is read by its definition, without the GPU catalog: its $/epoch and MFU come from the MLflow
    key its job logged."""
    value: Any = results
    path = source(metric).results
    if not path and metric in METRICS and results is not None:
        return trial_metrics(results, results.outcome.value, gpus=results.world_size, price_per_hour=None,
                             target=DEFAULT_TARGET_ACCURACY, peak_tflops=None)[metric]
    if not path or results is None:
        return None
    for key in path:
        value = getattr(value, key, None)
        if value is None:
            return None
    return finite(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def wanted(search: TuneSearch) -> list[str]:
    """The metrics a trial's values are read for: the objectives, then the constrained metrics not among them."""
    return [*search.metrics, *(c.metric for c in search.constraints if c.metric not in search.metrics)]


def read_results(path: Any) -> Results | None:
    """A trial's results.json, validated (`kubesweep.tracking.records.read_results_file`), or None where there is
    none (yet) or it is not a valid results file."""
    if not path:
        return None
    try:
        return read_results_file(Path(str(path)))
    except (OSError, ResultsFileError):
        return None


def final_values(names: list[str], results: Results | None, latest: dict[str, float]) -> dict[str, float | None]:
    """A finished trial's value of each metric: from its results file, else the final MLflow key's latest value."""
    values: dict[str, float | None] = {}
    for name in names:
        value = from_results(name, results)
        final_key = source(name).final
        if value is None and final_key:
            value = latest.get(final_key)
        values[name] = value
    return values


def violations(constraints: list[Constraint], values: dict[str, float | None]) -> list[str]:
    """The constraints the values break (a missing value breaks its constraint), as text."""
    out = []
    for c in constraints:
        value = values.get(c.metric)
        ok = value is not None and {">=": value >= c.value, "<=": value <= c.value, ">": value > c.value,
                                    "<": value < c.value}[c.op]
        if not ok:
            shown = "missing" if value is None else f"{value:.4g}"
            out.append(f"{c.metric} {c.op} {c.value:g} (got {shown})")
    return out


@dataclass
class RunPoller:
    """New points of a trial's MLflow metrics, read from its child run under the sweep's parent run
    (`tags.trial_run_filter`): a run that claims the trial id under another parent, or none, is never read."""

    uri: str
    experiment_id: str
    parent_run_id: str
    trial_id: str
    keys: list[str]
    run_id: str | None = None
    seen: dict[str, int] = field(default_factory=dict)
    latest: dict[str, float] = field(default_factory=dict)
    failed: bool = False  # the last poll could not read the server
    _client: Any = None

    def __post_init__(self) -> None:
        self.filter = tags.trial_run_filter(self.parent_run_id, self.trial_id)

    def client(self) -> Any:
        if self._client is None:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri=self.uri)
        return self._client

    def find_run(self) -> str | None:
        if self.run_id is None:
            runs = self.client().search_runs([self.experiment_id], filter_string=self.filter, max_results=1)
            self.run_id = runs[0].info.run_id if runs else None
        return self.run_id

    def poll(self) -> dict[str, list[tuple[int, float]]]:
        """key -> new (step, value) points, in step order; latest values are kept in `latest`."""
        out: dict[str, list[tuple[int, float]]] = {}
        self.failed = False
        try:
            run_id = self.find_run()
            if run_id is None:
                return out
            for key in self.keys:
                history = sorted(self.client().get_metric_history(run_id, key),
                                 key=lambda m: (m.step, m.timestamp))
                fresh = history[self.seen.get(key, 0):]
                if fresh:
                    self.seen[key] = len(history)
                    out[key] = [(int(m.step), float(m.value)) for m in fresh]
                    self.latest[key] = float(fresh[-1].value)
        except Exception:  # the server is away for a moment: the next poll reads the same points
            self.failed = True
        return out

    def poll_settled(self, pause_s: float, retries: int = 4) -> dict[str, list[tuple[int, float]]]:
        """poll(), and while the server cannot be read poll again, up to `retries` times with pauses doubling
        from `pause_s`: for a finished trial's last read, where a moment's outage must not pass for a run
        that logged nothing."""
        out = self.poll()
        for attempt in range(retries):
            if not self.failed:
                break
            time.sleep(pause_s * 2**attempt)
            for key, points in self.poll().items():
                out.setdefault(key, []).extend(points)
        return out


SNAPSHOT = "trials.json"


def write_snapshot(path: Path, statuses: dict[str, dict[str, Any]]) -> None:
    """The tuner's view of the backend's trials, for the trainables (atomic replace)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{time.monotonic_ns()}.tmp")
    tmp.write_text(json.dumps(statuses))
    tmp.replace(path)


def read_snapshot(path: Path) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
