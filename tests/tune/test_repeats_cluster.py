"""Sequential repeats on the Kubernetes backend against the real test control plane: every repeat is a Job, and the
rule reads each repeat's samples/s back from its MLflow run, as it must where the backend keeps no results files.

Real: the API server, scheduler and Job controller (kwok GPU nodes), an MLflow store (a sqlite file: the rule reads
it through the same client code as a server), and the rule driving the backend exactly as `sweep submit --direct`
does (`Session.run_search`, in this process).

Stand-in: kwok runs no containers, so no job runs in the trial pods. For every trial Job that appears, this test
does what the job would: it opens the trial's MLflow child run under the sweep's parent run, logs a `results.json`
with the trial's samples/s (exact for one cell; 20% above or below for the other, by the repeat's parity, so that
cell never reaches the target) and then lets the trial's pods succeed (kwok's pod-succeed Stage, 1 s on).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from kubesweep.backends.kubernetes import KubernetesBackend
from kubesweep.jobs.mlflow_logger import MlflowTrialLogger
from kubesweep.manifests import ANNOTATION_CONFIG, LABEL_SWEEP, LABEL_TRIAL
from kubesweep.plan import plan
from kubesweep.session import Options, Session
from kubesweep.sweep_spec import parse_sweep
from kubesweep.tracking.sweep import open_parent
from kubesweep.tracking.target import resolve
from kubesweep.wire.outcomes import Outcome
from kubesweep.wire.search import RepeatsSummary
from tests.support.results_docs import results_doc, trial_parts
from tests.tune.support import end_trial_pods

pytestmark = [pytest.mark.cluster]

NAME = "reps-kwok"
DIGEST = "registry.example/kubesweep-job@sha256:" + "0" * 64
SPEC: dict[str, Any] = {
    "apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": NAME},
    "spec": {"image": DIGEST, "warm_pods": False,  # kwok runs no containers: no warm pod's worker runs here
             "job": {"max_steps": 10}, "resources": {"gpus_per_trial": 1, "retries": 0},
             "concurrency": {"max_parallel": 4},
             "matrix": {"learning_rate": [1.0e-4, 0.789]},  # 0.789: 20% apart, never within the target
             "repeats": 2, "repeat_until": {"max": 4, "target": "3%"}},
}


def rate(learning_rate: float, repeat: int) -> float:
    return 1000.0 * (1.2 if repeat % 2 == 0 else 0.8) if learning_rate == 0.789 else 1000.0


class StandInPods(threading.Thread):
    """For every trial Job of the sweep: its MLflow child run with a results.json, then its pods succeed."""

    def __init__(self, backend: KubernetesBackend, namespace: str, uri: str, parent: str, tmp: Path):
        super().__init__(name="stand-in-pods", daemon=True)
        self.backend, self.namespace, self.uri, self.parent, self.tmp = backend, namespace, uri, parent, tmp
        self.halt = threading.Event()
        self.logged: set[str] = set()
        self.ended: set[str] = set()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.halt.wait(0.3):
                self._step()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def _step(self) -> None:
        jobs = self.backend.batch.list_namespaced_job(self.namespace, label_selector=f"{LABEL_SWEEP}={NAME}").items
        for job in jobs:
            trial_id = job.metadata.labels[LABEL_TRIAL]
            if trial_id not in self.logged:
                config = json.loads(job.spec.template.metadata.annotations[ANNOTATION_CONFIG])
                self._log(trial_id, config)
                self.logged.add(trial_id)
            if trial_id not in self.ended and end_trial_pods(self.backend.core, self.namespace, trial_id):
                self.ended.add(trial_id)

    def _log(self, trial_id: str, config: dict[str, Any]) -> None:
        repeat = int(config.get("repeat") or 0)
        doc = results_doc(**trial_parts(rate(config["job"]["learning_rate"], repeat)), config=config["job"],
                          trial={"sweep": NAME, "trial_id": trial_id, "name": config["name"], "repeat": repeat,
                                 "gpu": None, "gpu_product": None, "gpus_per_trial": 1})
        path = self.tmp / trial_id / "results.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(doc))
        logger = MlflowTrialLogger(uri=self.uri, trial_id=trial_id, run_name=config["name"], experiment=NAME,
                                   parent_run_id=self.parent)
        logger.start()
        logger.log_artifact(path)
        logger.close()  # returns once everything is sent

    def stop(self) -> None:
        self.halt.set()
        self.join(10)


def test_repeats_on_kubernetes_read_each_repeat_from_mlflow_and_stop_by_the_rule(
        k8s_cluster: Any, k8s_namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("KUBESWEEP_TUNE_STORAGE", str(tmp_path / "search"))
    sweep = parse_sweep(SPEC)
    session = Session(Options(backend="kubernetes", direct=True, namespace=k8s_namespace,
                              kubeconfig=Path(k8s_cluster.kubeconfig), tracking_uri=uri, home=tmp_path / "home"))
    target = resolve(experiment=NAME, home=tmp_path / "home", flag=uri, backend="kubernetes")
    opened = open_parent(target, NAME, backend="kubernetes", trials=0, spec=SPEC)
    assert opened.env is not None and opened.env.parent_run_id, opened.message
    backend = KubernetesBackend(namespace=k8s_namespace, api_client=k8s_cluster.api_client())
    pods = StandInPods(backend, k8s_namespace, uri, opened.env.parent_run_id, tmp_path / "results")
    pods.start()
    try:
        assert session.submit(sweep, plan(sweep)) is None  # --direct: the rule runs here
        ended = session.run_search(sweep)
    finally:
        pods.stop()
    assert pods.error is None, pods.error
    found = ended.found
    assert isinstance(found, RepeatsSummary)
    by_rate = {c.axes["learning_rate"]: (c.repeats, c.stopped) for c in found.cells}
    assert by_rate == {1.0e-4: (2, "reached"), 0.789: (4, "max")}, found.cells
    status = backend.status(NAME)
    backend.close()
    assert len(status.trials) == 6 and {t.outcome for t in status.trials} == {Outcome.SUCCEEDED}
    assert pods.logged == {t.trial_id for t in status.trials}  # every repeat was a Job
