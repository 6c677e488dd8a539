"""One row per trial for `sweep results --per-trial`: its cell, its outcome, and its value of every metric of the
catalogue (`kubesweep.wire.metrics`), read by each metric's own definition; which of them the row shows, and in
which order, is the column catalogue's (`kubesweep.tracking.columns.trial_columns`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kubesweep.gpus import Catalog, load_catalog
from kubesweep.tracking.aggregate import gpu_type
from kubesweep.tracking.columns import TrialColumn, trial_columns
from kubesweep.tracking.records import TrialRecord
from kubesweep.wire.config import ANY_GPU, CPU
from kubesweep.wire.flags import finite
from kubesweep.wire.trial_metrics import DEFAULT_TARGET_ACCURACY, gpu_product, trial_metrics


@dataclass
class ResultRow:
    trial: str
    gpu: str | None
    batch_size: int | None
    precision: str | None
    compile: Any
    repeat: int
    outcome: str
    metrics: dict[str, float | None] = field(default_factory=dict)  # metric name -> value (absent: None)
    train_s: float | None = None
    reason: str = ""

    def value(self, column: TrialColumn) -> Any:
        """The row's value in a per-trial column: a metric's, else its field's."""
        if column.kind == "metric":
            return self.metrics.get(column.key)
        return getattr(self, column.key)

    def as_dict(self) -> dict[str, Any]:
        """Each per-trial column's value by its key, then the reason."""
        return {**{c.key: self.value(c) for c in trial_columns()}, "reason": self.reason}


def row_of(record: TrialRecord, catalog: Catalog | None = None) -> ResultRow:
    """A trial's row from its record (`kubesweep.tracking.records`: results files or MLflow, as `sweep results`
    reads them); priced and held against its peak by the catalog (default: `load_catalog()`). A trial that did not
    succeed shows what its results file measured before it ended (an OOM's peak memory)."""
    results, job = record.results, record.job
    catalog = catalog or load_catalog()
    price, peak = catalog.price_and_peak(gpu_type(record, catalog), job.precision)
    metrics = trial_metrics(results, "succeeded", gpus=record.gpus, price_per_hour=price,
                            target=DEFAULT_TARGET_ACCURACY, peak_tflops=peak)
    return ResultRow(
        trial=record.name, gpu=record.gpu or gpu_product(results) or (CPU if record.gpus == 0 else ANY_GPU),
        batch_size=job.batch_size, precision=job.precision, compile=job.compile, repeat=record.repeat,
        outcome=record.outcome, metrics=metrics,
        train_s=finite(results.timings.train_s) if results is not None else None,
        reason=record.reason if record.outcome != "succeeded" else "",
    )
