"""The tune driver: Ray Tune suggests, the planner names, a backend runs, MLflow carries the metrics back.

    run_tune(sweep, backend, storage=..., tracking=...)

- Every suggestion becomes a trial through `plan.make_trial` (same ids and names as grid trials) and is added
  to the sweep with `Backend.add_trials`; a suggestion equal to an earlier one is that trial (nothing runs
  twice).
- Trainables poll the trial's MLflow child run and call `tune.report` with each new value of the first metric's
  intermediate series, so ASHA or the median rule can stop a trial; the driver then ends the trial
  (`Backend.stop_trial`: its process ended, its Job deleted) and marks its MLflow run KILLED with tag
  `kubesweep.outcome=stopped`.
- Tuner state lives under `storage/<sweep>`: a tuner killed and started again (`sweep submit` or `sweep resume`)
  restores it and reruns no finished trial; trials still running in the backend are picked up where they are.
- The summary (`tune.json` under the storage path, and artifact `tune/summary.json` of the parent run) lists
  every trial's last report, the best trial and, for several metrics, the Pareto front.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubesweep.backends.base import Backend, BackendError, SweepStatus
from kubesweep.plan import make_trial, plan
from kubesweep.sweep_spec import Sweep, TuneSearch
from kubesweep.tracking.runs import quiet
from kubesweep.tune import metrics as m
from kubesweep.tune.space import axes_from_config, ray_space
from kubesweep.wire import tags
from kubesweep.wire.env import TrackingEnv
from kubesweep.wire.outcomes import Outcome
from kubesweep.wire.search import TuneSummary, summary_json

log = logging.getLogger(__name__)

SUMMARY = "tune.json"
ASHA_MAX_T = 100_000  # reports; trials end on their own long before


class TuneError(RuntimeError):
    pass


class _Driver:
    """The backend side of the tuner, called from Ray's main loop (one thread)."""

    def __init__(self, sweep: Sweep, backend: Backend, snapshot: Path, tracking: TrackingEnv | None,
                 progress: Callable[[SweepStatus], None] | None, tick_s: float = 0.5):
        self.sweep = sweep
        self.plan = plan(sweep)
        self.backend = backend
        self.snapshot = snapshot
        self.tracking = tracking
        self.progress = progress
        self.tick_s = tick_s
        self._last = 0.0
        search = sweep.spec.search
        assert isinstance(search, TuneSearch)
        self.search = search

    def trial_for(self, config: dict[str, Any]) -> Any:
        return make_trial(self.sweep, axes_from_config(self.search, config))

    def add(self, config: dict[str, Any]) -> None:
        self.backend.add_trials(self.plan, [self.trial_for(config)])
        self.tick(force=True)

    def finish(self, config: dict[str, Any]) -> None:
        trial = self.trial_for(config)
        try:
            status = self.backend.status(self.sweep.name).trial(trial.id)
        except BackendError:
            return
        if not status.phase.terminal:
            self.backend.stop_trial(self.sweep.name, trial.id)
            # a trial that finished as the stop came keeps its own outcome, and its run its own status
            if self.backend.status(self.sweep.name).trial(trial.id).outcome == Outcome.STOPPED:
                self.mark_stopped(trial.id)
        self.tick(force=True)

    def tick(self, force: bool = False) -> SweepStatus | None:
        now = time.monotonic()
        if not force and now - self._last < self.tick_s:
            return None
        self._last = now
        status = self.backend.advance(self.sweep.name)
        m.write_snapshot(self.snapshot, {
            t.trial_id: {"name": t.name, "phase": t.phase.value, "terminal": t.phase.terminal,
                         "outcome": t.outcome.value if t.outcome else None, "results_path": t.results_path}
            for t in status.trials})
        if self.progress is not None:
            self.progress(status)
        return status

    def mark_all_stopped(self) -> None:
        """Mark the MLflow run of every stopped trial (a tuner killed between stopping a trial and marking its
        run, or a run the job created as it was ended, is caught here)."""
        stopped = [t.trial_id for t in self.backend.status(self.sweep.name).trials if t.outcome == Outcome.STOPPED]
        if stopped:
            self.mark_stopped(*stopped)

    def mark_stopped(self, *trial_ids: str) -> None:
        """The trials' MLflow child runs: KILLED, tag kubesweep.outcome=stopped (their jobs were ended mid-run)."""
        if self.tracking is None or not self.tracking.parent_run_id:
            return
        quiet()
        try:
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=self.tracking.uri)
            experiment = client.get_run(self.tracking.parent_run_id).info.experiment_id
            for trial_id in trial_ids:
                for run in client.search_runs([experiment], filter_string=tags.trial_run_filter(
                        self.tracking.parent_run_id, trial_id)):
                    if run.info.status != "KILLED" or run.data.tags.get(tags.OUTCOME) != "stopped":
                        client.set_tag(run.info.run_id, tags.OUTCOME, "stopped")
                        client.set_terminated(run.info.run_id, status="KILLED")
        except Exception as exc:  # tracking trouble never stops the search
            log.warning("tracking: cannot mark trials %s stopped in MLflow: %s", ", ".join(trial_ids), exc)


def experiment_id(tracking: TrackingEnv | None) -> str | None:
    if tracking is None or not tracking.parent_run_id:
        return None
    from mlflow.tracking import MlflowClient

    return str(MlflowClient(tracking_uri=tracking.uri).get_run(tracking.parent_run_id).info.experiment_id)


def init_ray(num_cpus: int) -> None:
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    temp = private_dir(Path(os.environ.get("KUBESWEEP_RAY_TMP") or f"/tmp/ks-ray-{os.getuid()}"))
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False,
             object_store_memory=100 * 1024 * 1024, _temp_dir=str(temp))


def private_dir(path: Path) -> Path:
    """`path` as a directory only this user can enter, or else a fresh one from `tempfile.mkdtemp`. `path` is made
    with mode 0700 when it does not exist, and closed to 0700 when it is this user's and no one else could write
    in it. Ray keeps its sockets, session logs and object spill files under its temporary directory; a fixed name
    under a shared /tmp could be made first by another user (or be their symbolic link) and so hand them the
    tuner's sockets and files."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        log.warning("cannot make Ray's temporary directory %s (%s): using a fresh private one", path, exc)
        return Path(tempfile.mkdtemp(prefix="ks-ray-"))
    st = os.lstat(path)  # the entry itself: a symbolic link is not followed
    problem = ("not a directory (a symbolic link or a file)" if not stat.S_ISDIR(st.st_mode)
               else f"owned by uid {st.st_uid}, not {os.getuid()}" if st.st_uid != os.getuid()
               else f"mode {stat.S_IMODE(st.st_mode):04o}: others may have written in it" if st.st_mode & 0o022
               else None)
    if problem is None:
        if st.st_mode & 0o077:  # this user's, written by none other: closed to the others from now on
            os.chmod(path, 0o700, follow_symlinks=False)
        return path
    log.warning("Ray's temporary directory %s is %s: using a fresh private one", path, problem)
    return Path(tempfile.mkdtemp(prefix="ks-ray-"))


def _searcher(search: TuneSearch) -> Any:
    metric: str | list[str] = search.metric
    mode: str | list[str] = search.modes if isinstance(search.metric, list) else search.modes[0]
    if search.algorithm == "optuna":
        from ray.tune.search.optuna import OptunaSearch

        return OptunaSearch(metric=metric, mode=mode, seed=search.seed)
    if search.algorithm == "hyperopt":
        from ray.tune.search.hyperopt import HyperOptSearch

        return HyperOptSearch(metric=search.metrics[0], mode=search.modes[0], random_state_seed=search.seed)
    from ray.tune.search.basic_variant import BasicVariantGenerator

    return BasicVariantGenerator(random_state=search.seed)


def _scheduler(search: TuneSearch) -> Any:
    """Schedulers judge one metric: the first (its intermediate series)."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, MedianStoppingRule

    metric, mode = search.metrics[0], search.modes[0]
    if search.scheduler == "asha":
        return ASHAScheduler(time_attr="training_iteration", metric=metric, mode=mode, max_t=ASHA_MAX_T,
                             grace_period=search.grace_period, reduction_factor=search.reduction_factor)
    if search.scheduler == "median":
        return MedianStoppingRule(time_attr="training_iteration", metric=metric, mode=mode,
                                  grace_period=search.grace_period, min_samples_required=2)
    return FIFOScheduler()  # type: ignore[no-untyped-call]


def run_tune(sweep: Sweep, backend: Backend, *, storage: Path, tracking: TrackingEnv | None = None,
             progress: Callable[[SweepStatus], None] | None = None, poll_s: float = 0.5) -> TuneSummary:
    """Run (or resume) the sweep's tune search to the end; returns its summary."""
    search = sweep.spec.search
    if not isinstance(search, TuneSearch):
        raise TuneError(f"sweep {sweep.name!r} is not a tune search (strategy {search.strategy!r})")
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "1")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    p = plan(sweep)
    backend.submit(p)  # the sweep, with no trials yet (or, resumed, those it has)
    storage = storage.expanduser().resolve()
    storage.mkdir(parents=True, exist_ok=True)
    init_ray(search.max_concurrent)

    from ray import tune

    from kubesweep.tune import _ray

    ctx = _ray.Context(sweep_doc=sweep.to_document(), snapshot=str(storage / m.SNAPSHOT),
                       tracking_uri=tracking.uri if tracking else None, experiment_id=experiment_id(tracking),
                       parent_run_id=tracking.parent_run_id if tracking else None, poll_s=poll_s)
    driver = _Driver(sweep, backend, Path(ctx.snapshot), tracking, progress)
    _ray.DRIVERS[sweep.name] = driver
    driver.tick(force=True)
    fn = tune.with_resources(tune.with_parameters(_ray.trainable, ctx=ctx), {"cpu": 1})
    path = storage / sweep.name
    resumed = tune.Tuner.can_restore(str(path))
    try:
        if resumed:
            tuner = tune.Tuner.restore(str(path), trainable=fn, resume_unfinished=True, resume_errored=False,
                                       restart_errored=True, param_space=ray_space(search))
        else:
            tuner = tune.Tuner(
                fn,
                param_space=ray_space(search),
                tune_config=tune.TuneConfig(
                    search_alg=_searcher(search), scheduler=_scheduler(search),
                    num_samples=1 if search.algorithm == "grid" else search.num_samples,
                    max_concurrent_trials=search.max_concurrent, reuse_actors=True),
                run_config=tune.RunConfig(name=sweep.name, storage_path=str(storage), verbose=0,
                                          callbacks=[_ray.BackendCallback(sweep.name)],
                                          failure_config=tune.FailureConfig(max_failures=0)),
            )
        grid = tuner.fit()
        # every suggestion has ended; let the backend collect what it still runs
        while True:
            status = driver.tick(force=True)
            if status is not None and status.done:
                break
            time.sleep(poll_s)
        driver.mark_all_stopped()
    finally:
        _ray.DRIVERS.pop(sweep.name, None)
    last = [(grid[i].config or {}, grid[i].metrics or {}) for i in range(len(grid))]
    summary = summarize(sweep, search, last, driver, resumed, finals=_FinalReader(ctx.tracking_uri,
                                                                                  ctx.experiment_id,
                                                                                  ctx.parent_run_id, search))
    (storage / SUMMARY).write_text(summary_json(summary))
    log_summary(tracking, storage / SUMMARY)
    return summary


class _FinalReader:
    """A finished trial's final metrics (its results file, else its MLflow run) and the constraints they break,
    as the trainable computes them. The summary shows these, not Ray's last result: for a trial that broke a
    constraint that result is the penalty, and for one the scheduler stopped only after it had finished it is
    an intermediate one."""

    def __init__(self, uri: str | None, experiment: str | None, parent_run_id: str | None, search: TuneSearch):
        self.uri, self.experiment, self.parent_run_id, self.search = uri, experiment, parent_run_id, search
        self.wanted = m.wanted(search)
        self.keys = sorted({k for n in self.wanted if (k := m.source(n).final)})

    def __call__(self, trial_id: str, results_path: str | None) -> dict[str, Any]:
        results = m.read_results(results_path)
        latest: dict[str, float] = {}
        if self.uri and self.experiment and self.parent_run_id and any(
                m.from_results(n, results) is None for n in self.wanted):  # MLflow only for what the file lacks
            poller = m.RunPoller(self.uri, self.experiment, self.parent_run_id, trial_id, self.keys)
            poller.poll_settled(pause_s=0.5)
            latest = poller.latest
        values = m.final_values(self.wanted, results, latest)
        broken = m.violations(self.search.constraints, values)
        return {**{n: values.get(n) for n in self.search.metrics}, "feasible": not broken,
                "violations": "; ".join(broken)}


def summarize(sweep: Sweep, search: TuneSearch, results: list[tuple[dict[str, Any], dict[str, Any]]],
              driver: _Driver, resumed: bool,
              finals: Callable[[str, str | None], dict[str, Any]] | None = None) -> TuneSummary:
    statuses = {t.trial_id: t for t in driver.backend.status(sweep.name).trials}
    names, modes = search.metrics, search.modes
    rows: dict[str, dict[str, Any]] = {}
    for config, last in results:
        trial = driver.trial_for(config)
        status = statuses.get(trial.id)
        outcome = status.outcome.value if status is not None and status.outcome else "unknown"
        if outcome == "succeeded" and finals is not None:
            # What it finished with, read again: its last report may hold the searcher's penalty (a constraint
            # broken) or an intermediate value (stopped by the scheduler only after it had finished).
            last = {**last, **finals(trial.id, status.results_path if status else None)}
        metrics = {n: last.get(n) for n in names}
        missing = [f"{n} missing" for n, v in metrics.items() if v is None and outcome == "succeeded"]
        rows[trial.id] = {
            "trial_id": trial.id, "name": trial.name, "axes": trial.axes, "outcome": outcome, "metrics": metrics,
            "feasible": bool(last.get("feasible")) and not missing,  # a trial that measured nothing ranks nowhere
            "violations": "; ".join(filter(None, [last.get("violations") or "", *missing])),
            "reports": last.get("training_iteration"),
        }
    trials = list(rows.values())
    ok = [t for t in trials if t["outcome"] == "succeeded" and t["feasible"]]
    best = None
    if ok:
        sign = 1.0 if modes[0] == "max" else -1.0
        best = max(ok, key=lambda t: sign * float(t["metrics"][names[0]]))
    pareto = pareto_front(ok, names, modes) if len(names) > 1 else []
    return TuneSummary.model_validate({"sweep": sweep.name, "metrics": names, "modes": modes, "trials": trials,
                                       "best": best, "pareto": pareto, "resumed": resumed})


def pareto_front(rows: list[dict[str, Any]], names: list[str], modes: list[str]) -> list[dict[str, Any]]:
    """Rows no other row is at least as good as on every metric and better on one."""
    def key(row: dict[str, Any]) -> list[float]:
        return [float(row["metrics"][n]) * (1.0 if mode == "max" else -1.0) for n, mode in zip(names, modes,
                                                                                              strict=True)]

    front = []
    for row in rows:
        mine = key(row)
        dominated = any(all(o >= s for o, s in zip(key(other), mine, strict=True)) and key(other) != mine
                        for other in rows if other is not row)
        if not dominated:
            front.append(row)
    return front


def log_summary(tracking: TrackingEnv | None, path: Path) -> None:
    if tracking is None or not tracking.parent_run_id:
        return
    with contextlib.suppress(Exception):
        from mlflow.tracking import MlflowClient

        MlflowClient(tracking_uri=tracking.uri).log_artifact(tracking.parent_run_id, str(path), "tune")
