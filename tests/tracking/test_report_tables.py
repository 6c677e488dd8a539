"""The report's tables (kubesweep/tracking/report_tables.py) on known cells: the repeats each setting got under the
rule, read from the `repeats.json` of each sweep merged into the report."""

from __future__ import annotations

from typing import Any

from kubesweep.gpus import load_catalog
from kubesweep.tracking import aggregate as agg
from kubesweep.tracking.report_tables import repeats_table
from kubesweep.wire.search import RepeatsSummary
from tests.tracking.test_aggregate import record, results


def summary(gpu: str, stops: dict[str, str]) -> RepeatsSummary:
    """A `repeats.json` of one GPU machine's sweep: bf16 and fp16 cells on `gpu`, and the CPU's cell."""
    def cell(axes: dict[str, Any], gpu: str, repeats: int, stopped: str) -> dict[str, Any]:
        return {"axes": axes, "task": "finetune", "gpu": gpu, "repeats": repeats, "ended": repeats, "values": repeats,
                "mean": 1000.0, "half_width_pct": 2.0, "stopped": stopped, "trials": []}

    cells = [cell({"precision": p}, gpu, 3, stops[p]) for p in ("bf16", "fp16")]
    cells.append(cell({"gpus_per_trial": 0, "precision": "fp32"}, "cpu", 8, stops["cpu"]))
    return RepeatsSummary.model_validate({
        "sweep": f"{gpu}-run", "strategy": "repeats", "rule": {"min": 3, "max": 8, "target": 3.0,
                                                               "metric": "samples_per_s"},
        "repeats": 14, "fixed_min": 9, "fixed_max": 24, "at_max": 1, "cells": cells})


def test_each_sweeps_stops_name_only_its_own_gpu_types_cells() -> None:
    recs = [record(f"{gpu}-{p}-{r}", gpu=gpu, repeat=r, precision=p, res=results(1000.0 + r))
            for gpu in ("h100-80gb", "h200") for p in ("bf16", "fp16") for r in range(3)]
    recs += [record(f"cpu-{r}", gpu=None, gpus=0, repeat=r, precision="fp32",
                    res=results(20.0 + r, device="cpu")) for r in range(3)]
    cells = agg.aggregate(recs, catalog=load_catalog())
    # the H200's sweep ran under the rule; the H100's was cut short before it wrote its repeats.json
    table = repeats_table(cells, [("h200-run", summary("h200", {"bf16": "reached", "fp16": "host-bound",
                                                                   "cpu": "max"}))], "samples_per_s")
    assert table is not None
    stopped = {(row[1], row[2]): row[5] for row in table.rows}
    assert stopped[("h200", "bs32 fp16 eager")] == "h200-run: host-bound"
    assert stopped[("h200", "bs32 bf16 eager")] == "target"
    assert stopped[("h100-80gb", "bs32 fp16 eager")] == "-"  # not the H200's host-bound, not "target"
    assert stopped[("h100-80gb", "bs32 bf16 eager")] == "-"
    assert stopped[("CPU", "bs32 fp32 eager")] == "h200-run: max"  # gpus_per_trial: 0 is the CPU's cell
    assert "'-': no sweep that ran it under the rule left its repeats.json" in table.note


def test_inference_rows_of_one_device_and_precision_say_what_sets_them_apart() -> None:
    """Eager and CUDA-graph inference at one precision and batch are two settings: the table names the setting that
    differs, or the two rows would read as one setting twice."""
    from kubesweep.tracking.report_tables import inference_table

    def inference(name: str, graph: bool, rate: float) -> Any:
        res = {"outcome": "succeeded", "device": "cuda",
               "inference": {"samples_per_s": rate, "latency_s": {"p50": 8 / rate, "p99": 9 / rate}}}
        return record(name, task="inference", batch_size=8, step_graph=graph, res=res)

    table = inference_table(agg.aggregate([inference("e", False, 900.0), inference("g", True, 7000.0)],
                                          catalog=load_catalog()))
    assert table is not None and table.headers[3] == "other"
    assert sorted(row[3] for row in table.rows) == ["step_graph=False", "step_graph=True"]
