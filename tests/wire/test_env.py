"""What a trial is told about tracking (`kubesweep.wire.env.TrackingEnv`): the environment list it renders."""

from __future__ import annotations

from kubesweep.wire.env import TRACKING_SECRET_ENV, TrackingEnv


def test_the_uri_and_experiment_always_and_the_parent_run_only_when_known() -> None:
    assert TrackingEnv("http://mlflow:5000", "exp").env() == [
        {"name": "MLFLOW_TRACKING_URI", "value": "http://mlflow:5000"},
        {"name": "KUBESWEEP_EXPERIMENT", "value": "exp"}]
    env = TrackingEnv("http://mlflow:5000", "exp", "run123").env()
    assert env[-1] == {"name": "KUBESWEEP_PARENT_RUN_ID", "value": "run123"}
    assert "MLFLOW_RUN_ID" not in {e["name"] for e in env}  # a trial must never write into the parent run
    assert TrackingEnv("u", "e", "").env() == TrackingEnv("u", "e").env()


def test_credentials_come_from_the_secret_never_as_values() -> None:
    env = TrackingEnv("http://mlflow:5000", "exp", "run123", credentials_secret="mlflow-trials").env()
    names = [e["name"] for e in env]
    assert names == ["MLFLOW_TRACKING_URI", "KUBESWEEP_EXPERIMENT", "KUBESWEEP_PARENT_RUN_ID", TRACKING_SECRET_ENV,
                     "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"]
    assert len(names) == len(set(names))
    by_name = {e["name"]: e for e in env}
    assert by_name[TRACKING_SECRET_ENV] == {"name": TRACKING_SECRET_ENV, "value": "mlflow-trials"}
    assert by_name["MLFLOW_TRACKING_USERNAME"] == {
        "name": "MLFLOW_TRACKING_USERNAME", "valueFrom": {"secretKeyRef": {"name": "mlflow-trials", "key": "username"}}}
    assert by_name["MLFLOW_TRACKING_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "mlflow-trials",
                                                                                "key": "password"}
    assert "value" not in by_name["MLFLOW_TRACKING_PASSWORD"]
