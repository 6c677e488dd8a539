"""Detached processes (`kubesweep.detach`): a real `sweep _drive` of a tiny local sweep, started in a session of
its own, runs the sweep to its end and writes its log where `driver_log` says; a session's `detach_search`
passes its options on to `spawn_search`."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from kubesweep import detach
from kubesweep.backends.kubernetes import KubernetesBackend
from kubesweep.operator.client import SweepClient
from kubesweep.plan import plan
from kubesweep.session import Options, Session
from kubesweep.sweep_spec import parse_sweep
from kubesweep.wire.outcomes import Outcome

STAND_IN = Path(__file__).parent / "support" / "stand_in_job.py"


def test_a_detached_driver_runs_a_local_sweep_to_its_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBESWEEP_JOB_COMMAND", json.dumps([sys.executable, str(STAND_IN)]))
    monkeypatch.setenv("KUBESWEEP_LOCAL_GPUS", "[]")
    home = tmp_path / "home"
    sweep = parse_sweep({"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "bg"},
                         "spec": {"job": {"max_steps": 1}, "matrix": {"batch_size": [8, 16]},
                                  "resources": {"gpus_per_trial": 0, "retries": 0}}})
    session = Session(Options(home=home, no_tracking=True, parallel=2))
    session.submit(sweep, plan(sweep))
    log = detach.spawn_driver("bg", home)
    assert log == detach.driver_log(home, "bg") == home / "sweeps" / "bg" / "driver.log"
    deadline = time.monotonic() + 60
    while not session.backend.status("bg").done:
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    assert {t.outcome for t in session.backend.status("bg").trials} == {Outcome.SUCCEEDED}
    assert log.exists()


def test_a_detached_search_is_the_same_submit_with_the_same_options(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[tuple[list[str], Path]] = []
    monkeypatch.setattr(detach, "_spawn", lambda argv, log: started.append((argv, log)))  # not started here
    spec = tmp_path / "search.yaml"
    options = Options(home=tmp_path / "home", backend="kubernetes", parallel=3, any_gpu=True,
                      tracking_uri="http://mlflow:5000", namespace="team", kubeconfig=tmp_path / "kc", direct=True)
    log = Session(options).detach_search(spec, "srch", allow_unpinned=True, max_trials=50,
                                         sets=["job.max_steps=5", "search.num_samples=8"])
    ((argv, spawned_log),) = started
    assert log == spawned_log == tmp_path / "home" / "sweeps" / "srch" / "driver.log"
    assert argv == [sys.executable, "-m", "kubesweep", "submit", str(spec.resolve()), "--home", str(tmp_path / "home"),
                    "--backend", "kubernetes", "--parallel", "3", "--max-trials", "50", "--allow-unpinned",
                    "--any-gpu", "--tracking-uri", "http://mlflow:5000", "--namespace", "team", "--kubeconfig",
                    str(tmp_path / "kc"), "--direct", "--set", "job.max_steps=5", "--set", "search.num_samples=8",
                    "--yes"]
    Session(Options(home=tmp_path / "home", no_tracking=True)).detach_search(spec, "srch", allow_unpinned=False,
                                                                             max_trials=5)
    assert started[1][0][4:] == [str(spec.resolve()), "--home", str(tmp_path / "home"), "--backend", "local",
                                 "--parallel", str(Options().parallel), "--max-trials", "5", "--no-tracking", "--yes"]


def test_a_detached_direct_kubernetes_sweep_gets_a_driver_with_the_same_options(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`sweep submit --direct --detach` on Kubernetes: whoever waits drives such a sweep (its next Jobs, its warm
    pods' hand-overs), so a driver process of its own is started with the same cluster and tracking options; a
    sweep the operator drives gets none."""
    started: list[tuple[list[str], Path]] = []
    monkeypatch.setattr(detach, "_spawn", lambda argv, log: started.append((argv, log)))  # not started here
    options = Options(home=tmp_path / "home", backend="kubernetes", tracking_uri="http://mlflow:5000",
                      namespace="team", kubeconfig=tmp_path / "kc", direct=True)
    session = Session(options)
    monkeypatch.setattr(session, "_backend", KubernetesBackend.__new__(KubernetesBackend))  # no cluster here
    log = session.detach("k")
    ((argv, spawned_log),) = started
    assert log == spawned_log == tmp_path / "home" / "sweeps" / "k" / "driver.log"
    assert argv == [sys.executable, "-m", "kubesweep", "_drive", "k", "--home", str(tmp_path / "home"),
                    "--backend", "kubernetes", "--direct", "--namespace", "team", "--kubeconfig",
                    str(tmp_path / "kc"), "--tracking-uri", "http://mlflow:5000"]
    operator = Session(Options(home=tmp_path / "home", backend="kubernetes", namespace="team"))
    monkeypatch.setattr(operator, "_backend", SweepClient.__new__(SweepClient))
    assert operator.detach("k") is None and len(started) == 1
