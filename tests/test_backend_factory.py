"""`make_backend`: a backend by name, its SDK imported only when that backend is asked for."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubesweep.backend_factory import BACKENDS, make_backend
from kubesweep.backends.base import BackendError
from kubesweep.backends.local import LocalBackend


def test_a_backend_by_name(tmp_path: Path) -> None:
    backend = make_backend("local", home=tmp_path, cpu_slots=2)
    assert isinstance(backend, LocalBackend)
    assert BACKENDS == ("local", "kubernetes")
    with pytest.raises(BackendError, match="unknown backend 'slurm'; expected one of local, kubernetes"):
        make_backend("slurm")
