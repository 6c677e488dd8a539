"""The operator's seal on the experiments it makes for namespaces: good for one experiment id and one namespace,
made only with the operator's key; and an operator with namespace users and no key does not start."""

from __future__ import annotations

import pytest

from kubesweep.operator import ownership
from kubesweep.operator.__main__ import OWNERSHIP_KEY_ENV, main
from kubesweep.wire import tags

KEY = b"a-key-of-thirty-two-bytes-012345"


def test_a_seal_is_good_for_its_own_experiment_and_namespace_only() -> None:
    sealed: dict[str, str | None] = {tags.NAMESPACE: "team-b", tags.OWNER_SEAL: ownership.seal(KEY, "7", "team-b")}
    assert ownership.sealed_for(KEY, "7", "team-b", sealed) and ownership.owner(KEY, "7", sealed) == "team-b"
    assert not ownership.sealed_for(KEY, "8", "team-b", sealed)  # copied onto another experiment
    assert not ownership.sealed_for(KEY, "7", "team-a", sealed)  # claimed for another namespace
    assert ownership.owner(KEY, "7", {**sealed, tags.NAMESPACE: "team-a"}) is None  # retagged
    assert not ownership.sealed_for(b"another-key-of-32-bytes-01234567", "7", "team-b", sealed)  # not the operator's
    assert not ownership.sealed_for(KEY, "7", "team-b", {tags.NAMESPACE: "team-b"})  # no seal
    # the parts are kept apart: experiment "7" of namespace "1-a" is not experiment "71" of namespace "-a"
    assert ownership.seal(KEY, "7", "1-a") != ownership.seal(KEY, "71", "-a")
    with pytest.raises(ownership.OwnershipKeyError):
        ownership.seal(b"short", "7", "team-b")


def test_the_operator_with_namespace_users_needs_the_key(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(OWNERSHIP_KEY_ENV, raising=False)
    assert main(["--namespace", "team-a", "--mlflow-namespace-user-prefix", "kubesweep-ns-"]) == 2
    assert OWNERSHIP_KEY_ENV in capsys.readouterr().err
    monkeypatch.setenv(OWNERSHIP_KEY_ENV, "too-short")
    assert main(["--namespace", "team-a", "--mlflow-namespace-user-prefix", "kubesweep-ns-"]) == 2
