"""A local sweep's status as any process reads it: its trials from the store, and whether anything still drives
it. A sweep whose recorded driver is gone (killed, or stopped by a signal) with trials left is `Interrupted`; as
nothing reaps its trials then, the ones that ended are read from their results files here.
"""

from __future__ import annotations

from kubesweep.backends._local_driver import running
from kubesweep.backends._local_store import Store, SweepRow
from kubesweep.backends._local_trials import Reaper, is_trial
from kubesweep.backends.base import Phase, SweepNotFound, SweepStatus


def require(store: Store, sweep: str) -> SweepRow:
    """The sweep's row; `SweepNotFound` (naming the sweeps there are) when the store has no such sweep."""
    state = store.get_sweep(sweep)
    if state is None:
        known = ", ".join(store.list_sweeps()) or "none"
        raise SweepNotFound(f"no local sweep named {sweep!r} (known: {known}) in {store.home}")
    return state


def driver_gone(state: SweepRow, driving: bool) -> bool:
    """A driver was recorded for the sweep and no longer runs (`driving`: this process drives it)."""
    if driving or state.driver_pid is None:
        return False
    return bool(state.driver_stop) or not running(state.driver_pid, state.driver_start)


def sweep_status(store: Store, reaper: Reaper, sweep: str, *, backend: str, driving: bool) -> SweepStatus:
    """The sweep's status (`backend`: the backend's name; `driving`: this process drives the sweep)."""
    state = require(store, sweep)
    gone = driver_gone(state, driving)
    if gone:  # nothing reaps its trials: the ones that ended are read from their results files here
        for row in store.trials(sweep):
            if row.phase == Phase.RUNNING and not is_trial(row):
                reaper.finish(sweep, row, None)
    trials = [store.to_status(sweep, r) for r in store.trials(sweep)]
    message, interrupted = f"state in {store.home}", ""
    if gone and not all(t.phase.terminal for t in trials):
        how = f", {state.driver_stop}" if state.driver_stop else ""
        interrupted = f"driver gone (pid {state.driver_pid}{how})"
        message = f"Interrupted: {interrupted}: `sweep resume {sweep}` picks it up; {message}"
    return SweepStatus(sweep, backend, trials, message=message, interrupted=interrupted)
