"""The Ray side of the tuner: the trainable each suggestion runs in, and the callback through which the tuner
drives the backend. Imported only by `kubesweep.tune.driver` once Ray is needed.

The trainable does no work itself: it makes the trial (`plan.make_trial`, the same naming as every other path),
waits for the backend to run it, and reports the trial's metrics as they reach MLflow. The callback runs in the
tuner's main loop: it adds each started suggestion to the backend, advances the backend, and ends the backend
trial of a suggestion the scheduler stopped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray import tune
from ray.tune import Callback

from kubesweep.plan import make_trial
from kubesweep.sweep_spec import Sweep, TuneSearch
from kubesweep.tune import metrics as m
from kubesweep.tune.space import axes_from_config


@dataclass(frozen=True)
class Context:
    """What a trainable needs; plain data, so it pickles into Ray's object store."""

    sweep_doc: dict[str, Any]
    snapshot: str
    tracking_uri: str | None
    experiment_id: str | None
    parent_run_id: str | None  # the sweep's parent run: a trial's metrics are read from its child run alone
    poll_s: float = 0.5


def sweep_of(doc: dict[str, Any]) -> Sweep:
    return Sweep.model_validate(doc)


def trainable(config: dict[str, Any], ctx: Context) -> None:
    sweep = sweep_of(ctx.sweep_doc)
    search = sweep.spec.search
    assert isinstance(search, TuneSearch)
    trial = make_trial(sweep, axes_from_config(search, config))
    names = search.metrics
    wanted = m.wanted(search)
    keys = sorted({k for n in wanted for k in (m.source(n).intermediate, m.source(n).final) if k})
    poller = (m.RunPoller(ctx.tracking_uri, ctx.experiment_id, ctx.parent_run_id, trial.id, keys)
              if ctx.tracking_uri and ctx.experiment_id and ctx.parent_run_id else None)
    primary = m.source(names[0]).intermediate
    worst = {n: m.worst(mode) for n, mode in zip(names, search.modes, strict=True)}

    def current(name: str) -> float | None:
        key = m.source(name).intermediate
        return poller.latest.get(key) if poller is not None and key else None

    def report(values: dict[str, float | None], **extra: Any) -> None:
        out: dict[str, Any] = {n: (v if (v := values.get(n)) is not None else worst[n]) for n in names}
        tune.report({**out, "trial": trial.name, **extra})

    def report_new(*, settle: bool = False) -> None:
        if poller is None:
            return
        new = poller.poll_settled(ctx.poll_s) if settle else poller.poll()
        for step, value in new.get(primary, []) if primary else []:
            values: dict[str, float | None] = {n: current(n) for n in names}
            values[names[0]] = value
            report(values, step=step, outcome="running")

    while True:
        state = m.read_snapshot(Path(ctx.snapshot)).get(trial.id)
        report_new()
        if state is not None and state.get("terminal"):
            time.sleep(ctx.poll_s)  # the job flushed its metrics before it ended; read the last ones
            report_new(settle=True)
            outcome = str(state.get("outcome") or "failed")
            if outcome == "stopped":
                return  # stopped on the scheduler's word: its last report stands
            results = m.read_results(state.get("results_path"))
            finals = m.final_values(wanted, results, poller.latest if poller is not None else {})
            broken = m.violations(search.constraints, finals)
            # a metric the trial never measured (a results file without it, no tracking) is no value to learn from
            broken += [f"{n} missing" for n in names if finals.get(n) is None]
            if outcome != "succeeded" or broken:
                report({}, outcome=outcome, feasible=False, violations="; ".join(broken))
            else:
                report(finals, outcome=outcome, feasible=True, violations="")
            return
        time.sleep(ctx.poll_s)


# The tuner registers its driver here under the sweep's name; the callback (pickled with Ray's experiment
# state, so it holds only the name) finds it again in a resumed tuner.
DRIVERS: dict[str, Any] = {}


class BackendCallback(Callback):  # type: ignore[misc]
    def __init__(self, key: str):
        self.key = key

    def _driver(self) -> Any:
        return DRIVERS[self.key]

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        self._driver().tick()

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._driver().add(dict(trial.config))

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._driver().finish(dict(trial.config))

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._driver().finish(dict(trial.config))
