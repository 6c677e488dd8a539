"""A tune sweep on the local backend with the real BERT job (tiny, random-init, CPU) and a real MLflow server:
Optuna suggests 6 trials, ASHA judges them on the samples/s they report every 3 steps and stops the slow
ones, whose processes are ended and whose MLflow runs are marked stopped. The tuner is killed (its whole
process group, Ray included) once two trials have ended and is started again: it restores Ray Tune's state
from the storage path, runs only the rest of the 6 suggestions, and reruns no trial."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from kubesweep.backends._local_trials import alive
from kubesweep.backends.local import LocalBackend
from kubesweep.tune.driver import pareto_front, private_dir
from kubesweep.wire.outcomes import Outcome
from tests.support.mlflow_fixtures import MlflowServer
from tests.tune.support import SST2, search_env, sweep_argv, tiny_job

NAME = "tune-asha"
SPEC = f"""\
apiVersion: kubesweep.io/v1alpha1
kind: Sweep
metadata: {{name: {NAME}}}
spec:
  job: {tiny_job(max_steps=60, log_every=3)}
  resources: {{gpus_per_trial: 0, retries: 0}}
  concurrency: {{max_parallel: 4}}
  search:
    strategy: tune
    algorithm: optuna
    scheduler: asha
    metric: samples_per_second
    mode: max
    num_samples: 6
    max_concurrent: 4
    grace_period: 1
    space:
      batch_size: {{type: choice, values: [2, 4, 8, 32]}}
      learning_rate: {{type: loguniform, low: 1.0e-4, high: 1.0e-2}}
"""


@pytest.mark.slow
def test_optuna_asha_search_stops_trials_and_resumes_after_a_kill(mlflow_server: MlflowServer,
                                                                   tmp_path: Path) -> None:
    assert SST2.is_dir(), f"SST-2 TSVs expected at {SST2}"
    spec = tmp_path / "tune.yaml"
    spec.write_text(SPEC)
    home = tmp_path / "home"
    env = search_env(mlflow_server, home)
    argv = sweep_argv("submit", str(spec), "--parallel", "4")

    # first tuner: killed with its Ray processes once two trials have ended
    log = (tmp_path / "first.log").open("wb")
    first = subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    backend = LocalBackend(home, devices=[])
    deadline = time.monotonic() + 300
    ended: list[str] = []
    while time.monotonic() < deadline and first.poll() is None:
        if (home / "state.db").exists() and NAME in backend.list_sweeps():
            ended = [t.trial_id for t in backend.status(NAME).trials if t.phase.terminal]
            if len(ended) >= 2:
                break
        time.sleep(0.5)
    assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
    assert len(ended) >= 2, "no trial ended within 300 s"
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()

    # second tuner: restores the search and finishes it
    second = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    output = second.stdout + second.stderr
    assert second.returncode == 0, output[-5000:]

    status = backend.status(NAME)
    assert len(status.trials) == 6, [t.label for t in status.trials]
    assert all(t.phase.terminal for t in status.trials)
    assert all(t.attempts == 1 for t in status.trials), {t.name: t.attempts for t in status.trials}
    stopped = [t for t in status.trials if t.outcome == Outcome.STOPPED]
    assert stopped, f"ASHA stopped no trial: {[(t.name, t.outcome) for t in status.trials]}"
    assert {t.outcome for t in status.trials} <= {Outcome.SUCCEEDED, Outcome.STOPPED}
    rows = {r.trial_id: r for r in backend.store.trials(NAME)}
    for t in stopped:
        assert rows[t.trial_id].pid and not alive(rows[t.trial_id].pid), t.name
        trial_log = (home / "sweeps" / NAME / "trials" / t.name / "log.txt").read_text()
        assert "succeeded (exit 0)" not in trial_log, t.name  # ended mid-run, not after
        # the stop's SIGTERM ended the job mid-run, and the job said so (or had not started yet)
        results_file = home / "sweeps" / NAME / "trials" / t.name / "results.json"
        if results_file.exists():
            ended = json.loads(results_file.read_text())
            assert ended["outcome"] == "cancelled" and ended["error"]["type"] == "Terminated", t.name

    summary = json.loads((home / "sweeps" / NAME / "search" / "tune.json").read_text())
    assert summary["resumed"] is True
    assert len(summary["trials"]) == 6
    assert summary["best"]["outcome"] == "succeeded"

    client = MlflowClient(tracking_uri=mlflow_server.url)
    experiment = client.get_experiment_by_name(NAME)
    assert experiment is not None
    (parent,) = client.search_runs([experiment.experiment_id], "tags.`kubesweep.role` = 'parent'")
    children = client.search_runs([experiment.experiment_id],
                                  f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    by_trial = {c.data.tags["kubesweep.trial_id"]: c for c in children}
    assert set(by_trial) == {t.trial_id for t in status.trials}
    for t in stopped:
        run = by_trial[t.trial_id]
        assert run.info.status == "KILLED" and run.data.tags["kubesweep.outcome"] == "stopped", t.name
        assert client.get_metric_history(run.info.run_id, "train/samples_per_s"), t.name  # it had reported
    for t in status.trials:
        if t.outcome == Outcome.SUCCEEDED:
            assert by_trial[t.trial_id].info.status == "FINISHED"

    results = subprocess.run(sweep_argv("results", NAME, "--format", "json"), env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)
    assert results.returncode == 0, results.stderr
    doc = json.loads(results.stdout)
    assert sum(1 for c in doc["cells"] if c["outcomes"] == {"stopped": 1}) == len(stopped)
    assert doc["search"]["best"]["trial_id"] == summary["best"]["trial_id"]


def test_pareto_front() -> None:
    rows = [{"name": n, "metrics": {"speed": s, "acc": a}} for n, s, a in
            [("fast", 10.0, 0.5), ("good", 5.0, 0.9), ("worse", 4.0, 0.8), ("both", 10.0, 0.9)]]
    assert [r["name"] for r in pareto_front(rows, ["speed", "acc"], ["max", "max"])] == ["both"]
    assert [r["name"] for r in pareto_front(rows[:3], ["speed", "acc"], ["max", "max"])] == ["fast", "good"]
    assert [r["name"] for r in pareto_front(rows[:3], ["speed", "acc"], ["min", "max"])] == ["good", "worse"]


def test_a_succeeded_trial_without_the_metric_is_infeasible_not_a_crash() -> None:
    """A trial that succeeded but measured no value of the search's metric (a results file without it, no MLflow
    to fall back on) made the summary raise TypeError (float(None)) and the tuner exit with a traceback. It is
    infeasible, says what it lacked, and the best is chosen among the others."""
    from types import SimpleNamespace

    from kubesweep.backends.base import Phase, TrialStatus
    from kubesweep.sweep_spec import parse_sweep
    from kubesweep.tune.driver import summarize

    sweep = parse_sweep({"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "t"},
                         "spec": {"search": {"strategy": "tune", "metric": "samples_per_s", "mode": "max",
                                             "space": {"batch_size": {"type": "choice", "values": [8, 16]}}}}})
    ids = {8: "id8", 16: "id16"}
    driver = SimpleNamespace(
        trial_for=lambda config: SimpleNamespace(id=ids[config["batch_size"]], name=f"t-{config['batch_size']}",
                                                 axes=config),
        backend=SimpleNamespace(status=lambda name: SimpleNamespace(trials=[
            TrialStatus(trial_id=i, name=f"t-{i}", label="", gpu=None, phase=Phase.SUCCEEDED,
                        outcome=Outcome.SUCCEEDED) for i in ids.values()])))
    results = [({"batch_size": 8}, {"samples_per_s": None, "feasible": True}),
               ({"batch_size": 16}, {"samples_per_s": 120.0, "feasible": True})]
    summary = summarize(sweep, sweep.spec.search, results, driver, resumed=False)  # type: ignore[arg-type]
    rows = {t.trial_id: t for t in summary.trials}
    assert rows["id8"].feasible is False and rows["id8"].violations == "samples_per_s missing"
    assert summary.best is not None and summary.best.trial_id == "id16"


def test_rays_temporary_directory_is_never_one_another_user_could_have_prepared(tmp_path: Path) -> None:
    """Ray's sockets and files go under `/tmp/ks-ray-<uid>` on a shared host: a directory made there first by
    someone else, open for others to write, or a symbolic link to elsewhere is not used; a fresh private one is."""
    def private(path: Path) -> bool:
        st = os.lstat(path)
        return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700

    made = private_dir(tmp_path / "absent")
    assert made == tmp_path / "absent" and private(made)
    own = tmp_path / "own"
    own.mkdir(mode=0o755)
    os.chmod(own, 0o755)
    assert private_dir(own) == own and private(own)  # this user's, written by no one else: closed and used

    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(target)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    hostile = [tmp_path / "link", shared]
    if os.getuid() == 0:  # another owner can be made only as root
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        hostile.append(theirs)
    for path in hostile:
        fresh = private_dir(path)
        try:
            assert fresh != path and fresh.parent != path and private(fresh), path
            assert not fresh.resolve().is_relative_to(target)
        finally:
            fresh.rmdir()
