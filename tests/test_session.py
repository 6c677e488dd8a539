"""The session layer (`kubesweep.session`) on the local backend, in this process: submit, follow, resume, cancel,
detach, a search run through the dispatch, and the rules that give exit codes. The workload is the stand-in job
(tests/support/stand_in_job.py): batch >= 256 is an OOM, learning_rate 0.123 a crash, max_steps/10 seconds of
sleep."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kubesweep.backends.base import (
    AmbiguousTrial,
    BackendError,
    Phase,
    SweepNotFound,
    SweepStatus,
    TrialStatus,
)
from kubesweep.gpus import CatalogError
from kubesweep.plan import plan
from kubesweep.preflight import NotRunnable
from kubesweep.session import (
    EXIT_BACKEND,
    EXIT_CANCELLED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_TRIALS_FAILED,
    EXIT_USAGE,
    Options,
    Session,
    error_code,
    exit_code,
)
from kubesweep.sweep_spec import SpecError, Sweep, parse_sweep
from kubesweep.tracking.runs import TrackingError
from kubesweep.wire.env import TrackingEnv
from kubesweep.wire.outcomes import Outcome
from kubesweep.wire.search import MaxBatchSummary, SummaryError

STAND_IN = Path(__file__).parent / "support" / "stand_in_job.py"


def make_sweep(name: str = "sess", *, batches: list[int] | None = None, search: dict[str, Any] | None = None,
               **job: Any) -> Sweep:
    spec: dict[str, Any] = {"job": {"max_steps": 2, **job}, "resources": {"gpus_per_trial": 0, "retries": 0},
                            "concurrency": {"max_parallel": 4}}
    if batches is not None:
        spec["matrix"] = {"batch_size": batches}
    if search is not None:
        spec["search"] = search
    return parse_sweep({"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": name},
                        "spec": spec})


class Recorder:
    """What the session says (notify) and the progress it reports."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, bool]] = []
        self.progress: list[SweepStatus] = []

    def notify(self, message: str, warning: bool) -> None:
        self.messages.append((message, warning))

    def update(self, status: SweepStatus) -> None:
        self.progress.append(status)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KUBESWEEP_JOB_COMMAND", json.dumps([sys.executable, str(STAND_IN)]))
    monkeypatch.setenv("KUBESWEEP_LOCAL_GPUS", "[]")
    monkeypatch.delenv("KUBESWEEP_TUNE_STORAGE", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the session pops it when tracking is off
    return tmp_path / "home"


def session(home: Path, recorder: Recorder | None = None, **options: Any) -> Session:
    opts = Options(home=home, no_tracking=True, parallel=4, **options)
    return Session(opts, notify=recorder.notify) if recorder else Session(opts)


def starts(home: Path, sweep: str) -> list[str]:
    log = home / "sweeps" / sweep / "starts.log"
    return [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []


def test_submit_then_follow_reports_progress_and_ends_with_exit_0(home: Path) -> None:
    recorder = Recorder()
    s = session(home, recorder)
    sweep = make_sweep(batches=[8, 16, 256])
    submitted = s.submit(sweep, plan(sweep))
    assert submitted is not None and len(submitted.trials) == 3
    # tracking is off, said once through notify; nothing else is printed by the session
    assert [m for m, _ in recorder.messages] == ["tracking: off (--no-tracking / KUBESWEEP_NO_TRACKING)"]
    ended = s.follow(sweep.name, progress=recorder.update)
    assert ended.code == EXIT_OK and ended.found is None
    assert ended.status.done and ended.status.phase == "Succeeded"
    assert sorted(t.outcome.value for t in ended.status.trials if t.outcome) == ["oom", "succeeded", "succeeded"]
    assert recorder.progress and recorder.progress[-1].done
    assert not recorder.progress[0].done  # progress came while the trials ran, not only at the end
    # the backend is made once and keeps the sweep as submitted
    assert s.backend is s.backend
    assert s.backend.sweep_of(sweep.name) == sweep
    assert s.backend.trial_dir(sweep.name, "x") == home / "sweeps" / sweep.name / "trials" / "x"
    # submitting the same spec again starts nothing twice
    s2 = session(home)
    assert s2.submit(sweep, plan(sweep)) is not None
    assert s2.follow(sweep.name).code == EXIT_OK
    assert len(starts(home, sweep.name)) == 3


def test_a_failed_trial_is_exit_1_and_resume_reruns_only_it(home: Path) -> None:
    sweep = make_sweep(batches=[8, 16], learning_rate=0.123)
    s = session(home)
    s.submit(sweep, plan(sweep))
    ended = s.follow(sweep.name)
    assert ended.code == EXIT_TRIALS_FAILED
    assert {t.outcome for t in ended.status.trials} == {Outcome.FAILED}

    ok = make_sweep("mixed", batches=[8, 256])
    s.submit(ok, plan(ok))
    assert s.follow(ok.name).code == EXIT_OK  # an OOM is a result, not a failure

    recorder = Recorder()
    again = session(home, recorder)
    resumed_sweep, resumed = again.resume(sweep.name)
    assert resumed_sweep == sweep  # read back from the backend, parsed
    assert resumed is not None
    assert recorder.messages and recorder.messages[0][0].startswith("tracking: off")
    assert again.follow(sweep.name).code == EXIT_TRIALS_FAILED
    assert len(starts(home, sweep.name)) == 4  # two trials, each run twice
    # the settled sweep: resume starts nothing, touches no tracking and says so
    recorder = Recorder()
    _, left = session(home, recorder).resume(ok.name)
    assert left is not None and left.done
    assert recorder.messages == [("sweep 'mixed': nothing to rerun: every trial has ended with an answer "
                                  "(1 succeeded, 1 oom)", False)]
    assert len(starts(home, ok.name)) == 2


def test_resume_and_cancel_of_an_unknown_sweep_are_not_found(home: Path) -> None:
    s = session(home)
    with pytest.raises(SweepNotFound, match="no local sweep named 'nope'") as resumed:
        s.resume("nope")
    assert error_code(resumed.value) == EXIT_NOT_FOUND
    with pytest.raises(SweepNotFound) as cancelled:
        s.cancel("nope")
    assert error_code(cancelled.value) == EXIT_NOT_FOUND


def test_cancel_stops_a_running_sweep_and_leaves_an_ended_one(home: Path) -> None:
    slow = make_sweep("slow", batches=[1, 2], max_steps=600)
    s = session(home)
    s.submit(slow, plan(slow))
    deadline = time.monotonic() + 30
    while not any(t.phase == Phase.RUNNING for t in s.backend.advance(slow.name).trials):
        assert time.monotonic() < deadline, "no trial started"
        time.sleep(0.1)
    cancelled, status = s.cancel(slow.name)
    assert cancelled
    assert {t.phase for t in status.trials} == {Phase.CANCELLED}
    assert s.follow(slow.name).code == EXIT_CANCELLED  # whoever waits on it is told it did not succeed

    quick = make_sweep("quick", batches=[8])
    s.submit(quick, plan(quick))
    s.follow(quick.name)
    cancelled, status = s.cancel(quick.name)
    assert not cancelled and status.phase == "Succeeded"
    assert status.trials[0].outcome == Outcome.SUCCEEDED


def test_detach_leaves_a_driver_process_that_runs_the_sweep(home: Path) -> None:
    s = session(home)
    sweep = make_sweep("detached", batches=[8, 16])
    s.submit(sweep, plan(sweep))
    s.detach(sweep.name)
    deadline = time.monotonic() + 60
    while not s.backend.status(sweep.name).done:
        assert time.monotonic() < deadline, (home / "sweeps" / sweep.name / "driver.log").read_text()
        time.sleep(0.2)
    assert {t.outcome for t in s.backend.status(sweep.name).trials} == {Outcome.SUCCEEDED}
    assert (home / "sweeps" / sweep.name / "driver.log").exists()


def test_use_tracking_is_kept_with_a_local_sweep(home: Path) -> None:
    s = session(home)
    sweep = make_sweep("tracked", batches=[8], learning_rate=0.123)  # its trial fails: resume reruns it
    s.submit(sweep, plan(sweep))
    s.follow(sweep.name)
    env = TrackingEnv("http://mlflow.example:5000", "exp", "run123")
    s.backend.use_tracking(sweep.name, env)
    assert s.backend.tracking == env
    recorded = json.loads((home / "sweeps" / sweep.name / "tracking.json").read_text())
    assert recorded["MLFLOW_TRACKING_URI"] == "http://mlflow.example:5000"
    assert recorded["KUBESWEEP_PARENT_RUN_ID"] == "run123"
    # resume with tracking off: the trial it reruns starts untracked
    session(home).resume(sweep.name)
    assert not (home / "sweeps" / sweep.name / "tracking.json").exists()


class _OperatorClient:
    """Stands for the operator's Sweep client (`SweepClient`: the operator opens the sweep's parent run and keeps
    its record; tests/operator run the real one on a cluster). Only what `open_tracking` reads."""

    name = "kubernetes"
    opens_parent_run = True
    tracking: TrackingEnv | None = None

    def use_tracking(self, sweep: str, tracking: TrackingEnv | None) -> None:
        self.tracking = tracking


def test_a_sweep_run_by_the_operator_gets_no_second_parent_run_from_the_client(home: Path,
                                                                               mlflow_server: Any) -> None:
    """The operator opens the parent run its trials log under; a parent opened by `sweep submit` as well would be
    one no trial logs under, found first by `sweep results` (the oldest) and read as a sweep without figures."""
    from kubesweep.tracking.runs import SweepRuns

    recorder = Recorder()
    s = Session(Options(backend="kubernetes", home=home, tracking_uri=mlflow_server.url), notify=recorder.notify)
    s._backend = _OperatorClient()  # type: ignore[assignment]
    sweep = make_sweep("operator-owned", batches=[8])
    assert s.open_tracking(sweep, 1) is None
    assert recorder.messages == [("tracking: the operator opens the sweep's MLflow parent run and keeps its record; "
                                  "`sweep status operator-owned` names it", False)]
    assert s.target is not None and s.target.uri == mlflow_server.url  # results are still read from there
    assert SweepRuns(s.target, sweep.name).find_parent() is None


# -- searches ------------------------------------------------------------------------------------------------


def test_where_a_search_runs(home: Path) -> None:
    search = make_sweep("searching", search={"strategy": "max_batch"})
    grid = make_sweep("gridded", batches=[8])
    assert Session(Options(backend="local")).search_runs_here(search)
    assert Session(Options(backend="kubernetes", direct=True)).search_runs_here(search)
    assert not Session(Options(backend="kubernetes")).search_runs_here(search)  # the operator's tuner Job
    assert not Session(Options(backend="local")).search_runs_here(grid)
    # a search that runs here submits nothing by itself: run_search makes its trials
    s = session(home)
    assert s.submit(search, plan(search)) is None
    with pytest.raises(SweepNotFound):
        s.backend.status(search.name)


def test_a_max_batch_search_runs_to_its_end_through_the_session(home: Path) -> None:
    recorder = Recorder()
    s = session(home, recorder)
    # the stand-in job runs out of memory from batch 256 on
    sweep = make_sweep("mb", search={"strategy": "max_batch", "low": 64, "high": 512, "step": 64, "probes": 2,
                                     "max_steps": 1})
    assert s.submit(sweep, plan(sweep)) is None
    ended = s.run_search(sweep, progress=recorder.update)
    assert ended.code == EXIT_OK
    assert ended.found is not None
    assert isinstance(ended.found, MaxBatchSummary)
    (cell,) = ended.found.cells
    assert (cell.max_batch, cell.smallest_oom) == (192, 256)
    assert recorder.progress
    storage = s.search_storage(sweep.name)
    assert storage == home / "sweeps" / "mb" / "search"
    assert json.loads((storage / "max_batch.json").read_text()) == ended.found.model_dump(mode="json")
    # what results shows: the file under the storage, found for the known sweep and for an unknown one
    assert s.search_found("mb", sweep, None) == ended.found
    assert s.search_found("mb", None, None) == ended.found
    assert s.searches("mb", unknown=False)
    # cancelling the ended search still cancels (a search may make more trials)
    cancelled, _ = s.cancel("mb")
    assert cancelled
    # resume: the search continues from its state, nothing submitted again
    resumed_sweep, resumed = session(home).resume("mb")
    assert resumed is None and resumed_sweep.spec.search.adaptive



def test_a_stored_search_summary_of_another_shape_is_one_line_of_bad_input(home: Path) -> None:
    """A summary file is data: a `max_batch.json` or `repeats.json` of another shape (edited, from elsewhere) is bad
    input that names the file and the field, never a half-read answer or a KeyError further on; a file that is
    not JSON (still being written) is passed over as before."""
    s = session(home)
    storage = s.search_storage("mb")
    storage.mkdir(parents=True)
    (storage / "max_batch.json").write_text(json.dumps({"sweep": "mb", "strategy": "max_batch", "cells": ["junk"]}))
    with pytest.raises(SummaryError) as caught:
        s.search_found("mb", None, None)
    assert str(caught.value) == (f"{storage / 'max_batch.json'}: not a valid MaxBatchSummary at cells.0: Input "
                                 "should be a valid dictionary or instance of MaxBatchCell")
    assert error_code(caught.value) == EXIT_USAGE  # what the CLI prints, with exit code 2
    copied = home / "copied"
    (copied / "search").mkdir(parents=True)
    (copied / "search" / "repeats.json").write_text(json.dumps({
        "sweep": "reps", "strategy": "repeats", "rule": {"min": 3, "max": 5, "target": 3.0, "metric": "samples_per_s"},
        "repeats": 9, "fixed_min": 9, "fixed_max": 15, "at_max": 0}))
    with pytest.raises(SummaryError, match=r"repeats\.json: not a valid RepeatsSummary at cells: Field required$"):
        s.repeats_spent([str(copied)])
    (storage / "max_batch.json").write_text('{"sweep": "mb", "cel')
    assert s.search_found("mb", None, None) is None

# -- what submit checks first (kubesweep.preflight) -----------------------------------------------------------


def gpu_sweep(name: str, image: str) -> Sweep:
    """Two trials on an A100 whose image is named by a key of the image lock not built yet."""
    return parse_sweep({"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": name},
                        "spec": {"image": image, "job": {"max_steps": 2},
                                 "matrix": {"gpu": ["a100-40gb"], "batch_size": [8, 16]}, "resources": {"retries": 0}}})


def test_submit_checks_first_and_leaves_nothing_behind(home: Path) -> None:
    """No A100 here: submit refuses (exit 2) before tracking or the backend is made, so no state exists."""
    recorder = Recorder()
    sweep = gpu_sweep("nogpu", "torch-2.8-cu128")
    with pytest.raises(NotRunnable, match=r"none of this sweep's 2 trials can run on the local backend here: each "
                                          r"needs a GPU of type a100-40gb \(NVIDIA-A100-SXM4-40GB\), and this "
                                          r"machine has no NVIDIA GPU\.") as info:
        session(home, recorder).submit(sweep, plan(sweep))
    assert error_code(info.value) == EXIT_USAGE
    assert recorder.messages == [] and not home.exists()


def test_an_image_key_not_built_yet_means_nothing_to_the_local_backend(home: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBESWEEP_LOCAL_GPUS", '["NVIDIA A100-SXM4-40GB"]')
    s = session(home)
    sweep = gpu_sweep("keyed", "torch-2.8-cu128")
    s.submit(sweep, plan(sweep))
    ended = s.follow(sweep.name)
    assert ended.code == EXIT_OK
    assert [t.outcome for t in ended.status.trials] == [Outcome.SUCCEEDED, Outcome.SUCCEEDED]
    stored = s.backend.sweep_of(sweep.name)  # the spec as the backend keeps it reads back
    assert stored is not None and stored.spec.image == "torch-2.8-cu128"


# -- exit codes -----------------------------------------------------------------------------------------------


def test_exit_code_of_a_sweep() -> None:
    def status(*outcomes: Outcome | None) -> SweepStatus:
        return SweepStatus("x", "local", [TrialStatus(str(i), f"t{i}", "", None, Phase.SUCCEEDED, o)
                                          for i, o in enumerate(outcomes)])

    assert exit_code(status(Outcome.SUCCEEDED, Outcome.OOM, Outcome.GPU_MISMATCH, Outcome.STOPPED)) == EXIT_OK
    assert exit_code(status(Outcome.SUCCEEDED, Outcome.FAILED)) == EXIT_TRIALS_FAILED
    assert exit_code(status()) == EXIT_OK
    cancelled = status(Outcome.SUCCEEDED, Outcome.CANCELLED)
    cancelled.trials[1].phase = Phase.CANCELLED
    assert exit_code(cancelled) == EXIT_CANCELLED  # not a success: a script must not read one
    cancelled.trials[0].outcome = Outcome.FAILED
    assert exit_code(cancelled) == EXIT_TRIALS_FAILED


def test_error_codes() -> None:
    assert error_code(AmbiguousTrial("two trials")) == EXIT_USAGE
    assert error_code(SpecError("x.yaml", [])) == EXIT_USAGE
    assert error_code(NotRunnable("x.yaml", [])) == EXIT_USAGE
    assert error_code(CatalogError("bad catalog")) == EXIT_USAGE
    assert error_code(SweepNotFound("no sweep")) == EXIT_NOT_FOUND
    assert error_code(BackendError("cluster down")) == EXIT_BACKEND
    assert error_code(TrackingError("server down")) == EXIT_BACKEND
    assert error_code(ValueError("a bug")) is None
