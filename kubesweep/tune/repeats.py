"""Sequential repeats: each cell of a grid or random sweep repeated until its interval decides.

    repeats: 3                                                  # min: every cell runs this often first
    repeat_until: {target: 3%, max: 10, metric: samples_per_s}

The plan holds `min` repeats of every cell. Once a cell's repeats have all ended, the rule reads the 95% interval
of its metric (`kubesweep.tracking.intervals`: Student's t over the repeats that succeeded) and the cell stops when

- its half-width is within `target` percent of its mean (`reached`), or
- none of its repeats has a value (`no value`: every one ran out of memory or failed; more would too), or
- every repeat that succeeded measured its host, not its GPU (`host-bound`, `kubesweep.wire.flags`: an inference GPU
  waiting for the host to issue its batches, a training GPU idle for most of its measured steps): its spread is
  the host's, more repeats would measure the host again, and the answer leaves it out of the GPU comparison, or
- it has had `max` repeats (`max`: the report names it);

otherwise it gets one more repeat. Repeats are spent first where the answer is undecided: within each task and
GPU type, the leaders (the best cell by mean and every cell whose interval overlaps the best one's, the answer's
tie rule) get their next repeat before any other cell, widest interval first, and at most
`spec.concurrency.max_parallel` extra repeats are in flight at once, so a busy backend runs the leaders' first.

A cancelled sweep (`sweep cancel`: a repeat ended cancelled) gets no repeat after it. A repeat is an ordinary trial
(`plan.make_trial` with its repeat index): its id is deterministic, so a resumed sweep
(a killed driver, `sweep resume`, a restarted tuner Job) reads the repeats that already ran and continues the rule.
What it decided goes to `repeats.json` under the search storage and to the parent MLflow run (artifact
`repeats/repeats.json`): the rule, and per cell its repeats, mean, half-width and why it stopped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubesweep.backends.base import Backend, BackendError, SweepStatus
from kubesweep.plan import Trial, make_trial, plan
from kubesweep.sweep_spec import SequentialRepeats, Sweep
from kubesweep.tracking import intervals
from kubesweep.tracking.aggregate import aggregate
from kubesweep.tracking.records import TrialRecord, from_backend, from_mlflow
from kubesweep.tracking.runs import SweepRuns, TrackingError
from kubesweep.tracking.target import TrackingTarget
from kubesweep.wire.env import TrackingEnv
from kubesweep.wire.flags import measured_host
from kubesweep.wire.metrics import METRICS
from kubesweep.wire.outcomes import Outcome
from kubesweep.wire.search import RepeatRule, RepeatsCell, RepeatsSummary, summary_json

SUMMARY = "repeats.json"

# why a cell stopped being repeated (None: it has not)
REACHED, AT_MAX, NO_VALUE, HOST_BOUND = "reached", "max", "no value", "host-bound"


@dataclass
class CellRepeats:
    """One cell of the plan under the rule: its repeats so far and the values of its metric."""

    axes: dict[str, Any]
    trials: list[Trial]  # by repeat index
    ended: int = 0
    values: list[float] = field(default_factory=list)  # the metric of the repeats that succeeded
    group: tuple[str, str] = ("", "")  # (task, GPU type): the answer compares cells within one
    host_bound: bool = False  # every repeat that succeeded measured the host (`kubesweep.wire.flags`)

    @property
    def running(self) -> bool:
        return self.ended < len(self.trials)

    @property
    def mean(self) -> float | None:
        return sum(self.values) / len(self.values) if self.values else None

    @property
    def half_width_pct(self) -> float | None:
        """The 95% half-width in percent of the mean (None below two values; inf around a zero mean)."""
        hw, mean = intervals.half_width(self.values), self.mean
        if hw is None or mean is None:
            return None
        return 100 * hw / abs(mean) if mean else math.inf

    def interval(self) -> intervals.Interval | None:
        return intervals.interval(self.values)

    def stopped(self, rule: SequentialRepeats) -> str | None:
        """Why the cell is repeated no more (`REACHED`, `NO_VALUE`, `HOST_BOUND`, `AT_MAX`), None while it may be;
        a cell with a repeat still running is judged once it ends."""
        if self.running:
            return None
        width = self.half_width_pct
        if width is not None and width <= rule.target:
            return REACHED
        if self.ended >= rule.min and not self.values:
            return NO_VALUE
        if self.ended >= rule.min and self.host_bound:
            return HOST_BOUND
        if len(self.trials) >= rule.max:
            return AT_MAX
        return None

    def summary(self, rule: SequentialRepeats) -> RepeatsCell:
        width = self.half_width_pct
        return RepeatsCell.model_validate({
            "axes": self.axes, "task": self.group[0], "gpu": self.group[1] or None, "repeats": len(self.trials),
            "ended": self.ended, "values": len(self.values), "mean": self.mean,
            "half_width_pct": width if width is None or math.isfinite(width) else None,
            "stopped": self.stopped(rule), "trials": [t.name for t in self.trials]})


def leaders(cells: Sequence[CellRepeats], higher_is_better: bool) -> set[int]:
    """Indexes of the cells the answer cannot yet tell apart from the best of their group: the best by mean and
    every cell whose interval overlaps the best one's."""
    groups: dict[tuple[str, str], list[int]] = {}
    for i, cell in enumerate(cells):
        if cell.values:
            groups.setdefault(cell.group, []).append(i)
    out: set[int] = set()
    for members in groups.values():
        pick = max if higher_is_better else min
        best = pick(members, key=lambda i: cells[i].mean or 0.0)
        mine = cells[best].interval()
        out |= {i for i in members if mine is not None and (other := cells[i].interval()) is not None
                and other.overlaps(mine)}
    return out


def next_repeats(cells: Sequence[CellRepeats], rule: SequentialRepeats, *, higher_is_better: bool,
                 width: int) -> list[int]:
    """Indexes of the cells that get one more repeat now: every cell that has ended its repeats without stopping,
    leaders first (widest interval first within each rank), at most `width` minus the extra repeats in flight."""
    in_flight = sum(1 for c in cells if c.running and len(c.trials) > rule.min)
    wanting = [i for i, c in enumerate(cells) if not c.running and c.stopped(rule) is None]
    if not wanting or in_flight >= width:
        return []
    lead = leaders(cells, higher_is_better)
    ranked = sorted(wanting, key=lambda i: (i not in lead, -(cells[i].half_width_pct or math.inf)))
    return ranked[: width - in_flight]


def summarize(sweep: str, rule: SequentialRepeats, cells: Sequence[CellRepeats]) -> RepeatsSummary:
    """What the rule decided: the rule, the repeats it spent against a fixed `min` and `max`, and each cell."""
    return RepeatsSummary(sweep=sweep, rule=RepeatRule.model_validate(dataclasses.asdict(rule)),
                          repeats=sum(len(c.trials) for c in cells), fixed_min=len(cells) * rule.min,
                          fixed_max=len(cells) * rule.max,
                          at_max=sum(1 for c in cells if c.stopped(rule) == AT_MAX),
                          cells=[c.summary(rule) for c in cells])


def run_repeats(sweep: Sweep, backend: Backend, *, storage: Path, tracking: TrackingEnv | None = None,
                progress: Callable[[SweepStatus], None] | None = None, poll_s: float = 0.5) -> RepeatsSummary:
    """Run (or continue) the sweep under its sequential repeats rule to its end; what each cell got."""
    rule = sweep.spec.repeat_rule
    assert rule is not None, "run_repeats needs spec.repeat_until"
    if not backend.keeps_results and (tracking is None or not tracking.parent_run_id):
        raise BackendError(f"sweep {sweep.name!r}: repeat_until reads each repeat's {rule.metric} from MLflow on "
                           f"the {backend.name} backend, and this sweep is not tracked (turn tracking on, or drop "
                           "repeat_until)")
    higher = METRICS[rule.metric].higher
    first = plan(sweep)
    by_cell: dict[str, CellRepeats] = {}
    for trial in sorted(first.trials, key=lambda t: t.repeat):
        by_cell.setdefault(_key(trial.axes), CellRepeats(dict(trial.axes), [])).trials.append(trial)
    cells = list(by_cell.values())
    known = {t.trial_id for t in backend.status(sweep.name).trials} if sweep.name in backend.list_sweeps() else set()
    backend.submit(first)
    _extend_known(sweep, backend, cells, known)  # a resumed sweep: the repeats it had added already
    reader = _Reader(sweep.name, backend, tracking, rule.metric)
    while True:
        status = backend.advance(sweep.name)
        if progress is not None:
            progress(status)
        reader.update(cells, status)
        if any(t.outcome == Outcome.CANCELLED for t in status.trials):  # `sweep cancel`: no repeat after it
            if all(t.phase.terminal for t in status.trials):
                break
            time.sleep(poll_s)
            continue
        picks = next_repeats(cells, rule, higher_is_better=higher, width=sweep.spec.concurrency.max_parallel)
        if picks:
            added = [make_trial(sweep, cells[i].axes, len(cells[i].trials)) for i in picks]
            backend.add_trials(first, added)
            for i, trial in zip(picks, added, strict=True):
                cells[i].trials.append(trial)
            continue
        if all(c.stopped(rule) is not None for c in cells):
            break
        time.sleep(poll_s)
    backend.wait(sweep.name, interval=poll_s)
    summary = summarize(sweep.name, rule, cells)
    storage.mkdir(parents=True, exist_ok=True)
    (storage / SUMMARY).write_text(summary_json(summary))
    _log(tracking, storage / SUMMARY)
    return summary


def _key(axes: dict[str, Any]) -> str:
    return json.dumps(axes, sort_keys=True, default=str)


def _extend_known(sweep: Sweep, backend: Backend, cells: list[CellRepeats], known: set[str]) -> None:
    """Give each cell the extra repeats an earlier run of the rule added (their ids are the same again)."""
    for cell in cells:
        while True:
            trial = make_trial(sweep, cell.axes, len(cell.trials))
            if trial.id not in known:
                break
            cell.trials.append(trial)


class _Reader:
    """Each ended repeat's value of the metric, read once: from the backend's results files, else from the sweep's
    MLflow runs (a Kubernetes backend keeps no results files here)."""

    def __init__(self, sweep: str, backend: Backend, tracking: TrackingEnv | None, metric: str):
        self.sweep, self.backend, self.tracking, self.metric = sweep, backend, tracking, metric
        self.read: dict[str, TrialRecord] = {}

    def update(self, cells: list[CellRepeats], status: SweepStatus) -> None:
        ended = {t.trial_id for t in status.trials if t.phase.terminal}
        wanted = {t.id for c in cells for t in c.trials if t.id in ended and t.id not in self.read}
        if not wanted:
            return
        for record in self._records():
            if record.trial_id in wanted:
                self.read[record.trial_id] = record
        for cell in cells:
            records = [self.read[t.id] for t in cell.trials if t.id in self.read]
            cell.ended = len(records)
            cell.values = []
            succeeded = [r.results for r in records if r.outcome == Outcome.SUCCEEDED.value]
            cell.host_bound = bool(succeeded) and all(map(measured_host, succeeded))
            if records:
                (agg,) = aggregate(records, best_by="samples_per_s")[:1] or (None,)
                if agg is not None:
                    cell.group = (agg.task, str(agg.axes.gpu or ""))
                    cell.values = list(agg.metrics[self.metric].values)

    def _records(self) -> list[TrialRecord]:
        if self.backend.keeps_results or self.tracking is None or \
                not self.tracking.parent_run_id:
            return from_backend(self.backend, self.sweep)
        target = TrackingTarget(self.tracking.uri, self.tracking.experiment, "env")
        try:
            return from_mlflow(SweepRuns(target, self.sweep), self.tracking.parent_run_id, self.backend, self.sweep)
        except (TrackingError, BackendError):  # a moment's outage: read again on the next poll
            return []


def _log(tracking: TrackingEnv | None, path: Path) -> None:
    if tracking is None or not tracking.parent_run_id:
        return
    with contextlib.suppress(Exception):  # tracking trouble never loses the answer: it is in the file too
        from mlflow.tracking import MlflowClient

        MlflowClient(tracking_uri=tracking.uri).log_artifact(tracking.parent_run_id, str(path), "repeats")
