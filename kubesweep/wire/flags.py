"""A trial's flags: what a reader must know beside its numbers (`OOM`, `GPU mismatch`, `failed`, `chance accuracy
(0.51)`, `random init: accuracy not meaningful`, `host-bound (99% issuing)`). One set of names and rules for the
job's MLflow run (its flags tag and description), `sweep results`, the report and the MLflow runs view."""

from __future__ import annotations

import math

from kubesweep.wire import tags
from kubesweep.wire.config import JobConfig
from kubesweep.wire.results import Results

# an outcome or a phase as the tables write it
OUTCOME_TEXT = {"oom": "OOM", "gpu_mismatch": "GPU mismatch", "failed": "failed", "skipped": "skipped",
                "cancelled": "cancelled", "stopped": "stopped", "pending": "pending", "running": "running",
                "unschedulable": "unschedulable"}
FLAGGED = ("oom", "gpu_mismatch", "failed", "unschedulable")  # the outcomes that are a flag of their own
CHANCE_ACCURACY = 0.5  # SST-2: two balanced classes
CHANCE_MARGIN = 0.05
RANDOM_INIT = "random init: accuracy not meaningful"
# An inference batch on a GPU whose issuing took at least this share of its latency measured the host's kernel
# launches, not the GPU (kubesweep/jobs/inference.py; eager bert-base at batch 8 on an H100: 0.77-0.99).
HOST_BOUND_SHARE = 0.5
# A training run whose GPU ran kernels less than this share of its measured steps' time (NVML, the samples inside
# the measured window; at least GPU_BUSY_SAMPLES of them) waited for its host: data loading, Python, launches.
# On an H100, bert-base at batch 256, bf16, bucketed: eager 35-40% (36-44 ms a step), as one CUDA graph 62-65%
# (14.8 ms); inference at batch 8: eager 21-22%, replayed 95%.
GPU_BUSY_BOUND_PCT = 50.0
GPU_BUSY_SAMPLES = 3


# The physics check: a figure above what the GPU can do is a measurement error (a clock that missed work, FLOPs
# counted for work that did not run), never a result: above the machine's own GEMM probe at the same precision
# (square 8192 matmuls, the easiest dense work there is), or above this share of the data sheet's dense peak (the
# peak is the tensor cores' at their boost clock; a whole model's steps, with their attention, norms and launches,
# do not come within 5% of it).
PHYSICS_PROBE_SHARE = 1.0
PHYSICS_PEAK_SHARE = 0.95


def physics_error(tflops: float | None, mfu_pct: float | None, mfu_probe_pct: float | None) -> str | None:
    """`measurement error: ...` with the numbers, where a trial's achieved TFLOP/s are above its GPUs' GEMM probe
    (`mfu_probe_pct` > 100) or above PHYSICS_PEAK_SHARE of their dense peak (`mfu_pct` > 95); else None."""
    if tflops is None:
        return None
    if mfu_probe_pct is not None and mfu_probe_pct > 100 * PHYSICS_PROBE_SHARE:
        return (f"measurement error: {tflops:,.0f} TFLOP/s is {mfu_probe_pct:.0f}% of the GPU's GEMM probe "
                f"({100 * tflops / mfu_probe_pct:,.0f} TFLOP/s)")
    if mfu_pct is not None and mfu_pct > 100 * PHYSICS_PEAK_SHARE:
        return (f"measurement error: {tflops:,.0f} TFLOP/s is {mfu_pct:.0f}% of the dense peak "
                f"({100 * tflops / mfu_pct:,.0f} TFLOP/s; above {PHYSICS_PEAK_SHARE:.0%} is not reached)")
    return None


def finite(value: float | None) -> float | None:
    """`value` where it is a finite number (a diverged run writes NaN), else None."""
    return float(value) if value is not None and math.isfinite(value) else None


def final_accuracy(results: Results | None) -> float | None:
    return finite(results.final_accuracy) if results is not None else None


def at_chance(results: Results | None) -> bool:
    """Its final accuracy is at chance: the training did not learn."""
    accuracy = final_accuracy(results)
    return accuracy is not None and accuracy <= CHANCE_ACCURACY + CHANCE_MARGIN


def random_init(job: JobConfig | None) -> bool:
    """A model built from its config, untrained: a speed run, whose accuracy says nothing about the recipe."""
    return job is not None and job.random_init


def chance_flag(accuracy: float) -> str:
    return f"chance accuracy ({accuracy:.2f})"


def host_bound_share(results: Results | None) -> float | None:
    """The share of its inference batches' latency the host spent issuing them (GPU runs only), where it is at
    least HOST_BOUND_SHARE: the figure is the host's."""
    inference = results.inference if results is not None else None
    share = finite(inference.host_share) if inference is not None else None
    return share if share is not None and share >= HOST_BOUND_SHARE else None


def host_bound_flag(share: float) -> str:
    return f"host-bound ({share:.0%} issuing)"


def window_holds_unmeasured_time(results: Results) -> bool:
    """The training run's measured window (`measured_from`..`measured_until`, less its pauses) is longer than its
    measured steps by more than a sample interval and a tenth: NVML's samples inside it read other work too. A
    job before the window began at the first measured step wrote windows that held the warm-up (torch.compile,
    graph capture): bert-base compiled at batch 256, 16.6 s of window for 3.8 s of steps."""
    train, monitor = results.train, results.gpu_monitor
    if train is None or monitor is None:
        return False
    start, end, measured = finite(train.measured_from), finite(train.measured_until), finite(train.measured_time_s)
    if start is None or end is None or not measured:
        return False
    window = end - start - sum(b - a for a, b in train.measured_pauses or [])
    return window - measured > max(monitor.interval_s, 0.1 * measured)


def gpu_busy_low(results: Results | None) -> float | None:
    """How busy a training run's least busy GPU was over its measured steps (NVML), where that is under
    GPU_BUSY_BOUND_PCT: its figure is the host's. None where the figure covers more than the measured steps
    (`window_holds_unmeasured_time`): it is not the steps' to judge by."""
    if results is None or results.train is None or results.gpu_monitor is None:
        return None
    if window_holds_unmeasured_time(results):
        return None
    busy = [d.utilization_measured_pct for d in results.gpu_monitor.devices
            if d.utilization_measured_pct is not None and (d.measured_samples or 0) >= GPU_BUSY_SAMPLES]
    low = min(busy, default=None)
    return low if low is not None and low < GPU_BUSY_BOUND_PCT else None


def gpu_busy_flag(busy: float) -> str:
    return f"host-bound (GPU busy {busy:.0f}% of measured steps)"


def measured_host(results: Results | None) -> bool:
    """The run measured its host, not its GPU: an inference GPU that waited for the host to issue its batches, or
    a training GPU idle for most of its measured steps."""
    return host_bound_share(results) is not None or gpu_busy_low(results) is not None


def trial_flags(outcome: str, results: Results | None) -> list[str]:
    """One trial's flags: `OOM`, `GPU mismatch` or `failed` by its outcome; `random init: accuracy not
    meaningful` for a random-init model; else `chance accuracy (0.51)` when it succeeded at chance; a run whose
    GPU waited for the host, `host-bound (99% issuing)` (inference) or `host-bound (GPU busy 37% of measured
    steps)` (training)."""
    if outcome in FLAGGED:
        return [OUTCOME_TEXT[outcome]]
    config = results.config if results is not None else None
    if config is not None and random_init(config) and config.task != "inference":
        return [RANDOM_INIT]
    if outcome == "succeeded" and at_chance(results):
        return [chance_flag(final_accuracy(results) or 0.0)]
    if outcome != "succeeded":
        return []
    share, busy = host_bound_share(results), gpu_busy_low(results)
    if share is not None:
        return [host_bound_flag(share)]
    if busy is not None:
        return [gpu_busy_flag(busy)]
    return []


def comparison_tags(results: Results, physics: str | None) -> dict[str, str]:
    """One trial's flags joined by `; ` as the tag `kubesweep.flags` and as its run's description, empty when it
    has none (a retried trial that now learned clears what an earlier attempt set); `physics`: its physics check's
    `measurement error: ...` (`physics_error`), after them."""
    flags = "; ".join([*trial_flags(results.outcome.value, results), *([physics] if physics else [])])
    return {tags.FLAGS: flags, tags.NOTE: flags}
