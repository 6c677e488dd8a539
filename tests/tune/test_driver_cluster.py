"""A tune sweep on the Kubernetes backend against the real test control plane: every suggestion is a Job.

Real: the API server, scheduler and Job controller (kwok GPU nodes), a real `mlflow server`, Ray Tune with
ASHA, and the tuner driving the backend exactly as `sweep submit --direct` does (`tests/tune/kwok_tuner.py`, in a
process of its own).

Stand-in: kwok runs no containers, so no BERT job runs in the trial pods. This test does the part of the job
the tuner reads: for every trial Job that appears, it logs what the job would log into the trial's MLflow child
run, through the job's own MLflow logger — an `eval/accuracy` and a `train/samples_per_s` point every 0.3 s
(larger learning rates learn faster and, here, run slower: a trade-off for the two objectives) and, at the end,
`result/final_accuracy` and `result/samples_per_s`. Trial pods stay Running (kwok outcome `hang`) until the
stand-in has sent those final metrics; it then re-annotates the pods to succeed 1 s later, as a real job exits
after logging its results. The trials ASHA stops before that must have their Jobs deleted.

The search is Optuna's multi-objective one (accuracy and samples/s, both maximised) under a constraint
(accuracy >= 0.6); ASHA judges the first objective.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from kubesweep.backends.kubernetes import KubernetesBackend
from kubesweep.jobs.mlflow_logger import MlflowTrialLogger
from kubesweep.manifests import ANNOTATION_CONFIG, LABEL_SWEEP, LABEL_TRIAL
from kubesweep.tracking.sweep import open_parent
from kubesweep.tracking.target import resolve
from kubesweep.wire import tags
from kubesweep.wire.outcomes import Outcome
from tests.support.mlflow_fixtures import ROOT, MlflowServer, quiet_mlflow_env
from tests.tune.support import end_trial_pods

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

NAME = "tune-kwok"
DIGEST = "registry.example/kubesweep-job@sha256:" + "0" * 64
POINTS = 10
POINT_S = 0.3
MIN_ACCURACY = 0.6
SPEC: dict[str, Any] = {
    "apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": NAME},
    "spec": {
        "image": DIGEST,
        "warm_pods": False,  # kwok runs no containers: no warm pod's worker could run here
        "job": {"max_steps": 100},
        "resources": {"gpus_per_trial": 1, "retries": 0},
        "concurrency": {"max_parallel": 4},
        "search": {"strategy": "tune", "algorithm": "optuna", "scheduler": "asha",
                   "metric": ["accuracy", "samples_per_second"], "mode": ["max", "max"],
                   "constraints": [{"metric": "accuracy", "op": ">=", "value": MIN_ACCURACY}],
                   "num_samples": 8, "max_concurrent": 4, "grace_period": 1, "reduction_factor": 2, "seed": 7,
                   "space": {"learning_rate": {"type": "loguniform", "low": 1.0e-5, "high": 1.0e-2}}},
    },
}


def accuracy(learning_rate: float, point: int) -> float:
    """The stand-in job's dev accuracy after `point` of POINTS evaluations: larger rates learn faster."""
    quality = (math.log10(learning_rate) + 5) / 3  # 0 at 1e-5, 1 at 1e-2
    return 0.5 + 0.45 * quality * point / POINTS


def speed(learning_rate: float) -> float:
    """The stand-in job's samples/s: slower for larger rates (the other side of the trade-off)."""
    return 1000.0 * (1.5 - (math.log10(learning_rate) + 5) / 3)


class StandInPods(threading.Thread):
    """Logs, for every trial Job of the sweep, what its job would log to MLflow (see the module docstring)."""

    def __init__(self, backend: KubernetesBackend, namespace: str, uri: str, experiment: str, parent: str):
        super().__init__(name="stand-in-pods", daemon=True)
        self.backend, self.namespace = backend, namespace
        self.uri, self.experiment, self.parent = uri, experiment, parent
        self.halt = threading.Event()
        self.trials: dict[str, dict[str, Any]] = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.halt.wait(POINT_S):
                self._step()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def _step(self) -> None:
        jobs = self.backend.batch.list_namespaced_job(self.namespace, label_selector=f"{LABEL_SWEEP}={NAME}").items
        alive = set()
        for job in jobs:
            trial_id = job.metadata.labels[LABEL_TRIAL]
            if job.metadata.deletion_timestamp is None:
                alive.add(trial_id)
            if trial_id not in self.trials:
                config = json.loads(job.spec.template.metadata.annotations[ANNOTATION_CONFIG])
                logger = MlflowTrialLogger(uri=self.uri, trial_id=trial_id, run_name=config["name"],
                                           experiment=self.experiment, parent_run_id=self.parent)
                logger.start()
                self.trials[trial_id] = {"lr": config["job"]["learning_rate"], "logger": logger, "point": 0}
        for trial_id, state in self.trials.items():
            logger = state["logger"]
            if state["point"] >= POINTS or trial_id not in alive:
                continue  # done, or its Job was deleted: a stopped job logs no more
            state["point"] += 1
            logger.log_metrics({"eval/accuracy": accuracy(state["lr"], state["point"]),
                                "train/samples_per_s": speed(state["lr"])}, step=state["point"])
            if state["point"] == POINTS:
                logger.log_metrics({"result/final_accuracy": accuracy(state["lr"], POINTS),
                                    "result/samples_per_s": speed(state["lr"])}, step=POINTS)
                logger.close()  # returns once everything is sent
        for trial_id, state in self.trials.items():
            if state["point"] == POINTS and not state.get("ended") and trial_id in alive:
                state["ended"] = end_trial_pods(self.backend.core, self.namespace, trial_id)

    def stop(self) -> None:
        self.halt.set()
        self.join(10)
        for state in self.trials.values():
            if state["point"] < POINTS:
                state["logger"].close(status="KILLED")


def test_tune_trials_are_jobs_and_asha_stops_delete_them(k8s_cluster: Any, k8s_namespace: str,
                                                         mlflow_server: MlflowServer, tmp_path: Path) -> None:
    target = resolve(experiment=NAME, home=tmp_path / "home", flag=mlflow_server.url, backend="kubernetes")
    opened = open_parent(target, NAME, backend="kubernetes", trials=0, spec=SPEC)
    assert opened.env is not None and opened.env.parent_run_id, opened.message
    backend = KubernetesBackend(namespace=k8s_namespace, api_client=k8s_cluster.api_client())
    pods = StandInPods(backend, k8s_namespace, mlflow_server.url, NAME, opened.env.parent_run_id)
    spec_file, out = tmp_path / "sweep.json", tmp_path / "summary.json"
    spec_file.write_text(json.dumps(SPEC))
    env = {**os.environ, **quiet_mlflow_env(), "KUBESWEEP_RAY_TMP": f"/tmp/ks-ray-kwok-{os.getpid()}",
           "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "tests.tune.kwok_tuner", str(spec_file), k8s_namespace,
            str(k8s_cluster.kubeconfig), str(tmp_path / "tune"), mlflow_server.url, NAME, opened.env.parent_run_id,
            str(out)]
    pods.start()
    try:
        tuner = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    finally:
        pods.stop()
    assert tuner.returncode == 0, (tuner.stdout + tuner.stderr)[-5000:]
    assert pods.error is None, pods.error
    summary: dict[str, Any] = json.loads(out.read_text())  # tune.json's shape

    status = {t.trial_id: t for t in backend.status(NAME).trials}
    backend.close()
    assert len(summary["trials"]) == len(status) == 8, summary
    stopped = {tid for tid, t in status.items() if t.outcome == Outcome.STOPPED}
    succeeded = {tid for tid, t in status.items() if t.outcome == Outcome.SUCCEEDED}
    assert stopped, f"ASHA stopped no trial: {summary}"
    assert stopped | succeeded == set(status), {tid: t.outcome for tid, t in status.items()}
    assert set(pods.trials) == set(status)  # every suggestion became a Job
    # stopped trials (before their pods ended: else they would have succeeded): Jobs deleted, runs marked stopped
    for trial_id in stopped:
        jobs = backend_jobs(k8s_cluster, k8s_namespace, trial_id)
        assert jobs == [], f"the Job of stopped trial {trial_id} still exists"
    client = MlflowClient(tracking_uri=mlflow_server.url)
    experiment = client.get_run(opened.env.parent_run_id).info.experiment_id
    runs = {r.data.tags[tags.TRIAL_ID]: r for r in client.search_runs([experiment], f"tags.`{tags.TRIAL_ID}` != ''")}
    for trial_id in stopped:
        assert runs[trial_id].info.status == "KILLED"
        assert runs[trial_id].data.tags.get(tags.OUTCOME) == "stopped"
    # finished trials: feasible exactly when they meet the constraint; the best and the Pareto front among those
    rows = {t["trial_id"]: t for t in summary["trials"]}
    feasible = set()
    for trial_id in succeeded:
        final = accuracy(pods.trials[trial_id]["lr"], POINTS)
        assert rows[trial_id]["metrics"]["accuracy"] == pytest.approx(final)
        assert rows[trial_id]["metrics"]["samples_per_second"] == pytest.approx(speed(pods.trials[trial_id]["lr"]))
        assert rows[trial_id]["feasible"] is (final >= MIN_ACCURACY), rows[trial_id]
        if final >= MIN_ACCURACY:
            feasible.add(trial_id)
        else:
            assert "accuracy >= 0.6" in rows[trial_id]["violations"]
    assert feasible, f"no finished trial met the constraint: {summary}"
    assert summary["best"] is not None and summary["best"]["trial_id"] in feasible
    best_lr = max(pods.trials[t]["lr"] for t in feasible)
    assert summary["best"]["metrics"]["accuracy"] == pytest.approx(accuracy(best_lr, POINTS))
    # accuracy rises and speed falls with the rate, so every feasible finished trial is Pareto-optimal
    assert {row["trial_id"] for row in summary["pareto"]} == feasible


def backend_jobs(cluster: Any, namespace: str, trial_id: str) -> list[Any]:
    deadline = time.monotonic() + 30  # deletion with background propagation takes a moment
    while True:
        items: list[Any] = cluster.get_json("jobs", "-l", f"{LABEL_TRIAL}={trial_id}", namespace=namespace)["items"]
        if not items or time.monotonic() > deadline:
            return items
        time.sleep(0.3)
