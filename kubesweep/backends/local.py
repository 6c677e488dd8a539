"""The local backend: trials as processes on this machine, state in sqlite under the kubesweep home.

- One trial per GPU (`CUDA_VISIBLE_DEVICES`), or per CPU slot when the machine has no GPU.
- Trials asking for a GPU type this machine lacks are `Skipped: gpu not present` unless `any_gpu`.
- A GPU trial's process starts while the trial before it on the same GPU still runs (`prestart`: up to 2 trials
  start early behind each running one; `KUBESWEEP_LOCAL_PRESTART=N` sets how many, 0 turns it off): it imports,
  opens its tracking run, tokenizes and builds the model in host memory, then waits for the GPU's lease
  (kubesweep/jobs/gpu_lease.py), which the trial before it gives back once its GPU work is done. GPU phases never
  overlap; the start-up of one trial hides behind the training of the one before it.
- Single-process trials of the job start from a fork server (kubesweep/jobs/forkserver.py) that imported torch,
  transformers and the job once: a trial's process is forked, fresh, with nothing to import
  (`KUBESWEEP_LOCAL_FORKSERVER=0` starts each as a new interpreter instead).
- Compiled trials share one torch.compile cache (`<home>/cache/inductor`, Triton's in `<home>/cache/triton`).
- Whoever waits on a sweep drives it: the process holding the sweep's lock file is its supervisor, others
  only observe. A supervisor killed mid-sweep loses nothing: finished trials are committed, trials it left
  running are adopted by the next supervisor (their results files are read when they end).

`LocalBackend` composes its parts: the store (`_local_store`), the machine's slots (`_local_schedule`), starting a
trial's process (`_local_launch`), following trials to their end (`_local_trials`), the status any process reads
(`_local_status`) and the files beside the store (`_local_files`).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from kubesweep.backends._local_driver import DriverStopped, StopRequest, stop_signals
from kubesweep.backends._local_driver import me as this_driver
from kubesweep.backends._local_files import (
    read_results,
    record_tracking,
    recorded_tracking,
    resolve_paths,
    trial_log,
    write_trial_file,
)
from kubesweep.backends._local_launch import Launcher
from kubesweep.backends._local_schedule import Scheduler
from kubesweep.backends._local_status import require, sweep_status
from kubesweep.backends._local_store import SpecMismatch, Store
from kubesweep.backends._local_trials import Reaper, Supervisor
from kubesweep.backends.base import (
    Backend,
    Phase,
    ProgressCallback,
    SweepConflict,
    SweepStatus,
    TrialStatus,
)
from kubesweep.backends.local_machine import (
    JOB_COMMAND_ENV,
    Device,
    default_home,
    detect_gpus,
    forkserver_wanted,
    parse_command,
    prestart_depth,
)
from kubesweep.gpus import load_catalog
from kubesweep.jobs.command import JOB_MODULE
from kubesweep.plan import Plan, Trial
from kubesweep.sweep_spec import Sweep, parse_sweep
from kubesweep.wire.env import TrackingEnv
from kubesweep.wire.outcomes import Outcome
from kubesweep.wire.results import Results
from kubesweep.wire.results_file import ResultsFileError


class LocalBackend(Backend):
    name = "local"
    runs_here = True
    keeps_results = True  # each trial's folder under the home: trial.json, results.json, log.txt
    remembers_tracking = True  # <home>/sweeps/<sweep>/tracking.json

    def __init__(self, home: Path | str | None = None, *, job_command: list[str] | None = None,
                 cpu_slots: int = 1, any_gpu: bool = False, devices: list[Device] | None = None,
                 tracking: TrackingEnv | None = None, prestart: int | None = None,
                 forkserver: bool | None = None):
        """`job_command` replaces `python -m kubesweep.jobs` (the trial's --config/--output-dir follow).

        `tracking`: the MLflow env of the sweeps submitted here (URI, experiment, parent run); kept with the
        sweep (`<home>/sweeps/<sweep>/tracking.json`) so a detached driver or a later resume passes the same.
        """
        self.tracking = tracking
        self.store = Store(Path(home).expanduser() if home else default_home())
        if job_command is None and os.environ.get(JOB_COMMAND_ENV):
            job_command = parse_command(os.environ[JOB_COMMAND_ENV])
        self.job_command = job_command
        self.cpu_slots = max(1, cpu_slots)
        self.any_gpu = any_gpu
        self.devices = detect_gpus() if devices is None else devices
        self.prestart = prestart_depth() if prestart is None else max(0, int(prestart))
        self.forkserver = forkserver_wanted() if forkserver is None else forkserver
        self.catalog = load_catalog()  # once: every trial's GPU type is looked up in it
        self.scheduler = Scheduler(self.devices, self.cpu_slots, self.prestart, self.catalog)
        self.launcher = Launcher(self.store, prestart=self.prestart, forkserver=self.forkserver)
        self.reaper = Reaper(self.store)
        self._supervisors: dict[str, Supervisor] = {}  # the sweeps this process drives
        self._stop: StopRequest | None = None  # while `wait` drives: a stop signal that came

    # -- submit ------------------------------------------------------------------------------------

    def _submit_impl(self, plan: Plan) -> None:
        self._record(plan, plan.trials)

    def _add_trials_impl(self, plan: Plan, trials: list[Trial]) -> None:
        self._record(plan, trials)

    @staticmethod
    def _conflict(name: str) -> SweepConflict:
        return SweepConflict(f"a sweep named {name!r} already exists with a different spec; "
                             f"`sweep resume {name}` continues it, `sweep delete {name}` forgets it")

    def conflict(self, sweep: Sweep) -> SweepConflict | None:
        existing = self.store.get_sweep(sweep.name)
        return self._conflict(sweep.name) if existing is not None and existing.spec != sweep.to_document() else None

    def _record(self, plan: Plan, trials: list[Trial]) -> None:
        sweep = plan.sweep
        document = sweep.to_document()
        existing = self.store.get_sweep(sweep.name)
        if existing is not None and existing.spec != document:
            raise self._conflict(sweep.name)
        known = {r.trial_id for r in self.store.trials(sweep.name)} if existing is not None else set()
        trials = [t for t in trials if t.id not in known]
        products = {d.product for d in self.devices}
        catalog = self.catalog
        rows = []
        for position, trial in enumerate(trials, start=len(known)):
            phase, reason = Phase.PENDING, ""
            if trial.gpu and not self.any_gpu and catalog[trial.gpu].product not in products:
                have = ", ".join(sorted(products)) or "none"
                phase, reason = Phase.SKIPPED, f"gpu not present: needs {catalog[trial.gpu].product}, have {have}"
            config = trial.config.model_dump(mode="json", by_alias=True)
            config["job"] = resolve_paths(config["job"], sweep.base_dir)
            rows.append({"trial_id": trial.id, "position": position, "name": trial.name, "label": trial.label(),
                         "gpu": trial.gpu, "gpus": trial.gpus_per_trial, "config": json.dumps(config),
                         "axes": json.dumps(trial.axes), "phase": phase.value, "reason": reason})
        command = self.job_command or [sys.executable, "-m", JOB_MODULE]
        try:  # checked again where it is recorded: another process may have recorded the name since
            self.store.add_sweep(sweep.name, document, sweep.source, command, self.any_gpu, rows)
        except SpecMismatch:
            raise self._conflict(sweep.name) from None
        if existing is None or self.tracking is not None:
            self.record_tracking(sweep.name, self.tracking)
        for row in rows:
            write_trial_file(self.store.trial_dir(sweep.name, str(row["name"])), json.loads(str(row["config"])))
            if row["phase"] == Phase.SKIPPED.value:
                self.store.update(sweep.name, str(row["trial_id"]), outcome=Outcome.SKIPPED, only_if=Phase.SKIPPED)

    # -- status ------------------------------------------------------------------------------------

    def _status_impl(self, sweep: str) -> SweepStatus:
        return sweep_status(self.store, self.reaper, sweep, backend=self.name, driving=sweep in self._supervisors)

    def _list_impl(self) -> list[str]:
        return self.store.list_sweeps()

    # -- driving a sweep -------------------------------------------------------------------------------

    def wait(self, sweep: str, *, timeout: float | None = None, progress: ProgressCallback | None = None,
             interval: float = 0.5) -> SweepStatus:
        """Drive the sweep (or observe it, when another process drives it) to its end. SIGTERM and SIGHUP stop
        the driver between steps: `DriverStopped`, after its state is recorded (`_interrupted`)."""
        with stop_signals() as stop:
            self._stop = stop
            try:
                return super().wait(sweep, timeout=timeout, progress=progress, interval=interval)
            except TimeoutError:
                raise  # the caller's timeout: this process drives on when it waits again
            except (KeyboardInterrupt, OSError) as exc:  # OSError: the terminal it shows progress on is gone
                self._interrupted(sweep, DriverStopped(stop.signum) if stop.signum is not None else exc)
                raise
            finally:
                self._stop = None

    def _interrupted(self, sweep: str, exc: BaseException) -> None:
        """This driver stops before the sweep has ended: it records so (how, for `sweep status`), notes on its
        pending trials that they wait for `sweep resume`, and lets the sweep's lock go. Its running trials run on
        to their results (the fork server ends once they have); whoever looks next reads them from there."""
        supervisor = self._supervisors.pop(sweep, None)
        if supervisor is None:
            return
        why = f"stopped by {exc}" if isinstance(exc, DriverStopped) else (
            "interrupted" if isinstance(exc, KeyboardInterrupt) else f"stopped by an error: {exc}"[:200])
        for row in self.store.trials(sweep):
            if row.phase == Phase.PENDING:
                self.store.update(sweep, row.trial_id, only_if=Phase.PENDING,
                                  reason=f"interrupted: the driver {why}; `sweep resume {sweep}` starts it")
        supervisor.close_logs()
        pid, start = this_driver()
        self.store.set_driver(sweep, pid, start, why)
        self.launcher.let_go(sweep)  # it ends once the trials it runs have
        supervisor.let_go()

    def _wait_step(self, sweep: str, interval: float) -> SweepStatus:
        require(self.store, sweep)
        if self._stop is not None:
            self._stop.check()
        supervisor = self._supervisors.get(sweep) or self._acquire(sweep)
        if supervisor is not None:
            self._advance(sweep, supervisor)
            status = self._status_impl(sweep)
            if status.done and not supervisor.running:
                self._release(sweep)
                return status
        status = self._status_impl(sweep)
        if not status.done:
            time.sleep(interval)
            status = self._status_impl(sweep)
        return status

    def _acquire(self, sweep: str) -> Supervisor | None:
        supervisor = Supervisor.take(self.store.sweep_dir(sweep) / "supervisor.lock")
        if supervisor is None:
            return None  # another process drives this sweep; we observe
        self._supervisors[sweep] = supervisor
        self.store.set_driver(sweep, *this_driver())
        return supervisor

    def _release(self, sweep: str) -> None:
        supervisor = self._supervisors.pop(sweep, None)
        if self.launcher.serves(sweep):  # the sweep has ended: nothing of it runs on its fork server
            self.launcher.end_servers(sweep)
        if supervisor is not None:
            self.store.set_driver(sweep, None, None)
            supervisor.let_go()
        if not self._supervisors:
            self.close()

    def _advance(self, sweep: str, supervisor: Supervisor) -> None:
        """One step: collect the trials that ended, start the pending ones that have a place now."""
        self.reaper.reap(sweep, supervisor)
        state = self.store.get_sweep(sweep)
        if state is None or state.cancel_requested:
            return
        trials = self.store.trials(sweep)
        for start in self.scheduler.starts(state, trials, supervisor.running, state.any_gpu or self.any_gpu):
            run = self.launcher.start(sweep, start.row, start.devices, state.job_argv, after=start.after)
            if run is not None:
                supervisor.running[start.row.trial_id] = run

    def close(self) -> None:
        """End the fork servers this process started (called once it drives no sweep: none of their trials
        runs). A driver that exits without it leaves each server to end once its trials have."""
        self.launcher.close()

    # -- tracking ----------------------------------------------------------------------------------

    def use_tracking(self, sweep: str, tracking: TrackingEnv | None) -> None:
        """The env is kept with the sweep too, for the trials a detached driver or a later resume starts."""
        super().use_tracking(sweep, tracking)
        self.record_tracking(sweep, tracking)

    def record_tracking(self, sweep: str, tracking: TrackingEnv | None) -> None:
        """Keep the MLflow env the sweep's trials start with (None: trials are not tracked)."""
        env = None if tracking is None else {e["name"]: e["value"] for e in tracking.env()}
        record_tracking(self.store.sweep_dir(sweep), env)

    def parent_run_id(self, sweep: str) -> str | None:
        """The MLflow parent run the sweep's trials log under, as recorded at submit (None: not tracked)."""
        return recorded_tracking(self.store.sweep_dir(sweep)).get("KUBESWEEP_PARENT_RUN_ID") or None

    # -- cancel / stop / resume / delete -----------------------------------------------------------

    def _cancel_impl(self, sweep: str) -> None:
        """Pending trials are cancelled, running ones stopped and cancelled (`Reaper.cancel`: a trial that has
        written its answer keeps it). Then the sweep's fork server is ended."""
        require(self.store, sweep)
        self.store.set_cancel(sweep, True)
        self.reaper.cancel(sweep, self._supervisors.get(sweep))
        self.launcher.end_servers(sweep)

    def _stop_trial_impl(self, sweep: str, trial: TrialStatus, reason: str) -> None:
        self.reaper.stop(sweep, trial.trial_id, reason, self._supervisors.get(sweep))

    def _resume_impl(self, sweep: str) -> None:
        require(self.store, sweep)
        self.store.set_cancel(sweep, False)
        for row in self.store.trials(sweep):
            results = self.store.trial_dir(sweep, row.name) / "results.json"
            if _reruns(row.phase, row.outcome, results.exists()):
                self.store.update(sweep, row.trial_id, phase=Phase.PENDING, outcome=None, attempts=0,
                                  reason="resumed", finished=None)

    def to_rerun(self, status: SweepStatus) -> list[TrialStatus]:
        """Failed and cancelled trials (not OOM or GPU-mismatch cells), and succeeded ones whose results file is
        missing."""
        return [t for t in status.trials if _reruns(t.phase, t.outcome, t.results_path is not None)]

    def _delete_impl(self, sweep: str) -> None:
        self._cancel_impl(sweep)
        self._release(sweep)
        self.store.delete_sweep(sweep)
        shutil.rmtree(self.store.sweep_dir(sweep), ignore_errors=True)

    # -- logs and results --------------------------------------------------------------------------

    def _logs_impl(self, sweep: str, trial: TrialStatus, follow: bool) -> Iterator[str]:
        return trial_log(self.store.trial_dir(sweep, trial.name), trial, follow,
                         lambda: self.status(sweep).trial(trial.trial_id).phase.terminal)

    def results(self, sweep: str) -> list[tuple[TrialStatus, Results | None]]:
        """Each trial with its results file, validated (None where it has none or it is not valid: its driver
        recorded the trial failed, with the file's error as the reason)."""
        out: list[tuple[TrialStatus, Results | None]] = []
        for trial in self.status(sweep).trials:
            try:
                out.append((trial, read_results(Path(trial.results_path)) if trial.results_path else None))
            except ResultsFileError:
                out.append((trial, None))
        return out

    def trial_dir(self, sweep: str, trial: str) -> Path:
        return self.store.trial_dir(sweep, trial)

    def sweep_of(self, sweep: str) -> Sweep | None:
        """The sweep as submitted (None for an unknown sweep); `SpecError` when its stored spec no longer
        validates (another GPU catalog)."""
        state = self.store.get_sweep(sweep)
        return parse_sweep(state.spec, source=state.source, allow_unpinned=True) if state else None


def _reruns(phase: Phase, outcome: Outcome | None, has_results: bool) -> bool:
    """Whether `resume` runs a trial again: it failed or was cancelled (an OOM or GPU-mismatch cell is an answer),
    or it succeeded and its results file is gone."""
    if phase in (Phase.FAILED, Phase.CANCELLED):
        return outcome not in (Outcome.OOM, Outcome.GPU_MISMATCH)
    return phase == Phase.SUCCEEDED and not has_results
