"""The aggregated results as a terminal shows them: the answer first, then a table that fits the width.

By default the table keeps whole columns in the order of what they tell (the settings that set the rows apart, the
objective, the repeats and outcomes, the flags (wrapped), then the other figures) and names the ones it left
out; what every row shares goes into the title instead of a column of equal cells. `wide` shows every column.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rich.console import Console

from kubesweep.cli.table_fit import Column, fit, table, width_of
from kubesweep.cli.terminal_text import clean, plain
from kubesweep.tracking.aggregate import Cell
from kubesweep.tracking.columns import cell_columns, rows, to_markdown
from kubesweep.tracking.report_answer import answer_lines
from kubesweep.tracking.report_page import LEGEND
from kubesweep.wire.metrics import FIT_ORDER, METRICS

LEFT = frozenset({"task", "gpu", "precision", "compile", "status", "flags", "model", "engine", "padding", "dataset"})
# the figures after the objective, most telling first (`Metric.priority`)
FIGURES = FIT_ORDER
NO_FIGURE = "-"


@dataclass
class CellsTable:
    """The columns of the results table and what the fitting needs to know about them."""

    columns: list[Column]
    order: list[int]  # indexes into columns, most telling first
    shared: list[str] = field(default_factory=list)  # `gpu cpu`: settings every row has, said once
    empty: list[str] = field(default_factory=list)  # the metrics no row has a figure of


def cells_table(cells: list[Cell], best_by: str, *, wide: bool = False) -> CellsTable:
    """Every column of the aggregated table; unless `wide`, the settings and outcomes every row shares and the
    figures no row has are taken out (into `shared` and `empty`)."""
    cols = cell_columns(cells)
    texts = rows(cells, cols)
    settings = sum(c.kind == "setting" for c in cols)
    columns = [Column(c.header, [clean(r[i], keep_lines=False) for r in texts],
                      "left" if c.key in LEFT else "right", wrap=c.kind == "flags")
               for i, c in enumerate(cols)]
    by_key = {c.key: i for i, c in enumerate(cols) if c.kind != "setting"}
    if wide:
        return CellsTable(columns, list(range(len(columns))))
    shared, empty, dropped = [], [], set()
    for i in range(settings):
        values = set(columns[i].values)
        if len(values) == 1:
            if not (columns[i].header == "gpus" and values == {"0"}):  # `gpu cpu` says it
                shared.append(f"{columns[i].header} {next(iter(values))}")
            dropped.add(i)
    status = by_key["status"]
    if set(columns[status].values) == {"ok"}:
        shared.append("every trial ok")
        dropped.add(status)
    for metric in (best_by, *FIGURES):
        at = by_key.get(metric)
        if at is not None and metric != best_by and all(v == NO_FIGURE for v in columns[at].values):
            empty.append(metric)
            dropped.add(at)
    flags = by_key["flags"]
    if not any(columns[flags].values):
        dropped.add(flags)
    objective = by_key.get(best_by)
    # inference's figure is its latency (step p50), fine-tuning's its accuracy: the latency first where cells infer
    shown = (("step_p50_ms", *(m for m in FIGURES if m != "step_p50_ms"))
             if any(c.task == "inference" for c in cells) else FIGURES)
    figures = [by_key[m] for m in shown if m != best_by and m in by_key]
    order = [*range(settings), *([objective] if objective is not None else []), by_key["best"], by_key["n"],
             status, flags, *figures]
    order = [i for i in dict.fromkeys(order) if i not in dropped]
    keep = sorted(order)
    renumber = {old: new for new, old in enumerate(keep)}
    return CellsTable([columns[i] for i in keep], [renumber[i] for i in order], shared, empty)


def print_cells(console: Console, sweep: str, cells: list[Cell], *, source: str, target: float, best_by: str,
                width: int, wide: bool = False, partial: str = "", more: str = "") -> None:
    """The answer (the objectives the sweep measured), then the table fitted to `width` (every column if
    `wide`), then how to read it. `partial`: what is not in yet (a sweep still running); `more`: the command that
    shows every column."""
    if partial:
        console.print(plain(f"partial results: {partial}; the answer may change", style="yellow"), width=width,
                      soft_wrap=False)
    answer = answer_lines(cells, target, measured_only=True)
    for line in answer:
        console.print(plain(line), width=width, soft_wrap=False)
    if answer:
        console.print()
    built = cells_table(cells, best_by, wide=wide)
    title = f"sweep {sweep}: {len(cells)} setting{'' if len(cells) == 1 else 's'}"
    if built.shared:
        title += f" ({', '.join(built.shared)})"
    styles = ["bold" if c.best else None for c in cells]
    if wide:
        whole = Console(file=console.file, width=max(width, width_of(built.columns)), highlight=False,
                        color_system=console.color_system, force_terminal=console.is_terminal)  # type: ignore[arg-type]
        whole.print(plain(title, style="italic"))
        whole.print(table("", built.columns, row_styles=styles))
        hidden: Sequence[str] = ()
    else:
        fitted = fit(built.columns, built.order, width)
        console.print(plain(title, style="italic"), width=width, soft_wrap=False)
        console.print(fitted.table("", row_styles=styles), width=width)
        hidden = fitted.hidden
    notes = [f"mean ± the 95% interval's half-width over repeats; TTA = training time to dev accuracy >= {target:g}; "
             f"* best {METRICS[best_by].label} per GPU type; from {source}"]
    if built.empty:
        cpu = any(c.axes.gpu == "cpu" for c in cells)  # MFU needs a peak: a CPU has none, and none is invented
        notes.append("no figures for: " + ", ".join(
            METRICS[m].label + (" (no peak on the CPU)" if cpu and m == "mfu_pct" else "") for m in built.empty))
    if hidden:
        notes.append(f"left out to fit {width} columns: {', '.join(hidden)}"
                     + (f"; {more} shows every column" if more else ""))
    for note in notes:
        console.print(plain(note, style="dim"), width=width, soft_wrap=False)


def markdown(cells: list[Cell], sweep: str, *, source: str, target: float, best_by: str, partial: str = "") -> str:
    """`sweep results -o markdown`: what the terminal shows, as a document to paste: the answer, the whole table,
    how to read it (the intervals, the target, the best mark) and the marks' legend."""
    parts = [f"## Sweep {sweep}: results", ""]
    if partial:
        parts += [f"*partial results: {partial}; the answer may change*", ""]
    answer = answer_lines(cells, target, measured_only=True)
    if answer:
        parts += ["**The answer**", "", *(f"- {line}" for line in answer), ""]
    parts.append(to_markdown(cells).rstrip("\n"))
    parts += ["", f"Mean ± the 95% interval's half-width over repeats; TTA = training time to dev accuracy >= "
                  f"{target:g}; * best {METRICS[best_by].label} per GPU type; from {source}.", "", LEGEND]
    return clean("\n".join(parts) + "\n")
