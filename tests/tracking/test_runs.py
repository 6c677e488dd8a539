"""A sweep's runs in MLflow (`kubesweep.tracking.runs.SweepRuns`), against a real MLflow store (sqlite in a
temporary directory): one parent run found again, child runs under it, their results files, and the error a
missing or unreachable server gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("mlflow")

from kubesweep.tracking.mlflow_logger import PARENT_TAG, TRIAL_TAG
from kubesweep.tracking.runs import ROLE_TAG, SWEEP_TAG, SweepRuns, TrackingError, trial_id_of
from kubesweep.tracking.target import resolve


def test_the_parent_run_is_made_once_and_its_children_and_results_are_read(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    runs = SweepRuns(resolve(experiment="exp", home=tmp_path), "s")
    assert runs.find_parent() is None and runs.experiment_id(create=False) is None
    spec = {"spec": {"matrix": {"batch_size": [8]}, "job": {"max_steps": 2}}}
    parent, created = runs.ensure_parent(backend="local", trials=1, spec=spec)
    assert created and runs.ensure_parent(backend="local", trials=1) == (parent, False)
    assert SweepRuns(resolve(experiment="exp", home=tmp_path), "s").find_parent() == parent
    client = runs.client
    run = client.get_run(parent)
    assert run.data.tags[SWEEP_TAG] == "s" and run.data.tags[ROLE_TAG] == "parent" and run.info.run_name == "s"
    assert run.data.params["matrix"] == json.dumps({"batch_size": [8]}) and run.data.params["trials"] == "1"
    assert (tmp_path / "mlartifacts" / "exp").is_dir()  # the local store's artifacts, one folder per experiment

    child = client.create_run(run.info.experiment_id, tags={PARENT_TAG: parent, TRIAL_TAG: "abc"}, run_name="s-0")
    client.log_dict(child.info.run_id, {"outcome": "succeeded"}, "results.json")
    bare = client.create_run(run.info.experiment_id, tags={PARENT_TAG: parent}, run_name="s-1")
    children = runs.children(parent)
    assert sorted(c.name for c in children) == ["s-0", "s-1"]
    assert {trial_id_of(c) for c in children} == {"abc", None}
    assert runs.all_results(children) == {child.info.run_id: {"outcome": "succeeded"}, bare.info.run_id: None}
    runs.finish_parent(parent, "FINISHED")
    assert client.get_run(parent).info.status == "FINISHED"


def test_no_uri_and_an_unreachable_server_are_tracking_errors(tmp_path: Path) -> None:
    with pytest.raises(TrackingError, match="tracking: off"):
        SweepRuns(resolve(experiment="e", home=tmp_path, disabled=True), "s")
    runs = SweepRuns(resolve(experiment="e", home=tmp_path, flag="http://127.0.0.1:9"), "s")
    with pytest.raises(TrackingError, match=r"MLflow at http://127\.0\.0\.1:9: cannot read the experiment"):
        runs.find_parent()
