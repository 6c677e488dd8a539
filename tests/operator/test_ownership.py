"""The operator's seal on the experiments it makes for namespaces: good for one experiment (its id and creation time)
and one namespace, made only with the operator's key; and an operator with namespace users and no key does not
start."""

from __future__ import annotations

import pytest

from kubesweep.operator import ownership
from kubesweep.operator.__main__ import OWNERSHIP_KEY_ENV, main
from kubesweep.wire import tags

KEY = b"a-key-of-thirty-two-bytes-012345"


def test_a_seal_is_good_for_its_own_experiment_and_namespace_only() -> None:
    seven = ownership.Identity("7", 1_700_000_000_000)
    sealed: dict[str, str | None] = {tags.NAMESPACE: "team-b", tags.OWNER_SEAL: ownership.seal(KEY, seven, "team-b")}
    assert ownership.sealed_for(KEY, seven, "team-b", sealed) and ownership.owner(KEY, seven, sealed) == "team-b"
    assert not ownership.sealed_for(KEY, ownership.Identity("8", seven.created_ms), "team-b", sealed)  # copied
    # the id made again (a store that reuses ids): another experiment, whose seal the copied one is not
    assert not ownership.sealed_for(KEY, ownership.Identity("7", seven.created_ms + 1), "team-b", sealed)
    assert not ownership.sealed_for(KEY, seven, "team-a", sealed)  # claimed for another namespace
    assert ownership.owner(KEY, seven, {**sealed, tags.NAMESPACE: "team-a"}) is None  # retagged
    assert not ownership.sealed_for(b"another-key-of-32-bytes-01234567", seven, "team-b", sealed)  # not the operator's
    assert not ownership.sealed_for(KEY, seven, "team-b", {tags.NAMESPACE: "team-b"})  # no seal
    # the parts are kept apart: experiment "7" of namespace "1-a" is not experiment "71" of namespace "-a"
    assert ownership.seal(KEY, seven, "1-a") != ownership.seal(KEY, ownership.Identity("71", seven.created_ms), "-a")
    with pytest.raises(ownership.OwnershipKeyError):
        ownership.seal(b"short", seven, "team-b")
    # MLflow's description of an experiment: its creation time is what tells an id made again apart
    assert ownership.Identity.of({"experiment_id": "7", "creation_time": 1_700_000_000_000}) == seven
    assert ownership.Identity.of({"experiment_id": "7", "creation_time": "1700000000000"}) == seven
    for missing in ({"experiment_id": "7"}, {"experiment_id": "7", "creation_time": 0},
                    {"experiment_id": "7", "creation_time": "soon"}, {"creation_time": 1}):
        assert ownership.Identity.of(missing) is None, missing


def test_the_operator_with_namespace_users_needs_the_key(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(OWNERSHIP_KEY_ENV, raising=False)
    assert main(["--namespace", "team-a", "--mlflow-namespace-user-prefix", "kubesweep-ns-"]) == 2
    assert OWNERSHIP_KEY_ENV in capsys.readouterr().err
    monkeypatch.setenv(OWNERSHIP_KEY_ENV, "too-short")
    assert main(["--namespace", "team-a", "--mlflow-namespace-user-prefix", "kubesweep-ns-"]) == 2
