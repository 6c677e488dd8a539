"""Where a sweep is tracked (`kubesweep.tracking.target.resolve`): flag, then MLFLOW_TRACKING_URI, then the spec,
then the local store; off when asked, and off for a cluster backend without a URI."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubesweep.tracking.target import (
    LOCAL_ARTIFACTS,
    URI_ENV,
    artifact_dir,
    local_store_uri,
    resolve,
    sqlite_path,
)


@pytest.fixture(autouse=True)
def _no_env_uri(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(URI_ENV, raising=False)


def test_first_match_wins_flag_env_spec_local_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def target(**kw: str):  # type: ignore[no-untyped-def]
        return resolve(experiment="exp", home=tmp_path, require_mlflow=False, **kw)

    local = target()
    assert (local.uri, local.source) == (local_store_uri(tmp_path), "local store")
    assert local.uri == f"sqlite:///{(tmp_path / 'mlflow.db').resolve()}"
    assert local.artifact_root == tmp_path / LOCAL_ARTIFACTS and local.enabled
    assert (target(spec_uri="http://spec:5000").uri, target(spec_uri="http://spec:5000").source) == \
        ("http://spec:5000", "spec tracking.uri")
    monkeypatch.setenv(URI_ENV, "http://env:5000")
    assert (target(spec_uri="http://spec:5000").uri, target().source) == ("http://env:5000", URI_ENV)
    flagged = target(flag="http://flag:5000", spec_uri="http://spec:5000")
    assert (flagged.uri, flagged.source, flagged.artifact_root) == ("http://flag:5000", "--tracking-uri", None)
    assert "MLflow at http://flag:5000 (from --tracking-uri), experiment 'exp'" in flagged.describe()
    monkeypatch.setenv(URI_ENV, "")  # an empty variable is no URI
    assert target().source == "local store"


def test_off_when_disabled_and_for_a_cluster_backend_without_a_uri(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    off = resolve(experiment="e", home=tmp_path, flag="http://flag:5000", disabled=True, require_mlflow=False)
    assert not off.enabled and off.source == "off" and "--no-tracking" in off.describe()
    cluster = resolve(experiment="e", home=tmp_path, backend="kubernetes", runs_here=False, require_mlflow=False)
    assert not cluster.enabled and "no tracking URI for the kubernetes backend" in cluster.off_reason
    monkeypatch.setenv(URI_ENV, "http://mlflow.ns:5000")
    assert resolve(experiment="e", home=tmp_path, backend="kubernetes", runs_here=False, require_mlflow=False).uri == \
        "http://mlflow.ns:5000"


def test_artifact_roots_of_file_based_stores(tmp_path: Path) -> None:
    db = tmp_path / "elsewhere" / "runs.db"
    sqlite = resolve(experiment="e", home=tmp_path, flag=f"sqlite:///{db}", require_mlflow=False)
    assert sqlite.artifact_root == db.parent / LOCAL_ARTIFACTS  # beside the database
    assert resolve(experiment="e", home=tmp_path, flag=f"file://{tmp_path}/mlruns",
                   require_mlflow=False).artifact_root is None  # a file store keeps them itself
    assert resolve(experiment="e", home=tmp_path, flag="./mlruns", require_mlflow=False).artifact_root is None
    assert sqlite_path(f"sqlite:///{db}") == db.resolve()
    assert sqlite_path("http://mlflow:5000") is None and sqlite_path("sqlite://") is None
    assert artifact_dir(tmp_path, "bert / sweep #1") == tmp_path / "bert_sweep_1"
    assert artifact_dir(tmp_path, "...") == tmp_path / "experiment"


def test_without_mlflow_tracking_is_off_unless_not_required(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kubesweep.tracking import target

    monkeypatch.setattr(target, "mlflow_installed", lambda: False)  # as on a machine without the extra
    off = resolve(experiment="e", home=tmp_path)
    assert not off.enabled and "pip install 'kubesweep[tracking]'" in off.off_reason
    assert resolve(experiment="e", home=tmp_path, require_mlflow=False).enabled
