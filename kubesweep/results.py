"""One row per trial for `sweep results`: its cell, its outcome and the headline figures of its results file."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kubesweep.backends.base import Backend, TrialStatus
from kubesweep.tracking.records import dig

GIB = 1024**3


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


def _num(value: Any, scale: float = 1.0) -> float | None:
    return float(value) / scale if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def row_from(trial: TrialStatus, results: dict[str, Any] | None, config: dict[str, Any] | None = None) -> ResultRow:
    """Headline figures from a results file (schema: docs/results-schema.md)."""
    r = results or {}
    job = r.get("config") or dig(config, "job") or {}
    outcome = r.get("outcome") or (trial.outcome.value if trial.outcome else trial.phase.value.lower())
    inference = r.get("inference")
    if inference:
        rate, p50 = _num(inference.get("samples_per_s")), _num(dig(inference, "latency_s", "p50"))
    else:
        rate, p50 = _num(dig(r, "train", "samples_per_s")), _num(dig(r, "train", "step_time_s", "p50"))
    return ResultRow(
        trial=trial.name,
        gpu=trial.gpu,
        batch_size=job.get("batch_size", trial.axes.get("batch_size")),
        precision=job.get("precision", trial.axes.get("precision")),
        compile=job.get("compile", trial.axes.get("compile")),
        repeat=int(dig(r, "trial", "repeat") or 0),
        outcome=str(outcome),
        samples_per_s=rate,
        step_p50_ms=p50 * 1000 if p50 is not None else None,
        peak_mem_gib=_num(dig(r, "memory", "torch_peak_allocated_bytes"), GIB),
        accuracy=_num(r.get("final_accuracy")),
        train_s=_num(dig(r, "timings", "train_s")),
        warmup_s=_num(dig(r, "timings", "compile_warmup_s")),
        reason=trial.reason if trial.outcome and trial.outcome.value != "succeeded" else "",
    )


def rows_for(backend: Backend, sweep: str) -> list[ResultRow]:
    reader = getattr(backend, "results", None)
    if reader is None:
        return [row_from(t, None) for t in backend.status(sweep).trials]
    return [row_from(t, r) for t, r in reader(sweep)]
