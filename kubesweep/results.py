"""One row per trial for `sweep results`: its cell, its outcome and the headline figures of its results file."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kubesweep.backends.base import Backend, TrialStatus
from kubesweep.tracking.records import axes_job, results_from_data
from kubesweep.wire.flags import finite
from kubesweep.wire.results import Results
from kubesweep.wire.trial_metrics import DEFAULT_TARGET_ACCURACY, GIB, trial_metrics


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
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def row_from(trial: TrialStatus, results: Results | None, config: dict[str, Any] | None = None) -> ResultRow:
    """Headline figures from a results file (schema: docs/results-schema.md); without one, the cell from the
    trial file's settings (`config`) or the trial's axes and the outcome from the backend."""
    job = results.config if results is not None else axes_job(trial.axes, (config or {}).get("job"))
    outcome = results.outcome.value if results is not None else _outcome_of(trial)
    metrics = trial_metrics(results, "succeeded", gpus=1, price_per_hour=None, target=DEFAULT_TARGET_ACCURACY)
    train_s = finite(results.timings.train_s) if results is not None else None
    return ResultRow(
        trial=trial.name,
        gpu=trial.gpu,
        batch_size=job.batch_size,
        precision=job.precision,
        compile=job.compile,
        repeat=results.trial.repeat if results is not None else 0,
        outcome=outcome,
        samples_per_s=metrics["samples_per_s"],
        step_p50_ms=metrics["step_p50_ms"],
        peak_mem_gib=_gib(results.memory.torch_peak_allocated_bytes) if results is not None else None,
        accuracy=metrics["accuracy"],
        train_s=train_s,
        warmup_s=metrics["warmup_s"],
        reason=trial.reason if trial.outcome and trial.outcome.value != "succeeded" else "",
    )


def _gib(value: int | None) -> float | None:
    return value / GIB if value is not None else None


def _outcome_of(trial: TrialStatus) -> str:
    return trial.outcome.value if trial.outcome else trial.phase.value.lower()


def rows_for(backend: Backend, sweep: str) -> list[ResultRow]:
    reader = getattr(backend, "results", None)
    if reader is None:
        return [row_from(t, None) for t in backend.status(sweep).trials]
    return [row_from(t, results_from_data(r)) for t, r in reader(sweep)]
