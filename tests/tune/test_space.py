"""The search space (`kubesweep.tune.space`): suggestions as typed axis values, and the space given to Ray."""

from __future__ import annotations

import pytest

from kubesweep.sweep_spec import TuneSearch
from kubesweep.tune.space import axes_from_config


def test_suggestions_become_typed_axis_values() -> None:
    search = TuneSearch.model_validate({"strategy": "tune", "space": {
        "batch_size": {"type": "quniform", "low": 8, "high": 64, "q": 8},
        "learning_rate": {"type": "loguniform", "low": 1e-5, "high": 1e-3},
        "compile": {"type": "choice", "values": [False, "default"]}}})
    axes = axes_from_config(search, {"compile": False, "learning_rate": 0.000123456789, "batch_size": 24.0})
    assert axes == {"batch_size": 24, "learning_rate": 0.000123457, "compile": False}
    assert list(axes) == ["batch_size", "learning_rate", "compile"]


def test_ray_space_types() -> None:
    pytest.importorskip("ray")
    from kubesweep.tune.space import ray_space

    search = TuneSearch.model_validate({"strategy": "tune", "algorithm": "grid", "space": {
        "precision": {"type": "choice", "values": ["fp32", "bf16"]}}})
    assert ray_space(search) == {"precision": {"grid_search": ["fp32", "bf16"]}}
    search = TuneSearch.model_validate({"strategy": "tune", "space": {
        "batch_size": {"type": "qloguniform", "low": 8, "high": 256, "q": 8},
        "warmup_ratio": {"type": "uniform", "low": 0, "high": 0.2}}})
    space = ray_space(search)
    assert type(space["batch_size"].sampler).__name__ == "Quantized"
    assert all(8 <= space["batch_size"].sample() <= 256 for _ in range(20))
    assert all(isinstance(space["batch_size"].sample(), int) for _ in range(5))


