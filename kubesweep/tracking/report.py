"""The sweep report: an HTML page with PNG figures and the comparison tables, from aggregated cells.

It opens with the answer: per objective (throughput, time to the target accuracy, $ per epoch; for inference
throughput and p50 latency; energy) the best setting overall and per task and GPU type, with the mean ± its 95%
interval, n and flags; settings whose intervals overlap the best one's are named as tied; with several GPU types,
how the GPU types compare at their best settings (`gpu_lines`).
Figures (`kubesweep.tracking.figures`; each skipped, with a line saying why, when the sweep has nothing for it;
CPU trials count as a device):
- `throughput.png`: samples/s vs batch size, one panel per GPU type, a line per precision (dashed: compiled);
- `compile_speedup.png`: compiled / eager samples/s for each (GPU, batch, precision) that ran both;
- `peak_memory.png`: peak memory vs batch size per GPU type and precision, with each GPU's memory as a line;
- `time_to_accuracy.png`, `cost_per_epoch.png`, `energy_per_epoch.png`: bars per cell;
- `heatmap.png`: samples/s of the whole fine-tuning matrix, OOM and GPU-mismatch cells labelled as such.
Tables: the GPU types at their best setting per model; time for the configured epochs at batch 16 per GPU;
torch.compile's break-even (`kubesweep.tracking.breakeven`); inference latency by device and precision; one GPU
vs DDP; then the full results table. Every row and every number drawn carries its cell's marks (`*` best, `OOM`,
`GPU mismatch`, `failed`, `chance accuracy (0.51)`); the page ends with the definitions and the marks' legend,
which its notes and column headers link to.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubesweep.gpus import Catalog, load_catalog
from kubesweep.tracking import figures as figs
from kubesweep.tracking.aggregate import Cell, to_json
from kubesweep.tracking.busy import busy_text, gpu_busy
from kubesweep.tracking.columns import cell_columns, headers, rows, to_markdown
from kubesweep.tracking.figures import finetune as _finetune
from kubesweep.tracking.report_answer import (
    answer_lines,
    answer_table,
    best_settings,
    noisy_lines,
    setting_text,
    why_no_best,
)
from kubesweep.tracking.report_files import publish, staged
from kubesweep.tracking.report_page import LEGEND, Report, Table, html_page
from kubesweep.tracking.report_tables import (
    breakeven_table,
    ddp_table,
    device_table,
    epochs_table,
    gpu_table,
    inference_table,
    queue_table,
    repeats_table,
    sharing_table,
)
from kubesweep.wire.metrics import METRICS, label
from kubesweep.wire.search import RepeatsSummary

# -- figures ---------------------------------------------------------------------------------------------------


def _figure_gap(name: str, cells: list[Cell], target: float, merged: bool = False) -> str:
    """Why a figure has nothing to draw, in the reader's terms."""
    if name == "gpu_timeline.png":
        if merged:
            return "several sweeps merged: each has its own timeline, in its own report"
        return "the sweep has no GPU trials with results"
    ft = _finetune(cells)
    if not ft:
        return "the sweep has no fine-tuning trials"
    if not any("succeeded" in c.outcomes for c in ft):
        return "no fine-tuning trial succeeded"
    if name == "compile_speedup.png":
        if all(c.axes.compile == "off" for c in ft):
            return "every trial ran eager (add a compile axis to compare)"
        return "no setting ran both eager and compiled with a result"
    if name == "time_to_accuracy.png":
        return why_no_best(ft, "tta_train_s", target)
    if name == "cost_per_epoch.png":
        return why_no_best(ft, "cost_per_epoch", target)
    if name == "energy_per_epoch.png":
        return "no trial measured its GPU energy (no NVML energy counter: CPU trials, or GPUs before Volta)"
    if name == "peak_memory.png":
        return "no trial recorded its peak memory"
    return "no single-device fine-tuning trial has the number"


# -- the report --------------------------------------------------------------------------------------------------


def build(cells: list[Cell], directory: Path, *, sweep: str, source: str, target: float, best_by: str,
          catalog: Catalog | None = None, merged: bool = False,
          repeats: list[tuple[str, RepeatsSummary]] | None = None) -> Report:
    """Write report.html, the figures, report.md and summary.json into `directory`. `merged`: the cells come from
    several sweeps (machines, at other times): no GPU-busy figure or timeline, which need one sweep's wall time.
    `repeats`: what sequential repeats spent in each sweep that ran under the rule ((where, repeats.json)).

    The files are written into a staging directory first and then each moved into place (a rename), report.html
    last: a build that fails leaves the report that was there as it was, never half of a new one. Other files in
    `directory` are left alone. `report_files.ReportPathError`: `directory` cannot be made or written."""
    catalog = catalog or load_catalog()
    with staged(directory) as staging:
        report = _write(cells, staging, sweep=sweep, source=source, target=target, best_by=best_by,
                        catalog=catalog, merged=merged, repeats=repeats or [])
        publish(staging, directory, [*FIGURES, "summary.json", "report.md", "report.html"])
    report.directory = directory
    return report


FIGURES = ("throughput.png", "compile_speedup.png", "peak_memory.png", "time_to_accuracy.png", "cost_per_epoch.png",
           "energy_per_epoch.png", "heatmap.png", "gpu_timeline.png")


def _rule_metric(repeats: list[tuple[str, RepeatsSummary]], best_by: str) -> str:
    """The metric the sweeps' repeats rule measured until (the first sweep's), else `best_by`."""
    metric = repeats[0][1].rule.metric if repeats else None
    return metric if metric is not None and metric in METRICS else best_by


def _write(cells: list[Cell], staging: Path, *, sweep: str, source: str, target: float, best_by: str,
           catalog: Catalog, merged: bool, repeats: list[tuple[str, RepeatsSummary]]) -> Report:
    """The report's files, written into `staging` (the report's directory until they are moved into place)."""
    report = Report(sweep, staging)

    def memory_line(gpu: str) -> float | None:
        return catalog[gpu].memory_gib if gpu in catalog else None

    on_gpu, on_cpu = any(c.axes.gpu != "cpu" for c in cells), any(c.axes.gpu == "cpu" for c in cells)
    device = "GPU type" if on_gpu and not on_cpu else ("device" if on_gpu else "setting")
    shape = "per setting" if figs.single_x(cells) else "vs batch size"
    peak = "; ".join([*(["GPU: the torch allocator's peak, dotted: the GPU's memory"] if on_gpu else []),
                      *(["CPU: the process's peak RSS"] if on_cpu else [])])
    drawings: list[tuple[str, str, Callable[[], Any]]] = [
        ("throughput.png", f"Throughput {shape}{f' per {device}' if device != 'setting' else ''} and precision "
         f"(error bars: the 95% interval over repeats)",
         lambda: figs.per_gpu_lines(cells, "samples_per_s", label("samples_per_s"), "Fine-tuning throughput")),
        ("compile_speedup.png", "torch.compile speed-up: compiled / eager samples/s for the same setting",
         lambda: figs.speedup(cells)),
        ("peak_memory.png", f"Peak memory {shape} ({peak}; error bars: the 95% interval over repeats)",
         lambda: figs.per_gpu_lines(cells, "peak_mem_gib", label("peak_mem_gib"), "Peak memory", memory_line)),
        ("time_to_accuracy.png", f"Time to {target:.0%} dev accuracy (training time at the steady step time, the "
         "warm-up apart; green: best per GPU)",
         lambda: figs.bars(_finetune(cells), "tta_train_s", "seconds", f"Time to accuracy >= {target:g}")),
        ("cost_per_epoch.png", "$ per epoch: catalog price x GPUs x epoch time",
         lambda: figs.bars(_finetune(cells), "cost_per_epoch", "USD", "$ per epoch")),
        ("energy_per_epoch.png", "GPU energy per epoch: joules per sample over the measured steps (NVML's energy "
         "counter) x training rows",
         lambda: figs.bars(_finetune(cells), "kwh_per_epoch", "kWh", "Energy per epoch")),
        ("heatmap.png", "The whole fine-tuning matrix: samples/s; grey cells say why there is no number, or hold a "
         "flagged one",
         lambda: figs.heatmap(cells)),
        ("gpu_timeline.png", "Where the GPU time went: each trial's process (grey), the time it held its GPU "
         "(blue) and its measured training steps (green; drawn at the end of the blue span, where training "
         "runs after warm-up)", lambda: None if merged else figs.timeline(cells)),
    ]
    for name, caption, draw in drawings:
        path = staging / name
        drawn = draw()
        if drawn is not None:
            figs.save(drawn, path)
            report.figures.append((name, caption))
        else:
            report.skipped.append(f"{name}: not drawn: {_figure_gap(name, cells, target, merged)}")
    makers: list[tuple[str, Callable[[list[Cell]], Table | None]]] = [
        ("GPU types at their best setting", lambda c: gpu_table(c, target)),
        ("time for N epochs at batch 16", epochs_table), ("torch.compile break-even", breakeven_table),
        ("inference latency", inference_table), ("one GPU vs DDP", ddp_table),
        ("time to get a GPU (queue wait)", queue_table), ("trials alone or beside others", sharing_table),
        ("GPU busy per device", lambda c: None if merged else device_table(c)),
    ] + ([("repeats per setting", lambda c: repeats_table(c, repeats, _rule_metric(repeats, best_by)))]
         if repeats else [])
    for title, make in makers:
        table = make(cells)
        if table is None:
            report.table_notes.append(f"table '{title}' skipped: the sweep has no trials for it")
        else:
            report.tables.append(table)
    columns = cell_columns(cells)
    full = Table("", headers(columns), rows(cells, columns),
                 f"mean ± the 95% interval's half-width over repeats; TTA target {target:g}; * best "
                 f"{METRICS[best_by].label} per GPU type")
    report.answer = answer_lines(cells, target, measured_only=True)
    report.unanswered = [line for line in answer_lines(cells, target) if line not in report.answer]
    busy = None if merged else gpu_busy([t for c in cells for t in c.trials])
    if busy is not None:
        report.answer.append(busy_text(busy) + " (measured training steps over the sweep's wall time)")
    report.answer += noisy_lines(cells)
    report.best = answer_table(cells, target)
    summary = to_json(cells, sweep=sweep, source=source, target=target, best_by=best_by, busy=busy)
    summary["answer"] = report.answer
    summary["unanswered"] = report.unanswered
    summary["best"] = [{"task": b.task, "gpu": b.gpu, "metric": b.metric, "objective": b.objective,
                        "setting": setting_text(b.cell) if b.cell else None,
                        "stat": b.cell.metrics[b.metric].as_dict() if b.cell else None,
                        "flags": b.cell.flags if b.cell else [], "none": b.why_none or None}
                       for b in best_settings(cells, target)]
    summary["tables"] = [{"title": t.title, "headers": t.headers, "rows": t.rows} for t in report.tables]
    summary["figures"] = [name for name, _ in report.figures]
    (staging / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    md = [f"# Sweep {sweep}: report", "", LEGEND, "", "## The answer", ""]
    md += [f"- {line}" for line in report.answer] + ["", report.best.markdown()]
    md += [t.markdown() for t in report.tables]
    md += ["## All results", "", to_markdown(cells)]
    md += [f"![{cap}]({name})" for name, cap in report.figures]
    left_out = [*report.unanswered, *report.table_notes, *report.skipped]
    md += ["## Left out", "", *[f"- {line}" for line in left_out]] if left_out else []
    (staging / "report.md").write_text("\n".join(md) + "\n")
    (staging / "report.html").write_text(html_page(report, full, source, target))
    return report
