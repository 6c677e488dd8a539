"""`python -m kubesweep.operator`'s start: it waits for the API server to serve the Sweep resource before kopf looks
for what to serve (kopf looks once; a replica that started before the chart's CRD was served would serve nothing).
The discovery itself (`client.crd_installed`) runs against the real control plane in tests/operator/. Its secrets
may come from files."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubesweep.backends.base import BackendError
from kubesweep.operator import __main__ as operator_main


def test_the_operator_waits_until_the_sweep_resource_is_served(monkeypatch: pytest.MonkeyPatch) -> None:
    replies: list[bool | Exception] = [BackendError("cannot reach the Kubernetes API"), False, True]
    asked: list[object] = []

    def served(api_client: object) -> bool:
        asked.append(api_client)
        reply = replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply

    monkeypatch.setattr(operator_main, "crd_installed", served)
    assert operator_main.wait_served("client", timeout=30, interval=0.01) is True
    assert asked == ["client"] * 3


def test_an_operator_that_never_sees_the_sweep_resource_gives_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(operator_main, "crd_installed", lambda api_client: False)
    assert operator_main.wait_served("client", timeout=0.05, interval=0.01) is False


def test_the_operators_secrets_come_from_files_when_named(tmp_path: Path) -> None:
    """The chart mounts the operator's MLflow password and ownership key as files (a value in the container's
    environment is seen by `kubectl exec ... env` and by every process started there): NAME_FILE gives NAME."""
    (tmp_path / "password").write_text("s3cret\n")
    (tmp_path / "key").write_text("k" * 32)
    env = {"MLFLOW_TRACKING_PASSWORD_FILE": str(tmp_path / "password"),
           "KUBESWEEP_MLFLOW_OWNERSHIP_KEY_FILE": str(tmp_path / "key")}
    assert operator_main.secrets_from_files(env) is None
    assert env["MLFLOW_TRACKING_PASSWORD"] == "s3cret" and env["KUBESWEEP_MLFLOW_OWNERSHIP_KEY"] == "k" * 32
    both = {"MLFLOW_TRACKING_PASSWORD": "a", "MLFLOW_TRACKING_PASSWORD_FILE": str(tmp_path / "password")}
    assert operator_main.secrets_from_files(both) == (
        "MLFLOW_TRACKING_PASSWORD and MLFLOW_TRACKING_PASSWORD_FILE are both set: give the secret one way")
    missing = {"MLFLOW_TRACKING_USERNAME_FILE": str(tmp_path / "nope")}
    assert operator_main.secrets_from_files(missing) == (
        f"MLFLOW_TRACKING_USERNAME_FILE: cannot read {tmp_path / 'nope'}: No such file or directory")
    assert operator_main.secrets_from_files({}) is None
