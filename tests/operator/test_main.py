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


def test_a_uid_the_image_does_not_list_still_starts_the_operator(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    """The chart runs the operator as uid 65532, which an image need not list in /etc/passwd (the GPU node's image
    does not; a platform that assigns random uids never does). kopf names a replica from the password database
    unless it is given an identity: the operator gives it its own, so the lookup that failed is never made."""
    import getpass
    import json

    import kopf

    def no_such_user() -> str:
        raise KeyError("getpwuid(): uid not found: 65532")

    ran: dict[str, object] = {}
    monkeypatch.setattr(getpass, "getuser", no_such_user)
    monkeypatch.setattr(kopf, "run", lambda **kwargs: ran.update(kwargs))
    monkeypatch.setattr(operator_main, "crd_installed", lambda api_client: True)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u", "namespace": "ml-team"}}]}))
    for name in ("KUBESWEEP_WATCH_NAMESPACES", "KUBECONFIG"):
        monkeypatch.delenv(name, raising=False)
    assert operator_main.main(["--namespace", "ml-team", "--kubeconfig", str(kubeconfig),
                               "--identity", "kubesweep-operator-abc12"]) == 0
    assert ran["identity"] == "kubesweep-operator-abc12" and ran["standalone"] is True
