"""The max-batch search: per GPU type and precision, the largest batch size that fits, by bisection on OOM.

    search: {strategy: max_batch, low: 8, high: 1024, step: 8, probes: 2, max_steps: 3}

Each cell of the matrix without `batch_size` (GPU type x precision x any other axis) is searched on its own,
all cells at once. A probe is an ordinary trial (`plan.make_trial` with `batch_size` and `max_steps` set) run
by the backend; outcome `succeeded` means the batch fits, `oom` that it does not. Each round tries `probes`
batch sizes spread over the interval still open, so the answer takes about log_(probes+1)(candidates) rounds.

Probes are trials like any other, with deterministic ids: run again (a killed search, `sweep resume`), the
search re-reads the outcomes of the probes that already ran and runs none of them twice. The answer goes to
`max_batch.json` under the search's storage path, to the parent MLflow run (metrics `max_batch/<gpu>/<precision>`,
artifact `max_batch/max_batch.json`) and to `sweep results`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubesweep.backends.base import Backend, SweepStatus
from kubesweep.gpus import load_catalog
from kubesweep.plan import Trial, candidates, cells, drop_reason, make_trial, next_probes, plan
from kubesweep.sweep_spec import MaxBatchSearch, Sweep
from kubesweep.wire.env import TrackingEnv
from kubesweep.wire.outcomes import Outcome
from kubesweep.wire.search import MaxBatchCell, MaxBatchSummary, summary_json

SUMMARY = "max_batch.json"


@dataclass
class CellSearch:
    axes: dict[str, Any]
    sizes: list[int]
    fit: int = -1
    oom: int = 0
    running: dict[str, int] = field(default_factory=dict)  # trial id -> index
    history: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""

    def __post_init__(self) -> None:
        self.oom = len(self.sizes)

    @property
    def done(self) -> bool:
        return bool(self.error) or (not self.running and self.oom - self.fit <= 1)

    def summary(self, sweep: Sweep) -> MaxBatchCell:
        return MaxBatchCell.model_validate({
            "gpu": self.axes.get("gpu"), "precision": self.axes.get("precision", sweep.spec.job.precision),
            "axes": self.axes, "max_batch": self.sizes[self.fit] if self.fit >= 0 else None,
            "smallest_oom": self.sizes[self.oom] if self.oom < len(self.sizes) else None,
            "low": self.sizes[0] if self.sizes else None, "high": self.sizes[-1] if self.sizes else None,
            "probes": len(self.history), "history": self.history, "error": self.error})


def probe_trial(sweep: Sweep, search: MaxBatchSearch, axes: dict[str, Any], batch: int) -> Trial:
    return make_trial(sweep, {**axes, "batch_size": batch, "max_steps": search.max_steps})


def run_max_batch(sweep: Sweep, backend: Backend, *, storage: Path, tracking: TrackingEnv | None = None,
                  progress: Callable[[SweepStatus], None] | None = None, poll_s: float = 0.5) -> MaxBatchSummary:
    search = sweep.spec.search
    assert isinstance(search, MaxBatchSearch)
    p = plan(sweep)
    backend.submit(p)
    catalog = load_catalog()
    sizes = candidates(search)
    searches = [CellSearch(dict(c), sizes) for c in cells(sweep) if not drop_reason(sweep, c, catalog)]
    while True:
        for cell in searches:
            if cell.error or cell.running:
                continue
            picks = next_probes(cell.fit, cell.oom, search.probes)
            trials = [probe_trial(sweep, search, cell.axes, sizes[i]) for i in picks]
            if trials:
                backend.add_trials(p, trials)
                cell.running.update({t.id: i for t, i in zip(trials, picks, strict=True)})
        status = backend.advance(sweep.name)
        if progress is not None:
            progress(status)
        by_id = {t.trial_id: t for t in status.trials}
        for cell in searches:
            for trial_id, index in list(cell.running.items()):
                t = by_id.get(trial_id)
                if t is None or not t.phase.terminal:
                    continue
                del cell.running[trial_id]
                cell.history.append({"batch_size": sizes[index], "outcome": t.outcome.value if t.outcome else None,
                                     "trial": t.name})
                if t.outcome == Outcome.SUCCEEDED:
                    cell.fit = max(cell.fit, index)
                elif t.outcome == Outcome.OOM:
                    cell.oom = min(cell.oom, index)
                else:
                    cell.error = f"probe {t.name} (batch {sizes[index]}) ended {t.outcome}: {t.reason}".strip()
            if cell.fit >= cell.oom:  # a noisy edge: a larger size fitted after a smaller one did not
                cell.fit = cell.oom - 1
        if all(c.done for c in searches):
            break
        time.sleep(poll_s)
    backend.wait(sweep.name, interval=poll_s)
    summary = MaxBatchSummary(sweep=sweep.name, cells=[c.summary(sweep) for c in searches])
    storage.mkdir(parents=True, exist_ok=True)
    (storage / SUMMARY).write_text(summary_json(summary))
    _log(tracking, summary, storage / SUMMARY)
    return summary


def _log(tracking: TrackingEnv | None, summary: MaxBatchSummary, path: Path) -> None:
    if tracking is None or not tracking.parent_run_id:
        return
    with contextlib.suppress(Exception):  # tracking trouble never loses the answer: it is in the file too
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=tracking.uri)
        for cell in summary.cells:
            if cell.max_batch is not None:
                client.log_metric(tracking.parent_run_id, f"max_batch/{cell.gpu or 'cpu'}/{cell.precision}",
                                  float(cell.max_batch))
        client.log_artifact(tracking.parent_run_id, str(path), "max_batch")
