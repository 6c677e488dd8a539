"""`backend_factory`: a backend by name from its typed configuration, its SDK imported only when that backend is
asked for; what a configuration declares (the class it makes) read without making one."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubesweep.backend_factory import (
    BACKENDS,
    REGISTRY,
    Flags,
    KubernetesConfig,
    LocalConfig,
    configure,
    make_backend,
)
from kubesweep.backends.base import BackendError
from kubesweep.backends.kubernetes import KubernetesBackend
from kubesweep.backends.local import LocalBackend
from kubesweep.operator.client import SweepClient
from kubesweep.wire.env import TrackingEnv


def test_a_backend_by_name(tmp_path: Path) -> None:
    config = configure("local", Flags(home=tmp_path, parallel=2, namespace="ignored"))
    assert config == LocalConfig(home=tmp_path, cpu_slots=2)
    tracking = TrackingEnv("http://mlflow:5000", "e", "run1")
    backend = make_backend(config, tracking)
    assert isinstance(backend, LocalBackend) and isinstance(backend, config.kind())
    assert backend.cpu_slots == 2 and backend.tracking == tracking and backend.store.home == tmp_path
    assert BACKENDS == ("local", "kubernetes") == tuple(REGISTRY)
    assert all(REGISTRY[name].name == name for name in BACKENDS)
    with pytest.raises(BackendError, match="unknown backend 'slurm'; expected one of local, kubernetes"):
        configure("slurm")


def test_what_a_configuration_declares_is_read_without_reaching_anything() -> None:
    """Where a search runs and whether a cluster is asked are read from the class a configuration makes, before
    any backend is made (no cluster is reached here)."""
    operator = configure("kubernetes", Flags(namespace="team", allow_unpinned=True))
    assert operator == KubernetesConfig(namespace="team", allow_unpinned=True)
    assert operator.kind() is SweepClient and not operator.kind().driven_by_waiter
    direct = configure("kubernetes", Flags(direct=True))
    assert direct.kind() is KubernetesBackend and direct.kind().driven_by_waiter
    local = configure("local")
    assert local.kind() is LocalBackend and local.kind().runs_here and local.kind().keeps_results
    assert not local.asks_cluster and operator.asks_cluster and direct.asks_cluster
    assert not any(k.runs_here or k.keeps_results for k in (operator.kind(), direct.kind()))
