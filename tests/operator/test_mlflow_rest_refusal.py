"""The operator's refusal of an experiment it did not seal for the Sweep's namespace, against a stand-in server
that answers each request as MLflow's REST API would (the whole exchange with a real MLflow is
`tests/operator/test_mlflow_ownership.py`, slow): an experiment of the Sweep's name whose tags claim the namespace
but carry no seal is refused before anything is written to it, and an operator without its key makes none."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from kubesweep.operator.mlflow_rest import ExperimentRefused, MlflowError, MlflowRest
from kubesweep.wire import tags
from tests.operator.test_mlflow_rest import _Server

KEY = b"a-key-of-thirty-two-bytes-012345"


@pytest.fixture()
def server() -> Iterator[_Server]:
    s = _Server()
    yield s
    s.httpd.shutdown()


def _experiment(experiment_tags: dict[str, str]) -> str:
    return json.dumps({"experiment": {"experiment_id": "7", "name": "bert", "lifecycle_stage": "active",
                                      "creation_time": 1765000000000,
                                      "tags": [{"key": k, "value": v} for k, v in experiment_tags.items()]}})


@pytest.mark.parametrize("claimed", [
    {tags.NAMESPACE: "team-a"},  # a user made it and tagged it for the namespace
    {tags.NAMESPACE: "team-a", tags.OWNER_SEAL: "0" * 64},  # with a seal of its own making
    {},  # nothing at all
])
def test_an_unsealed_experiment_of_the_name_is_refused_and_left_untouched(server: _Server,
                                                                           claimed: dict[str, str]) -> None:
    server.reply = (200, _experiment(claimed))
    with pytest.raises(ExperimentRefused, match="was not made by the operator for namespace team-a"):
        MlflowRest(server.url, environ={}, owner_key=KEY).experiment_id("bert", "team-a")
    assert [(method, path.split("?")[0]) for method, path, _ in server.requests] == [
        ("GET", "/api/2.0/mlflow/experiments/get-by-name")]  # read, never tagged, granted or renamed


def test_an_operator_without_its_key_makes_no_experiment_for_a_namespace(server: _Server) -> None:
    server.reply = (200, _experiment({}))
    with pytest.raises(MlflowError, match="no ownership key"):
        MlflowRest(server.url, environ={}).experiment_id("bert", "team-a")
    assert server.requests == []
