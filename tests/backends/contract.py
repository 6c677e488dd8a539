"""The contract every backend passes. A backend's test module subclasses `BackendContract` and provides a
`harness` fixture (see `Harness`). Trial outcomes are chosen by settings the harness's workload honours:

  batch_size >= 256        -> outcome oom (the job's exit code 3)
  learning_rate == 0.123   -> the job crashes (exit 1)
  max_steps = N            -> the trial runs for about N/10 seconds
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from kubesweep.backends import Backend, BackendError, Phase, SweepConflict, SweepNotFound, SweepStatus
from kubesweep.plan import Plan, Trial, make_trial, plan
from kubesweep.sweep_spec import parse_sweep
from kubesweep.wire.outcomes import Outcome

CRASH_LR = 0.123


@dataclass
class Harness:
    backend: Backend
    starts: Callable[[str, str], int]  # (sweep, trial_id) -> how many times the trial's workload started
    timeout: float = 60.0
    log_marker: Callable[[Trial], str] = lambda trial: trial.name  # text a trial's log must contain
    # (sweep, trial_id) -> True once nothing of the trial runs any more (its process, its Job)
    gone: Callable[[str, str], bool] = lambda sweep, trial_id: True
    # whether single trials are added and stopped through this backend (a search drives it); otherwise both
    # requests are refused and change nothing (the operator's client: the operator's tuner Job does it)
    searches: bool = True


def make_plan(name: str, matrix: dict[str, Any], **spec: Any) -> Plan:
    doc = {
        "apiVersion": "kubesweep.io/v1alpha1",
        "kind": "Sweep",
        "metadata": {"name": name},
        # a pod per trial: the Kubernetes harnesses run on kwok, which runs no containers, so no warm pod's worker
        # (spec.warm_pods, the default) could run there; warm pods are proven on the real node
        # (tests/operator/test_controller_realnode.py) and against the API stand-in (tests/backends/test_k8s_warm.py)
        "spec": {"job": {"max_steps": 2}, "matrix": matrix, "resources": {"gpus_per_trial": 0, "retries": 0},
                 "warm_pods": False, **spec},
    }
    return plan(parse_sweep(doc))


def kwok_annotations(trial: Trial) -> Mapping[str, str]:
    """What the stand-in job decides from the settings, as the test cluster's kwok Stage annotations (the
    Kubernetes harnesses: kwok runs no containers; docs/testing.md)."""
    job = trial.job
    notes = {"kubesweep.io/test-duration": f"{(job.max_steps or 2) * 100}ms"}
    if job.learning_rate == CRASH_LR:
        notes.update({"kubesweep.io/test-outcome": "crash", "kubesweep.io/test-exit-code": "1"})
    elif job.batch_size >= 256:
        notes.update({"kubesweep.io/test-outcome": "crash", "kubesweep.io/test-exit-code": "3"})
    return notes


def by_batch(status: SweepStatus, batch: int) -> list[Any]:
    return [t for t in status.trials if t.axes.get("batch_size") == batch]


class BackendContract:
    def run(self, harness: Harness, p: Plan, **kw: Any) -> SweepStatus:
        harness.backend.submit(p)
        return harness.backend.wait(p.sweep.name, timeout=harness.timeout, **kw)

    def test_runs_every_trial_to_an_outcome(self, harness: Harness) -> None:
        p = make_plan("contract-basic", {"batch_size": [8, 16, 256]})
        status = self.run(harness, p)
        assert [t.trial_id for t in status.trials] == [t.id for t in p.trials]
        assert all(t.phase.terminal for t in status.trials)
        assert [t.outcome for t in status.trials] == [Outcome.SUCCEEDED, Outcome.SUCCEEDED, Outcome.OOM]
        assert status.phase == "Succeeded"  # an OOM cell is a result, not a failure

    def test_submitting_twice_starts_nothing_twice(self, harness: Harness) -> None:
        p = make_plan("contract-twice", {"batch_size": [8, 16]})
        self.run(harness, p)
        again = harness.backend.submit(p)
        harness.backend.wait(p.sweep.name, timeout=harness.timeout)
        assert len(again.trials) == 2
        assert [harness.starts(p.sweep.name, t.id) for t in p.trials] == [1, 1]

    def test_a_failing_trial_leaves_the_others_alone(self, harness: Harness) -> None:
        p = make_plan("contract-crash", {"batch_size": [8, 16], "learning_rate": [1e-4, CRASH_LR]})
        status = self.run(harness, p)
        crashed = [t for t in status.trials if t.axes["learning_rate"] == CRASH_LR]
        fine = [t for t in status.trials if t.axes["learning_rate"] != CRASH_LR]
        assert {t.outcome for t in crashed} == {Outcome.FAILED}
        assert all(t.reason for t in crashed)
        assert {t.outcome for t in fine} == {Outcome.SUCCEEDED}
        assert status.phase == "Failed"

    def test_resume_reruns_only_failed_trials(self, harness: Harness) -> None:
        p = make_plan("contract-resume", {"batch_size": [8, 256], "learning_rate": [1e-4, CRASH_LR]})
        # crash wins over OOM in the workload: both CRASH_LR cells fail, the bs256 1e-4 cell is an OOM
        self.run(harness, p)
        harness.backend.resume(p.sweep.name)
        status = harness.backend.wait(p.sweep.name, timeout=harness.timeout)
        starts = {t.trial_id: harness.starts(p.sweep.name, t.trial_id) for t in status.trials}
        for t in status.trials:
            crashed = t.axes["learning_rate"] == CRASH_LR
            assert starts[t.trial_id] == (2 if crashed else 1), t.name

    def test_cancel_stops_running_and_pending_trials(self, harness: Harness) -> None:
        p = make_plan("contract-cancel", {"batch_size": [8, 16, 32]}, job={"max_steps": 600},
                      concurrency={"max_parallel": 1})
        harness.backend.submit(p)
        seen_running: list[SweepStatus] = []

        def until_running(status: SweepStatus) -> None:
            if any(t.phase == Phase.RUNNING for t in status.trials):
                seen_running.append(status)
                raise _Stop

        with pytest.raises(_Stop):
            harness.backend.wait(p.sweep.name, timeout=harness.timeout, progress=until_running, interval=0.1)
        status = harness.backend.cancel(p.sweep.name)
        assert all(t.phase == Phase.CANCELLED for t in status.trials)
        status = harness.backend.wait(p.sweep.name, timeout=harness.timeout)
        assert all(t.outcome == Outcome.CANCELLED for t in status.trials)

    def test_respects_max_parallel(self, harness: Harness) -> None:
        p = make_plan("contract-parallel", {"batch_size": [1, 2, 3, 4, 5]}, job={"max_steps": 5},
                      concurrency={"max_parallel": 2})
        peak = 0

        def watch(status: SweepStatus) -> None:
            nonlocal peak
            peak = max(peak, sum(1 for t in status.trials if t.phase == Phase.RUNNING))

        harness.backend.submit(p)
        harness.backend.wait(p.sweep.name, timeout=harness.timeout, progress=watch, interval=0.05)
        assert 1 <= peak <= 2

    def test_logs_show_the_trial_output(self, harness: Harness) -> None:
        p = make_plan("contract-logs", {"batch_size": [8]})
        self.run(harness, p)
        text = "".join(harness.backend.logs(p.sweep.name, p.trials[0].name))
        assert harness.log_marker(p.trials[0]) in text

    def test_what_it_keeps_is_what_it_declares(self, harness: Harness) -> None:
        """`keeps_results`: each trial's results file is read on this machine (`results`, from its `trial_dir`);
        without it, `results` gives every trial without a file (its figures are in MLflow). `parent_run_id` of a
        sweep the backend does not know is None, and of an untracked one where no controller opens one."""
        p = make_plan("contract-kept", {"batch_size": [8, 256]})
        status = self.run(harness, p)
        backend, name = harness.backend, p.sweep.name
        read = backend.results(name)
        assert [t.trial_id for t, _ in read] == [t.trial_id for t in status.trials]
        if backend.keeps_results:
            assert [r is not None for _, r in read] == [True, True]  # the OOM cell's file says so too
            assert all((d := backend.trial_dir(name, t.name)) is not None and d.is_dir() for t, _ in read)
        else:
            assert [r for _, r in read] == [None, None]
        assert backend.parent_run_id("contract-no-such-sweep") is None
        if backend.tracking is None and not backend.opens_parent_run:
            assert backend.parent_run_id(name) is None

    def test_unknown_sweep_is_not_found(self, harness: Harness) -> None:
        with pytest.raises(SweepNotFound):
            harness.backend.status("contract-no-such-sweep")

    def test_same_name_different_spec_is_refused(self, harness: Harness) -> None:
        self.run(harness, make_plan("contract-conflict", {"batch_size": [8]}))
        with pytest.raises(SweepConflict):
            harness.backend.submit(make_plan("contract-conflict", {"batch_size": [8, 16]}))


    def test_trials_added_while_the_sweep_runs_start_once(self, harness: Harness) -> None:
        p = make_plan("contract-add", {"batch_size": [8]})
        harness.backend.submit(p)
        extra = [make_trial(p.sweep, {"batch_size": b}) for b in (16, 256)]
        if not harness.searches:
            with pytest.raises(BackendError, match="alone adds trials"):
                harness.backend.add_trials(p, extra)
            status = harness.backend.wait(p.sweep.name, timeout=harness.timeout)
            assert [t.trial_id for t in status.trials] == [p.trials[0].id]  # nothing was added
            assert [harness.starts(p.sweep.name, t.id) for t in (p.trials[0], *extra)] == [1, 0, 0]
            return
        harness.backend.add_trials(p, extra)
        harness.backend.add_trials(p, extra)  # the same suggestions again: nothing starts twice
        status = harness.backend.wait(p.sweep.name, timeout=harness.timeout)
        assert [t.trial_id for t in status.trials] == [p.trials[0].id, *(t.id for t in extra)]
        assert [t.outcome for t in status.trials] == [Outcome.SUCCEEDED, Outcome.SUCCEEDED, Outcome.OOM]
        assert [harness.starts(p.sweep.name, t.trial_id) for t in status.trials] == [1, 1, 1]

    def test_stop_trial_ends_one_running_trial(self, harness: Harness) -> None:
        p = make_plan("contract-stop", {"batch_size": [8, 16]}, job={"max_steps": 600},
                      concurrency={"max_parallel": 2})
        harness.backend.submit(p)
        victim = p.trials[0]

        def until_running(status: SweepStatus) -> None:
            if status.trial(victim.id).phase == Phase.RUNNING:
                raise _Stop

        with pytest.raises(_Stop):
            harness.backend.wait(p.sweep.name, timeout=harness.timeout, progress=until_running, interval=0.1)
        if not harness.searches:
            with pytest.raises(BackendError, match="alone stops trials"):
                harness.backend.stop_trial(p.sweep.name, victim.id)
            assert harness.backend.status(p.sweep.name).trial(victim.id).phase == Phase.RUNNING
            harness.backend.cancel(p.sweep.name)
            return
        stopped = harness.backend.stop_trial(p.sweep.name, victim.id)
        assert (stopped.phase, stopped.outcome) == (Phase.STOPPED, Outcome.STOPPED)
        assert harness.gone(p.sweep.name, victim.id)
        status = harness.backend.status(p.sweep.name)
        assert status.trial(p.trials[1].id).phase != Phase.STOPPED  # the other trial is left alone
        harness.backend.stop_trial(p.sweep.name, p.trials[1].id)
        status = harness.backend.wait(p.sweep.name, timeout=harness.timeout)
        assert {t.outcome for t in status.trials} == {Outcome.STOPPED}
        assert status.phase == "Succeeded"  # stopped early by a search: a result, not a failure
        # each started once at most (under load, a trial stopped right after it started may not have said so yet)
        before = [harness.starts(p.sweep.name, t.id) for t in p.trials]
        assert all(n <= 1 for n in before), before
        harness.backend.resume(p.sweep.name)  # a stopped trial is settled: resume does not rerun it
        status = harness.backend.wait(p.sweep.name, timeout=harness.timeout)
        assert [harness.starts(p.sweep.name, t.id) for t in p.trials] == before
        again = harness.backend.stop_trial(p.sweep.name, victim.id)  # terminal: left as it is
        assert again.outcome == Outcome.STOPPED


class _Stop(Exception):
    pass
