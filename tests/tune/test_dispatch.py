"""Starting a search (`kubesweep.tune.dispatch`): which function runs a strategy, where its summary is, and
`run_search` importing and running it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from kubesweep.session import Options, Session
from kubesweep.sweep_spec import SEARCH_RUNNERS, Sweep
from kubesweep.tune.dispatch import NoSearch, run_search, summary_names
from kubesweep.wire.env import TrackingEnv
from kubesweep.wire.search import MaxBatchSummary
from tests.test_session import make_sweep

STAND_IN = Path(__file__).parents[1] / "support" / "stand_in_job.py"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KUBESWEEP_JOB_COMMAND", json.dumps([sys.executable, str(STAND_IN)]))
    monkeypatch.setenv("KUBESWEEP_LOCAL_GPUS", "[]")
    monkeypatch.delenv("KUBESWEEP_TUNE_STORAGE", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path / "home"


def session(home: Path) -> Session:
    return Session(Options(home=home, no_tracking=True, parallel=4))


def test_the_spec_says_which_searches_are_adaptive_and_what_runs_them() -> None:
    grid = make_sweep(batches=[8])
    rand = make_sweep(batches=[8, 16], search={"strategy": "random", "num_samples": 1})
    tune = make_sweep(search={"strategy": "tune", "space": {"batch_size": {"type": "choice", "values": [8, 16]}}})
    max_batch = make_sweep(search={"strategy": "max_batch"})
    assert [s.spec.search.adaptive for s in (grid, rand, tune, max_batch)] == [False, False, True, True]
    assert grid.spec.search.runner is None and rand.spec.search.runner is None
    assert tune.spec.search.runner == "kubesweep.tune.driver:run_tune"
    assert max_batch.spec.search.runner == "kubesweep.tune.maxbatch:run_max_batch"
    assert summary_names("tune") == [("tune", "tune.json")]
    assert summary_names("grid") == []
    assert summary_names("repeats") == [("repeats", "repeats.json")]
    assert summary_names(None) == [("tune", "tune.json"), ("max_batch", "max_batch.json"), ("repeats", "repeats.json")]


def test_run_search_dispatches_on_the_spec(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, Path, TrackingEnv | None]] = []

    def fake_runner(sweep: Sweep, backend: Any, *, storage: Path, tracking: TrackingEnv | None,
                    progress: Any) -> MaxBatchSummary:
        calls.append((sweep.name, storage, tracking))
        return MaxBatchSummary(sweep="fake", cells=[])

    module = type(sys)("fake_search_runner")
    module.run = fake_runner  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_search_runner", module)
    monkeypatch.setitem(SEARCH_RUNNERS, "max_batch", "fake_search_runner:run")
    sweep = make_sweep("dispatched", search={"strategy": "max_batch"})
    found = run_search(sweep, session(home).backend, storage=home / "st")
    assert found == MaxBatchSummary(sweep="fake", cells=[])
    assert calls == [("dispatched", home / "st", None)]
    with pytest.raises(NoSearch, match="has no search to run"):
        run_search(make_sweep(batches=[8]), session(home).backend, storage=home / "st")
