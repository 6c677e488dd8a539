"""The local backend's driver: the process that holds a sweep's lock and starts its trials, as other processes
see it, and how it stops.

- While it drives, the sweep's row names it by pid and start time (`Store.set_driver`): a sweep whose driver is
  gone (killed, or stopped by a signal) while trials remain reads `Interrupted`, not `Running`.
- SIGTERM and SIGHUP (a closed terminal) stop a driver between two steps, never inside one (a trial started but
  not recorded would run twice): `stop_signals` turns them into `DriverStopped`, raised where the driver can
  record what it leaves: its pending trials stay pending, its running ones run on to their results.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class DriverStopped(KeyboardInterrupt):
    """The driver was asked to stop (SIGTERM, SIGHUP): an interruption, as Ctrl-C is."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def process_start(pid: int) -> int | None:
    """When the process started (clock ticks after boot, /proc/<pid>/stat field 22); None when it is gone."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def running(pid: int | None, start: int | None) -> bool:
    """The process `pid` started at `start` still runs (not exited, not a zombie, its pid not reused since)."""
    if not pid:
        return False
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and (start is None or int(fields[19]) == start)


class StopRequest:
    """The stop signal received while `stop_signals` was in force (None: none)."""

    signum: int | None = None

    def check(self) -> None:
        """Raise `DriverStopped` when a stop signal came."""
        if self.signum is not None:
            raise DriverStopped(self.signum)


@contextmanager
def stop_signals() -> Iterator[StopRequest]:
    """SIGTERM and SIGHUP are noted (`StopRequest.check` raises them) instead of ending the process at once; the
    handlers before are restored after. Outside the main thread nothing is installed (Python delivers signals
    to the main thread only)."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return

    def note(signum: int, frame: FrameType | None) -> None:
        request.signum = signum

    before = {sig: signal.signal(sig, note) for sig in STOP_SIGNALS}
    try:
        yield request
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def me() -> tuple[int, int | None]:
    """This process, as a driver is recorded: pid and start time."""
    return os.getpid(), process_start(os.getpid())
