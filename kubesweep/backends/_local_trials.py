"""The local backend's trial processes, followed to their end: which process is a trial's (pid and start time),
what a driver holds while it drives a sweep, and what is recorded when a trial ends.

A trial ends on its own (its driver reaps it: the outcome its results file gives, else its exit code; a failure
is retried while the spec's `retries` allow), or it is ended from outside: `sweep cancel` (every unfinished trial)
and a search scheduler's stop (one trial). A trial that has written its answer before the cancel reached it keeps
that answer.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from kubesweep.backends._local_driver import process_start
from kubesweep.backends._local_files import LOG_FILE, RESULTS_FILE, read_results
from kubesweep.backends._local_store import Store, TrialRow
from kubesweep.backends.base import SETTLED_OUTCOMES, Phase
from kubesweep.wire.outcomes import Outcome, outcome_for_exit
from kubesweep.wire.results import Results
from kubesweep.wire.results_file import ResultsFileError

TERM_GRACE_S = 10.0


def alive(pid: int | None) -> bool:
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


def is_trial(row: TrialRow) -> bool:
    """The recorded process still runs and is the trial's: its pid has not been reused by another process since
    (pid and start time together name one process; a row recorded before start times were kept has pid only)."""
    if not row.pid or not alive(row.pid):
        return False
    return row.pid_start is None or process_start(row.pid) == row.pid_start


def kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


@dataclass
class Running:
    row: TrialRow
    proc: subprocess.Popen[bytes] | None  # None: adopted from a supervisor that died
    devices: list[int]
    log: IO[bytes] | None = None
    staged: bool = False  # started before its GPUs were free: waits for their lease


@dataclass
class Supervisor:
    """Holds a sweep's lock and the processes it started."""

    lock: IO[str]
    running: dict[str, Running] = field(default_factory=dict)

    @classmethod
    def take(cls, path: Path) -> Supervisor | None:
        """The sweep's lock file `path`, locked by this process (its pid written in it); None when another
        process holds it (it drives the sweep, this one observes)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = path.open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        return cls(lock=handle)

    def let_go(self) -> None:
        """Unlock the sweep's lock (the processes it started run on)."""
        fcntl.flock(self.lock, fcntl.LOCK_UN)
        self.lock.close()

    def close_logs(self) -> None:
        for run in self.running.values():
            if run.log:
                run.log.close()


def _reason(results: Results) -> str:
    """Why a trial's results say it ended as it did: its error (none for one that succeeded)."""
    return f"{results.error.type}: {results.error.message}" if results.error is not None else ""


class Reaper:
    """Records how the trials of the sweeps in `store` end."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def reap(self, sweep: str, supervisor: Supervisor) -> None:
        """Collect the trials that ended (adopting those a dead supervisor left running), and hand their GPUs to
        the trials staged behind them."""
        for row in self.store.trials(sweep):
            if row.phase == Phase.RUNNING and row.trial_id not in supervisor.running:
                supervisor.running[row.trial_id] = Running(row, None, [])
        for trial_id, run in list(supervisor.running.items()):
            if run.proc is not None:
                code = run.proc.poll()
                if code is None:
                    continue
            elif is_trial(run.row):
                continue
            else:
                code = None
            if run.log:
                run.log.close()
            del supervisor.running[trial_id]
            self.finish(sweep, run.row, code)
            if not run.staged:
                self._promote(sweep, supervisor, run.devices)

    def _promote(self, sweep: str, supervisor: Supervisor, devices: list[int]) -> None:
        """The trial staged behind one that ended now has its GPUs (or is next in line for their lease)."""
        for run in supervisor.running.values():
            if run.staged and run.devices == devices:
                run.staged = False
                self.store.update(sweep, run.row.trial_id, only_if=Phase.RUNNING, reason="")
                return

    def finish(self, sweep: str, row: TrialRow, code: int | None) -> None:
        """Record how the trial ended (`code`: its exit code; None for a trial this process did not start, whose
        end is its results file's time, else its log's: the trial's own run time, not when it was noticed). A
        results file that is not valid (`wire.results_file`) is the trial's failure, its error's line the reason."""
        trial_dir = self.store.trial_dir(sweep, row.name)
        invalid = ""
        try:
            results = read_results(trial_dir / RESULTS_FILE)
        except ResultsFileError as exc:
            results, invalid = None, str(exc)
        finished = time.time()
        if code is None:
            for last in (trial_dir / RESULTS_FILE, trial_dir / LOG_FILE):
                with contextlib.suppress(OSError):
                    finished = min(finished, last.stat().st_mtime)
                    break
        if results is not None:
            outcome, reason = results.outcome, _reason(results)
        elif invalid:
            outcome, reason = Outcome.FAILED, invalid
        elif code is None:
            outcome, reason = Outcome.FAILED, "interrupted: the job ended without a results file"
        else:
            outcome = outcome_for_exit(code)
            reason = f"exit code {code}" if code >= 0 else f"killed by signal {-code}"
        state = self.store.get_sweep(sweep)
        retries = state.resources.retries if state is not None else 0
        if outcome == Outcome.FAILED and row.attempts <= retries:
            self.store.update(sweep, row.trial_id, only_if=Phase.RUNNING, phase=Phase.PENDING, pid=None,
                              reason=f"retrying after: {reason[-300:]}", exit_code=code)
            return
        phase = Phase.SUCCEEDED if outcome == Outcome.SUCCEEDED else Phase.FAILED
        self.store.update(sweep, row.trial_id, only_if=Phase.RUNNING, phase=phase, outcome=outcome,
                          reason=reason[-500:], exit_code=code, finished=finished, pid=None)

    def answer(self, sweep: str, row: TrialRow) -> tuple[Outcome, str] | None:
        """The settled outcome (succeeded, OOM, GPU mismatch, stopped) the trial's results file gives, with its
        reason; None when it has none."""
        try:
            results = read_results(self.store.trial_dir(sweep, row.name) / RESULTS_FILE)
        except ResultsFileError:
            return None
        if results is None or results.outcome not in SETTLED_OUTCOMES:
            return None
        return results.outcome, _reason(results)[-500:]

    def record_answer(self, sweep: str, row: TrialRow, only_if: Phase) -> None:
        """Record the outcome the trial's results file gives, if settled, while the trial is in phase `only_if`."""
        answer = self.answer(sweep, row)
        if answer is not None:
            outcome, reason = answer
            phase = {Outcome.SUCCEEDED: Phase.SUCCEEDED, Outcome.STOPPED: Phase.STOPPED}.get(outcome, Phase.FAILED)
            self.store.update(sweep, row.trial_id, only_if=only_if, phase=phase, outcome=outcome, reason=reason,
                              finished=time.time(), pid=None)

    # -- ended from outside --------------------------------------------------------------------------

    def cancel(self, sweep: str, supervisor: Supervisor | None) -> None:
        """Pending trials are cancelled; running ones are stopped (SIGTERM, SIGKILL after TERM_GRACE_S) and
        cancelled, except a trial that has written its answer (a results file that says succeeded, OOM or GPU
        mismatch) and is still sending it to MLflow: it is left that time to end and keeps its outcome.
        `supervisor`: this process's hold on the sweep, when it drives it (its children are reaped)."""
        now = time.time()
        victims, ending = [], []
        for row in self.store.trials(sweep):
            for _ in range(3):  # a trial may start or end between the read and the update: read it again
                if row.phase == Phase.RUNNING and self.answer(sweep, row) is not None:
                    ending.append(row)
                    break
                if row.phase not in (Phase.PENDING, Phase.UNSCHEDULABLE, Phase.RUNNING):
                    break
                if self.store.update(sweep, row.trial_id, only_if=row.phase, phase=Phase.CANCELLED,
                                     outcome=Outcome.CANCELLED, reason="cancelled", finished=now):
                    if row.phase == Phase.RUNNING and is_trial(row):  # never a process that reused its pid
                        victims.append(row)
                    break
                row = next(r for r in self.store.trials(sweep) if r.trial_id == row.trial_id)
        for row in victims:
            kill_group(row.pid or 0, signal.SIGTERM)
        waiting = [r for r in victims + ending if r.pid]
        deadline = time.monotonic() + TERM_GRACE_S
        while any(is_trial(r) for r in waiting) and time.monotonic() < deadline:
            if supervisor:  # reap our own children so they do not linger as zombies
                for run in supervisor.running.values():
                    if run.proc:
                        run.proc.poll()
            time.sleep(0.1)
        for row in waiting:
            if is_trial(row):
                kill_group(row.pid or 0, signal.SIGKILL)
        # a trial that wrote its answer before the cancel reached it keeps it
        for row in ending:
            self.record_answer(sweep, row, Phase.RUNNING)
        for row in victims:
            self.record_answer(sweep, row, Phase.CANCELLED)
        if supervisor:
            self.reap(sweep, supervisor)

    def stop(self, sweep: str, trial_id: str, reason: str, supervisor: Supervisor | None) -> None:
        """End one trial early and record it Stopped (its process: SIGTERM, SIGKILL after TERM_GRACE_S). A trial
        that has finished before the stop came, or wrote its answer while the stop was on its way, keeps its own
        outcome."""
        row = next(r for r in self.store.trials(sweep) if r.trial_id == trial_id)
        if (self.store.trial_dir(sweep, row.name) / RESULTS_FILE).exists():
            # it finished before the stop came (the results file is the job's last word; the process may still
            # be exiting): its outcome is its own, recorded when it is reaped
            if supervisor is not None:
                self.reap(sweep, supervisor)
            return
        for _ in range(3):  # the trial may start or end between the read and the update
            row = next(r for r in self.store.trials(sweep) if r.trial_id == trial_id)
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
        if is_trial(row):  # never a process that reused its pid
            kill_group(row.pid, signal.SIGTERM)
        deadline = time.monotonic() + TERM_GRACE_S
        while is_trial(row) and time.monotonic() < deadline:
            if run is not None and run.proc is not None:
                run.proc.poll()  # reap our own child so it does not linger as a zombie
            time.sleep(0.05)
        if is_trial(row):
            kill_group(row.pid, signal.SIGKILL)
        if run is not None and run.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                run.proc.wait(timeout=5)
        # it may have written its answer between the look above and the signal: a settled outcome of its own
        # (succeeded, OOM, ...) is what it did, and stands over the stop
        answer = self.answer(sweep, row)
        if answer is not None and answer[0] != Outcome.STOPPED:
            self.record_answer(sweep, row, Phase.STOPPED)
        if supervisor is not None:
            self.reap(sweep, supervisor)
