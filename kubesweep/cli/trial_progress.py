"""Progress inside the running trials and the sweep's ETA, read from what the trials already write.

Each trial's log carries its step lines (`kubesweep.wire.progress`); `ProgressReader` reads the tail of each running
trial's log at most every `every_s` seconds (a pod's log is a round trip to the API server), keeps the first and the
last step it saw, and gives each trial its step, its rate and an ETA at the pace seen so far. The sweep's ETA is the
pace at which trials (whole ones, and the parts of running ones) have ended since the view began.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kubesweep.backends.base import Phase, SweepStatus, TrialStatus
from kubesweep.wire.progress import StepProgress, last_progress

TAIL_LINES = 50
READ_EVERY_S = 3.0

Peek = Callable[[TrialStatus], Iterable[str]]  # a trial's log so far, in lines or chunks


@dataclass
class TrialProgress:
    step: StepProgress
    eta_s: float | None = None  # at the pace seen between the first and the last step line read

    def text(self) -> str:
        """`step 120/400 · 812 samples/s · ETA 1m05s`."""
        parts = [f"step {self.step.step}/{self.step.total}"]
        if self.step.samples_per_s is not None:
            parts.append(f"{self.step.samples_per_s:,.0f} samples/s")
        if self.eta_s is not None:
            parts.append(f"ETA {duration(self.eta_s)}")
        return " · ".join(parts)


@dataclass
class _Seen:
    read_at: float
    first: tuple[float, StepProgress] | None = None
    last: tuple[float, StepProgress] | None = None


@dataclass
class ProgressReader:
    peek: Peek
    every_s: float = READ_EVERY_S
    clock: Callable[[], float] = time.monotonic
    seen: dict[str, _Seen] = field(default_factory=dict)
    start: tuple[float, float] | None = None  # (when, trials ended) at the first read

    def read(self, status: SweepStatus) -> dict[str, TrialProgress]:
        """The progress of each running trial whose log has a step line (by trial id)."""
        now = self.clock()
        out = {}
        for trial in status.trials:
            if trial.phase != Phase.RUNNING:
                self.seen.pop(trial.trial_id, None)
                continue
            seen = self.seen.get(trial.trial_id)
            if seen is None or now - seen.read_at >= self.every_s:
                seen = self.seen[trial.trial_id] = self._read(trial, now, seen)
            if seen.last is not None:
                out[trial.trial_id] = TrialProgress(seen.last[1], _eta(seen))
        if self.start is None:
            self.start = (now, self.ended(status, out))
        return out

    def _read(self, trial: TrialStatus, now: float, seen: _Seen | None) -> _Seen:
        seen = seen or _Seen(now)
        seen.read_at = now
        try:
            tail: deque[str] = deque(maxlen=TAIL_LINES)
            for chunk in self.peek(trial):
                tail.extend(chunk.splitlines())
        except Exception:  # progress is cosmetic: a log that cannot be read (a pod gone, the API server away for a
            return seen  # moment) is no progress, never the end of the view that follows the sweep
        step = last_progress(tail)
        if step is None:  # no step yet in this attempt: what an earlier one reached is not its progress
            seen.first = seen.last = None
            return seen
        if seen.first is None or step.step < seen.first[1].step:  # a restart from a checkpoint begins anew
            seen.first = (now, step)
        seen.last = (now, step)
        return seen

    @staticmethod
    def ended(status: SweepStatus, progress: dict[str, TrialProgress]) -> float:
        """Trials ended, counting each running one's done fraction once its pace is known: a trial at its first
        step line (1 of 200 after a minute of start-up and compilation) would otherwise make the sweep's pace, and
        its ETA, hundreds of times too slow."""
        return (sum(1 for t in status.trials if t.phase.terminal)
                + sum(p.step.fraction for p in progress.values() if p.eta_s is not None))

    def sweep_eta(self, status: SweepStatus, progress: dict[str, TrialProgress]) -> float | None:
        """Seconds to the sweep's end at the pace trials have ended since the first read (None before any)."""
        if self.start is None:
            return None
        elapsed = self.clock() - self.start[0]
        done = self.ended(status, progress) - self.start[1]
        left = len(status.trials) - self.ended(status, progress)
        if done <= 0 or elapsed <= 0:
            return None
        return max(0.0, left * elapsed / done)


def _eta(seen: _Seen) -> float | None:
    if seen.first is None or seen.last is None:
        return None
    (t0, first), (t1, last) = seen.first, seen.last
    if last.step <= first.step or t1 <= t0:
        return None
    return (last.total - last.step) * (t1 - t0) / (last.step - first.step)


def duration(seconds: float) -> str:
    """`45s`, `3m05s`, `1h02m`."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
