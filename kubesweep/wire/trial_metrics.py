"""One trial's numbers, from its typed results: what `sweep results`, the report and the trial's own MLflow run
(the runs view's columns) show of it, by the definitions of the metric catalogue (`kubesweep.wire.metrics`, which
says each one; docs/tracking.md gives them with examples).

Pure functions: the GPU type's price and peak come from the caller (the catalog is not part of the contract).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from kubesweep.wire.flags import at_chance, physics_error, random_init
from kubesweep.wire.metrics import CATALOGUE, LOGGED_METRICS, Trial, read_all
from kubesweep.wire.results import Results

DEFAULT_TARGET_ACCURACY = 0.90

# samples_per_s of a run that may rank among the best: absent where its accuracy stayed at chance or its TFLOP/s are
# physically impossible (`flags.physics_error`), so the runs view, sorted by it, lists such a run after every run
# that learned (with OOM and mismatched runs)
RANK_METRIC = "ranked_samples_per_s"


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


def trial_metrics(results: Results | None, outcome: str, *, gpus: int, price_per_hour: float | None,
                  target: float, peak_tflops: float | None) -> dict[str, float | None]:
    """One trial's value of every metric of the catalogue (all None unless it succeeded with results). `gpus`: the
    GPUs it asked for (its world size where the results have one); `price_per_hour`: its GPU type's (None: no
    cost); `peak_tflops`: one of its GPUs' dense peak at its precision (None: no MFU)."""
    if results is None or outcome != "succeeded":
        return {m.name: None for m in CATALOGUE}
    return read_all(Trial(results, gpus=gpus, price_per_hour=price_per_hour, peak_tflops=peak_tflops,
                          target=target))


def physics(values: Mapping[str, float | None]) -> str | None:
    """The physics check of one trial's `trial_metrics`: `flags.physics_error` of its TFLOP/s and MFUs."""
    return physics_error(values.get("tflops_per_s"), values.get("mfu_pct"), values.get("mfu_probe_pct"))


def comparison_metrics(results: Results, *, gpus: int, price_per_hour: float | None,
                       peak_tflops: float | None) -> dict[str, float]:
    """One trial's metrics that its MLflow run logs (`Metric.logged`), by the catalogue's definitions (none unless
    it succeeded), and `RANK_METRIC` unless its accuracy is at chance (a random-init speed run ranks by its speed)
    or its figures fail the physics check."""
    values = trial_metrics(results, results.outcome.value, gpus=gpus, price_per_hour=price_per_hour,
                           target=DEFAULT_TARGET_ACCURACY, peak_tflops=peak_tflops)
    out = {m: float(f"{v:.5g}") for m in LOGGED_METRICS if (v := values[m]) is not None}  # as a person reads
    if ("samples_per_s" in out and (not at_chance(results) or random_init(results.config))
            and physics(values) is None):
        out[RANK_METRIC] = out["samples_per_s"]
    return out
