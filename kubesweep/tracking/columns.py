"""The results table's columns: one catalogue for `sweep results` (`kubesweep.results_view`) and the report's whole
table (`kubesweep.tracking.report`, and `sweep results -o markdown`).

A column says what it shows of a cell (`kind`: a setting, the repeats, the status, a metric of the catalogue
`kubesweep.wire.metrics`, the best mark or the flags), its `key` (the setting's or metric's name), its header and the
cell's text in it. The numbers stay typed in the cells (`kubesweep.tracking.aggregate`); their text is made here, and
a view that needs a column finds it by its kind and key, never by its header's text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kubesweep.tracking.aggregate import Cell, columns, setting_text
from kubesweep.wire.metrics import METRICS, TABLE_METRICS, label

ColumnKind = Literal["setting", "repeats", "status", "metric", "best", "flags"]


@dataclass(frozen=True)
class CellColumn:
    key: str
    kind: ColumnKind
    header: str

    def text(self, cell: Cell) -> str:
        """The cell's text in this column."""
        if self.kind == "setting":
            return setting_text(cell.key_values().get(self.key))
        if self.kind == "repeats":
            return str(len(cell.trials))
        if self.kind == "status":
            return cell.status
        if self.kind == "metric":
            return metric_text(cell, self.key)
        if self.kind == "best":
            return "*" if cell.best else ""
        return "; ".join(cell.flags)


def cell_columns(cells: list[Cell]) -> list[CellColumn]:
    """The table's columns: the settings that name the rows (`aggregate.columns`), the repeats and the status, the
    catalogue's table metrics (`Metric.column`, in its order), the best mark and the flags."""
    return ([CellColumn(name, "setting", label(name)) for name in columns(cells)]
            + [CellColumn("n", "repeats", "n"), CellColumn("status", "status", "status")]
            + [CellColumn(m, "metric", label(m)) for m in TABLE_METRICS]
            + [CellColumn("best", "best", "best"), CellColumn("flags", "flags", "flags")])


def headers(cols: list[CellColumn]) -> list[str]:
    return [c.header for c in cols]


def rows(cells: list[Cell], cols: list[CellColumn]) -> list[list[str]]:
    """Each cell's text in each column."""
    return [[c.text(cell) for c in cols] for cell in cells]


def metric_text(cell: Cell, metric: str) -> str:
    """`mean ±h%` (h: the 95% interval's half-width in percent of the mean), or the cell's outcome where no
    repeat produced the number; a metric of accuracy of a random-init run says so, and a mean of the repeats that
    reached it says how many did (`110.0 (1/2)`)."""
    stat, defined = cell.metrics[metric], METRICS[metric]
    if stat.mean is None:
        if "succeeded" not in cell.outcomes:
            return cell.status
        return "-"
    text = defined.text(stat.mean)
    if defined.of_accuracy and cell.random_init:
        text += " (random init)"
    if defined.aggregate == "mean of those that reached it" and stat.n < cell.outcomes.get("succeeded", 0):
        text += f" ({stat.n}/{cell.outcomes['succeeded']})"
    if (rel := stat.relative_half_width) is not None:
        text += f" ±{rel * 100:.1f}%"
    return text


def to_markdown(cells: list[Cell]) -> str:
    cols = cell_columns(cells)
    head = headers(cols)
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows(cells, cols)]
    return "\n".join(lines) + "\n"

