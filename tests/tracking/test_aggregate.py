"""The numbers `sweep results` shows (docs/tracking.md): one trial's measurements priced by the catalog, aggregation
over repeats, the best cell per GPU type, flags, filters, sorting and the table, CSV and JSON forms; one trial's
numbers alone are tests/wire/test_trial_metrics.py. Records are built in process; the end-to-end check against a
real sweep's files is tests/tracking/test_sweep.py."""

from __future__ import annotations

import csv
import io
import math
from typing import Any

import pytest

from kubesweep.gpus import load_catalog
from kubesweep.tracking import aggregate as agg
from kubesweep.tracking import columns
from kubesweep.tracking.records import TrialRecord
from kubesweep.wire import flags
from kubesweep.wire import trial_metrics as tm
from kubesweep.wire.config import JobConfig
from kubesweep.wire.results import Results
from tests.support.results_docs import GIB, make_results, monitor, trial_parts

CATALOG = load_catalog()
results = trial_parts


def record(name: str, gpu: str | None = "h100-80gb", outcome: str = "succeeded", repeat: int = 0, gpus: int = 1,
           res: dict[str, Any] | None = None, **job: Any) -> TrialRecord:
    job = {"task": "finetune", "batch_size": 32, "precision": "bf16", "compile": False, "seed": 42 + repeat, **job}
    return TrialRecord(name, name, repeat, gpu, gpus, outcome, JobConfig.model_validate(job),
                       make_results(**{"config": job, **res}) if res is not None else None)


def test_trial_metrics_of_a_training_trial() -> None:
    m = agg.record_metrics(record("a", res=results(1500.0, train_s=120.0, epochs=3)), CATALOG, 0.90)
    assert m["samples_per_s"] == 1500.0 and m["step_p50_ms"] == 50.0 and m["peak_mem_gib"] == 6.0
    assert m["accuracy"] == 0.91 and m["epoch_s"] == (120.0 - 10.0) / 3  # the warm-up (10 s) apart
    assert m["cost_per_epoch"] == pytest.approx(CATALOG["h100-80gb"].price_per_hour * 110.0 / 3 / 3600)
    assert m["latency_p99_ms"] is None and m["tta_s"] is None  # no evaluations in these results

    two = agg.record_metrics(record("b", gpus=2, res=results(world_size=2)), CATALOG, 0.90)
    assert two["cost_per_epoch"] == pytest.approx(2 * CATALOG["h100-80gb"].price_per_hour * 110.0 / 3 / 3600)


def test_trial_metrics_of_a_cpu_and_an_inference_trial() -> None:
    cpu = results(device="cpu", memory={"host_peak_rss_bytes": 2 * GIB})
    m = agg.record_metrics(record("c", gpu=None, res=cpu), CATALOG, 0.90)
    assert m["peak_mem_gib"] == 2.0 and m["cost_per_epoch"] is None and m["epoch_s"] == 110.0 / 3

    inference = {"outcome": "succeeded", "inference": {"samples_per_s": 1670.0,
                                                        "latency_s": {"p50": 0.004, "p99": 0.006}}}
    m = agg.record_metrics(record("i", res=inference, task="inference"), CATALOG, 0.90)
    assert m["samples_per_s"] == 1670.0 and m["step_p50_ms"] == 4.0 and m["latency_p99_ms"] == 6.0
    assert m["tta_s"] is None and m["epoch_s"] is None


def test_a_trial_that_did_not_succeed_has_no_measurements() -> None:
    for outcome, res in (("oom", results()), ("succeeded", None), ("stopped", results())):
        assert set(agg.record_metrics(record("x", outcome=outcome, res=res), CATALOG, 0.9).values()) == {None}
    nan = results(float("nan"))
    assert agg.record_metrics(record("n", res=nan), CATALOG, 0.9)["samples_per_s"] is None


def test_stat_mean_sample_std_and_cv() -> None:
    s = agg.Stat([90.0, 100.0, 110.0])
    assert s.n == 3 and s.mean == 100.0 and s.std == 10.0 and s.cv == pytest.approx(0.1)
    assert agg.Stat([5.0]).std is None and agg.Stat([5.0]).cv is None
    assert agg.Stat([]).mean is None
    assert agg.Stat([0.0, 0.0]).cv is None  # no CV of a zero mean
    # by hand: s = sqrt(2), t(0.975, 1) = 12.706, half-width = 12.706 x sqrt(2) / sqrt(2)
    got = agg.Stat([1.0, 3.0]).as_dict()
    assert got["ci95"] == pytest.approx([2.0 - 12.706, 2.0 + 12.706]) and got["ci95_half_width"] == 12.706
    assert {k: v for k, v in got.items() if not k.startswith("ci95")} == {
        "mean": 2.0, "cv": math.sqrt(2) / 2, "std": math.sqrt(2), "n": 2, "values": [1.0, 3.0]}
    assert agg.Stat([5.0]).as_dict()["ci95"] is None


def test_repeats_of_a_setting_are_one_cell_and_the_best_per_gpu_type_is_marked() -> None:
    recs = [record("h32-0", res=results(1000.0)), record("h32-1", repeat=1, res=results(1200.0)),
            record("h64-0", batch_size=64, res=results(1500.0)),
            record("h128-0", batch_size=128, outcome="oom", res={"outcome": "oom"}),
            record("l4-0", gpu="l4", res=results(300.0))]
    cells = agg.aggregate(recs, catalog=CATALOG)
    assert [[t.name for t in c.trials] for c in cells] == [["h32-0", "h32-1"], ["h64-0"], ["h128-0"], ["l4-0"]]
    assert cells[0].value("samples_per_s") == 1100.0 and cells[0].metrics["samples_per_s"].n == 2
    assert [c.best for c in cells] == [False, True, False, True]  # the fastest H100 cell, the only L4 cell
    assert cells[0].axes.as_dict() == {"task": "finetune", "gpu": "h100-80gb", "gpus": 1, "batch_size": 32,
                             "precision": "bf16", "compile": "off"}
    assert cells[0].extra == {}  # seed differs between repeats: not a setting

    agg.mark_best(cells, "peak_mem_gib")  # lower is better; equal values keep the first
    assert [c.best for c in cells] == [True, False, False, True]


def test_a_setting_whose_training_stayed_at_chance_is_never_the_best() -> None:
    """Fastest is not best when the setting did not learn: a cell with any repeat at chance accuracy is left out
    (but keeps its numbers and its flag); with every cell left out, none is marked."""
    recs = [record("slow", res=results(1000.0)), record("slow", repeat=1, res=results(1100.0)),
            record("fast", batch_size=64, res=results(3000.0, accuracy=0.509)),
            record("fast", batch_size=64, repeat=1, res=results(3100.0, accuracy=0.509)),
            record("mixed", batch_size=128, res=results(2000.0)),
            record("mixed", batch_size=128, repeat=1, res=results(2100.0, accuracy=0.52)),
            record("l4", gpu="l4", res=results(300.0, accuracy=0.49))]
    cells = agg.aggregate(recs, catalog=CATALOG)
    assert [c.best for c in cells] == [True, False, False, False]
    assert [len(c.at_chance) for c in cells] == [0, 2, 1, 1]
    assert cells[1].value("samples_per_s") == 3050.0 and cells[1].flags == ["chance accuracy (0.51)"]
    assert agg.best_cell(cells, "samples_per_s") is cells[0]
    assert agg.best_cell(cells[1:], "samples_per_s") is None
    inference = agg.aggregate([record("i", task="inference", res={
        "outcome": "succeeded", "inference": {"samples_per_s": 900.0, "latency_s": {"p50": 0.004}}})],
        catalog=CATALOG)
    assert inference[0].best  # no accuracy: nothing to stay at chance


def test_job_settings_that_vary_between_cells_become_columns() -> None:
    recs = [record("a", res=results(), learning_rate=2e-5), record("b", res=results(), learning_rate=5e-5)]
    cells = agg.aggregate(recs, catalog=CATALOG)
    assert [c.extra for c in cells] == [{"learning_rate": 2e-5}, {"learning_rate": 5e-5}]
    assert agg.columns(cells) == ["task", "gpu", "batch_size", "precision", "compile", "learning_rate"]
    two_gpus = agg.aggregate([*recs, record("c", gpus=2, res=results())], catalog=CATALOG)
    assert "gpus" in agg.columns(two_gpus)


def test_status_and_flags_say_what_a_reader_must_know() -> None:
    ok, chance = results(accuracy=0.91), results(accuracy=0.509)
    [cell] = agg.aggregate([record("a", res=ok), record("b", repeat=1, res=chance),
                            record("c", repeat=2, outcome="oom", res={"outcome": "oom"})], catalog=CATALOG)
    assert cell.status == "2 ok, 1 OOM"
    assert cell.flags == ["1/3 OOM", "1/3 chance accuracy (0.51)"]
    [cell] = agg.aggregate([record("a", outcome="gpu_mismatch")], catalog=CATALOG)
    assert cell.status == "GPU mismatch" and cell.flags == ["GPU mismatch"]
    [cell] = agg.aggregate([record("a", res=chance)], catalog=CATALOG)
    assert cell.status == "ok" and cell.flags == ["chance accuracy (0.51)", "n=1"]
    assert columns.metric_text(cell, "samples_per_s") == "1,000"
    [cell] = agg.aggregate([record("a", outcome="pending")], catalog=CATALOG)
    assert columns.metric_text(cell, "samples_per_s") == "pending"


def test_an_inference_cell_whose_gpu_waited_for_the_host_says_so() -> None:
    """The mean issuing share of its host-bound repeats; how many, where not all; nothing for graph replays."""
    def inference(share: float | None) -> dict[str, Any]:
        return {"outcome": "succeeded", "inference": {"samples_per_s": 1300.0, "host_share": share,
                                                      "latency_s": {"p50": 0.006}}}

    [cell] = agg.aggregate([record(str(i), repeat=i, res=inference(s), task="inference")
                            for i, s in enumerate((0.99, 0.97, 0.98))], catalog=CATALOG)
    assert cell.flags == ["host-bound (98% issuing)"]
    [cell] = agg.aggregate([record(str(i), repeat=i, res=inference(s), task="inference")
                            for i, s in enumerate((0.9, 0.3, 0.05))], catalog=CATALOG)
    assert cell.flags == ["1/3 host-bound (90% issuing)"]
    [cell] = agg.aggregate([record(str(i), repeat=i, res=inference(s), task="inference")
                            for i, s in enumerate((0.04, 0.08))], catalog=CATALOG)
    assert cell.flags == []
    # training: how busy the GPU was over the measured steps alone (NVML)
    [cell] = agg.aggregate([record(str(i), repeat=i, res=results(gpu_monitor=monitor(b)))
                            for i, b in enumerate((35.0, 40.0, 80.0))], catalog=CATALOG)
    assert cell.flags == ["2/3 host-bound (GPU busy 38% of measured steps)"]
    # a window that held more than the measured steps (a job that began it at the warm-up, as the committed
    # showcase-rule-h100 results did: 16.6 s of window for 3.8 s of steps and 12.8 s of torch.compile warm-up)
    # read the compile's samples too: no flag from it. A window of the steps alone, pauses left out, keeps it.
    def timed(window: float, pauses: list[list[float]] | None = None) -> dict[str, Any]:
        doc = results(gpu_monitor=monitor(24.0))
        doc["train"] |= {"measured_time_s": 3.8, "measured_from": 1000.0, "measured_until": 1000.0 + window,
                         "measured_pauses": pauses}
        return doc

    [cell] = agg.aggregate([record("a", res=timed(16.61))], catalog=CATALOG)
    assert cell.flags == ["n=1"] and not cell.host_bound
    [cell] = agg.aggregate([record("a", res=timed(3.85))], catalog=CATALOG)
    assert cell.flags == ["host-bound (GPU busy 24% of measured steps)", "n=1"] and cell.host_bound
    [cell] = agg.aggregate([record("a", res=timed(9.85, [[1001.0, 1007.0]]))], catalog=CATALOG)
    assert cell.host_bound  # 6 s of evaluation between measured steps: not the steps' time, not held against them


def test_metric_text_gives_mean_cv_and_how_many_repeats_reached_the_target() -> None:
    reached, missed = results(1000.0, train_s=110.0), results(1200.0, train_s=110.0)
    reached["eval"] = [{"step": 100, "accuracy": 0.95}]
    missed["eval"] = [{"step": 100, "accuracy": 0.80}]
    [cell] = agg.aggregate([record("a", res=reached), record("b", repeat=1, res=missed)], catalog=CATALOG)
    assert columns.metric_text(cell, "tta_s") == "110.0 (1/2)"
    # ± the 95% interval's half-width in percent of the mean: t(0.975, 1) x s / sqrt(2) = 12.706 x 100 / 1,100
    assert columns.metric_text(cell, "samples_per_s") == f"1,100 ±{12.706 * 100 / 1100 * 100:.1f}%" == "1,100 ±115.5%"
    assert columns.metric_text(cell, "latency_p99_ms") == "-"  # succeeded, without that number


# -- filters and sorting ------------------------------------------------------------------------------------------


def cells_for_queries() -> list[agg.Cell]:
    return agg.aggregate([
        record("h-bf16", res=results(1500.0)),
        record("h-fp32", precision="fp32", compile="default", res=results(900.0)),
        record("l4-bf16", gpu="l4", res=results(300.0)),
        record("l4-oom", gpu="l4", batch_size=256, outcome="oom", res={"outcome": "oom"}),
    ], catalog=CATALOG)


def names(cells: list[agg.Cell]) -> list[str]:
    return [c.trials[0].name for c in cells]


def test_filters_by_axis_status_outcome_best_and_job_setting() -> None:
    cells = cells_for_queries()
    assert names(agg.apply_filters(cells, agg.parse_filters(["gpu=l4"]))) == ["l4-bf16", "l4-oom"]
    assert names(agg.apply_filters(cells, agg.parse_filters(["precision=fp32,bf16", "gpu=h100-80gb"]))) == [
        "h-bf16", "h-fp32"]
    assert names(agg.apply_filters(cells, agg.parse_filters(["compile=false"]))) == ["h-bf16", "l4-bf16", "l4-oom"]
    assert names(agg.apply_filters(cells, agg.parse_filters(["status=OOM"]))) == ["l4-oom"]
    assert names(agg.apply_filters(cells, agg.parse_filters(["outcome=oom"]))) == ["l4-oom"]
    assert names(agg.apply_filters(cells, agg.parse_filters(["best=yes"]))) == ["h-bf16", "l4-bf16"]
    assert names(agg.apply_filters(cells, agg.parse_filters(["seed=42"]))) == names(cells)  # a job setting
    assert names(agg.apply_filters(cells, agg.parse_filters(["seed=7"]))) == []
    assert agg.apply_filters(cells, []) is cells


def test_bad_filters_are_refused_with_what_is_expected() -> None:
    with pytest.raises(agg.QueryError, match="expected KEY=VALUE"):
        agg.parse_filters(["gpu"])
    with pytest.raises(agg.QueryError, match=r"unknown key 'colour'; known: batch_size, best, .*, seed, status, task"):
        agg.apply_filters(cells_for_queries(), agg.parse_filters(["colour=red"]))


def test_sorting_by_a_metric_puts_the_best_first_and_missing_values_last() -> None:
    cells = cells_for_queries()
    assert names(agg.sort_cells(cells, "samples_per_s")) == ["h-bf16", "h-fp32", "l4-bf16", "l4-oom"]
    assert names(agg.sort_cells(cells, "samples_per_s", reverse=True)) == ["l4-bf16", "h-fp32", "h-bf16", "l4-oom"]
    assert names(agg.sort_cells(cells, "step_p50_ms"))[-1] == "l4-oom"
    assert names(agg.sort_cells(cells, "batch_size", reverse=True))[0] == "l4-oom"
    assert agg.sort_cells(cells, None) is cells
    with pytest.raises(agg.QueryError, match="--sort: unknown key 'speed'"):
        agg.sort_cells(cells, "speed")


# -- output -------------------------------------------------------------------------------------------------------


def test_markdown_csv_and_json_carry_the_same_cells() -> None:
    cells = cells_for_queries()
    md = columns.to_markdown(cells).splitlines()
    assert md[0] == "| " + " | ".join(columns.headers(columns.cell_columns(cells))) + " |" and len(md) == 2 + len(cells)
    assert md[2].startswith("| finetune | h100-80gb | 32 | bf16 | off | 1 | ok | 1,500 |")
    assert md[2].endswith("| * | n=1 |")

    rows = list(csv.DictReader(io.StringIO(agg.to_csv(cells))))
    assert [r["trials"] for r in rows] == names(cells)
    assert rows[0]["samples_per_s_mean"] == "1500.0" and rows[0]["samples_per_s_n"] == "1"
    assert rows[3]["samples_per_s_mean"] == "" and rows[3]["status"] == "OOM" and rows[3]["best"] == "0"

    out = agg.to_json(cells, sweep="s", source="test", target=0.9, best_by="samples_per_s")
    assert (out["sweep"], out["best_by"], len(out["cells"])) == ("s", "samples_per_s", 4)
    first = out["cells"][0]
    assert first["gpu"] == "h100-80gb" and first["best"] and first["metrics"]["samples_per_s"]["mean"] == 1500.0
    assert first["trials"] == [{"id": "h-bf16", "name": "h-bf16", "repeat": 0, "outcome": "succeeded", "reason": "",
                                "run_id": None}]


def test_a_trials_own_checkpoint_directory_is_no_setting() -> None:
    """On Kubernetes each trial checkpoints under /checkpoints/<sweep>/<trial id>, recorded in its job settings:
    repeats of one setting are still one cell, and no column (no report panel) per trial appears."""
    recs = [record(f"r{i}", repeat=i, res=results(1000.0 + i), checkpoint_dir=f"/checkpoints/s/id{i}")
            for i in range(3)]
    (cell,) = agg.aggregate(recs, catalog=CATALOG)
    assert cell.metrics["samples_per_s"].n == 3 and cell.extra == {}


# -- intervals, ties, random init and merged sweeps ---------------------------------------------------------------


def flops(rate: float, tflops: float, probe: float | None) -> dict[str, Any]:
    """A succeeded bf16 GPU trial at `rate` samples/s and `tflops` achieved, with its GEMM probe's TFLOP/s."""
    parts = results(rate)
    parts["train"] |= {"tflops_per_s": tflops, "tokens_per_sample": 19.5, "padded_tokens_per_sample": 21.0}
    if probe is not None:
        parts["probe"] = {"precision": "bf16", "dtype": "bfloat16", "size": 8192, "repeats": 5,
                          "matmuls_per_repeat": 10, "best_s": 0.0157, "tflops_per_s": probe, "seconds": 0.2}
    return parts


def test_a_cell_above_the_gpus_ceiling_is_flagged_with_its_numbers_and_never_the_best() -> None:
    """The physics check: a setting whose TFLOP/s exceed its machine's GEMM probe, or 95% of the dense peak (H100
    bf16: 989.4), is a measurement error: flagged with the numbers, never the best nor tied with it, though it is
    the fastest; the answer says why where no setting is left."""
    honest = [record("ok", repeat=i, res=flops(28000.0 + 100 * i, 300.0 + i, 700.0)) for i in range(3)]
    above_probe = [record("probe", batch_size=64, repeat=i, res=flops(29000.0 + 100 * i, 750.0 + i, 700.0))
                   for i in range(3)]
    above_peak = [record("peak", batch_size=128, repeat=0, res=flops(60000.0, 960.0, None)),
                  record("peak", batch_size=128, repeat=1, res=flops(30000.0, 400.0, None))]
    cells = agg.aggregate(honest + above_probe + above_peak, catalog=CATALOG)
    assert [c.best for c in cells] == [True, False, False]
    assert cells[0].physics == [] and cells[0].value("mfu_pct") == pytest.approx(100 * 301 / 989.4)
    assert cells[0].value("mfu_probe_pct") == pytest.approx(100 * 301 / 700)
    assert cells[1].flags[-1] == "measurement error: 752 TFLOP/s is 107% of the GPU's GEMM probe (700 TFLOP/s)"
    assert cells[2].flags[-1] == ("1/2 measurement error: 960 TFLOP/s is 97% of the dense peak (989 TFLOP/s; above "
                                  "95% is not reached)")
    assert agg.best_cell(cells, "samples_per_s") is cells[0]
    assert agg.tied_with(cells[0], cells, "samples_per_s") == []  # 29,100 ± overlaps 28,100 ±, but is an error
    assert agg.best_cell(cells[1:], "samples_per_s") is None
    from kubesweep.tracking.report_answer import why_no_best

    assert why_no_best(cells[1:], "samples_per_s", 0.9) == ("every measured setting failed the physics check: a "
                                                             "measurement error")
    text = columns.to_markdown(cells)
    assert "| TFLOP/s | MFU % | MFU probe % | padded tokens/sample |" in text
    assert "| 301.0 ±0.8% | 30.42 ±0.8% | 43.00 ±0.8% | 21.00" in text


def _cell_of(rates: list[float], batch: int, gpu: str = "h100-80gb", **job: Any) -> list[TrialRecord]:
    return [record(f"{gpu}-{batch}-{i}", gpu=gpu, repeat=i, res=results(rate), batch_size=batch, **job)
            for i, rate in enumerate(rates)]


def test_settings_whose_intervals_overlap_the_best_are_tied_with_it() -> None:
    # 100, 102, 104: mean 102 ± 4.97 -> [97.0, 107.0]; 96, 98, 100: [93.0, 103.0] overlaps; 80, 81, 82 does not
    cells = agg.aggregate(_cell_of([100.0, 102.0, 104.0], 64) + _cell_of([96.0, 98.0, 100.0], 32)
                          + _cell_of([80.0, 81.0, 82.0], 16), catalog=CATALOG)
    best = agg.best_cell(cells, "samples_per_s")
    assert best is not None and best.axes.batch_size == 64
    assert [c.axes.batch_size for c in agg.tied_with(best, cells, "samples_per_s")] == [32]
    apart = agg.aggregate(_cell_of([100.0, 102.0, 104.0], 64) + _cell_of([90.0, 91.0, 92.0], 32), catalog=CATALOG)
    assert agg.tied_with(apart[0], apart, "samples_per_s") == []  # [89.8, 93.5] vs [97.0, 107.0]


def test_a_random_init_speed_run_is_marked_and_may_be_fastest_but_never_most_accurate() -> None:
    speed = _cell_of([5000.0, 5100.0], 256, random_init=True)
    for r in speed:
        assert r.results is not None
        r.results.final_accuracy = 0.509  # random init, one epoch: chance
    learned = _cell_of([1000.0, 1010.0], 32)
    cells = agg.aggregate(speed + learned, catalog=CATALOG)
    fast = next(c for c in cells if c.axes.batch_size == 256)
    assert fast.random_init and fast.flags == [flags.RANDOM_INIT] and not fast.at_chance
    assert columns.metric_text(fast, "accuracy").startswith("0.5090 (random init)")
    assert agg.best_cell(cells, "samples_per_s") is fast
    best_acc = agg.best_cell(cells, "accuracy")
    assert best_acc is not None and best_acc.axes.batch_size == 32
    assert isinstance(speed[0].results, Results)
    assert flags.trial_flags("succeeded", speed[0].results) == [flags.RANDOM_INIT]
    assert tm.RANK_METRIC in tm.comparison_metrics(speed[0].results, gpus=1, price_per_hour=None, peak_tflops=None)


def test_sweeps_from_two_machines_meet_in_cells_by_the_gpu_nvml_named() -> None:
    def on(product: str, name: str, rate: float) -> TrialRecord:
        res = results(rate, environment={"gpus": [{"product": product}]})
        return record(name, gpu=None, res=res)  # a local sweep that takes any GPU

    # the job records NVML's name as GPU Feature Discovery's product label (kubesweep.jobs.env.product_label)
    cells = agg.aggregate([on("NVIDIA-H100-80GB-HBM3", "a", 1000.0), on("NVIDIA-H200", "b", 1400.0),
                           on("NVIDIA-H100-80GB-HBM3", "c", 1010.0)], catalog=CATALOG)
    assert {c.axes.gpu: len(c.trials) for c in cells} == {"h100-80gb": 2, "h200": 1}
