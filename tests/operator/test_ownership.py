"""The operator's seal on the experiments it makes for namespaces: good for one experiment id and one namespace,
made only with the operator's key; and an operator with namespace users and no key does not start."""

from __future__ import annotations

import pytest

from kubesweep.operator import ownership
from kubesweep.operator.__main__ import OWNERSHIP_KEY_ENV, main

KEY = b"a-key-of-thirty-two-bytes-012345"


def test_a_seal_is_good_for_its_own_experiment_and_namespace_only() -> None:
    tags: dict[str, str | None] = {ownership.NAMESPACE_TAG: "team-b", ownership.SEAL_TAG: ownership.seal(KEY, "7",
                                                                                                          "team-b")}
    assert ownership.sealed_for(KEY, "7", "team-b", tags) and ownership.owner(KEY, "7", tags) == "team-b"
    assert not ownership.sealed_for(KEY, "8", "team-b", tags)  # copied onto another experiment
    assert not ownership.sealed_for(KEY, "7", "team-a", tags)  # claimed for another namespace
    assert ownership.owner(KEY, "7", {**tags, ownership.NAMESPACE_TAG: "team-a"}) is None  # retagged
    assert not ownership.sealed_for(b"another-key-of-32-bytes-01234567", "7", "team-b", tags)  # not the operator's
    assert not ownership.sealed_for(KEY, "7", "team-b", {ownership.NAMESPACE_TAG: "team-b"})  # no seal
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
