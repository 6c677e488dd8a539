"""The sweep report's figures (matplotlib, imported here only, with the Agg backend), drawn from aggregated cells.

Each drawing function returns a matplotlib Figure, or None when the sweep has nothing for it; `save` writes it as
a PNG. Every number drawn carries its cell's marks beside it, as the tables carry its flags: `*` for the best
setting per GPU type, and `OOM`, `GPU mismatch`, `failed`, `chance accuracy (0.51)` (with `k/n` where only some
repeats have it). Figures are drawn `WIDTH` inches wide at `DPI`, for a page that shows them at its full width,
and their text is fitted once drawn (`kubesweep.tracking.figure_fit`): no label covers another or leaves the figure.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubesweep.tracking import figure_fit as fit
from kubesweep.tracking.aggregate import Cell
from kubesweep.tracking.busy import busy_text, gpu_busy, measured_train_s, trial_span
from kubesweep.wire.flags import trial_flags
from kubesweep.wire.metrics import METRICS, fmt_number

WIDTH = 12.0  # inches: about the report's page width at 110 px per inch
DPI = 150  # pixels per inch in the PNG: sharper than the page shows it
FLAGGED = "tab:red"


def finetune(cells: list[Cell]) -> list[Cell]:
    return [c for c in cells if c.task == "finetune"]


def gpu_label(cell: Cell) -> str:
    """The cell's device as the report names it: its GPU type, or `CPU`."""
    return "CPU" if cell.axes.gpu == "cpu" else str(cell.axes.gpu)


def device_label(cell: Cell) -> str:
    """The device and, for a multi-GPU trial, how many: `h100-80gb x2`, `l40s`, `CPU`."""
    return gpu_label(cell) + (f" x{cell.axes.gpus}" if cell.axes.gpus > 1 else "")


def other_settings(cell: Cell) -> str:
    return " ".join(f"{k}={v}" for k, v in cell.extra.items())


def cell_label(cell: Cell, marked: bool = True) -> str:
    """`h100-80gb bs64 fp16 c`, then the cell's marks in brackets: `[*]`, `[chance accuracy (0.51)]`."""
    extra = (" " + other_settings(cell)) if cell.extra else ""
    compiled = " c" if cell.axes.compile != "off" else ""
    task = "inf " if cell.task == "inference" else ""
    label = f"{task}{device_label(cell)} bs{cell.axes.batch_size} {cell.axes.precision}{compiled}{extra}"
    marks = (["*"] if cell.best else []) + cell.marks
    return label + (f" [{'; '.join(marks)}]" if marked and marks else "")


def _figure(height: float, width: float = WIDTH) -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    # names from results files (a GPU's, a setting's) are text: `$x^2$` is not mathtext, nothing goes to LaTeX
    matplotlib.rcParams.update({"text.parse_math": False, "text.usetex": False})
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)  # a renderer to measure its text with (`figure_fit`)
    return fig


def save(fig: Any, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=DPI)


def _batch(cell: Cell) -> int:
    """The batch size of a cell of `_series` (each has one)."""
    return int(cell.axes.batch_size or 0)


def _series(cells: list[Cell]) -> dict[str, dict[tuple[str, str], list[Cell]]]:
    """GPU type -> (precision, compile) -> cells sorted by batch size (single-GPU fine-tuning only)."""
    out: dict[str, dict[tuple[str, str], list[Cell]]] = {}
    for cell in finetune(cells):
        if cell.axes.gpus > 1 or cell.axes.batch_size is None:  # one device: a GPU, or the CPU (0 GPUs)
            continue
        label = gpu_label(cell) + (" " + other_settings(cell) if cell.extra else "")
        out.setdefault(label, {}).setdefault((str(cell.axes.precision), str(cell.axes.compile)),
                                             []).append(cell)
    for by in out.values():
        for group in by.values():
            group.sort(key=lambda c: _batch(c))
    return out


def single_x(cells: list[Cell]) -> bool:
    """Whether the single-device fine-tuning cells ran one batch size alone: a line would have one x value."""
    return len({_batch(c) for by in _series(cells).values() for g in by.values() for c in g}) <= 1


def _series_name(key: tuple[str, str]) -> str:
    precision, compiled = key
    return precision + ("" if compiled == "off" else f" compile={compiled}")


def per_gpu_lines(cells: list[Cell], metric: str, ylabel: str, title: str,
                  hline: Callable[[str], float | None] | None = None) -> Any:
    """A panel per GPU type: `metric` vs batch size, a line per precision (dashed: compiled; a line has its colour
    in every panel); a point whose cell is flagged is ringed in red with its marks; settings with no result sit
    at 0 as a red x and status (after the line's name where the panel has several). The labels are stacked
    (`figure_fit.stack_labels`): none covers another or leaves its panel."""
    series = _series(cells)
    if not any(c.value(metric) is not None for by in series.values() for g in by.values() for c in g):
        return None
    if single_x(cells):  # one batch size: no line to draw, a bar per setting says the same
        return bars([c for by in series.values() for g in by.values() for c in g], metric, ylabel, title)
    gpus = sorted(series)
    cols = min(3, len(gpus))
    rows = (len(gpus) + cols - 1) // cols
    fig = _figure((4.2 if cols == 1 else 3.6) * rows + 0.4)
    axes = fig.subplots(rows, cols, squeeze=False)
    colours = {key: f"C{i % 10}" for i, key in enumerate(sorted({k for by in series.values() for k in by}))}
    handles: dict[str, Any] = {}
    panels: list[tuple[Any, list[fit.Label]]] = []
    for i, gpu in enumerate(gpus):
        ax = axes[i // cols][i % cols]
        for key, group in sorted(series[gpu].items()):
            pts = [(_batch(c), c.metrics[metric]) for c in group if c.value(metric) is not None]
            if pts:
                handles[_series_name(key)] = ax.errorbar(
                    [p[0] for p in pts], [p[1].mean for p in pts], yerr=[p[1].half_width or 0.0 for p in pts],
                    marker="o", capsize=3, color=colours[key], linestyle="--" if key[1] != "off" else "-")
        labels = _point_labels(ax, series[gpu], metric, handles)
        fit.annotate(ax, labels)
        panels.append((ax, labels))
        limit = hline(gpu.split()[0]) if hline is not None else None
        if limit is not None:
            handles.setdefault("dotted: the GPU's memory", ax.axhline(limit, color="grey", linestyle=":"))
        batches = sorted({_batch(c) for g in series[gpu].values() for c in g})
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.minorticks_off()
        ax.set_ylim(0, ax.get_ylim()[1])  # the labels' room above the top point: `stack_labels`
        ax.set_title(gpu + (f" ({limit:g} GiB)" if limit is not None else ""))
        ax.set_xlabel("batch size")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    for j in range(len(gpus), rows * cols):
        axes[j // cols][j % cols].set_visible(False)
    names = [_series_name(key) for key in colours if _series_name(key) in handles]
    names += [name for name in handles if name not in names]  # the lines, then the marks
    fig.legend([handles[name] for name in names], names, loc="outside lower center", ncols=min(len(names), 5),
               fontsize=8)
    titles = [fig.suptitle(title), *(ax.title for ax, _ in panels)]
    fit.settle(fig, fit.fit_titles(fig, titles, per_panel=True), fit.stack_labels(fig, panels))
    return fig


def _point_labels(ax: Any, series: dict[tuple[str, str], list[Cell]], metric: str,
                  handles: dict[str, Any]) -> list[fit.Label]:
    """Ring each flagged point of a panel, cross each setting with no result, and their labels."""
    labels = []
    for key, group in sorted(series.items()):
        name = f"{_series_name(key)}: " if len(series) > 1 else ""  # which line's, where labels are stacked
        for c in group:
            x, value = _batch(c), c.value(metric)
            if value is None and "succeeded" not in c.outcomes:
                handles.setdefault("no result (its status above)", ax.scatter([x], [0], marker="x", color=FLAGGED))
                labels.append(fit.Label(x, 0.0, name + c.status, offset=6.0, clear=3.5))
            elif value is not None and c.marks:
                handles.setdefault("flagged (its marks above)", ax.scatter(
                    [x], [value], s=160, facecolors="none", edgecolors=FLAGGED, linewidths=1.5, zorder=3))
                labels.append(fit.Label(x, value, name + "; ".join(c.marks), offset=9.0, clear=6.5))
    return labels


def bars(cells: list[Cell], metric: str, xlabel: str, title: str) -> Any:
    """A bar per cell that has `metric`, best first; green: best per GPU type, red hatched: a flagged cell, its
    marks in brackets after its label."""
    chosen = [c for c in cells if c.value(metric) is not None]
    if not chosen:
        return None
    chosen.sort(key=lambda c: c.value(metric) or 0.0)
    labels = [tick_label(cell_label(c)) for c in chosen]
    rows, height = _rows(labels, 0.26)
    fig = _figure(max(2.8, height + 1.4))
    ax = fig.subplots()
    ax.barh(rows, [c.value(metric) or 0.0 for c in chosen],
            xerr=[c.metrics[metric].half_width or 0.0 for c in chosen], capsize=3,
            color=["tab:green" if c.best else ("#f4b6b6" if c.marks else "tab:blue") for c in chosen],
            hatch=["//" if c.marks else "" for c in chosen], edgecolor=[FLAGGED if c.marks else "none" for c in chosen])
    ax.set_yticks(rows, labels, fontsize=8)
    for tick, cell in zip(ax.get_yticklabels(), chosen, strict=True):
        if cell.marks:
            tick.set_color(FLAGGED)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    fit.settle(fig, fit.fit_titles(fig, [ax.title]))
    return fig


def tick_label(label: str, width: int = 90) -> str:
    """A long bar label on more lines: the setting, then its marks (`[...]`) wrapped at `width` characters."""
    if len(label) <= width:
        return label
    setting, bracket, marks = label.partition(" [")
    return fit.wrap(setting, width) + ("\n" + fit.wrap("[" + marks, width) if bracket else "")


def _rows(labels: list[str], pitch: float) -> tuple[list[float], float]:
    """Where each bar goes (in bars of `pitch` inches) so its label (8-point lines, 0.135 inches each, and a
    gap) has room; and the inches they take."""
    rows, at = [], 0.0
    for label in labels:
        span = max(1.0, (0.135 * (label.count("\n") + 1) + 0.1) / pitch)
        rows.append(at + span / 2 - 0.5)
        at += span
    return rows, at * pitch


def timeline(cells: list[Cell]) -> Any:
    """Where the sweep's wall time went on its GPUs: each GPU trial's process (grey), the span it held its GPU
    (blue, trials started early behind another) and its measured training time (green, inside that span); a
    trial's flags follow its name."""
    rows = []
    for record in (t for c in cells for t in c.trials):
        res = record.results
        span = trial_span(res) if res is not None and res.device == "cuda" else None
        if res is None or span is None:
            continue
        start, end = span
        lease = res.gpu_lease
        flags = trial_flags(record.outcome, res)
        name = record.name + (f" [{'; '.join(flags)}]" if flags else "")
        rows.append((start, end, lease.acquired_at if lease else None, lease.released_at if lease else None,
                     measured_train_s(res), name))
    if not any(end > start for start, end, *_ in rows):
        return None  # no trial with a time span to draw
    rows.sort()
    t0 = rows[0][0]
    fig = _figure(max(3.0, 0.22 * len(rows) + 1.2))
    ax = fig.subplots()
    for y, (start, end, acquired, released, measured, _) in enumerate(rows):
        ax.barh(y, end - start, left=start - t0, color="#dddddd", height=0.8)
        if acquired is not None and released is not None:
            ax.barh(y, released - acquired, left=acquired - t0, color="tab:blue", height=0.8)
            ax.barh(y, measured, left=released - t0 - measured, color="tab:green", height=0.4)
    ax.set_yticks(range(len(rows)), [r[5] for r in rows], fontsize=6)
    for tick, row in zip(ax.get_yticklabels(), rows, strict=True):
        if row[5].endswith("]"):
            tick.set_color(FLAGGED)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the first trial started")
    busy = gpu_busy([t for c in cells for t in c.trials])
    ax.set_title(busy_text(busy) if busy else "GPU timeline", fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    fit.settle(fig, fit.fit_titles(fig, [ax.title]))
    return fig


def _setting(cell: Cell) -> tuple[Any, ...]:
    return (cell.axes.gpu, cell.axes.gpus, cell.axes.batch_size, cell.axes.precision,
            json.dumps(cell.extra, sort_keys=True, default=str))


def speedup(cells: list[Cell]) -> Any:
    """compiled / eager samples/s for each setting that ran both; the marks of either side follow the label."""
    eager = {_setting(c): c for c in finetune(cells) if c.axes.compile == "off"}
    pairs = []
    for cell in finetune(cells):
        base = eager.get(_setting(cell)) if cell.axes.compile != "off" else None
        if base and base.value("samples_per_s") and cell.value("samples_per_s"):
            marks = [f"eager: {m}" for m in base.marks] + [f"compiled: {m}" for m in cell.marks]
            label = tick_label(cell_label(base, marked=False) + (f" [{'; '.join(marks)}]" if marks else ""))
            pairs.append((label, (cell.value("samples_per_s") or 0.0) / (base.value("samples_per_s") or 1),
                          bool(marks)))
    if not pairs:
        return None
    rows, height = _rows([p[0] for p in pairs], 0.3)
    fig = _figure(max(2.8, height + 1.4))
    ax = fig.subplots()
    ax.barh(rows, [p[1] for p in pairs], color=["tab:green" if p[1] >= 1 else "tab:red" for p in pairs],
            hatch=["//" if p[2] else "" for p in pairs])
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(rows, [p[0] for p in pairs], fontsize=8)
    for tick, pair in zip(ax.get_yticklabels(), pairs, strict=True):
        if pair[2]:
            tick.set_color(FLAGGED)
    ax.invert_yaxis()
    ax.set_xlabel("compiled / eager samples/s")
    ax.set_title("torch.compile speed-up (hatched: a flagged setting, its marks in brackets)")
    values = [ax.annotate(f"{value:.2f}x", (value, i), textcoords="offset points", xytext=(4, 0), va="center",
                          fontsize=7) for i, (_, value, _) in zip(rows, pairs, strict=True)]
    fit.settle(fig, fit.fit_titles(fig, [ax.title]), fit.fit_right(fig, ax, values))
    return fig


def heatmap_text(cell: Cell) -> str:
    """What a heatmap cell says: samples/s, `*` when best, then each mark on its own lines; or the status."""
    value = cell.value("samples_per_s")
    if value is None:
        return cell.status
    lines = [fmt_number(value) + (" *" if cell.best else "")]
    lines += [textwrap.fill(mark, 16) for mark in cell.marks]
    return "\n".join(lines)


def heatmap(cells: list[Cell]) -> Any:
    """samples/s of the whole fine-tuning matrix: a row per device, a column per batch/precision/compile. A
    flagged number takes no colour (grey, as a cell with none): the brightest cell is never a flagged run. The
    figure grows until every cell's text fits its cell (`figure_fit.fit_cells`)."""
    ft = finetune(cells)
    if not ft:
        return None
    import numpy as np

    def col_key(c: Cell) -> str:
        compiled = "compile" if c.axes.compile != "off" else "eager"
        extra = (" " + other_settings(c)) if c.extra else ""
        return f"bs{c.axes.batch_size} {c.axes.precision} {compiled}{extra}"

    rows = sorted({device_label(c) for c in ft})
    cols = sorted({col_key(c) for c in ft},
                  key=lambda k: (int(k.split()[0][2:]) if k.split()[0][2:].isdigit() else 0, k))
    grid = np.full((len(rows), len(cols)), np.nan)
    text = [["" for _ in cols] for _ in rows]
    flagged = [[False for _ in cols] for _ in rows]
    for cell in ft:
        i, j = rows.index(device_label(cell)), cols.index(col_key(cell))
        value = cell.value("samples_per_s")
        if value is not None and not cell.marks:  # a flagged number (did not learn, 1/2 OOM, ...): grey
            grid[i, j] = value
        text[i][j] = heatmap_text(cell)
        flagged[i][j] = value is not None and bool(cell.marks)
    lines = max((t.count("\n") + 1 for r in text for t in r), default=1)
    fig = _figure(max(2.6, (0.25 + 0.16 * lines) * len(rows) + 2.0), max(WIDTH, 0.85 * len(cols) + 3.0))
    ax = fig.subplots()
    image = ax.imshow(np.ma.masked_invalid(grid), cmap="viridis", aspect="auto")
    ax.set_facecolor("#dddddd")
    ax.set_xticks(range(len(cols)), [c.replace(" ", "\n") for c in cols], fontsize=8)  # level: none overlap
    ax.set_yticks(range(len(rows)), rows, fontsize=9)
    finite = grid[np.isfinite(grid)]
    middle = float(finite.mean()) if finite.size else 0.0
    written = []
    for i in range(len(rows)):
        for j in range(len(cols)):
            if text[i][j]:
                dark = not np.isfinite(grid[i, j]) or grid[i, j] > middle
                written.append(ax.text(j, i, text[i][j], ha="center", va="center", fontsize=8,
                                       color="black" if dark else "white",
                                       fontweight="bold" if flagged[i][j] else "normal"))
                if flagged[i][j]:
                    ax.add_patch(_frame(j, i))
    if finite.size:  # a scale for the coloured cells (none: every cell grey)
        fig.colorbar(image, ax=ax, label=METRICS["samples_per_s"].label)
    title = fig.suptitle("Fine-tuning samples/s (* best per GPU type; red frame: flagged, its marks under the "
                         "number; grey: no number, or a flagged one)")  # above the colour bar's labels too
    fit.settle(fig, fit.fit_titles(fig, [title]), fit.fit_cells(fig, ax, len(cols), len(rows), written))
    return fig


def _frame(x: float, y: float) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((x - 0.48, y - 0.48), 0.96, 0.96, fill=False, edgecolor=FLAGGED, linewidth=2.5)
