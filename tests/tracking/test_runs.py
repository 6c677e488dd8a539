"""A sweep's runs in MLflow (`kubesweep.tracking.runs.SweepRuns`), against a real MLflow store (sqlite in a
temporary directory): one parent run found again, child runs under it, their results files, and the error a
missing or unreachable server gives."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mlflow")

from kubesweep.tracking.records import from_mlflow
from kubesweep.tracking.runs import SweepRuns, TrackingError, UnusableStore, trial_id_of
from kubesweep.tracking.target import resolve
from kubesweep.wire import tags
from kubesweep.wire.results_file import MAX_RESULTS_BYTES, ResultsFileError
from tests.support.results_docs import make_results, results_doc


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
    assert run.data.tags[tags.SWEEP] == "s" and run.data.tags[tags.ROLE] == "parent" and run.info.run_name == "s"
    assert run.data.params["matrix"] == json.dumps({"batch_size": [8]}) and run.data.params["trials"] == "1"
    assert (tmp_path / "mlartifacts" / "exp").is_dir()  # the local store's artifacts, one folder per experiment

    child = client.create_run(run.info.experiment_id, tags={tags.PARENT_RUN: parent, tags.TRIAL_ID: "abc"},
                              run_name="s-0")
    client.log_dict(child.info.run_id, results_doc(), "results.json")
    bare = client.create_run(run.info.experiment_id, tags={tags.PARENT_RUN: parent}, run_name="s-1")
    children = runs.children(parent)
    assert sorted(c.name for c in children) == ["s-0", "s-1"]
    assert {trial_id_of(c) for c in children} == {"abc", None}
    assert runs.all_results(children) == {child.info.run_id: make_results(), bare.info.run_id: None}
    runs.finish_parent(parent, "FINISHED")
    assert client.get_run(parent).info.status == "FINISHED"


def test_no_uri_and_an_unreachable_server_are_tracking_errors(tmp_path: Path) -> None:
    with pytest.raises(TrackingError, match="tracking: off"):
        SweepRuns(resolve(experiment="e", home=tmp_path, disabled=True), "s")
    runs = SweepRuns(resolve(experiment="e", home=tmp_path, flag="http://127.0.0.1:9"), "s")
    with pytest.raises(TrackingError, match=r"MLflow at http://127\.0\.0\.1:9: cannot read the experiment"):
        runs.find_parent()


OPENER = """
import sys, time
from pathlib import Path
from kubesweep.backends._local_store import Store
from kubesweep.tracking.runs import SweepRuns
from kubesweep.tracking.target import resolve

root, me, rounds = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
import mlflow.tracking  # imported before the rounds: each round is the opening alone
for i in range(rounds):
    home = root / f"home-{i}"
    (root / f"ready-{i}-{me}").touch()
    deadline = time.monotonic() + 60
    while len(list(root.glob(f"ready-{i}-*"))) < 2:
        if time.monotonic() > deadline:
            sys.exit(f"round {i}: the other process did not come")
        time.sleep(0.001)
    Store(home)
    SweepRuns(resolve(experiment="exp", home=home), f"sweep-{me}").ensure_parent(backend="local", trials=1)
print("ok", flush=True)
"""


@pytest.mark.slow
def test_two_processes_open_a_fresh_home_at_once_twenty_times(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes (two `sweep submit` at once) make the state store and MLflow's sqlite schema of one fresh
    home together, twenty homes in a row: neither fails, and each finds or makes its parent run."""
    import subprocess
    import sys

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    procs = [subprocess.Popen([sys.executable, "-c", OPENER, str(tmp_path), me, "20"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for me in ("a", "b")]
    outs = [p.communicate(timeout=300) for p in procs]
    said = "\n---\n".join(errors[-2000:] for _, errors in outs)
    assert [(p.returncode, out.strip()) for p, (out, _) in zip(procs, outs, strict=True)] == [(0, "ok")] * 2, said
    for i in range(20):
        runs = SweepRuns(resolve(experiment="exp", home=tmp_path / f"home-{i}"), "sweep-a")
        assert runs.find_parent() is not None
        assert SweepRuns(resolve(experiment="exp", home=tmp_path / f"home-{i}"), "sweep-b").find_parent() is not None


def test_an_experiment_made_by_another_process_between_the_read_and_the_create_is_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two `sweep submit` at once on a fresh store: both read no experiment, one creates it, the other's create
    is refused (it exists). The second uses the one the first made rather than failing (seen in the two-process
    test above, once in some twenty rounds). Here the race is made certain: the read says none, while another
    client has made it in the real store."""
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    target = resolve(experiment="exp", home=tmp_path)
    runs = SweepRuns(target, "sweep-a")
    other = MlflowClient(tracking_uri=target.uri).create_experiment("exp")
    real_read = runs.client.get_experiment_by_name
    reads: list[str] = []

    def first_read_misses(name: str) -> Any:
        reads.append(name)
        return None if len(reads) == 1 else real_read(name)

    monkeypatch.setattr(runs.client, "get_experiment_by_name", first_read_misses)
    assert runs.experiment_id(create=True) == other
    parent, created = runs.ensure_parent(backend="local", trials=1)
    assert created and MlflowClient(tracking_uri=target.uri).get_run(parent).info.experiment_id == other


def test_a_damaged_store_file_is_one_error_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "mlflow.db").write_bytes(b"not a database" * 400)
    with pytest.raises(UnusableStore, match=f"the MLflow store {tmp_path / 'mlflow.db'} cannot be read "
                                            r"\(file is not a database\): move it aside"):
        SweepRuns(resolve(experiment="exp", home=tmp_path), "s").find_parent()


def test_a_hostile_results_artifact_is_its_trials_failure_in_one_line(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Child runs whose `results.json` artifact is 200,000 nested brackets, a whole file with outcome "bogus", or
    more than a results file has: each is read as every results file is (bounded, validated), its trial failed
    with one line naming the run; the good one reads whole; `sweep results --from mlflow` and `sweep report` on the
    sweep end with exit 0, not a traceback. (The oversized one is refused by its listed size, not downloaded.)"""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    home = tmp_path / "home"
    runs = SweepRuns(resolve(experiment="hostile", home=home), "hostile")
    parent, _ = runs.ensure_parent(backend="local", trials=4)
    experiment = runs.client.get_run(parent).info.experiment_id
    ids = {}
    for name, body in (("bomb", "[" * 200_000 + "]" * 200_000), ("bogus", json.dumps(results_doc(outcome="bogus"))),
                       ("huge", " " * (MAX_RESULTS_BYTES + 1)), ("good", json.dumps(results_doc()))):
        run = runs.client.create_run(experiment, run_name=f"hostile-{name}", tags={
            tags.PARENT_RUN: parent, tags.TRIAL_ID: name, tags.TRIAL: f"hostile-{name}", tags.OUTCOME: "succeeded"})
        runs.client.log_text(run.info.run_id, body, "results.json")
        runs.client.set_terminated(run.info.run_id, "FINISHED")
        ids[name] = run.info.run_id
    read = runs.all_results(runs.children(parent))
    assert isinstance(read[ids["good"]], type(make_results())) and all(
        isinstance(read[ids[name]], ResultsFileError) for name in ("bomb", "bogus", "huge"))
    records = {r.trial_id: r for r in from_mlflow(runs, parent, None, "hostile")}
    assert {k: r.outcome for k, r in records.items()} == {"bomb": "failed", "bogus": "failed", "huge": "failed",
                                                          "good": "succeeded"}
    assert records["bomb"].reason == (f"run {ids['bomb']}'s results.json: not JSON: recursion limit exceeded at "
                                      "line 1 column 202")
    assert records["bogus"].reason.startswith(f"run {ids['bogus']}'s results.json: outcome: not one of the "
                                              "outcomes, got 'bogus'")
    assert records["huge"].reason == (f"run {ids['huge']}'s results.json: {MAX_RESULTS_BYTES + 1:,} bytes, more "
                                      f"than a results file has ({MAX_RESULTS_BYTES:,})")
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "KUBESWEEP_NO_TRACKING")}
    env.update(KUBESWEEP_HOME=str(home), KUBESWEEP_LOCAL_GPUS="[]", COLUMNS="200")
    procs = [subprocess.run([sys.executable, "-m", "kubesweep", *args], capture_output=True, text=True, env=env,
                            cwd=tmp_path, timeout=300)
             for args in (["results", "hostile", "--from", "mlflow", "--per-trial", "-f", "json"],
                          ["report", "hostile", "--from", "mlflow", "--no-upload", "-o", str(tmp_path / "report")])]
    for proc in procs:
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    rows = {r["trial"]: r["outcome"] for r in json.loads(procs[0].stdout)}
    assert rows == {"hostile-bomb": "failed", "hostile-bogus": "failed", "hostile-huge": "failed",
                    "hostile-good": "succeeded"}, rows


def test_a_childs_results_file_is_read_from_its_runs_artifact_store(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Each child run's results.json comes from the artifact store its run names (`artifact_uri`), not through a
    `runs:/` URI: MLflow's runs repository also searches the run's logged models and, when either fails, keeps
    only "Failed to download artifacts from path", losing the server's words (what `sweep results` printed as a
    namespace's user on a GPU cluster)."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    runs = SweepRuns(resolve(experiment="exp", home=tmp_path), "s")
    parent, _ = runs.ensure_parent(backend="local", trials=1)
    child = runs.client.create_run(runs.client.get_run(parent).info.experiment_id,
                                   tags={tags.PARENT_RUN: parent, tags.TRIAL_ID: "abc"}, run_name="s-0")
    runs.client.log_dict(child.info.run_id, results_doc(), "results.json")
    (found,) = runs.children(parent)
    assert found.artifact_uri == runs.client.get_run(child.info.run_id).info.artifact_uri

    def through_runs_uri(*_: Any, **__: Any) -> str:
        raise AssertionError("read through a runs:/ URI")

    monkeypatch.setattr(runs.client, "download_artifacts", through_runs_uri)
    assert runs.all_results([found]) == {child.info.run_id: make_results()}
