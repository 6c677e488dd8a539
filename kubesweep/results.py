"""One row per trial for `sweep results`: its cell, its outcome and the headline figures of its results file."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kubesweep.gpus import Catalog, load_catalog
from kubesweep.tracking.aggregate import gpu_type
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
    samples_per_s: float | None = None
    step_p50_ms: float | None = None
    peak_mem_gib: float | None = None
    accuracy: float | None = None
    train_s: float | None = None
    warmup_s: float | None = None
    tflops_per_s: float | None = None
    mfu_pct: float | None = None
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def row_of(record: TrialRecord, catalog: Catalog | None = None) -> ResultRow:
    """A trial's row from its record (`kubesweep.tracking.records`: results files or MLflow, as `sweep results`
    reads them); its MFU against the catalog's peak (default: `load_catalog()`)."""
    results, job = record.results, record.job
    catalog = catalog or load_catalog()
    _, peak = catalog.price_and_peak(gpu_type(record, catalog), job.precision)
    metrics = trial_metrics(results, "succeeded", gpus=record.gpus, price_per_hour=None,
                            target=DEFAULT_TARGET_ACCURACY, peak_tflops=peak)
    return ResultRow(
        trial=record.name, gpu=record.gpu or gpu_product(results) or (CPU if record.gpus == 0 else ANY_GPU),
        batch_size=job.batch_size,
        precision=job.precision, compile=job.compile,
        repeat=record.repeat, outcome=record.outcome, samples_per_s=metrics["samples_per_s"],
        step_p50_ms=metrics["step_p50_ms"],
        peak_mem_gib=metrics["peak_mem_gib"],
        accuracy=metrics["accuracy"], train_s=finite(results.timings.train_s) if results is not None else None,
        warmup_s=metrics["warmup_s"], tflops_per_s=metrics["tflops_per_s"], mfu_pct=metrics["mfu_pct"],
        reason=record.reason if record.outcome != "succeeded" else "",
    )

