"""The spec's typed distributions as a Ray Tune search space, and a suggestion back as axis values."""

from __future__ import annotations

import math
from typing import Any

from kubesweep.sweep_spec import Distribution, TuneSearch, axis_is_int


def ray_space(search: TuneSearch) -> dict[str, Any]:
    """axis -> a Ray Tune domain (grid: `grid_search` over choice values)."""
    from ray import tune

    space: dict[str, Any] = {}
    for axis, dist in search.space.items():
        space[axis] = _domain(tune, axis, dist, grid=search.algorithm == "grid")
    return space


def _domain(tune: Any, axis: str, d: Distribution, *, grid: bool) -> Any:
    if d.type == "choice":
        values = list(d.values or [])
        return tune.grid_search(values) if grid else tune.choice(values)
    assert d.low is not None and d.high is not None
    whole = axis_is_int(axis)
    if d.type == "uniform":
        return tune.uniform(d.low, d.high)
    if d.type == "loguniform":
        return tune.loguniform(d.low, d.high)
    if d.type == "randint":
        return tune.randint(int(d.low), int(d.high))
    assert d.q is not None
    if d.type == "quniform":
        return tune.qrandint(int(d.low), int(d.high), int(d.q)) if whole else tune.quniform(d.low, d.high, d.q)
    return tune.qlograndint(int(d.low), int(d.high), int(d.q)) if whole else tune.qloguniform(d.low, d.high, d.q)


def axes_from_config(search: TuneSearch, config: dict[str, Any]) -> dict[str, Any]:
    """A suggestion as axis values of the right types (integers for integer axes), in the space's order."""
    axes: dict[str, Any] = {}
    for axis in search.space:
        value = config[axis]
        if hasattr(value, "item"):  # numpy scalars
            value = value.item()
        if isinstance(value, float) and axis_is_int(axis):
            value = round(value)
        elif isinstance(value, float):
            value = float(f"{value:.6g}") if math.isfinite(value) else value
        axes[axis] = value
    return axes
