"""Tune and max-batch pieces without Ray running: spec validation, the search space, bisection, constraints,
the Pareto front, the tuner's Job manifest."""

from __future__ import annotations

import importlib.util
import json
from types import SimpleNamespace
from typing import Any

import pytest

from kubesweep.spec import Constraint, SpecError, TuneSearch, parse_sweep
from kubesweep.tune import metrics
from kubesweep.tune.driver import pareto_front
from kubesweep.tune.maxbatch import candidates, next_probes
from kubesweep.tune.space import axes_from_config


def sweep_doc(search: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "t"},
            "spec": {"search": search, **spec}}


def problems(search: dict[str, Any], **spec: Any) -> str:
    with pytest.raises(SpecError) as info:
        parse_sweep(sweep_doc(search, **spec))
    return str(info.value)


TEXT = """\
apiVersion: kubesweep.io/v1alpha1
kind: Sweep
metadata: {name: t}
spec:
  search:
    strategy: tune
    space:
      batch_size: {type: uniform, low: 8, high: 64}
"""


def test_errors_name_file_line_and_field() -> None:
    from kubesweep.spec import parse_sweep_text

    with pytest.raises(SpecError) as info:
        parse_sweep_text(TEXT, source="x.yaml")
    assert str(info.value) == ("x.yaml:8: spec.search.space.batch_size.type: axis 'batch_size' takes integers; "
                               "use randint, quniform or qloguniform")


@pytest.mark.parametrize(("search", "expected"), [
    ({"space": {"batch_sise": {"type": "choice", "values": [8]}}}, "did you mean 'batch_size'?"),
    ({"space": {}}, "needs at least one axis in space"),
    ({"space": {"learning_rate": {"type": "loguniform", "low": 0, "high": 1}}}, "loguniform needs low > 0"),
    ({"space": {"learning_rate": {"type": "uniform", "low": 2, "high": 1}}}, "must be > low"),
    ({"space": {"learning_rate": {"type": "uniform"}}}, "uniform needs low and high"),
    ({"space": {"learning_rate": {"type": "quniform", "low": 1, "high": 2}}}, "quniform needs q"),
    ({"space": {"precision": {"type": "choice", "values": ["fp32", "fp61"]}}}, "'fp61' is not one of"),
    ({"space": {"precision": {"type": "uniform", "low": 1, "high": 2}}}, "is not numeric; use choice"),
    ({"space": {"gpu": {"type": "choice", "values": ["h100"]}}}, "did you mean 'h100-80gb'?"),
    ({"space": {"batch_size": {"type": "choice", "values": [8]}}, "metric": ["samples_per_second", "accuracy"],
      "mode": ["max"]}, "1 modes for 2 metrics"),
    ({"space": {"batch_size": {"type": "choice", "values": [8]}}, "metric": "speed"}, "'speed' is not a tune metric"),
    ({"space": {"batch_size": {"type": "choice", "values": [8]}}, "metric": ["samples_per_second", "accuracy"],
      "mode": ["max", "max"], "algorithm": "random"}, "multi-objective search (2 metrics) needs algorithm optuna"),
    ({"space": {"learning_rate": {"type": "uniform", "low": 1, "high": 2}}, "algorithm": "grid"},
     "algorithm grid needs choice distributions"),
    ({"space": {"batch_size": {"type": "choice", "values": [8]}}, "algorithm": "hyperopt"},
     "hyperopt is not installed"),
    ({"space": {"batch_size": {"type": "choice", "values": [8]}},
      "constraints": [{"metric": "acc", "op": ">=", "value": 0.9}]}, "'acc' is not a tune metric"),
])
def test_tune_spec_problems(search: dict[str, Any], expected: str) -> None:
    if search.get("algorithm") == "hyperopt" and importlib.util.find_spec("hyperopt") is not None:
        pytest.skip("hyperopt is installed here")
    assert expected in problems({"strategy": "tune", **search})


def test_space_axis_must_not_be_a_matrix_axis() -> None:
    text = problems({"strategy": "tune", "space": {"batch_size": {"type": "choice", "values": [8, 16]}}},
                    matrix={"batch_size": [8]})
    assert "spec.search.space.batch_size: 'batch_size' is also a matrix axis" in text


def test_a_valid_multi_objective_search_with_constraints() -> None:
    sweep = parse_sweep(sweep_doc({
        "strategy": "tune", "metric": ["samples_per_second", "accuracy"], "mode": ["max", "max"],
        "constraints": [{"metric": "accuracy", "op": ">=", "value": 0.9}],
        "space": {"batch_size": {"type": "qloguniform", "low": 8, "high": 256, "q": 8},
                  "learning_rate": {"type": "loguniform", "low": 1e-5, "high": 1e-3},
                  "precision": {"type": "choice", "values": ["fp32", "bf16"]}}}))
    search = sweep.spec.search
    assert isinstance(search, TuneSearch)
    assert (search.metrics, search.modes) == (["samples_per_second", "accuracy"], ["max", "max"])


def test_max_batch_spec_problems() -> None:
    assert "spec.search.high: must be >= low (64)" in problems({"strategy": "max_batch", "low": 64, "high": 8})
    assert "leave batch_size out of the matrix" in problems({"strategy": "max_batch"}, matrix={"batch_size": [8]})


def test_suggestions_become_typed_axis_values() -> None:
    search = TuneSearch.model_validate({"strategy": "tune", "space": {
        "batch_size": {"type": "quniform", "low": 8, "high": 64, "q": 8},
        "learning_rate": {"type": "loguniform", "low": 1e-5, "high": 1e-3},
        "compile": {"type": "choice", "values": [False, "default"]}}})
    axes = axes_from_config(search, {"compile": False, "learning_rate": 0.000123456789, "batch_size": 24.0})
    assert axes == {"batch_size": 24, "learning_rate": 0.000123457, "compile": False}
    assert list(axes) == ["batch_size", "learning_rate", "compile"]


def test_ray_space_types() -> None:
    pytest.importorskip("ray")
    from kubesweep.tune.space import ray_space

    search = TuneSearch.model_validate({"strategy": "tune", "algorithm": "grid", "space": {
        "precision": {"type": "choice", "values": ["fp32", "bf16"]}}})
    assert ray_space(search) == {"precision": {"grid_search": ["fp32", "bf16"]}}
    search = TuneSearch.model_validate({"strategy": "tune", "space": {
        "batch_size": {"type": "qloguniform", "low": 8, "high": 256, "q": 8},
        "warmup_ratio": {"type": "uniform", "low": 0, "high": 0.2}}})
    space = ray_space(search)
    assert type(space["batch_size"].sampler).__name__ == "Quantized"
    assert all(8 <= space["batch_size"].sample() <= 256 for _ in range(20))
    assert all(isinstance(space["batch_size"].sample(), int) for _ in range(5))


def test_bisection_probes() -> None:
    from kubesweep.spec import MaxBatchSearch

    assert candidates(MaxBatchSearch(strategy="max_batch", low=8, high=64, step=8)) == [8, 16, 24, 32, 40, 48,
                                                                                         56, 64]
    assert candidates(MaxBatchSearch(strategy="max_batch", low=3, high=6)) == [3, 4, 5, 6]
    assert next_probes(-1, 8, 2) == [2, 5]
    assert next_probes(2, 5, 2) == [3, 4]
    assert next_probes(4, 5, 2) == []
    assert next_probes(-1, 8, 1) == [3]
    assert next_probes(-1, 1, 3) == [0]


def test_constraints_and_penalties() -> None:
    rules = [Constraint(metric="accuracy", op=">=", value=0.9)]
    assert metrics.violations(rules, {"accuracy": 0.91}) == []
    assert metrics.violations(rules, {"accuracy": 0.5}) == ["accuracy >= 0.9 (got 0.5)"]
    assert metrics.violations(rules, {}) == ["accuracy >= 0.9 (got missing)"]
    assert metrics.worst("max") < -1e9 and metrics.worst("min") > 1e9
    results = {"train": {"samples_per_s": 12.5}, "final_accuracy": 0.75}
    assert metrics.from_results("samples_per_second", results) == 12.5
    assert metrics.from_results("accuracy", results) == 0.75
    assert metrics.source("result/tokens_per_s").intermediate == "result/tokens_per_s"


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
    return metrics.RunPoller("http://tracking", "1", "trial-1", ["result/final_accuracy"], _client=ServerAway(outages))


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


def test_pareto_front() -> None:
    rows = [{"name": n, "metrics": {"speed": s, "acc": a}} for n, s, a in
            [("fast", 10.0, 0.5), ("good", 5.0, 0.9), ("worse", 4.0, 0.8), ("both", 10.0, 0.9)]]
    assert [r["name"] for r in pareto_front(rows, ["speed", "acc"], ["max", "max"])] == ["both"]
    assert [r["name"] for r in pareto_front(rows[:3], ["speed", "acc"], ["max", "max"])] == ["fast", "good"]
    assert [r["name"] for r in pareto_front(rows[:3], ["speed", "acc"], ["min", "max"])] == ["good", "worse"]


def test_tuner_job_manifest_is_a_valid_job() -> None:
    from kubesweep.manifests import ANNOTATION_SWEEP, render_plan, render_tuner_job, tuner_name
    from kubesweep.plan import plan

    sweep = parse_sweep(sweep_doc({"strategy": "tune", "space": {"batch_size": {"type": "choice", "values": [8]}}},
                                  image="registry.example/job@sha256:" + "0" * 64,
                                  storage={"checkpoint_claim": "ckpt"}))
    job = render_tuner_job(sweep, image="img@sha256:" + "1" * 64, namespace="ns",
                           trial_image="registry.example/job@sha256:" + "0" * 64)
    assert job["metadata"]["name"] == tuner_name("t") == "t-tuner"
    container = job["spec"]["template"]["spec"]["containers"][0]
    # the tuner (token that may create Jobs) runs the given image; the sweep's image only reaches its trials
    assert container["image"] == "img@sha256:" + "1" * 64
    assert {"name": "KUBESWEEP_IMAGE", "value": "registry.example/job@sha256:" + "0" * 64} in container["env"]
    assert container["command"][:4] == ["python", "-m", "kubesweep.tune", "--spec"]
    assert "/checkpoints/t/search" in container["command"]
    doc = json.loads(job["spec"]["template"]["metadata"]["annotations"][ANNOTATION_SWEEP])
    assert parse_sweep(doc).to_document() == sweep.to_document()
    assert len(tuner_name("x" * 63)) <= 63
    # with the sweep's MLflow parent run: each variable once (a duplicate is refused by server-side apply)
    from kubesweep.tracking.env import TrackingEnv

    tracked = render_tuner_job(sweep, image="img@sha256:" + "1" * 64, namespace="ns",
                               tracking=TrackingEnv("http://mlflow:5000", "t", "run123"))
    names = [e["name"] for e in tracked["spec"]["template"]["spec"]["containers"][0]["env"]]
    assert len(names) == len(set(names)) and names.count("KUBESWEEP_PARENT_RUN_ID") == 1, names
    (rendered,) = render_plan(plan(sweep))  # a search plans no trials: its manifest is the tuner Job
    assert rendered["metadata"]["name"] == "t-tuner"
    kv = pytest.importorskip("kubernetes_validate")
    from tests.test_manifests import K8S_VERSION

    kv.validate(job, K8S_VERSION, strict=True)


@pytest.mark.parametrize("name", ["tune_example.yaml", "max_batch.yaml"])
def test_shipped_search_examples_validate(name: str) -> None:
    from pathlib import Path

    from kubesweep.spec import load_sweep_file

    sweep = load_sweep_file(Path(__file__).parents[2] / "sweeps" / name)
    assert sweep.spec.search.strategy in ("tune", "max_batch")
