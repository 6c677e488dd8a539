"""The backend interface: where trials run.

Public methods (`submit`, `status`, `wait`, `cancel`, `resume`, `logs`, `delete`) hold the behaviour every
backend shares — argument checks, idempotency rules, the meaning of "resume" — and call the `_impl` methods a
backend provides. `Backend`'s docstring states the contract; `tests/backends/contract.py` is the suite every
backend must pass.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from kubesweep.plan import Plan, Trial
from kubesweep.sweep_spec import Sweep
from kubesweep.wire.env import TrackingEnv
from kubesweep.wire.outcomes import Outcome
from kubesweep.wire.results import Results


class Phase(StrEnum):
    PENDING = "Pending"
    UNSCHEDULABLE = "Unschedulable"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SKIPPED = "Skipped"
    CANCELLED = "Cancelled"
    STOPPED = "Stopped"  # ended early by a search scheduler (ASHA, median); a result, not a failure

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({Phase.SUCCEEDED, Phase.FAILED, Phase.SKIPPED, Phase.CANCELLED, Phase.STOPPED})

# Outcomes that are results, not failures: rerunning them would give the same answer (a trial a search
# scheduler stopped early was judged by the search; rerunning it would undo the search's decision).
SETTLED_OUTCOMES = frozenset({Outcome.SUCCEEDED, Outcome.OOM, Outcome.GPU_MISMATCH, Outcome.STOPPED})
# Outcomes that make a sweep fail (exit 1): a trial that failed, and one no node of the cluster could take (it
# never ran: not a result, and `resume` runs it again).
FAILURES = frozenset({Outcome.FAILED, Outcome.UNSCHEDULABLE})
STOPPED_REASON = "stopped early by the search scheduler"


class BackendError(RuntimeError):
    """A backend could not do what was asked; the message says why and what to do."""


class SweepNotFound(BackendError):
    pass


class SweepConflict(BackendError):
    """A sweep of that name exists with a different spec."""


class AmbiguousTrial(BackendError):
    """A trial reference (a name or id prefix) that matches more than one trial."""


@dataclass
class TrialStatus:
    trial_id: str
    name: str
    label: str
    gpu: str | None
    phase: Phase
    outcome: Outcome | None = None
    reason: str = ""
    attempts: int = 0
    started_at: float | None = None
    finished_at: float | None = None
    results_path: str | None = None
    axes: dict[str, Any] = field(default_factory=dict)

    @property
    def settled(self) -> bool:
        """Finished with an answer (succeeded, or an OOM / GPU-mismatch cell): resume leaves it alone."""
        return self.phase.terminal and self.outcome in SETTLED_OUTCOMES


@dataclass
class SweepStatus:
    name: str
    backend: str
    trials: list[TrialStatus]
    message: str = ""
    interrupted: str = ""  # not done and nothing drives it any more (why: its driver is gone)

    def counts(self) -> Counter[str]:
        return Counter(t.phase.value for t in self.trials)

    @property
    def done(self) -> bool:
        return all(t.phase.terminal for t in self.trials)

    @property
    def has_failures(self) -> bool:
        """A trial failed, or never ran because no node could take it (`unschedulable`); OOM, GPU-mismatch and
        stopped trials are results, not failures."""
        return any(t.outcome in FAILURES for t in self.trials)

    @property
    def phase(self) -> str:
        counts = self.counts()
        if not self.trials:
            return "Empty"
        if not self.done:
            if self.interrupted:
                return "Interrupted"
            return "Running" if counts[Phase.RUNNING] else "Pending"
        if counts[Phase.CANCELLED]:
            return "Cancelled"
        return "Failed" if self.has_failures else "Succeeded"

    def trial(self, ref: str) -> TrialStatus:
        """A trial by name, id or unique name/id prefix."""
        exact = [t for t in self.trials if ref in (t.name, t.trial_id)]
        found = exact or [t for t in self.trials if t.name.startswith(ref) or t.trial_id.startswith(ref)]
        if not found:
            raise SweepNotFound(f"no trial of sweep {self.name!r} matches {ref!r}")
        if len(found) > 1:
            shown = [f"  {t.name} (id {t.trial_id})" for t in found[:10]]
            more = [f"  ... and {len(found) - 10} more"] if len(found) > 10 else []
            raise AmbiguousTrial("\n".join([f"{ref!r} matches {len(found)} trials of sweep {self.name!r}; give "
                                             "more of a name, or an id:", *shown, *more]))
        return found[0]


ProgressCallback = Callable[[SweepStatus], None]


class Backend(ABC):
    """Where a plan's trials run, and the one way the rest of kubesweep asks about them.

    A backend keeps each sweep's state (its spec, its trials' phases and outcomes) where any process that makes
    the same backend finds it again: a sweep outlives the process that submitted it. Nothing above this floor
    asks which backend it holds: what differs between backends is declared here, with a default, and read as
    declared (never probed with `getattr`).

    **Idempotency.** `submit` of a plan already submitted starts no trial twice, and `add_trials` of a trial
    already in the sweep leaves it as it is; `submit` of another spec under a sweep's name is refused
    (`SweepConflict`, said before anything is opened by `conflict` where the backend can tell). `resume` runs again
    only the trials that ended without an answer (failed, cancelled, or a results file gone: `to_rerun`); a settled
    trial (succeeded, OOM, GPU mismatch, stopped by a search) keeps its outcome. `cancel` keeps the results of the
    trials that finished; `stop_trial` of a trial that has ended changes nothing. A driver killed mid-sweep loses
    nothing: what a step has done is recorded before the next begins, and whoever drives the sweep next carries on
    from there (the local backend adopts the trials a dead supervisor left running).

    **Who drives a sweep.** A sweep moves (its pending trials start, ended ones are collected) only while something
    drives it. Where `driven_by_waiter` (the local backend, Kubernetes `--direct`), that is whoever waits on it
    (`wait`, `advance`, `submit(wait=True)`); a sweep left detached needs a driver process of its own (`sweep
    _drive`). Otherwise a controller of the backend's own (the operator) drives it, and waiting only reads it.

    **Two processes at once.** Any number of processes may read a sweep (`status`, `logs`, `results`) while one
    drives it. Two that wait on the same sweep never start a trial twice: the local backend's supervisor lock gives
    one of them the sweep and the other observes; Kubernetes reconcile steps are idempotent (a trial's Job has one
    name), so two processes' steps start it once. `cancel`, `delete` and `stop_trial` may come from another process
    than the driver's: the driver honours them on its next step.

    **Optional capabilities**, each with its default here: a backend that has one says so by overriding it.

    - `runs_here`: the trials are processes of this machine, started with this process's environment (default:
      no; they run elsewhere, with the environment the backend gives them).
    - `keeps_results`: the trials' results files are on this machine, read by `results` (default: no; `results`
      then gives each trial's status without a file, and figures come from MLflow).
    - `parent_run_id`: the MLflow parent run the backend records for a sweep (default: none).
    - `opens_parent_run`: a controller of the backend's own opens that run (default: no; the client opens it).
    - `driven_by_waiter`: see above (default: yes).
    - `remembers_tracking`: the MLflow env the trials start with is kept with the sweep, so a detached driver or a
      later resume passes the same (default: no; a driver finds the sweep's parent run again).
    - `add_trials` and `stop_trial` (a search's trials): refused by default (`BackendError`).
    - `conflict`, `sweep_of`, `trial_dir`: what the backend knows before it submits, of a submitted spec and of a
      trial's files on this machine (default: nothing).
    """

    name: str = "abstract"
    # the MLflow env of the trials this backend starts (None: not tracked); see `use_tracking`
    tracking: TrackingEnv | None = None
    # True where a controller of the backend's own (the operator) opens the sweep's MLflow parent run, owns it and
    # keeps its record (`parent_run_id`): a client then opens none, and reads the sweep's runs under that record
    opens_parent_run: bool = False
    # True where whoever waits on a sweep drives it (starts its trials, hands warm pods their next trial): a sweep
    # left detached then needs a driver process of its own (`sweep _drive`). False where a controller drives it.
    driven_by_waiter: bool = True
    # True where the trials are processes of this machine, started with this process's environment
    runs_here: bool = False
    # True where the trials' results files are on this machine (`results` reads them, `trial_dir` finds them)
    keeps_results: bool = False
    # True where the MLflow env the trials start with is kept with the sweep (`use_tracking`), for a detached driver
    # or a later resume; False where a driver finds the sweep's parent run again (`parent_run_id`, MLflow)
    remembers_tracking: bool = False

    def submit(self, plan: Plan, *, wait: bool = False, progress: ProgressCallback | None = None) -> SweepStatus:
        """Start a sweep's trials. Submitting the same plan again starts nothing twice."""
        if not plan.trials and not plan.notes:
            raise BackendError(f"sweep {plan.sweep.name!r} has no trials to run (every cell was excluded or dropped)")
        self._submit_impl(plan)
        return self.wait(plan.sweep.name, progress=progress) if wait else self.status(plan.sweep.name)

    def status(self, sweep: str) -> SweepStatus:
        return self._status_impl(sweep)

    def wait(self, sweep: str, *, timeout: float | None = None, progress: ProgressCallback | None = None,
             interval: float = 0.5) -> SweepStatus:
        """Block until every trial is terminal (or `timeout` seconds pass), reporting progress."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self._wait_step(sweep, interval)
            if progress:
                progress(status)
            if status.done:
                return status
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"sweep {sweep!r} not finished after {timeout:.0f}s: {dict(status.counts())}")

    def cancel(self, sweep: str) -> SweepStatus:
        """Stop running trials and start no new ones. Finished trials keep their results."""
        self._cancel_impl(sweep)
        return self.status(sweep)

    def resume(self, sweep: str, *, wait: bool = False, progress: ProgressCallback | None = None) -> SweepStatus:
        """Run again only the trials that failed, were cancelled, or are missing; settled ones stay."""
        self._resume_impl(sweep)
        return self.wait(sweep, progress=progress) if wait else self.status(sweep)

    def to_rerun(self, status: SweepStatus) -> list[TrialStatus]:
        """The trials of `status` that `resume` would run again: ended without an answer (failed, cancelled)."""
        return [t for t in status.trials if t.phase.terminal and not t.settled]

    def logs(self, sweep: str, trial: str, *, follow: bool = False) -> Iterator[str]:
        status = self.status(sweep)
        return self._logs_impl(sweep, status.trial(trial), follow)

    def delete(self, sweep: str) -> None:
        """Cancel a sweep and forget it (its results files stay where they were written)."""
        self._delete_impl(sweep)

    def list_sweeps(self) -> list[str]:
        return self._list_impl()

    def conflict(self, sweep: Sweep) -> SweepConflict | None:
        """The error `submit` would end in because a sweep of this name is recorded here with another spec, said
        before anything is opened for it (`sweep validate`, and `submit` before its tracking); None where there is
        none, or where this backend learns of one only as it submits (a cluster it does not ask before)."""
        return None

    def sweep_of(self, sweep: str) -> Sweep | None:
        """The sweep as submitted (its spec, parsed), or None when this backend does not know it."""
        return None

    def use_tracking(self, sweep: str, tracking: TrackingEnv | None) -> None:
        """Start the sweep's trials from now on with this MLflow env (None: untracked), e.g. on resume."""
        self.tracking = tracking

    def trial_dir(self, sweep: str, trial: str) -> Path | None:
        """The directory on this machine holding a trial's files (trial.json, results.json, log.txt); None when
        the trials run elsewhere."""
        return None

    def results(self, sweep: str) -> list[tuple[TrialStatus, Results | None]]:
        """Each trial with its results file, validated (None where it has none, or the file is not valid). Without
        `keeps_results`, every trial's is None: its figures are in its MLflow run."""
        return [(trial, None) for trial in self.status(sweep).trials]

    def parent_run_id(self, sweep: str) -> str | None:
        """The MLflow parent run the backend records for the sweep, that its trials log under (None: no record:
        not tracked, not yet opened, an unknown sweep, or a backend that keeps none)."""
        return None

    # -- searches: trials made while the sweep runs ---------------------------------------------------

    def add_trials(self, plan: Plan, trials: Sequence[Trial]) -> SweepStatus:
        """Add trials to a sweep while it runs (a tuner's suggestions, max-batch probes); `plan` is the sweep's
        plan (it is created from it when new). A trial already in the sweep is left as it is, so adding the
        same suggestion twice starts it once. The trials start on the next `advance` or `wait` step."""
        if any(t.config.sweep != plan.sweep.name for t in trials):
            raise BackendError(f"trials of another sweep cannot be added to {plan.sweep.name!r}")
        self._add_trials_impl(plan, list(trials))
        return self.status(plan.sweep.name)

    def stop_trial(self, sweep: str, trial: str, reason: str = STOPPED_REASON) -> TrialStatus:
        """End one trial early and mark it Stopped (outcome `stopped`): its process is ended or its Job deleted.
        A trial that is already terminal keeps its phase and outcome."""
        status = self.status(sweep).trial(trial)
        if not status.phase.terminal:
            self._stop_trial_impl(sweep, status, reason)
        return self.status(sweep).trial(status.trial_id)

    def advance(self, sweep: str) -> SweepStatus:
        """One step of driving the sweep, without waiting: start pending trials, collect ended ones."""
        return self._wait_step(sweep, 0.0)

    def _add_trials_impl(self, plan: Plan, trials: list[Trial]) -> None:
        raise BackendError(f"the {self.name} backend cannot add trials to a running sweep")

    def _stop_trial_impl(self, sweep: str, trial: TrialStatus, reason: str) -> None:
        raise BackendError(f"the {self.name} backend cannot stop a single trial")

    # -- what a backend implements ------------------------------------------------------------------

    @abstractmethod
    def _submit_impl(self, plan: Plan) -> None: ...

    @abstractmethod
    def _status_impl(self, sweep: str) -> SweepStatus: ...

    def _wait_step(self, sweep: str, interval: float) -> SweepStatus:
        """Advance or observe the sweep for up to `interval` seconds and return its status."""
        status = self._status_impl(sweep)
        if not status.done:
            time.sleep(interval)
        return status

    @abstractmethod
    def _cancel_impl(self, sweep: str) -> None: ...

    @abstractmethod
    def _resume_impl(self, sweep: str) -> None: ...

    @abstractmethod
    def _logs_impl(self, sweep: str, trial: TrialStatus, follow: bool) -> Iterator[str]: ...

    @abstractmethod
    def _delete_impl(self, sweep: str) -> None: ...

    @abstractmethod
    def _list_impl(self) -> list[str]: ...
