"""Starting a search, for every backend: the one place that turns a spec's `search` into the code that runs it.

The spec says whether its search is adaptive and which function runs it (`kubesweep.sweep_spec.SEARCH_RUNNERS`);
`run_search` imports that function and runs the search to its end. `sweep submit`/`sweep resume` call it in
their process (the session layer, `kubesweep.session`), the tuner Job calls it through `python -m kubesweep.tune`.

A search writes what it found to `<strategy>.json` in its storage and logs the same file as artifact
`<strategy>/<strategy>.json` of the sweep's parent MLflow run; `summary_names` lists where to look for it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kubesweep.sweep_spec import SEARCH_RUNNERS

REPEATS = "repeats"  # what sequential repeats write: repeats/repeats.json

if TYPE_CHECKING:
    from kubesweep.backends.base import Backend, SweepStatus
    from kubesweep.sweep_spec import Sweep
    from kubesweep.wire.env import TrackingEnv
    from kubesweep.wire.search import SearchSummary


class NoSearch(ValueError):
    """The sweep's strategy makes no trials while it runs (grid, random): there is no search to run."""


def run_search(sweep: Sweep, backend: Backend, *, storage: Path, tracking: TrackingEnv | None = None,
               progress: Callable[[SweepStatus], None] | None = None) -> SearchSummary:
    """Run (or continue, from the state under `storage`) the sweep's search to its end; what it found."""
    runner = sweep.spec.runner
    if runner is None:
        raise NoSearch(f"sweep {sweep.name!r} has no search to run (strategy {sweep.spec.search.strategy!r}, "
                       "a fixed number of repeats)")
    module, function = runner.split(":")
    run = getattr(importlib.import_module(module), function)
    summary: SearchSummary = run(sweep, backend, storage=storage, tracking=tracking, progress=progress)
    return summary


def summary_of(sweep: Sweep) -> str:
    """The name of what the sweep's search writes: its strategy, or `repeats` under sequential repeats."""
    return REPEATS if sweep.spec.repeat_rule is not None else sweep.spec.search.strategy


def summary_names(strategy: str | None = None) -> list[tuple[str, str]]:
    """(artifact folder, file name) of what a search found: the strategy's, or every adaptive strategy's when
    the strategy is not known."""
    strategies = [strategy] if strategy is not None else [*SEARCH_RUNNERS, REPEATS]
    return [(s, f"{s}.json") for s in strategies if s in SEARCH_RUNNERS or s == REPEATS]
