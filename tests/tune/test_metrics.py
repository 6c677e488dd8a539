"""A search's metrics (`kubesweep.tune.metrics`): constraints, penalties, where each metric is read, and the
MLflow poller that follows a trial's run."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kubesweep.spec import Constraint
from kubesweep.tune import metrics
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
