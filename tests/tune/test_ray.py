"""The Ray side of the tuner (`kubesweep.tune._ray`), in the parts that run without a Ray session: the sweep a
trainable rebuilds, a trainable whose trial the scheduler stopped (it returns without reporting again), and the
callback, which pickles as its key and drives the driver registered under it. Reporting to Ray (`tune.report`)
needs a running Ray session: tests/tune/test_driver.py covers it."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")

from kubesweep.plan import make_trial
from kubesweep.sweep_spec import parse_sweep
from kubesweep.tune import _ray
from kubesweep.tune.metrics import write_snapshot

DOC = {"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "t"},
       "spec": {"search": {"strategy": "tune", "space": {"batch_size": {"type": "choice", "values": [8, 16]}}},
                "resources": {"gpus_per_trial": 0}}}


def test_the_sweep_a_trainable_rebuilds_is_the_submitted_one() -> None:
    sweep = parse_sweep(DOC)
    assert _ray.sweep_of(sweep.model_dump(mode="json", by_alias=True)).to_document() == sweep.to_document()


def test_a_trainable_of_a_stopped_trial_ends_without_reporting(tmp_path: Path) -> None:
    sweep = parse_sweep(DOC)
    trial = make_trial(sweep, {"batch_size": 16})
    snapshot = tmp_path / "trials.json"
    write_snapshot(snapshot, {trial.id: {"terminal": True, "outcome": "stopped"}})
    ctx = _ray.Context(sweep.model_dump(mode="json", by_alias=True), str(snapshot), None, None, None, poll_s=0.01)
    _ray.trainable({"batch_size": 16}, ctx)  # would raise outside a Ray session, had it reported


class Driver:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def tick(self) -> None:
        self.calls.append(("tick", None))

    def add(self, config: dict[str, Any]) -> None:
        self.calls.append(("add", config))

    def finish(self, config: dict[str, Any]) -> None:
        self.calls.append(("finish", config))


class RayTrial:
    def __init__(self, config: dict[str, Any]):
        self.config = config


def test_the_callback_pickles_as_its_key_and_drives_the_registered_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    driver = Driver()
    monkeypatch.setitem(_ray.DRIVERS, "t", driver)
    callback = pickle.loads(pickle.dumps(_ray.BackendCallback("t")))  # as a resumed tuner finds it
    assert vars(callback) == {"key": "t"}
    callback.on_trial_start(0, [], RayTrial({"batch_size": 8}))
    callback.on_step_end(1, [])
    callback.on_trial_complete(2, [], RayTrial({"batch_size": 8}))
    callback.on_trial_error(3, [], RayTrial({"batch_size": 16}))
    assert driver.calls == [("add", {"batch_size": 8}), ("tick", None), ("finish", {"batch_size": 8}),
                            ("finish", {"batch_size": 16})]
