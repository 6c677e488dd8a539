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
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from kubesweep.backends._local_driver import DriverStopped, StopRequest, running, stop_signals
from kubesweep.backends._local_driver import me as this_driver
from kubesweep.backends._local_driver import process_start as _started
from kubesweep.backends._local_store import SpecMismatch, Store, SweepRow, TrialRow
from kubesweep.backends.base import (
    SETTLED_OUTCOMES,
    Backend,
    BackendError,
    Phase,
    ProgressCallback,
    SweepConflict,
    SweepNotFound,
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
from kubesweep.jobs import forkserver as forkserver_mod
from kubesweep.jobs.command import JOB_MODULE, job_argv
from kubesweep.jobs.config import PATH_SETTINGS, local_path
from kubesweep.plan import Plan, Trial
from kubesweep.spec import Sweep, parse_sweep
from kubesweep.wire.env import TrackingEnv
from kubesweep.wire.outcomes import Outcome, outcome_for_exit

TRACKING_FILE = "tracking.json"
FORKSERVER_RECORD = "forkserver.json"  # the sweep's fork server while it runs: pid and socket
TERM_GRACE_S = 10.0


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has exited
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return True


def _is_trial(row: TrialRow) -> bool:
    """The recorded process still runs and is the trial's: its pid has not been reused by another process since
    (pid and start time together name one process; a row recorded before start times were kept has pid only)."""
    if not row.pid or not _alive(row.pid):
        return False
    return row.pid_start is None or _started(row.pid) == row.pid_start


def _kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


@dataclass
class _Running:
    row: TrialRow
    proc: subprocess.Popen[bytes] | None  # None: adopted from a supervisor that died
    devices: list[int]
    log: IO[bytes] | None = None
    staged: bool = False  # started before its GPUs were free: waits for their lease


@dataclass
class _Supervisor:
    """Holds a sweep's lock and the processes it started."""

    lock: IO[str]
    running: dict[str, _Running] = field(default_factory=dict)


class LocalBackend(Backend):
    name = "local"

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
        self._servers: dict[str, forkserver_mod.Handle] = {}  # per sweep this process drives
        self._supervisors: dict[str, _Supervisor] = {}
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

    def _record(self, plan: Plan, trials: list[Trial]) -> None:
        sweep = plan.sweep
        document = sweep.to_document()
        existing = self.store.get_sweep(sweep.name)
        if existing is not None and existing.spec != document:
            raise self._conflict(sweep.name)
        known = {r.trial_id for r in self.store.trials(sweep.name)} if existing is not None else set()
        trials = [t for t in trials if t.id not in known]
        products = {d.product for d in self.devices}
        catalog = load_catalog()
        rows = []
        for position, trial in enumerate(trials, start=len(known)):
            phase, reason = Phase.PENDING, ""
            if trial.gpu and not self.any_gpu and catalog[trial.gpu].product not in products:
                have = ", ".join(sorted(products)) or "none"
                phase, reason = Phase.SKIPPED, f"gpu not present: needs {catalog[trial.gpu].product}, have {have}"
            config = trial.config.model_dump(mode="json", by_alias=True)
            config["job"] = _resolve_paths(config["job"], sweep.base_dir)
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
            trial_dir = self.store.trial_dir(sweep.name, str(row["name"]))
            trial_dir.mkdir(parents=True, exist_ok=True)
            (trial_dir / "trial.json").write_text(json.dumps(json.loads(str(row["config"])), indent=2) + "\n")
            if row["phase"] == Phase.SKIPPED.value:
                self.store.update(sweep.name, str(row["trial_id"]), outcome=Outcome.SKIPPED, only_if=Phase.SKIPPED)

    # -- status ------------------------------------------------------------------------------------

    def _require(self, sweep: str) -> None:
        if self.store.get_sweep(sweep) is None:
            known = ", ".join(self.store.list_sweeps()) or "none"
            raise SweepNotFound(f"no local sweep named {sweep!r} (known: {known}) in {self.store.home}")

    def _status_impl(self, sweep: str) -> SweepStatus:
        state = self.store.get_sweep(sweep)
        if state is None:
            self._require(sweep)
        assert state is not None
        gone = self._driver_gone(state)
        if gone:  # nothing reaps its trials: the ones that ended are read from their results files here
            for row in self.store.trials(sweep):
                if row.phase == Phase.RUNNING and not _is_trial(row):
                    self._finish(sweep, row, None)
        trials = [self.store.to_status(sweep, r) for r in self.store.trials(sweep)]
        message, interrupted = f"state in {self.store.home}", ""
        if gone and not all(t.phase.terminal for t in trials):
            how = f", {state.driver_stop}" if state.driver_stop else ""
            interrupted = f"driver gone (pid {state.driver_pid}{how})"
            message = f"Interrupted: {interrupted}: `sweep resume {sweep}` picks it up; {message}"
        return SweepStatus(sweep, self.name, trials, message=message, interrupted=interrupted)

    def _driver_gone(self, state: SweepRow) -> bool:
        """A driver was recorded for the sweep and no longer runs (this process drives what it drives)."""
        if state.name in self._supervisors or state.driver_pid is None:
            return False
        return bool(state.driver_stop) or not running(state.driver_pid, state.driver_start)

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
        for run in supervisor.running.values():
            if run.log:
                run.log.close()
        pid, start = this_driver()
        self.store.set_driver(sweep, pid, start, why)
        server = self._servers.pop(sweep, None)
        if server is not None:
            server.stop()  # it ends once the trials it runs have
        fcntl.flock(supervisor.lock, fcntl.LOCK_UN)
        supervisor.lock.close()

    def _wait_step(self, sweep: str, interval: float) -> SweepStatus:
        self._require(sweep)
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

    def _acquire(self, sweep: str) -> _Supervisor | None:
        path = self.store.sweep_dir(sweep) / "supervisor.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = path.open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return None  # another process drives this sweep; we observe
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        supervisor = _Supervisor(lock=handle)
        self._supervisors[sweep] = supervisor
        self.store.set_driver(sweep, *this_driver())
        return supervisor

    def _release(self, sweep: str) -> None:
        supervisor = self._supervisors.pop(sweep, None)
        if sweep in self._servers:  # the sweep has ended: nothing of it runs on its fork server
            self._end_servers(sweep)
        if supervisor is not None:
            self.store.set_driver(sweep, None, None)
            fcntl.flock(supervisor.lock, fcntl.LOCK_UN)
            supervisor.lock.close()
        if not self._supervisors:
            self.close()

    def _advance(self, sweep: str, supervisor: _Supervisor) -> None:
        self._reap(sweep, supervisor)
        state = self.store.get_sweep(sweep)
        if state is None or state.cancel_requested:
            return
        spec = state.spec["spec"]
        alone = bool((spec.get("placement") or {}).get("alone"))  # one machine is one node: one trial at a time
        max_parallel = 1 if alone else int(spec["concurrency"]["max_parallel"])
        per_type = spec["concurrency"].get("per_gpu_type")
        any_gpu = state.any_gpu or self.any_gpu
        prestart = self.prestart and not alone  # a trial preparing behind another is its neighbour on the host
        for row in self.store.trials(sweep):
            if row.phase != Phase.PENDING:
                continue
            active = [r for r in supervisor.running.values() if not r.staged]
            if len(active) >= max_parallel and not (prestart and self.devices):
                break  # nothing more starts this step, early or not
            by_type = Counter(r.row.gpu for r in active)
            devices = None
            if len(active) < max_parallel and not (per_type and row.gpu and by_type[row.gpu] >= per_type):
                devices = self._free_devices(supervisor, row, any_gpu)
            if devices is not None:
                self._start(sweep, supervisor, row, devices, state.job_argv)
                continue
            successor_of = self._stage_devices(supervisor, row, any_gpu) if prestart else None
            if successor_of is not None:
                self._start(sweep, supervisor, row, successor_of.devices, state.job_argv, after=successor_of)

    def _free_devices(self, supervisor: _Supervisor, row: TrialRow, any_gpu: bool) -> list[int] | None:
        """Device indices for the trial ([] = CPU), or None when it has to wait."""
        busy = {i for r in supervisor.running.values() for i in r.devices}
        cpu_busy = sum(1 for r in supervisor.running.values() if not r.devices)
        if row.gpus == 0 or (not self.devices and row.gpu is None):
            return [] if cpu_busy < self.cpu_slots else None
        product = load_catalog()[row.gpu].product if row.gpu else None
        fits = [d.index for d in self.devices
                if d.index not in busy and (product is None or any_gpu or d.product == product)]
        if row.gpu and not any_gpu and not any(d.product == product for d in self.devices):
            return None
        return fits[: row.gpus] if len(fits) >= row.gpus else None

    def _stage_devices(self, supervisor: _Supervisor, row: TrialRow, any_gpu: bool) -> _Running | None:
        """The running GPU trial this pending one can start behind (same devices, fewer than `prestart` trials
        staged there already)."""
        if not self.prestart or row.gpus == 0 or not self.devices:
            return None
        runs = list(supervisor.running.values())
        staged = Counter(i for r in runs if r.staged for i in r.devices)
        product = load_catalog()[row.gpu].product if row.gpu else None
        products = {d.index: d.product for d in self.devices}
        for run in runs:
            if run.staged or run.proc is None or len(run.devices) != row.gpus or \
                    any(staged[i] >= self.prestart for i in run.devices):
                continue
            if product is None or any_gpu or all(products.get(i) == product for i in run.devices):
                return run
        return None

    def _lease_paths(self, devices: list[int]) -> str:
        return os.pathsep.join(str(self.store.home / "gpus" / f"gpu-{i}.lock") for i in devices)

    def _compile_cache_env(self) -> dict[str, str]:
        cache = self.store.home / "cache"
        env = {}
        if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
            env["TORCHINDUCTOR_CACHE_DIR"] = str(cache / "inductor")
        if "TRITON_CACHE_DIR" not in os.environ:
            env["TRITON_CACHE_DIR"] = str(cache / "triton")
        return env

    def _start(self, sweep: str, supervisor: _Supervisor, row: TrialRow, devices: list[int],
               command: list[str], *, after: _Running | None = None) -> None:
        trial_dir = self.store.trial_dir(sweep, row.name)
        trial_dir.mkdir(parents=True, exist_ok=True)
        config_path = trial_dir / "trial.json"
        config_path.write_text(json.dumps(row.config, indent=2) + "\n")
        (trial_dir / "results.json").unlink(missing_ok=True)
        env = {**os.environ, **self._tracking_env(sweep), "KUBESWEEP_SWEEP": sweep,
               "KUBESWEEP_TRIAL_ID": row.trial_id, "PYTHONUNBUFFERED": "1",
               "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in devices), **self._compile_cache_env()}
        if devices and self.prestart:
            env["KUBESWEEP_GPU_LEASE"] = self._lease_paths(devices)
        if command == [command[0], "-m", JOB_MODULE]:
            argv = job_argv(str(config_path), str(trial_dir), python=command[0], gpus=len(devices) or 1)
            if self.forkserver and argv[1:3] == ["-m", JOB_MODULE]:  # one process (torchrun's are not forked)
                argv = self._server(sweep, command[0], env).argv(argv[3:])
        else:
            argv = [*command, "--config", str(config_path), "--output-dir", str(trial_dir)]
        log = (trial_dir / "log.txt").open("ab")
        log.write(f"# attempt {row.attempts + 1}: {' '.join(argv)}\n".encode())
        log.flush()
        try:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=trial_dir,
                                    start_new_session=True)
        except OSError as exc:
            log.close()
            self.store.update(sweep, row.trial_id, phase=Phase.FAILED, outcome=Outcome.FAILED,
                              reason=f"cannot start the job: {exc}", finished=time.time())
            return
        reason = f"started early: waits for GPU {','.join(map(str, devices))} ({after.row.name})" if after else ""
        self.store.update(sweep, row.trial_id, phase=Phase.RUNNING, pid=proc.pid, pid_start=_started(proc.pid),
                          attempts=row.attempts + 1,
                          started=time.time(), finished=None, outcome=None, reason=reason, exit_code=None)
        row.attempts += 1
        supervisor.running[row.trial_id] = _Running(row, proc, devices, log, staged=after is not None)

    def _server(self, sweep: str, python: str, trial_env: dict[str, str]) -> forkserver_mod.Handle:
        """The sweep's fork server in this driver, for `python`: started on first use (again if it died), with
        the CUDA environment of the trial that starts it (what its first spare prepares for). Its pid is kept in
        `<home>/sweeps/<sweep>/forkserver.json`, so that `sweep cancel` in another process ends it."""
        server = self._servers.get(sweep)
        if server is None or not server.alive() or server.python != python:
            if server is not None:
                server.terminate()
            env = {**os.environ, **self._compile_cache_env(), **forkserver_mod.cuda_env(trial_env)}
            server = forkserver_mod.Handle(python, env, self.store.home / "forkserver.log",
                                           record=self.store.sweep_dir(sweep) / FORKSERVER_RECORD)
            self._servers[sweep] = server
        return server

    def _end_servers(self, sweep: str) -> None:
        """End the sweep's fork server now (it holds the job's imports, about 1 GB): this process's, or the one
        another process started for it (its record)."""
        server = self._servers.pop(sweep, None)
        if server is not None:
            server.terminate()
        forkserver_mod.end_recorded(self.store.sweep_dir(sweep) / FORKSERVER_RECORD)

    def close(self) -> None:
        """End the fork servers this process started (called once it drives no sweep: none of their trials
        runs). A driver that exits without it leaves each server to end once its trials have."""
        for sweep in list(self._servers):
            self._end_servers(sweep)

    def use_tracking(self, sweep: str, tracking: TrackingEnv | None) -> None:
        """The env is kept with the sweep too, for the trials a detached driver or a later resume starts."""
        super().use_tracking(sweep, tracking)
        self.record_tracking(sweep, tracking)

    def record_tracking(self, sweep: str, tracking: TrackingEnv | None) -> None:
        """Keep the MLflow env the sweep's trials start with (None: trials are not tracked)."""
        path = self.store.sweep_dir(sweep) / TRACKING_FILE
        if tracking is None:
            path.unlink(missing_ok=True)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({e["name"]: e["value"] for e in tracking.env()}) + "\n")

    def parent_run_id(self, sweep: str) -> str | None:
        """The MLflow parent run the sweep's trials log under, as recorded at submit (None: not tracked)."""
        return self._tracking_env(sweep).get("KUBESWEEP_PARENT_RUN_ID") or None

    def _tracking_env(self, sweep: str) -> dict[str, str]:
        """MLflow env recorded at submit (empty when the sweep is not tracked)."""
        try:
            data = json.loads((self.store.sweep_dir(sweep) / TRACKING_FILE).read_text())
        except (OSError, ValueError):
            return {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def _reap(self, sweep: str, supervisor: _Supervisor) -> None:
        # adopt trials a dead supervisor left running
        for row in self.store.trials(sweep):
            if row.phase == Phase.RUNNING and row.trial_id not in supervisor.running:
                supervisor.running[row.trial_id] = _Running(row, None, [])
        for trial_id, run in list(supervisor.running.items()):
            if run.proc is not None:
                code = run.proc.poll()
                if code is None:
                    continue
            elif _is_trial(run.row):
                continue
            else:
                code = None
            if run.log:
                run.log.close()
            del supervisor.running[trial_id]
            self._finish(sweep, run.row, code)
            if not run.staged:
                self._promote(sweep, supervisor, run.devices)

    def _promote(self, sweep: str, supervisor: _Supervisor, devices: list[int]) -> None:
        """The trial staged behind one that ended now has its GPUs (or is next in line for their lease)."""
        for run in supervisor.running.values():
            if run.staged and run.devices == devices:
                run.staged = False
                self.store.update(sweep, run.row.trial_id, only_if=Phase.RUNNING, reason="")
                return

    def _finish(self, sweep: str, row: TrialRow, code: int | None) -> None:
        """Record how the trial ended (`code`: its exit code; None for a trial this process did not start, whose
        end is its results file's time, else its log's: the trial's own run time, not when it was noticed)."""
        trial_dir = self.store.trial_dir(sweep, row.name)
        results = _read_results(trial_dir / "results.json")
        finished = time.time()
        if code is None:
            for last in (trial_dir / "results.json", trial_dir / "log.txt"):
                with contextlib.suppress(OSError):
                    finished = min(finished, last.stat().st_mtime)
                    break
        if results and results.get("outcome"):
            outcome = Outcome(results["outcome"])
            reason = str(results.get("error") or results.get("reason") or "")
        elif code is None:
            outcome, reason = Outcome.FAILED, "interrupted: the job ended without a results file"
        else:
            outcome = outcome_for_exit(code)
            reason = f"exit code {code}" if code >= 0 else f"killed by signal {-code}"
        retries = int(self.store.get_sweep(sweep).spec["spec"]["resources"]["retries"])  # type: ignore[union-attr]
        if outcome == Outcome.FAILED and row.attempts <= retries:
            self.store.update(sweep, row.trial_id, only_if=Phase.RUNNING, phase=Phase.PENDING, pid=None,
                              reason=f"retrying after: {reason[-300:]}", exit_code=code)
            return
        phase = Phase.SUCCEEDED if outcome == Outcome.SUCCEEDED else Phase.FAILED
        self.store.update(sweep, row.trial_id, only_if=Phase.RUNNING, phase=phase, outcome=outcome,
                          reason=reason[-500:], exit_code=code, finished=finished, pid=None)

    # -- cancel / resume / delete --------------------------------------------------------------------

    def _cancel_impl(self, sweep: str) -> None:
        """Pending trials are cancelled; running ones are stopped (SIGTERM, SIGKILL after TERM_GRACE_S) and
        cancelled, except a trial that has written its answer (a results file that says succeeded, OOM or GPU
        mismatch) and is still sending it to MLflow: it is left that time to end and keeps its outcome. Then the
        sweep's fork server is ended."""
        self._require(sweep)
        self.store.set_cancel(sweep, True)
        now = time.time()
        victims, ending = [], []
        for row in self.store.trials(sweep):
            for _ in range(3):  # a trial may start or end between the read and the update: read it again
                if row.phase == Phase.RUNNING and self._answer(sweep, row) is not None:
                    ending.append(row)
                    break
                if row.phase not in (Phase.PENDING, Phase.UNSCHEDULABLE, Phase.RUNNING):
                    break
                if self.store.update(sweep, row.trial_id, only_if=row.phase, phase=Phase.CANCELLED,
                                     outcome=Outcome.CANCELLED, reason="cancelled", finished=now):
                    if row.phase == Phase.RUNNING and _is_trial(row):  # never a process that reused its pid
                        victims.append(row)
                    break
                row = next(r for r in self.store.trials(sweep) if r.trial_id == row.trial_id)
        for row in victims:
            _kill_group(row.pid or 0, signal.SIGTERM)
        waiting = [r for r in victims + ending if r.pid]
        deadline = time.monotonic() + TERM_GRACE_S
        supervisor = self._supervisors.get(sweep)
        while any(_is_trial(r) for r in waiting) and time.monotonic() < deadline:
            if supervisor:  # reap our own children so they do not linger as zombies
                for run in supervisor.running.values():
                    if run.proc:
                        run.proc.poll()
            time.sleep(0.1)
        for row in waiting:
            if _is_trial(row):
                _kill_group(row.pid or 0, signal.SIGKILL)
        # a trial that wrote its answer before the cancel reached it keeps it
        for row in ending:
            self._record_answer(sweep, row, Phase.RUNNING)
        for row in victims:
            self._record_answer(sweep, row, Phase.CANCELLED)
        if supervisor:
            self._reap(sweep, supervisor)
        self._end_servers(sweep)

    def _answer(self, sweep: str, row: TrialRow) -> tuple[Outcome, str] | None:
        """The settled outcome (succeeded, OOM, GPU mismatch, stopped) the trial's results file gives, with its
        reason; None when it has none."""
        results = _read_results(self.store.trial_dir(sweep, row.name) / "results.json")
        try:
            outcome = Outcome(results["outcome"]) if results else None
        except ValueError:
            return None
        if results is None or outcome not in SETTLED_OUTCOMES:
            return None
        return outcome, str(results.get("error") or results.get("reason") or "")[-500:]

    def _record_answer(self, sweep: str, row: TrialRow, only_if: Phase) -> None:
        """Record the outcome the trial's results file gives, if settled, while the trial is in phase `only_if`."""
        answer = self._answer(sweep, row)
        if answer is not None:
            outcome, reason = answer
            phase = {Outcome.SUCCEEDED: Phase.SUCCEEDED, Outcome.STOPPED: Phase.STOPPED}.get(outcome, Phase.FAILED)
            self.store.update(sweep, row.trial_id, only_if=only_if, phase=phase, outcome=outcome, reason=reason,
                              finished=time.time(), pid=None)

    def _stop_trial_impl(self, sweep: str, trial: TrialStatus, reason: str) -> None:
        supervisor = self._supervisors.get(sweep)
        row = next(r for r in self.store.trials(sweep) if r.trial_id == trial.trial_id)
        if (self.store.trial_dir(sweep, row.name) / "results.json").exists():
            # it finished before the stop came (the results file is the job's last word; the process may still
            # be exiting): its outcome is its own, recorded when it is reaped
            if supervisor is not None:
                self._reap(sweep, supervisor)
            return
        for _ in range(3):  # the trial may start or end between the read and the update
            row = next(r for r in self.store.trials(sweep) if r.trial_id == trial.trial_id)
            if row.phase.terminal:
                return
            if self.store.update(sweep, row.trial_id, only_if=row.phase, phase=Phase.STOPPED,
                                 outcome=Outcome.STOPPED, reason=reason, finished=time.time()):
                break
        else:
            return
        if row.phase != Phase.RUNNING or not row.pid:
            return
        run = supervisor.running.get(row.trial_id) if supervisor else None
        if _is_trial(row):  # never a process that reused its pid
            _kill_group(row.pid, signal.SIGTERM)
        deadline = time.monotonic() + TERM_GRACE_S
        while _is_trial(row) and time.monotonic() < deadline:
            if run is not None and run.proc is not None:
                run.proc.poll()  # reap our own child so it does not linger as a zombie
            time.sleep(0.05)
        if _is_trial(row):
            _kill_group(row.pid, signal.SIGKILL)
        if run is not None and run.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                run.proc.wait(timeout=5)
        if supervisor is not None:
            self._reap(sweep, supervisor)

    def _resume_impl(self, sweep: str) -> None:
        self._require(sweep)
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

    # -- logs --------------------------------------------------------------------------------------

    def _logs_impl(self, sweep: str, trial: TrialStatus, follow: bool) -> Iterator[str]:
        path = self.store.trial_dir(sweep, trial.name) / "log.txt"
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
                if not follow or self.status(sweep).trial(trial.trial_id).phase.terminal:
                    rest = handle.read()
                    if rest:
                        yield rest
                    return
                time.sleep(0.25)

    # -- results -----------------------------------------------------------------------------------

    def results(self, sweep: str) -> list[tuple[TrialStatus, dict[str, Any] | None]]:
        """Each trial with its parsed results file (None where it has none)."""
        status = self.status(sweep)
        return [(t, _read_results(Path(t.results_path)) if t.results_path else None) for t in status.trials]

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


def _read_results(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _resolve_paths(job: dict[str, Any], base: Path) -> dict[str, Any]:
    """Relative dataset/model paths in a spec are relative to the spec file's directory (`jobs.config.local_path`,
    which `kubesweep.preflight` checks the same paths with)."""
    out = dict(job)
    for key in PATH_SETTINGS:
        value = out.get(key)
        path = local_path(value, base) if isinstance(value, str) else None
        if path is not None:
            out[key] = str(path)
    return out
