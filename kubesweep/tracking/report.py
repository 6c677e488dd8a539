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
torch.compile's break-even (`kubesweep.tracking.breakeven`); inference latency on CPU vs GPU vs FP16; one GPU
vs DDP; then the full results table. Every row and every number drawn carries its cell's marks (`*` best, `OOM`,
`GPU mismatch`, `failed`, `chance accuracy (0.51)`); the page ends with the definitions and the marks' legend,
which its notes and column headers link to.
"""

from __future__ import annotations

import html
import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubesweep.gpus import Catalog, load_catalog
from kubesweep.tracking import figures as figs
from kubesweep.tracking import intervals, sharing
from kubesweep.tracking.aggregate import (
    METRICS,
    RANDOM_INIT,
    Cell,
    best_cell,
    fmt_number,
    headers,
    metric_text,
    text_rows,
    tied_with,
    to_json,
    to_markdown,
)
from kubesweep.tracking.breakeven import break_evens
from kubesweep.tracking.busy import busy_text, gpu_busy
from kubesweep.tracking.figures import finetune as _finetune
from kubesweep.tracking.figures import gpu_label as _gpu_label
from kubesweep.tracking.figures import other_settings as _other_settings
from kubesweep.tracking.records import dig
from kubesweep.tracking.report_files import publish, staged
from kubesweep.tracking.report_page import ANCHORS, LEGEND, html_page

SEED_BATCH = 16


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]]
    note: str = ""

    def markdown(self) -> str:
        lines = [f"### {self.title}", ""]
        if self.note:
            lines += [self.note, ""]
        lines.append("| " + " | ".join(self.headers) + " |")
        lines.append("|" + "|".join("---" for _ in self.headers) + "|")
        lines += ["| " + " | ".join(r) + " |" for r in self.rows]
        return "\n".join(lines) + "\n"

    def html(self) -> str:
        """The table; a header with a definition links to it, a row with flags other than `n=1` is tinted."""
        head = "".join(f"<th><a href='#{ANCHORS[h]}'>{html.escape(h)}</a></th>" if h in ANCHORS
                       else f"<th>{html.escape(h)}</th>" for h in self.headers)
        at = self.headers.index("flags") if "flags" in self.headers else None

        def flagged(row: list[str]) -> bool:
            return at is not None and any(f not in ("", "*", "n=1", RANDOM_INIT) for f in row[at].split("; "))

        body = "".join(("<tr class='flagged'>" if flagged(row) else "<tr>")
                       + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in self.rows)
        note = f"<p class='note'>{html.escape(self.note)}</p>" if self.note else ""
        title = f"<h3>{html.escape(self.title)}</h3>" if self.title else ""
        return f"{title}{note}<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


@dataclass
class Report:
    sweep: str
    directory: Path
    figures: list[tuple[str, str]] = field(default_factory=list)  # (file, caption)
    skipped: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    table_notes: list[str] = field(default_factory=list)
    answer: list[str] = field(default_factory=list)
    best: Table | None = None

    @property
    def html_path(self) -> Path:
        return self.directory / "report.html"


# -- the answer ------------------------------------------------------------------------------------------------

# (metric, what it answers) per task: the objectives the headline picks a best setting for
OBJECTIVES: dict[str, list[tuple[str, str]]] = {
    "finetune": [("samples_per_s", "highest throughput"), ("tta_s", "soonest to the target accuracy"),
                 ("cost_per_epoch", "lowest $ per epoch"), ("kwh_per_epoch", "least energy per epoch")],
    "inference": [("samples_per_s", "highest throughput"), ("step_p50_ms", "lowest p50 latency"),
                  ("j_per_sample", "least energy per sample")],
}


UNITS = {"samples_per_s": "{} samples/s", "tta_s": "{} s", "cost_per_epoch": "${} per epoch",
         "step_p50_ms": "{} ms", "kwh_per_epoch": "{} kWh per epoch", "j_per_sample": "{} J per sample"}


@dataclass
class Best:
    task: str
    gpu: str
    metric: str
    objective: str
    cell: Cell | None
    why_none: str = ""

    def value_text(self) -> str:
        if self.cell is None:
            return self.why_none
        return value_text(self.cell, self.metric)


def value_text(cell: Cell, metric: str) -> str:
    """`5,120 samples/s ±1.2%`: the mean in its unit, ± its 95% interval's half-width (n >= 2)."""
    stat = cell.metrics[metric]
    rel = stat.relative_half_width
    spread = f" ±{rel * 100:.1f}%" if rel is not None else ""
    return UNITS.get(metric, "{} " + METRICS[metric][0]).format(fmt_number(stat.mean)) + spread


def setting_text(cell: Cell, with_gpu: bool = False) -> str:
    """`bs64 bf16 compile=default` (`h100-80gb x2 GPUs bs64 ...` with_gpu)."""
    parts = [_gpu_label(cell)] if with_gpu else []
    if cell.axes["gpus"] > 1:
        parts.append(f"x{cell.axes['gpus']} GPUs")
    parts += [f"bs{cell.axes['batch_size']}", str(cell.axes["precision"])]
    parts.append("eager" if cell.axes["compile"] == "off" else f"compile={cell.axes['compile']}")
    parts += [f"{k}={v}" for k, v in cell.extra.items()]
    return " ".join(parts)


def _why_none(cells: list[Cell], metric: str, target: float) -> str:
    if not any("succeeded" in c.outcomes for c in cells):
        return "no trial succeeded"
    if any(c.value(metric) is not None for c in cells):  # measured, but best_cell left every such setting out
        return "no setting learned: each has a repeat at chance accuracy"
    if metric == "tta_s":
        best = max((v for c in cells if (v := c.value("accuracy")) is not None), default=None)
        return f"no trial reached {target:g} dev accuracy" + (f" (best {best:.3f})" if best is not None else "")
    if metric == "cost_per_epoch":
        return "no price: CPU trials" if all(c.axes["gpu"] == "cpu" for c in cells) else "no price in the catalog"
    return "not measured"


def best_settings(cells: list[Cell], target: float) -> list[Best]:
    """The best setting for each objective, per task and GPU type (`cpu` for CPU trials)."""
    groups: dict[tuple[str, str], list[Cell]] = {}
    for cell in cells:
        groups.setdefault((cell.task, str(cell.axes["gpu"])), []).append(cell)
    out = []
    for (task, gpu), group in sorted(groups.items(), key=lambda kv: (kv[0][0] != "finetune", kv[0][1] == "cpu",
                                                                      kv[0][1])):
        for metric, objective in OBJECTIVES.get(task, OBJECTIVES["finetune"]):
            chosen = best_cell(group, metric)
            out.append(Best(task, gpu, metric, objective, chosen,
                            "" if chosen is not None else _why_none(group, metric, target)))
    return out


def _shown(cell: Cell, metric: str) -> str:
    """`h100-80gb bs64 bf16 eager: 5,120 samples/s ±1.2% (n=3; OOM)`."""
    shown = [f for f in cell.flags if f != "n=1"]  # n is given beside them
    flags = f"; {', '.join(shown)}" if shown else ""
    return f"{setting_text(cell, with_gpu=True)}: {value_text(cell, metric)} (n={cell.metrics[metric].n}{flags})"


def answer_lines(cells: list[Cell], target: float) -> list[str]:
    """One sentence per objective across every GPU type: the sweep's answer. Where other settings' 95% intervals
    overlap the best one's, the sentence names them all as tied instead of naming a winner."""
    lines = []
    for task in ("finetune", "inference"):
        group = [c for c in cells if c.task == task]
        if not group:
            continue
        noun = "fine-tuning" if task == "finetune" else "inference"
        for metric, objective in OBJECTIVES[task]:
            cell = best_cell(group, metric)
            if cell is None:
                lines.append(f"{noun}, {objective}: {_why_none(group, metric, target)}.")
                continue
            tied = tied_with(cell, group, metric)
            if tied:
                shown = "; ".join(_shown(c, metric) for c in [cell, *tied][:TIED_SHOWN])
                more = f"; and {len(tied) + 1 - TIED_SHOWN} more" if len(tied) + 1 > TIED_SHOWN else ""
                lines.append(f"{noun}, {objective}: {len(tied) + 1} settings tied (95% intervals overlap): "
                             f"{shown}{more}.")
            else:
                lines.append(f"{noun}, {objective}: {_shown(cell, metric)}.")
        lines += gpu_lines(group, task)
    return lines


TIED_SHOWN = 3


NOISY = 0.03  # a samples/s interval wider than ±3% of the mean is named, with what may explain it


def _measured_s(cell: Cell) -> float | None:
    """The mean measured time of a repeat: training's measured steps, or inference's measured batches."""
    times = []
    for trial in cell.trials:
        res = trial.results or {}
        t = dig(res, "train", "measured_time_s")
        if t is None and (lat := dig(res, "inference", "latency_s")):
            t = float(lat.get("mean") or 0.0) * float(lat.get("n") or 0)
        if isinstance(t, (int, float)):
            times.append(float(t))
    return sum(times) / len(times) if times else None


def noisy_lines(cells: list[Cell]) -> list[str]:
    """One sentence naming the settings whose samples/s is known to less than ±3% (95%), with each one's repeats
    and measured time per repeat: a short measured window or a shared CPU is the usual cause."""
    noisy = [c for c in cells if (rel := c.metrics["samples_per_s"].relative_half_width) is not None and rel > NOISY]
    if not noisy:
        return []
    parts = []
    for cell in noisy:
        stat = cell.metrics["samples_per_s"]
        measured = _measured_s(cell)
        window = f", {measured:.2g} s measured per repeat" if measured is not None else ""
        rel = (stat.relative_half_width or 0.0) * 100
        parts.append(f"{setting_text(cell, with_gpu=True)} ({cell.task}) ±{rel:.1f}%: repeats "
                     f"{', '.join(fmt_number(v) for v in stat.values)}{window}")
    return [f"Noisier than ±{NOISY:.0%} in samples/s (95% interval): " + "; ".join(parts) + "."]


def gpu_lines(cells: list[Cell], task: str) -> list[str]:
    """Per objective, the GPU types compared at their best settings: which is best and by how much, or tied."""
    noun = "fine-tuning" if task == "finetune" else "inference"
    groups: dict[str, list[Cell]] = {}
    for cell in cells:
        if task == "inference" or cell.axes["gpu"] != "cpu":
            groups.setdefault(str(cell.axes["gpu"]), []).append(cell)
    if len(groups) < 2:
        return []
    lines = []
    for metric, objective in OBJECTIVES[task]:
        bests = [found for g in groups.values() if (found := best_cell(g, metric)) is not None]
        if len(bests) < 2:
            continue
        higher = METRICS[metric][1]
        bests.sort(key=lambda c: c.value(metric) or 0.0, reverse=higher)
        first, second = bests[0], bests[1]
        a, b = first.value(metric) or 0.0, second.value(metric) or 0.0
        ia, ib = first.metrics[metric].interval, second.metrics[metric].interval
        versus = f"{_gpu_label(first)} {value_text(first, metric)} vs {_gpu_label(second)} {value_text(second, metric)}"
        if ia is not None and ib is not None and ia.overlaps(ib) and (first.metrics[metric].n > 1
                                                                      or second.metrics[metric].n > 1):
            lines.append(f"GPU types, {noun}, {objective}: tied at their best settings, 95% intervals overlap "
                         f"({versus}).")
            continue
        if not b:
            by = "ahead of"
        elif higher:
            by = f"{a / b:.2f}x"
        else:
            by = f"{(1 - a / b) * 100:.0f}% below"
        rest = f"; {len(bests) - 2} more GPU types behind" if len(bests) > 2 else ""
        lines.append(f"GPU types, {noun}, {objective}: {_gpu_label(first)} is {by} {_gpu_label(second)} at "
                     f"their best settings ({versus}){rest}.")
    return lines


def answer_table(cells: list[Cell], target: float) -> Table:
    rows = []
    for b in best_settings(cells, target):
        c = b.cell
        rows.append([b.task, "CPU" if b.gpu == "cpu" else b.gpu, b.objective,
                     setting_text(c) if c is not None else "-", b.value_text(),
                     str(c.metrics[b.metric].n) if c is not None else "-", "; ".join(c.flags) if c else ""])
    note = (f"Per task and GPU type, the setting that does best on each objective: mean over the repeats that "
            f"succeeded ± the 95% interval's half-width, n repeats; the target accuracy is {target:g}. Flags: OOM, "
            "GPU mismatch and failed "
            "repeats, chance accuracy (<= 0.55 on SST-2's two classes; such a setting is never the best), n=1 "
            "(no spread).")
    return Table("Best setting per GPU type", ["task", "GPU", "objective", "setting", "value", "n", "flags"], rows,
                 note)


# -- comparison tables ---------------------------------------------------------------------------------------


def _minutes(seconds: float | None) -> str:
    return "-" if seconds is None else fmt_number(seconds / 60)


def _flags(cell: Cell) -> str:
    """The flags column of every table: `*` first for the best setting, then the cell's flags."""
    return "; ".join((["*"] if cell.best else []) + cell.flags)


def epochs_table(cells: list[Cell]) -> Table | None:
    """Time for the configured number of epochs at batch 16 (or the smallest batch run) on each GPU type."""
    single = [c for c in _finetune(cells) if c.axes["gpus"] == 1 and c.axes["gpu"] != "cpu"]
    if not single:
        return None
    batches = sorted({int(c.axes["batch_size"]) for c in single if c.axes["batch_size"] is not None})
    batch = SEED_BATCH if SEED_BATCH in batches else batches[0]
    chosen = [c for c in single if c.axes["batch_size"] == batch]
    first_job = chosen[0].trials[0].job
    epochs = float(first_job.get("epochs") or 3)
    epochs_text = f"{epochs:g} epoch" + ("" if epochs == 1 else "s")
    dataset = str(first_job.get("dataset") or "the dataset")
    rows_n = {str(dig(t.results, "data", "train_rows")) for c in chosen for t in c.trials if t.results}
    rows_n.discard("None")
    note = (f"epoch time = training-loop wall time less the warm-up / epochs completed (evaluation excluded), x "
            f"{epochs:g}; training rows per epoch: {', '.join(sorted(rows_n)) or 'unknown'}.")
    chosen.sort(key=lambda c: (str(c.axes["gpu"]), c.value("epoch_s") is None, c.value("epoch_s") or 0.0))
    rows = []
    for cell in chosen:
        epoch_s = cell.value("epoch_s")
        cost = cell.value("cost_per_epoch")
        rows.append([
            _gpu_label(cell), str(cell.axes["precision"]), str(cell.axes["compile"]), _other_settings(cell),
            _minutes(epoch_s * epochs) if epoch_s is not None else cell.status,
            metric_text(cell, "samples_per_s"),
            fmt_number(cost * epochs) if cost is not None else "-",
            metric_text(cell, "accuracy"), _flags(cell),
        ])
    return Table(f"Time for {epochs_text} of {dataset} at batch {batch} per GPU",
                 ["GPU", "precision", "compile", "other", f"min for {epochs_text}", "samples/s",
                  f"$ for {epochs_text}", "accuracy", "flags"], rows, note)


def gpu_table(cells: list[Cell], target: float) -> Table | None:
    """The GPU types side by side, per model, each at its best fine-tuning setting by samples/s (among settings
    that learned): time per epoch, samples/s, peak memory, energy and $ per epoch, accuracy and time to it."""
    groups: dict[tuple[str, str], list[Cell]] = {}
    for cell in _finetune(cells):
        if cell.axes["gpu"] != "cpu":
            model = str(cell.trials[0].job.get("model") or "-")
            groups.setdefault((model, str(cell.axes["gpu"])), []).append(cell)
    rows = []
    for (model, _gpu), group in sorted(groups.items()):
        chosen = best_cell(group, "samples_per_s")
        if chosen is None:
            continue
        cell = chosen
        epoch = cell.metrics["epoch_s"]
        minutes = fmt_number(epoch.mean / 60) if epoch.mean is not None else "-"
        if (rel := epoch.relative_half_width) is not None:
            minutes += f" ±{rel * 100:.1f}%"
        rows.append([model, _gpu_label(cell), setting_text(cell), minutes, metric_text(cell, "warmup_s"),
                     metric_text(cell, "samples_per_s"), metric_text(cell, "peak_mem_gib"),
                     metric_text(cell, "kwh_per_epoch"),
                     metric_text(cell, "cost_per_epoch"), metric_text(cell, "accuracy"), metric_text(cell, "tta_s"),
                     str(len(cell.trials)), _flags(cell)])
    if len(rows) < 1:
        return None
    note = ("Per model and GPU type, the fine-tuning setting with the most samples/s among those that learned (a "
            "random-init speed run counts: its accuracy is not meaningful): mean ± the 95% interval's half-width "
            "over the repeats. min/epoch: training-loop wall time per epoch, the warm-up apart (warm-up s: "
            f"compilation and each shape's first steps, once per run); TTA: to {target:g} dev accuracy, warm-up "
            "included.")
    return Table("GPU types at their best setting", ["model", "GPU", "setting", "min/epoch", "warm-up s",
                                                    "samples/s",
                                                    "peak GiB", "kWh/epoch", "$/epoch", "accuracy", "TTA s", "n",
                                                    "flags"], rows, note)


def queue_table(cells: list[Cell]) -> Table | None:
    """Per GPU type, how long its queued trials (spec.queue) waited from their Job's creation to their start: which
    GPU type is fast to get, beside which is fast to run."""
    waits: dict[str, list[float]] = {}
    for cell in cells:
        if cell.axes.get("gpu") in (None, "cpu"):
            continue
        for trial in cell.trials:
            wait = dig(trial.results, "timings", "queue_wait_s")
            if isinstance(wait, (int, float)) and not isinstance(wait, bool):
                waits.setdefault(_gpu_label(cell), []).append(float(wait))
    if not waits:
        return None
    rows = []
    for gpu, values in sorted(waits.items()):
        mean = statistics.fmean(values)
        half = intervals.half_width(values)
        spread = f" ±{half / mean * 100:.0f}%" if half is not None and mean > 0 else ""
        rows.append([gpu, fmt_number(mean) + spread, fmt_number(statistics.median(values)), fmt_number(max(values)),
                     str(len(values))])
    return Table("time to get a GPU (queue wait)", ["GPU", "mean s", "median s", "max s", "trials"], rows,
                 "Queued trials (spec.queue): from their Job's creation to their process's start, the wait for "
                 "Kueue's admission, scheduling and image pull; mean ± the 95% interval's half-width over the "
                 "trials of that GPU type.")


def breakeven_table(cells: list[Cell]) -> Table | None:
    """When compiling pays off, per compiled fine-tuning setting against the same setting run eager."""
    found = break_evens(cells)
    if not found:
        return None
    rows = []
    for be in found:
        rows.append([_gpu_label(be.compiled), setting_text(be.compiled), fmt_number(be.eager.value("warmup_s")),
                     fmt_number(be.compiled.value("warmup_s")), fmt_number(be.extra_warmup_s),
                     fmt_number(be.saved_per_step_s * 1000), be.text, _flags(be.compiled)])
    note = ("extra warm-up = compiled - eager warm-up (means); saved per step = global batch / eager samples/s - "
            "global batch / compiled samples/s; break-even = extra warm-up / saved per step, in steps and epochs "
            "of the training rows. A compile cache that already holds the graphs shortens the compiled warm-up.")
    return Table("torch.compile break-even", ["GPU", "setting", "eager warm-up s", "compiled warm-up s",
                                              "extra s", "saved ms/step", "pays off", "flags"], rows, note)


def inference_table(cells: list[Cell]) -> Table | None:
    """Inference latency: CPU vs GPU vs reduced precision."""
    inf = [c for c in cells if c.task == "inference"]
    if not inf:
        return None
    cpu = [v for c in inf if c.axes["gpu"] == "cpu" and (v := c.value("step_p50_ms")) is not None]
    cpu_p50 = min(cpu) if cpu else None
    inf.sort(key=lambda c: (c.axes["gpu"] != "cpu", str(c.axes["gpu"]), int(c.axes["batch_size"] or 0),
                            str(c.axes["precision"]), str(c.axes["compile"])))
    rows = []
    for cell in inf:
        p50 = cell.value("step_p50_ms")
        speedup = f"{cpu_p50 / p50:.1f}x" if cpu_p50 and p50 else "-"
        rows.append([_gpu_label(cell), str(cell.axes["precision"]), str(cell.axes["compile"]),
                     str(cell.axes["batch_size"]), metric_text(cell, "step_p50_ms"),
                     metric_text(cell, "latency_p99_ms"), metric_text(cell, "samples_per_s"), speedup,
                     _flags(cell)])
    note = "latency = wall time of one batch (p50, p99 over the measured batches); speed-up = CPU p50 / p50."
    return Table("Inference latency: CPU vs GPU vs FP16", ["device", "precision", "compile", "batch",
                                                          "p50 ms", "p99 ms", "samples/s", "speed-up vs CPU",
                                                          "flags"],
                 rows, note if cpu_p50 else note + " (no CPU trial: no speed-up)")


def ddp_table(cells: list[Cell]) -> Table | None:
    """One GPU vs DDP over N GPUs, for the same GPU type and settings."""
    ft = [c for c in _finetune(cells) if c.axes["gpu"] != "cpu"]
    if not any(c.axes["gpus"] > 1 for c in ft):
        return None

    def setting(c: Cell) -> tuple[Any, ...]:
        return (c.axes["gpu"], c.axes["batch_size"], c.axes["precision"], c.axes["compile"],
                json.dumps(c.extra, sort_keys=True, default=str))

    groups: dict[tuple[Any, ...], list[Cell]] = {}
    for cell in ft:
        groups.setdefault(setting(cell), []).append(cell)
    rows = []
    for key in sorted(k for k, g in groups.items() if any(c.axes["gpus"] > 1 for c in g)):
        group = sorted(groups[key], key=lambda c: c.axes["gpus"])
        base = next((c.value("samples_per_s") for c in group if c.axes["gpus"] == 1), None)
        for cell in group:
            n = int(cell.axes["gpus"])
            rate = cell.value("samples_per_s")
            eff = f"{rate / (n * base) * 100:.0f}%" if rate and base and n > 1 else ("100%" if n == 1 and rate else "-")
            rows.append([str(key[0]), str(n), "single GPU" if n == 1 else f"DDP x{n}", str(key[1]), str(key[2]),
                         str(key[3]), metric_text(cell, "samples_per_s"), eff, metric_text(cell, "epoch_s"),
                         metric_text(cell, "cost_per_epoch"), _flags(cell)])
    note = ("batch is per GPU; scaling efficiency = samples/s with N GPUs / (N x samples/s on one GPU). The job "
            "runs multi-GPU trials as DistributedDataParallel (one process per GPU).")
    return Table("One GPU vs DDP", ["GPU", "GPUs", "strategy", "batch", "precision", "compile", "samples/s",
                                    "scaling", "epoch s", "$/epoch", "flags"], rows, note)


def sharing_table(cells: list[Cell]) -> Table | None:
    """Every GPU trial: its node and GPU (PCI bus id), and whether it was measured alone or beside other trials."""
    trials = [t for c in cells for t in c.trials if (t.results or {}).get("device") == "cuda"]
    rows = sharing.sharing_rows(trials)
    if not rows:
        return None
    return Table("Measured alone or beside other trials", ["trial", "node", "GPU (PCI bus id)", "measured",
                                                           "samples/s"], rows,
                 "a neighbour is another trial whose process ran on the same node during this trial's measured "
                 "steps; a cell whose shared repeats differ from its lone ones beyond their 95% intervals is "
                 "flagged")


def device_table(cells: list[Cell]) -> Table | None:
    """The busy fraction of each GPU the sweep's trials ran on (only where they ran on more than one)."""
    devices = sharing.device_busy([t for c in cells for t in c.trials])
    if len(devices) < 2:
        return None
    return Table("GPU busy per device", ["node", "PCI bus id", "UUID", "trials", "measured training s", "busy"],
                 sharing.busy_rows(devices), "measured training steps on that GPU over the sweep's wall time "
                                             "(first trial's start to last results file)")


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
        if all(c.axes["compile"] == "off" for c in ft):
            return "every trial ran eager (add a compile axis to compare)"
        return "no setting ran both eager and compiled with a result"
    if name == "time_to_accuracy.png":
        return _why_none(ft, "tta_s", target)
    if name == "cost_per_epoch.png":
        return _why_none(ft, "cost_per_epoch", target)
    if name == "energy_per_epoch.png":
        return "no trial measured its GPU energy (no NVML energy counter: CPU trials, or GPUs before Volta)"
    if name == "peak_memory.png":
        return "no trial recorded its peak memory"
    return "no single-device fine-tuning trial has the number"


# -- the report --------------------------------------------------------------------------------------------------


def build(cells: list[Cell], directory: Path, *, sweep: str, source: str, target: float, best_by: str,
          catalog: Catalog | None = None, merged: bool = False) -> Report:
    """Write report.html, the figures, report.md and summary.json into `directory`. `merged`: the cells come from
    several sweeps (machines, at other times): no GPU-busy figure or timeline, which need one sweep's wall time.

    The files are written into a staging directory first and then each moved into place (a rename), report.html
    last: a build that fails leaves the report that was there as it was, never half of a new one. Other files in
    `directory` are left alone. `report_files.ReportPathError`: `directory` cannot be made or written."""
    catalog = catalog or load_catalog()
    with staged(directory) as staging:
        report = _write(cells, staging, sweep=sweep, source=source, target=target, best_by=best_by,
                        catalog=catalog, merged=merged)
        publish(staging, directory, [*FIGURES, "summary.json", "report.md", "report.html"])
    report.directory = directory
    return report


FIGURES = ("throughput.png", "compile_speedup.png", "peak_memory.png", "time_to_accuracy.png", "cost_per_epoch.png",
           "energy_per_epoch.png", "heatmap.png", "gpu_timeline.png")


def _write(cells: list[Cell], staging: Path, *, sweep: str, source: str, target: float, best_by: str,
           catalog: Catalog, merged: bool) -> Report:
    """The report's files, written into `staging` (the report's directory until they are moved into place)."""
    report = Report(sweep, staging)

    def memory_line(gpu: str) -> float | None:
        return catalog[gpu].memory_gib if gpu in catalog else None

    drawings: list[tuple[str, str, Callable[[], Any]]] = [
        ("throughput.png", "Throughput vs batch size per GPU type and precision (error bars: std over repeats)",
         lambda: figs.per_gpu_lines(cells, "samples_per_s", "samples/s", "Fine-tuning throughput")),
        ("compile_speedup.png", "torch.compile speed-up: compiled / eager samples/s for the same setting",
         lambda: figs.speedup(cells)),
        ("peak_memory.png", "Peak memory vs batch size (GPU: the torch allocator's peak, dotted: the GPU's memory; "
         "CPU: the process's peak RSS)",
         lambda: figs.per_gpu_lines(cells, "peak_mem_gib", "peak GiB", "Peak memory", memory_line)),
        ("time_to_accuracy.png", f"Time to {target:.0%} dev accuracy (training wall time; green: best per GPU)",
         lambda: figs.bars(_finetune(cells), "tta_s", "seconds", f"Time to accuracy >= {target:g}")),
        ("cost_per_epoch.png", "$ per epoch: catalog price x GPUs x epoch time",
         lambda: figs.bars(_finetune(cells), "cost_per_epoch", "USD", "$ per epoch")),
        ("energy_per_epoch.png", "GPU energy per epoch: joules per sample over the measured steps (NVML's energy "
         "counter) x training rows",
         lambda: figs.bars(_finetune(cells), "kwh_per_epoch", "kWh", "Energy per epoch")),
        ("heatmap.png", "The whole fine-tuning matrix: samples/s; grey cells say why there is no number",
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
        ("GPU busy per device", lambda c: None if merged else device_table(c))]
    for title, make in makers:
        table = make(cells)
        if table is None:
            report.table_notes.append(f"table '{title}' skipped: the sweep has no trials for it")
        else:
            report.tables.append(table)
    full = Table("", headers(cells), text_rows(cells),
                 f"mean ± the 95% interval's half-width over repeats; TTA target {target:g}; * best "
                 f"{METRICS[best_by][0]} per GPU type")
    report.answer = answer_lines(cells, target)
    busy = None if merged else gpu_busy([t for c in cells for t in c.trials])
    if busy is not None:
        report.answer.append(busy_text(busy) + " (measured training steps over the sweep's wall time)")
    report.answer += noisy_lines(cells)
    report.best = answer_table(cells, target)
    summary = to_json(cells, sweep=sweep, source=source, target=target, best_by=best_by, busy=busy)
    summary["answer"] = report.answer
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
    (staging / "report.md").write_text("\n".join(md) + "\n")
    (staging / "report.html").write_text(html_page(report, full, source, target))
    return report
