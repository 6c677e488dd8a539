"""One trial's numbers and flags from its typed results (kubesweep/wire/trial_metrics.py, kubesweep/wire/flags.py):
time to accuracy, the comparison metrics a trial's MLflow run logs and the flags it carries. How they meet over
repeats is tests/tracking/test_aggregate.py."""

from __future__ import annotations

from typing import Any

import pytest

from kubesweep.gpus import load_catalog
from kubesweep.wire import flags, tags
from kubesweep.wire import trial_metrics as tm
from kubesweep.wire.metrics import LOGGED_METRICS
from tests.support.results_docs import make_results, monitor, trial_parts

CATALOG = load_catalog()
results = trial_parts
PROBE = {"precision": "bf16", "dtype": "bfloat16", "size": 8192, "repeats": 5, "matmuls_per_repeat": 10,
         "best_s": 0.0157, "tflops_per_s": 700.0, "seconds": 0.2}


def bf16(tflops: float | None, *, probe: float | None = 700.0, device: str = "cuda", world_size: int = 1,
         **train: Any) -> dict[str, Any]:
    """A bf16 training trial's results parts with `tflops` achieved and, on a GPU, a GEMM probe of `probe`."""
    parts = results(config={"precision": "bf16"}, device=device, world_size=world_size)
    parts["train"] |= {"tflops_per_s": tflops, "tokens_per_sample": 19.5, "padded_tokens_per_sample": 21.0, **train}
    if probe is not None:
        parts["probe"] = {**PROBE, "tflops_per_s": probe}
    return parts


def comparison(res: dict[str, Any], gpu: str | None, gpus: int) -> dict[str, float]:
    """A trial's comparison metrics as its job logs them (priced and held against its peak by the catalog)."""
    typed = make_results(**res)
    price, peak = CATALOG.price_and_peak(gpu, typed.config.precision)
    return tm.comparison_metrics(typed, gpus=gpus, price_per_hour=price, peak_tflops=peak)


# -- one trial --------------------------------------------------------------------------------------------------


def test_comparison_metrics_are_rounded_to_five_significant_digits_and_only_for_a_success() -> None:
    queued = results(1234.56789)
    queued["timings"]["queue_wait_s"] = 61.23456  # a trial run from a Kueue queue (spec.queue)
    queued["train"] |= {"tflops_per_s": 12.3456, "padded_tokens_per_sample": 21.25}
    queued["probe"] = PROBE
    out = comparison(queued, gpu="h100-80gb", gpus=1)
    assert set(out) == {*LOGGED_METRICS, tm.RANK_METRIC}
    assert out["samples_per_s"] == out[tm.RANK_METRIC] == 1234.6 and out["epoch_s"] == 36.667
    assert out["queue_wait_s"] == 61.235
    assert "queue_wait_s" not in comparison(results(1234.56789), gpu="h100-80gb", gpus=1)
    assert comparison({"outcome": "oom"}, gpu="h100-80gb", gpus=1) == {}


def test_a_run_at_chance_accuracy_has_its_numbers_and_flag_but_no_rank() -> None:
    """What the MLflow runs view sorts by and shows: a run that did not learn keeps samples/s and accuracy, has
    no ranking metric (so it sorts after every run that learned) and says why in its flags tag."""
    chance = results(5000.0, accuracy=0.509)
    out = comparison(chance, gpu="h100-80gb", gpus=1)
    assert out["samples_per_s"] == 5000.0 and out["accuracy"] == 0.509 and tm.RANK_METRIC not in out
    for res, flag in ((chance, "chance accuracy (0.51)"), (results(), ""), ({"outcome": "oom"}, "OOM"),
                       ({"outcome": "gpu_mismatch"}, "GPU mismatch"), ({"outcome": "failed"}, "failed")):
        assert flags.comparison_tags(make_results(**res), None) == {tags.FLAGS: flag, tags.NOTE: flag}
    inference = {"outcome": "succeeded", "device": "cpu", "inference": {"samples_per_s": 80.0}}
    assert comparison(inference, gpu=None, gpus=0)[tm.RANK_METRIC] == 80.0  # no accuracy: ranks


@pytest.mark.parametrize(("share", "flag"), [(0.99, "host-bound (99% issuing)"), (0.5, "host-bound (50% issuing)"),
                                             (0.49, ""), (0.04, ""), (None, "")])
def test_an_inference_run_whose_gpu_waited_for_the_host_is_flagged_host_bound(share: float | None,
                                                                                flag: str) -> None:
    """Eager bert-base at batch 8 on an H100 spends 77-99% of each batch's latency issuing it: the figure is the
    host's. Replayed as a CUDA graph, 1-8%. The CPU records no share (issuing is the whole latency there)."""
    doc = {"outcome": "succeeded", "device": "cuda",
           "inference": {"samples_per_s": 1300.0, "host_share": share, "latency_s": {"p50": 0.006}}}
    assert flags.comparison_tags(make_results(**doc), None)[tags.FLAGS] == flag


@pytest.mark.parametrize(("busy", "samples", "flag"), [
    (37.4, 20, "host-bound (GPU busy 37% of measured steps)"), (49.9, 3, "host-bound (GPU busy 50% of measured steps)"),
    (62.0, 20, ""), (95.0, 20, ""), (20.0, 2, ""), (None, 0, "")])
def test_a_training_run_whose_gpu_sat_idle_through_its_measured_steps_is_flagged_host_bound(
        busy: float | None, samples: int, flag: str) -> None:
    """bert-base at batch 256 on an H100, eager: the GPU busy 35-40% of the measured steps (36-44 ms a step); as
    one CUDA graph, 62-65% (14.8 ms): only the first is the host's figure. Fewer than 3 samples in the window
    (a window shorter than the sampler's interval) say nothing. The figure over the trial's whole life, start-up
    and evaluation included, is never read."""
    doc = results(gpu_monitor=monitor(busy, samples))
    assert flags.comparison_tags(make_results(**doc), None)[tags.FLAGS] == flag


# -- over repeats -------------------------------------------------------------------------------------------------


# -- FLOPs, MFU and the physics check ----------------------------------------------------------------------------


def test_mfu_is_achieved_tflops_over_the_dense_peak_of_the_trials_gpus_and_over_its_probe() -> None:
    """H100 bf16: 989.4 TFLOP/s dense; 300 achieved is 30.3% of it and 42.9% of a 700 TFLOP/s probe. Two GPUs
    (world size 2) hold the same figure against twice the ceiling."""
    one = tm.trial_metrics(make_results(**bf16(300.0)), "succeeded", gpus=1, price_per_hour=None, target=0.9,
                           peak_tflops=CATALOG["h100-80gb"].peak_tflops("bf16"))
    assert one["tflops_per_s"] == 300.0
    assert one["mfu_pct"] == pytest.approx(100 * 300 / 989.4)
    assert one["mfu_probe_pct"] == pytest.approx(100 * 300 / 700)
    assert (one["tokens_per_sample"], one["padded_tokens_per_sample"]) == (19.5, 21.0)
    two = tm.trial_metrics(make_results(**bf16(300.0, world_size=2)), "succeeded", gpus=2, price_per_hour=None,
                           target=0.9, peak_tflops=989.4)
    assert two["mfu_pct"] == pytest.approx(100 * 300 / 989.4 / 2)
    assert two["mfu_probe_pct"] == pytest.approx(100 * 300 / 700 / 2)


def test_a_cpu_trial_has_tflops_but_no_mfu_and_none_is_invented() -> None:
    cpu = tm.trial_metrics(make_results(**bf16(0.05, probe=None, device="cpu")), "succeeded", gpus=0,
                           price_per_hour=None, target=0.9, peak_tflops=CATALOG.price_and_peak(None, "bf16")[1])
    assert cpu["tflops_per_s"] == 0.05 and cpu["mfu_pct"] is None and cpu["mfu_probe_pct"] is None
    # a GPU type the catalog gives no peak (the A10G has no data sheet): TFLOP/s and the probe's MFU, no peak MFU
    a10g = tm.trial_metrics(make_results(**bf16(40.0)), "succeeded", gpus=1, price_per_hour=None, target=0.9,
                            peak_tflops=CATALOG.price_and_peak("a10g", "bf16")[1])
    assert a10g["mfu_pct"] is None and a10g["mfu_probe_pct"] == pytest.approx(100 * 40 / 700)


@pytest.mark.parametrize(("tflops", "probe", "flag"), [
    (750.0, 700.0, "measurement error: 750 TFLOP/s is 107% of the GPU's GEMM probe (700 TFLOP/s)"),
    (950.0, None, "measurement error: 950 TFLOP/s is 96% of the dense peak (989 TFLOP/s; above 95% is not reached)"),
    (1980.0, 1900.0, "measurement error: 1,980 TFLOP/s is 104% of the GPU's GEMM probe (1,900 TFLOP/s)"),
    (690.0, 700.0, None),
    (900.0, None, None),
])
def test_the_physics_check_flags_a_figure_above_the_probe_or_near_the_peak(tflops: float, probe: float | None,
                                                                           flag: str | None) -> None:
    """A run whose TFLOP/s are above its GPU's probe or above 95% of the dense peak is a measurement error: the
    flag says so with the numbers, on its MLflow run too, and the run has no rank in the runs view."""
    out = comparison(bf16(tflops, probe=probe), gpu="h100-80gb", gpus=1)
    assert tm.physics(out) == flag
    assert (tm.RANK_METRIC in out) == (flag is None)
    typed = make_results(**bf16(tflops, probe=probe))
    assert flags.comparison_tags(typed, tm.physics(out))[tags.FLAGS] == (flag or "")
