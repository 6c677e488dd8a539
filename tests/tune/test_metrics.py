"""A search's metrics (`kubesweep.tune.metrics`): constraints, penalties, where each metric is read, and the
MLflow poller that follows a trial's run."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pytest

from kubesweep.jobs.mlflow_logger import MlflowTrialLogger
from kubesweep.sweep_spec import Constraint
from kubesweep.tune import metrics
from kubesweep.wire import tags
from tests.support.mlflow_fixtures import MlflowServer
from tests.support.results_docs import make_results


def test_constraints_and_penalties() -> None:
    rules = [Constraint(metric="accuracy", op=">=", value=0.9)]
    assert metrics.violations(rules, {"accuracy": 0.91}) == []
    assert metrics.violations(rules, {"accuracy": 0.5}) == ["accuracy >= 0.9 (got 0.5)"]
    assert metrics.violations(rules, {}) == ["accuracy >= 0.9 (got missing)"]
    assert metrics.worst("max") < -1e9 and metrics.worst("min") > 1e9
    results = make_results(train={"samples_per_s": 12.5}, final_accuracy=0.75)
    assert metrics.from_results("samples_per_second", results) == 12.5
    assert metrics.from_results("accuracy", results) == 0.75
    assert metrics.source("result/tokens_per_s").intermediate == "result/tokens_per_s"


def test_a_metric_of_the_catalogue_is_a_tune_metric_read_by_its_definition() -> None:
    """Every metric a trial's run logs at its end may be optimised or constrained: judged at the end only (no
    intermediate key), its final key its name, its value in results.json read as `sweep results` reads it."""
    src = metrics.source("peak_mem_gib")
    assert (src.intermediate, src.final) == (None, "peak_mem_gib")
    results = make_results(train={"samples_per_s": 12.5, "tflops_per_s": 3.5},
                           memory={"torch_peak_allocated_bytes": 3 * 1024**3})
    assert metrics.from_results("peak_mem_gib", results) == 3.0
    assert metrics.from_results("tflops_per_s", results) == 3.5
    assert metrics.from_results("cost_per_epoch", results) is None  # priced by the job: its MLflow key
    assert metrics.final_values(["cost_per_epoch"], results, {"cost_per_epoch": 0.5}) == {"cost_per_epoch": 0.5}


class ServerAway:
    """An MLflow client whose server is unreachable for its first `outages` calls. A stand-in: a real server
    cannot be made to drop a request on cue within a unit test; the poller's reaction to it is what is tested."""

    def __init__(self, outages: int):
        self.outages = outages
        self.calls = 0

    def _call(self) -> None:
        self.calls += 1
        if self.calls <= self.outages:
            raise ConnectionError("connection refused")

    def search_runs(self, *args: Any, **kwargs: Any) -> list[Any]:
        self._call()
        return [SimpleNamespace(info=SimpleNamespace(run_id="run-1"))]

    def get_metric_history(self, run_id: str, key: str) -> list[Any]:
        self._call()
        return [SimpleNamespace(step=1, value=0.5, timestamp=1), SimpleNamespace(step=2, value=0.9, timestamp=2)]


def poller(outages: int) -> metrics.RunPoller:
    return metrics.RunPoller("http://tracking", "1", "parent1", "trial-1", ["result/final_accuracy"],
                             _client=ServerAway(outages))


def test_a_poll_that_cannot_reach_the_server_says_so_and_the_next_reads_everything() -> None:
    p = poller(outages=1)
    assert p.poll() == {} and p.failed and p.latest == {}
    assert p.poll() == {"result/final_accuracy": [(1, 0.5), (2, 0.9)]} and not p.failed
    assert p.latest == {"result/final_accuracy": 0.9}
    assert p.poll() == {} and not p.failed  # nothing new


def test_a_finished_trials_last_read_waits_out_a_short_outage_and_gives_up_after_a_long_one() -> None:
    p = poller(outages=2)
    assert p.poll_settled(pause_s=0.001) == {"result/final_accuracy": [(1, 0.5), (2, 0.9)]}
    assert not p.failed and p.latest == {"result/final_accuracy": 0.9}
    p = poller(outages=10)
    assert p.poll_settled(pause_s=0.001, retries=3) == {} and p.failed
    assert p.client().calls == 4  # one poll and three more


def test_the_poller_reads_the_trials_run_under_the_sweeps_parent_run_alone(mlflow_server: MlflowServer) -> None:
    """Against a real `mlflow server`: a sweep made again under its name has the same trial ids under a new parent
    run of the same experiment. The old sweep's run of a trial and a run someone who may edit the experiment made
    with its trial id and no parent (each at 0.99) are never read while the trial has no run of its own, nor logged
    into by its job (the job's own logger): the search reads the real run's 0.50."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_server.url)
    name = f"poller-{os.urandom(4).hex()}"
    experiment = client.create_experiment(name)
    tid, key = "a1b2c3d4e5", "eval/accuracy"
    stale_parent = client.create_run(experiment, run_name="made-again").info.run_id
    for claims in ({tags.TRIAL_ID: tid, tags.PARENT_RUN: stale_parent}, {tags.TRIAL_ID: tid}):
        client.log_metric(client.create_run(experiment, tags=claims).info.run_id, key, 0.99, step=1)
    parent = client.create_run(experiment, run_name="made-again").info.run_id
    poller = metrics.RunPoller(mlflow_server.url, experiment, parent, tid, [key])
    assert poller.poll() == {} and not poller.failed and poller.run_id is None  # no run of its own yet

    job = MlflowTrialLogger(uri=mlflow_server.url, trial_id=tid, run_name="made-again-t", experiment=name,
                            parent_run_id=parent)
    job.start()
    job.log_metrics({key: 0.5}, 1)
    assert job.close().pending == 0
    assert poller.poll() == {key: [(1, 0.5)]} and poller.latest == {key: 0.5}
    assert job.run_id is not None and poller.run_id == job.run_id
    assert client.get_run(job.run_id).data.tags[tags.PARENT_RUN] == parent


def test_a_trial_run_filter_quotes_only_ids() -> None:
    assert tags.trial_run_filter("abc123", "t-1") == (
        "tags.`kubesweep.trial_id` = 't-1' AND tags.`mlflow.parentRunId` = 'abc123'")
    with pytest.raises(ValueError, match="not a run id"):
        metrics.RunPoller("http://tracking", "1", "x' OR '1' = '1", "t-1", [])
    with pytest.raises(ValueError, match="not a trial id"):
        tags.trial_run_filter("abc123", "t' OR '1' = '1")
