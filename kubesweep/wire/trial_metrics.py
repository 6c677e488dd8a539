"""One trial's numbers, from its typed results: what `sweep results`, the report and the trial's own MLflow run
(the runs view's columns) show of it, by one set of definitions (docs/tracking.md gives them with examples):

- samples/s: `train.samples_per_s` (measured steps only, all ranks) or, for inference, `inference.samples_per_s`;
- step p50: `train.step_time_s.p50` (inference: `inference.latency_s.p50`, one batch), in milliseconds;
- peak memory: `memory.torch_peak_allocated_bytes` in GiB (the CUDA caching allocator's peak); on a CPU trial
  `memory.host_peak_rss_bytes` (the process's peak resident set);
- accuracy: `final_accuracy`, the dev accuracy of the last evaluation;
- epoch time: `(timings.train_s - train.warmup_time_s) / train.epochs_completed`, the training loop's wall time
  per epoch with the warm-up apart (compilation and each new shape's first steps: `warm-up s`, reported beside it;
  a compile cache that one repeat fills and the next reads would otherwise set repeats of one setting apart by
  the compilation), checkpoints included, evaluation excluded;
- $/epoch: the GPU type's price per hour x GPUs of the trial x epoch time / 3600 (none for CPU trials);
- time-to-accuracy (TTA): training wall time from the first optimizer step until the first evaluation whose
  accuracy is at or above the target (default 0.90). Evaluation time is not counted. Results files record
  evaluations by step, so the time at step s is `warmup_time_s + (s - warmup_steps) x (train_s -
  warmup_time_s) / (steps - warmup_steps)`: warm-up (compilation included) is charged in full to the first
  steps, the rest of the training loop is spread evenly over the remaining steps; an evaluation at the last step
  gives exactly `train_s`. Not reached: no TTA.
- TTA train s: the same target reached, warm-up apart: the steps until that evaluation x the steady step time
  (`(train_s - warmup_time_s) / (steps - warmup_steps)`), so the warm-up steps count at the speed of every other
  step and their compilation not at all. It measures the setting's training, whatever the compile cache held;
  the answer ranks time to accuracy by it, with the warm-up beside it.
- warm-up cold s / warm-up warm s: `warm-up s` of a compiled trial whose compile cache held nothing of its graphs
  (`compile_cache.hit` false, or no cache record) / held every one of them (`hit` true): one interval each, so
  repeats that compiled and repeats that read the cache are never averaged together. Eager trials have neither.
- energy: `energy.j_per_sample` (joules per sample over the measured window, NVML's energy counter) and
  `energy.kwh_per_epoch` (J/sample x training rows / 3.6e6);
- warm-up s: `timings.compile_warmup_s`, the steps reported apart from the measured ones (compilation included);
- queue wait s: `timings.queue_wait_s`, a queued trial's (spec.queue) Job creation to its process's start: the wait
  for Kueue's admission, scheduling and image pull.
- TFLOP/s: `train.tflops_per_s` (inference: `inference.tflops_per_s`), the model FLOPs of the measured steps (padded
  batch shapes, matmuls and attention, forward + backward = 3x forward; kubesweep/jobs/flops.py) over their time,
  all ranks; CPU trials too.
- MFU %: TFLOP/s / (the GPU type's dense peak at the trial's precision x its GPUs) x 100 (PaLM's model FLOPs
  utilization); none on the CPU and for a GPU type or precision the catalog gives no peak: no peak is invented.
- MFU probe %: TFLOP/s / (the trial's GEMM probe x its GPUs) x 100: against what that machine's GPU delivered on
  square matmuls at that precision (`probe.tflops_per_s`), not the data sheet.
- tokens/sample, padded tokens/sample: `tokens_per_sample` and `padded_tokens_per_sample` of the measured steps:
  what one of the samples of samples/s carried (SST-2 bucketed: about 21 padded tokens, not 128).

Pure functions: the GPU type's price and peak come from the caller (the catalog is not part of the contract).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from kubesweep.wire.flags import at_chance, finite, physics_error, random_init
from kubesweep.wire.results import Results

GIB = 1024**3
DEFAULT_TARGET_ACCURACY = 0.90

# metric name -> (column header, higher is better)
METRICS: dict[str, tuple[str, bool]] = {
    "samples_per_s": ("samples/s", True),
    "step_p50_ms": ("step p50 ms", False),
    "peak_mem_gib": ("peak GiB", False),
    "tta_s": ("TTA s", False),
    "accuracy": ("accuracy", True),
    "cost_per_epoch": ("$/epoch", False),
    "epoch_s": ("epoch s", False),
    "latency_p99_ms": ("p99 ms", False),
    "j_per_sample": ("J/sample", False),
    "kwh_per_epoch": ("kWh/epoch", False),
    "warmup_s": ("warm-up s", False),
    "tta_train_s": ("TTA train s", False),
    "warmup_cold_s": ("warm-up cold s", False),
    "warmup_warm_s": ("warm-up warm s", False),
    "queue_wait_s": ("queue wait s", False),
    "tflops_per_s": ("TFLOP/s", True),
    "mfu_pct": ("MFU %", True),
    "mfu_probe_pct": ("MFU probe %", True),
    "tokens_per_sample": ("tokens/sample", False),
    "padded_tokens_per_sample": ("padded tokens/sample", False),
}
# what a trial's MLflow run carries as metrics of these names, for the UI's runs view (kubesweep.tracking.view)
COMPARISON_METRICS = ("samples_per_s", "accuracy", "peak_mem_gib", "cost_per_epoch", "step_p50_ms", "epoch_s",
                      "j_per_sample", "kwh_per_epoch", "queue_wait_s", "tflops_per_s", "mfu_pct", "mfu_probe_pct",
                      "padded_tokens_per_sample")
# samples_per_s of a run that may rank among the best: absent where its accuracy stayed at chance or its TFLOP/s are
# physically impossible (`flags.physics_error`), so the runs view, sorted by it, lists such a run after every run
# that learned (with OOM and mismatched runs)
RANK_METRIC = "ranked_samples_per_s"


def time_to_accuracy(results: Results, target: float) -> float | None:
    """Seconds of training until the first evaluation at or above `target` (see the module docstring)."""
    train = results.train
    train_s = finite(results.timings.train_s)
    steps = finite(train.steps) if train is not None else None
    warm_steps = (finite(train.warmup_steps) if train is not None else None) or 0.0
    warm_s = (finite(train.warmup_time_s) if train is not None else None) or 0.0
    for point in results.eval:
        accuracy = finite(point.accuracy)
        if accuracy is None or accuracy < target:
            continue
        step = float(point.step)
        if train_s is None or not steps:
            return None
        if step >= steps:
            return train_s
        if step <= warm_steps:
            return warm_s * step / warm_steps if warm_steps else 0.0
        return warm_s + (step - warm_steps) * (train_s - warm_s) / (steps - warm_steps)
    return None


def train_time_to_accuracy(results: Results, target: float) -> float | None:
    """Seconds of steady training until the first evaluation at or above `target`: its step x the steady step
    time, warm-up apart (see the module docstring)."""
    train = results.train
    train_s = finite(results.timings.train_s)
    if train is None or train_s is None:
        return None
    steps = finite(train.steps)
    warm_steps = finite(train.warmup_steps) or 0.0
    warm_s = min(train_s, finite(train.warmup_time_s) or 0.0)
    if not steps or steps <= warm_steps:
        return None
    per_step = (train_s - warm_s) / (steps - warm_steps)
    for point in results.eval:
        accuracy = finite(point.accuracy)
        if accuracy is not None and accuracy >= target:
            return min(float(point.step), steps) * per_step
    return None


def warmup_by_cache(results: Results) -> tuple[float | None, float | None]:
    """(cold, warm): a compiled trial's warm-up seconds as the one its compile cache state says; eager: neither."""
    if not results.config.compile:
        return None, None
    warm_up = finite(results.timings.compile_warmup_s)
    hit = results.compile_cache is not None and results.compile_cache.hit
    return (None, warm_up) if hit else (warm_up, None)


def peak_memory(results: Results) -> float | None:
    """Bytes: the CUDA caching allocator's peak on a GPU; on a CPU, the process's peak RSS."""
    peak = results.memory.torch_peak_allocated_bytes
    if peak is None and results.device == "cpu":
        peak = results.memory.host_peak_rss_bytes
    return float(peak) if peak is not None else None


def gpu_product(results: Results | None) -> str:
    """The product NVML named for the trial's first GPU ("" on the CPU or where the results do not say)."""
    if results is None or results.device != "cuda":
        return ""
    gpus = results.environment.gpus
    return gpus[0].product or "" if gpus else ""


def gpu_type(asked: str | None, results: Results | None, by_product: Callable[[str], str | None]) -> str | None:
    """The trial's GPU type: the one it asked for, else the one it ran on (a trial that takes any GPU: its
    results' device, as a catalog name where `by_product` knows the product); None on the CPU."""
    if asked:
        return asked
    product = gpu_product(results)
    return (by_product(product) or product) if product else None


def _ms(seconds: float | None) -> float | None:
    return seconds * 1000 if seconds is not None else None


def flops_metrics(results: Results, gpus: int, peak_tflops: float | None) -> dict[str, float | None]:
    """TFLOP/s, MFU against the dense peak and against the probe, tokens and padded tokens per sample (see the
    module docstring); `peak_tflops`: one GPU's dense peak at the trial's precision, None on the CPU."""
    stats = results.inference or results.train
    if stats is None:
        return {}
    tflops = finite(stats.tflops_per_s)
    gpus = max(1, results.world_size or gpus or 1)
    probe = finite(results.probe.tflops_per_s) if results.probe is not None else None
    on_gpu = results.device != "cpu"
    return {"tflops_per_s": tflops,
            "mfu_pct": 100 * tflops / (peak_tflops * gpus) if tflops is not None and peak_tflops and on_gpu else None,
            "mfu_probe_pct": 100 * tflops / (probe * gpus) if tflops is not None and probe and on_gpu else None,
            "tokens_per_sample": finite(stats.tokens_per_sample),
            "padded_tokens_per_sample": finite(stats.padded_tokens_per_sample)}


def trial_metrics(results: Results | None, outcome: str, *, gpus: int, price_per_hour: float | None,
                  target: float, peak_tflops: float | None) -> dict[str, float | None]:
    """One trial's `METRICS` (all None unless it succeeded with results). `gpus`: the GPUs it asked for (its
    world size where the results have one); `price_per_hour`: its GPU type's (None: no cost); `peak_tflops`: one
    of its GPUs' dense peak at its precision (None: no MFU)."""
    out: dict[str, float | None] = dict.fromkeys(METRICS)
    r = results
    if r is None or outcome != "succeeded":
        return out
    inference = r.inference
    if inference is not None:
        out["samples_per_s"] = finite(inference.samples_per_s)
        out["step_p50_ms"] = _ms(finite(inference.latency_s.p50))
        out["latency_p99_ms"] = _ms(finite(inference.latency_s.p99))
    elif r.train is not None:
        out["samples_per_s"] = finite(r.train.samples_per_s)
        out["step_p50_ms"] = _ms(finite(r.train.step_time_s.p50) if r.train.step_time_s is not None else None)
    peak = finite(peak_memory(r))
    out["peak_mem_gib"] = peak / GIB if peak is not None else None
    out["accuracy"] = finite(r.final_accuracy)
    if r.energy is not None:
        out["j_per_sample"] = finite(r.energy.j_per_sample)
        out["kwh_per_epoch"] = finite(r.energy.kwh_per_epoch)
    out["warmup_s"] = finite(r.timings.compile_warmup_s)
    out["queue_wait_s"] = finite(r.timings.queue_wait_s)
    out["tta_s"] = time_to_accuracy(r, target) if inference is None else None
    out["tta_train_s"] = train_time_to_accuracy(r, target) if inference is None else None
    out["warmup_cold_s"], out["warmup_warm_s"] = warmup_by_cache(r)
    out.update(flops_metrics(r, gpus, peak_tflops))
    train_s = finite(r.timings.train_s)
    epochs = finite(r.train.epochs_completed) if r.train is not None else None
    if train_s is not None and epochs and r.train is not None:
        warm_s = min(train_s, finite(r.train.warmup_time_s) or 0.0)
        epoch_s = out["epoch_s"] = (train_s - warm_s) / epochs
        if price_per_hour is not None and r.device != "cpu":
            out["cost_per_epoch"] = price_per_hour * max(1, r.world_size or gpus or 1) * epoch_s / 3600
    return out


def physics(values: Mapping[str, float | None]) -> str | None:
    """The physics check of one trial's `trial_metrics`: `flags.physics_error` of its TFLOP/s and MFUs."""
    return physics_error(values.get("tflops_per_s"), values.get("mfu_pct"), values.get("mfu_probe_pct"))


def comparison_metrics(results: Results, *, gpus: int, price_per_hour: float | None,
                       peak_tflops: float | None) -> dict[str, float]:
    """One trial's `COMPARISON_METRICS` from its results, by the definitions above (none unless it succeeded),
    and `RANK_METRIC` unless its accuracy is at chance (a random-init speed run ranks by its speed) or its
    figures fail the physics check."""
    values = trial_metrics(results, results.outcome.value, gpus=gpus, price_per_hour=price_per_hour,
                           target=DEFAULT_TARGET_ACCURACY, peak_tflops=peak_tflops)
    out = {m: float(f"{v:.5g}") for m in COMPARISON_METRICS if (v := values[m]) is not None}  # as a person reads
    if ("samples_per_s" in out and (not at_chance(results) or random_init(results.config))
            and physics(values) is None):
        out[RANK_METRIC] = out["samples_per_s"]
    return out
