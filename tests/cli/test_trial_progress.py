"""Progress inside running trials and the sweep's ETA (kubesweep/cli/trial_progress.py), on a clock the test turns."""

from __future__ import annotations

import io
from collections.abc import Iterable

import pytest
from rich.console import Console

from kubesweep.backends.base import BackendError, Phase, SweepStatus, TrialStatus
from kubesweep.cli.trial_progress import ProgressReader, duration
from kubesweep.cli.views import ProgressView
from kubesweep.wire.progress import step_line


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def sweep(*phases: Phase) -> SweepStatus:
    return SweepStatus("s", "local", [TrialStatus(f"t{i}", f"s-t{i}", "cell", None, p) for i, p in enumerate(phases)])


class Logs:
    """Each trial's log so far; `reads` counts the reads."""

    def __init__(self) -> None:
        self.lines: dict[str, list[str]] = {}
        self.reads = 0

    def step(self, trial: str, step: int, total: int = 100, rate: float | None = 500.0) -> None:
        self.lines.setdefault(trial, []).append(step_line(step, total, step / total, 0.7, 2e-5, rate))

    def __call__(self, trial: TrialStatus) -> Iterable[str]:
        self.reads += 1
        if trial.trial_id == "broken":
            raise BackendError("pod gone")
        if trial.trial_id == "away":
            raise ConnectionResetError("the API server went away")
        return ["\n".join(self.lines.get(trial.trial_id, ["starting"]))]  # one chunk, as a pod's log comes


def test_a_running_trial_gets_its_step_rate_and_an_eta_at_the_pace_seen() -> None:
    clock, logs = Clock(), Logs()
    reader = ProgressReader(logs, every_s=5.0, clock=clock)
    status = sweep(Phase.RUNNING, Phase.PENDING)
    assert reader.read(status) == {}  # no step line yet
    logs.step("t0", 10)
    clock.now += 5
    first = reader.read(status)["t0"]
    assert first.text() == "step 10/100 · 500 samples/s"  # one point: no pace yet
    logs.step("t0", 30)
    clock.now += 10
    later = reader.read(status)["t0"]
    assert later.eta_s == 70 * 10 / 20 and later.text() == "step 30/100 · 500 samples/s · ETA 35s"


def test_a_log_is_read_at_most_once_per_period_and_a_failed_read_is_no_progress() -> None:
    clock, logs = Clock(), Logs()
    reader = ProgressReader(logs, every_s=5.0, clock=clock)
    status = sweep(Phase.RUNNING)
    logs.step("t0", 10)
    for _ in range(4):
        reader.read(status)
        clock.now += 1
    assert logs.reads == 1
    clock.now += 1
    reader.read(status)
    assert logs.reads == 2
    broken = SweepStatus("s", "local", [TrialStatus("broken", "s-broken", "cell", None, Phase.RUNNING),
                                        TrialStatus("away", "s-away", "cell", None, Phase.RUNNING)])
    assert reader.read(broken) == {}


def test_a_trial_that_starts_again_from_a_checkpoint_is_paced_anew() -> None:
    clock, logs = Clock(), Logs()
    reader = ProgressReader(logs, every_s=0.0, clock=clock)
    status = sweep(Phase.RUNNING)
    logs.step("t0", 50)
    reader.read(status)
    logs.step("t0", 20)  # evicted, resumed from step 15
    clock.now += 10
    assert reader.read(status)["t0"].eta_s is None
    logs.step("t0", 40)
    clock.now += 10
    assert reader.read(status)["t0"].eta_s == 60 * 10 / 20


def test_the_sweeps_eta_is_the_pace_trials_end_since_the_view_began() -> None:
    clock, logs = Clock(), Logs()
    reader = ProgressReader(logs, every_s=0.0, clock=clock)
    before = sweep(Phase.SUCCEEDED, Phase.RUNNING, Phase.PENDING, Phase.PENDING)
    logs.step("t1", 0)
    assert reader.sweep_eta(before, reader.read(before)) is None  # nothing has ended since the view began
    clock.now += 60
    logs.step("t1", 50)  # half a trial in 60 s; 2.5 trials left
    assert reader.sweep_eta(before, reader.read(before)) == 2.5 * 60 / 0.5
    assert (duration(45), duration(185), duration(3725)) == ("45s", "3m05s", "1h02m")


def test_a_trial_at_its_first_step_gives_the_sweep_no_eta_until_its_pace_is_known() -> None:
    """A trial's first step line comes after its start-up and compilation: step 1 of 200 a minute in is not a
    pace of 200 minutes a trial (the sweep's ETA read 79h36m so, 18 trials of under a minute each)."""
    clock, logs = Clock(), Logs()
    reader = ProgressReader(logs, every_s=0.0, clock=clock)
    status = sweep(Phase.RUNNING, Phase.PENDING)
    reader.read(status)  # no step line yet
    clock.now += 60
    logs.step("t0", 1, 200)
    assert reader.sweep_eta(status, reader.read(status)) is None
    clock.now += 5
    logs.step("t0", 101, 200)  # 100 steps in 5 s: about half a trial ended in the 65 s since the view began
    done = 101 / 200
    assert reader.sweep_eta(status, reader.read(status)) == pytest.approx((2 - done) * 65 / done)


def test_without_a_terminal_progress_is_a_plain_line_per_trial_at_most_every_30_seconds() -> None:
    out = io.StringIO()
    logs = Logs()
    view = ProgressView(Console(file=out, width=200), logs)
    clock = Clock()
    assert view.reader is not None
    view.reader.clock = clock
    status = sweep(Phase.RUNNING, Phase.PENDING)
    logs.step("t0", 10)
    view.update(status)
    view.update(status)
    lines = out.getvalue().splitlines()
    assert lines == ["[0/2] s-t0: Running", "[0/2] s-t0: step 10/100 · 500 samples/s"]
    assert "\x1b" not in out.getvalue()


def test_a_rerun_starts_from_nothing_not_from_the_step_its_cancelled_attempt_reached() -> None:
    """`sweep cancel` at step 32/48, then `sweep resume`: the log holds the cancelled attempt's lines, then the
    new attempt's header; until the new attempt prints a step, the trial has no progress."""
    from kubesweep.wire.progress import attempt_header

    clock, logs = Clock(), Logs()
    reader = ProgressReader(logs, every_s=0.0, clock=clock)
    status = sweep(Phase.RUNNING)
    logs.lines["t0"] = [attempt_header(1, ["job"]).rstrip("\n")]
    logs.step("t0", 32, total=48)
    assert reader.read(status)["t0"].step.step == 32
    logs.lines["t0"].append(attempt_header(2, ["job"]).rstrip("\n"))
    clock.now += 10
    assert "t0" not in reader.read(status)
    logs.step("t0", 1, total=48)
    assert reader.read(status)["t0"].step.step == 1
