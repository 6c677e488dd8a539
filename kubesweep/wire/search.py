"""What a search found: the summary each adaptive search writes (`<strategy>.json` under its storage, and artifact
`<strategy>/<strategy>.json` of the sweep's parent MLflow run), read back by `sweep submit`, `sweep results`, the
report and the tuner Job.

- `tune.json` (`TuneSummary`): every trial's last report, the best trial and, for several metrics, the Pareto front.
- `max_batch.json` (`MaxBatchSummary`): per cell (GPU type x precision x other axes), the largest batch that fits.
- `repeats.json` (`RepeatsSummary`): the sequential repeats rule and, per cell, the repeats it got and why it stopped.

The JSON shape is the one these files have always had (a tune summary carries no `strategy` key); `read_summary`
tells them apart and raises `SummaryError`, one line naming the file and the field, for a file of another shape.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

Number = Annotated[int | float, Field(union_mode="smart")]  # as written: an integer stays one


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class SummaryError(ValueError):
    """A stored search summary of the wrong shape (one line: where it was read, the field, what was expected)."""


class TuneTrial(_Model):
    trial_id: str
    name: str
    axes: dict[str, Any] = Field(description="the trial's axis values, as the search suggested them")
    outcome: str = Field(description="the trial's outcome, or `unknown`")
    metrics: dict[str, Number | None] = Field(description="the final value of each of the search's metrics")
    feasible: bool = Field(description="it succeeded, measured every metric and broke no constraint")
    violations: str = Field(description="the constraints it broke and the metrics it lacked, `; `-separated")
    reports: int | None = Field(description="intermediate reports the trial made to the searcher")


class TuneSummary(_Model):
    sweep: str
    metrics: list[str]
    modes: list[Literal["max", "min"]]
    trials: list[TuneTrial]
    best: TuneTrial | None
    pareto: list[TuneTrial] = Field(default_factory=list)
    resumed: bool = False


class Probe(_Model):
    batch_size: int
    outcome: str | None
    trial: str


class MaxBatchCell(_Model):
    gpu: str | None
    precision: str
    axes: dict[str, Any]
    max_batch: int | None = Field(description="the largest batch size that fitted (null: none did)")
    smallest_oom: int | None = Field(description="the smallest that ran out of memory (null: none did)")
    low: int | None
    high: int | None
    probes: int
    history: list[Probe]
    error: str = Field(description="why the cell's search stopped early (a probe that neither fitted nor ran out "
                                   "of memory); empty when it did not")


class MaxBatchSummary(_Model):
    sweep: str
    strategy: Literal["max_batch"] = "max_batch"
    cells: list[MaxBatchCell]


class RepeatRule(_Model):
    min: int
    max: int
    target: float = Field(description="the 95% half-width, in percent of the mean, that stops a cell")
    metric: str


Stopped = Literal["reached", "max", "no value", "host-bound"]


class RepeatsCell(_Model):
    axes: dict[str, Any]
    task: str
    gpu: str | None
    repeats: int
    ended: int
    values: int = Field(description="repeats that measured the metric")
    mean: float | None
    half_width_pct: float | None
    stopped: Stopped | None = Field(description="why it was repeated no more (null: the sweep ended first)")
    trials: list[str]


class RepeatsSummary(_Model):
    sweep: str
    strategy: Literal["repeats"] = "repeats"
    rule: RepeatRule
    repeats: int = Field(description="repeats run in all")
    fixed_min: int = Field(description="what a fixed `min` repeats of every cell would have run")
    fixed_max: int = Field(description="what a fixed `max` repeats of every cell would have run")
    at_max: int = Field(description="cells stopped at `max` without reaching the target")
    cells: list[RepeatsCell]


SearchSummary = TuneSummary | MaxBatchSummary | RepeatsSummary


def read_summary(data: object, where: str) -> SearchSummary:
    """The summary `data` (as read from JSON) holds; `where` names it in the error."""
    if not isinstance(data, dict):
        raise SummaryError(f"{where}: not a search summary (expected a JSON object, got {type(data).__name__})")
    strategy = data.get("strategy")
    model: type[SearchSummary] = (RepeatsSummary if strategy == "repeats" else
                                  MaxBatchSummary if strategy == "max_batch" or "cells" in data else TuneSummary)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "(top)"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise SummaryError(f"{where}: not a valid {model.__name__} at {field}: {first['msg']}{more}") from None


def summary_json(summary: SearchSummary) -> str:
    """The summary as its file holds it."""
    return json.dumps(summary.model_dump(mode="json"), indent=2) + "\n"
