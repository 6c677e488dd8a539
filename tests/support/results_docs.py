"""Whole results documents (`kubesweep.wire.results.Results`) from the parts a test names: what a test does not
say is zero, null or empty, as a trial that did not get that far writes it (no steps, no evaluation, no energy)."""

from __future__ import annotations

from typing import Any

from kubesweep.wire.results import RESULTS_SCHEMA, Results

_PERCENTILES = {"p50": 0.0, "p90": 0.0, "p99": 0.0, "mean": 0.0, "n": 0}
_PARTS: dict[str, dict[str, Any]] = {
    "trial": {"sweep": "s", "trial_id": "t", "name": "t", "repeat": 0, "gpu": None, "gpu_product": None,
              "gpus_per_trial": 1},
    "timings": {"total_s": 1.0},
    "train": {"steps": 0, "target_steps": 0, "epochs_completed": 0.0, "samples": 0, "warmup_steps": 0,
              "warmup_time_s": 0.0, "measured_steps": 0, "measured_samples": 0, "measured_time_s": 0.0,
              "samples_per_s": None, "tokens_per_s": None, "padded_tokens_per_s": None, "step_time_s": None,
              "final_loss": None},
    "inference": {"batch_size": 1, "seq_len": 8, "dtype": "fp32", "compiled": False, "warmup_batches": 0,
                  "warmup_s": 0.0, "batches": 0, "latency_s": _PERCENTILES, "samples_per_s": 0.0,
                  "tokens_per_s": 0.0, "padded_tokens_per_s": 0.0},
    "energy": {"source": "nvml_total_energy", "measured_j": 0.0, "measured_s": 0.0, "measured_samples": 0,
               "j_per_sample": 0.0, "kwh_per_epoch": None, "mean_power_w": 0.0},
    "error": {"type": "Error", "message": ""},
    "gpu_lease": {"path": "/tmp/gpu.lock"},
}
_EVAL_POINT = {"epoch": 0.0, "step": 0, "accuracy": 0.0, "loss": 0.0, "samples": 0}
_PERCENTILE_FIELDS = ("step_time_s", "latency_s")


def _part(name: str, given: Any) -> Any:
    if not isinstance(given, dict) or name not in _PARTS:
        return given
    out = {**_PARTS[name], **given}
    for key in _PERCENTILE_FIELDS:
        if isinstance(out.get(key), dict):
            out[key] = {**_PERCENTILES, **out[key]}
    return out


def results_doc(**parts: Any) -> dict[str, Any]:
    """A whole results document as JSON values: `parts` over a succeeded CUDA trial that measured nothing."""
    doc: dict[str, Any] = {"schema": RESULTS_SCHEMA, "outcome": "succeeded", "exit_code": 0, "trial": _PARTS["trial"],
                           "config": {}, "device": "cuda", "started_at": "2026-11-26T00:00:00+00:00",
                           "finished_at": "2026-11-26T00:00:01+00:00", "timings": _PARTS["timings"]}
    for name, given in parts.items():
        doc[name] = _part(name, given)
    if isinstance(doc.get("eval"), list):
        doc["eval"] = [{**_EVAL_POINT, **p} for p in doc["eval"]]
    return doc


def make_results(**parts: Any) -> Results:
    """`results_doc(**parts)`, validated."""
    return Results.model_validate(results_doc(**parts))


GIB = 1024**3


def trial_parts(rate: float = 1000.0, *, accuracy: float = 0.91, train_s: float = 120.0, epochs: float = 3,
                **extra: Any) -> dict[str, Any]:
    """The parts of a succeeded GPU trial's results that the metrics read (samples/s, step p50, peak memory,
    accuracy, energy, train time), for `make_results(**...)`; `extra` adds or replaces parts."""
    return {"outcome": "succeeded", "device": "cuda", "world_size": 1,
            "train": {"samples_per_s": rate, "step_time_s": {"p50": 0.05}, "epochs_completed": epochs,
                      "steps": 100, "warmup_steps": 3, "warmup_time_s": 10.0},
            "memory": {"torch_peak_allocated_bytes": 6 * GIB}, "final_accuracy": accuracy,
            "energy": {"j_per_sample": 0.5, "kwh_per_epoch": 0.0093},
            "timings": {"train_s": train_s}, **extra}


def monitor(busy: float | None, samples: int = 20) -> dict[str, Any]:
    """One GPU's NVML summary whose measured steps kept it `busy` percent of the time."""
    return {"interval_s": 0.25, "devices": [
        {"index": 0, "samples": samples + 10, "utilization_mean_pct": 30.0, "utilization_max_pct": 100.0,
         "power_mean_w": None, "power_max_w": None, "temperature_max_c": None, "memory_used_max_bytes": 1,
         "process_memory_max_bytes": None, "measured_samples": samples, "utilization_measured_pct": busy}]}
