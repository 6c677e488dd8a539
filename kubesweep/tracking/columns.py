"""The results tables' columns: one catalogue for `sweep results` (`kubesweep.cli.results_view`) and the report's
whole table (`kubesweep.tracking.report`, and `sweep results -o markdown`), and for `sweep results --per-trial`'s
row per trial (`trial_columns`: `kubesweep.results` and `kubesweep.cli.views`).

A column says what it shows of a cell (`kind`: a setting, the repeats, the status, a metric of the catalogue
`kubesweep.wire.metrics`, the best mark or the flags), its `key` (the setting's or metric's name), its header and the
cell's text in it. The numbers stay typed in the cells (`kubesweep.tracking.aggregate`); their text is made here, and
a view that needs a column finds it by its kind and key, never by its header's text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kubesweep.tracking.aggregate import Cell, columns, setting_text
from kubesweep.wire.metrics import CATALOGUE, METRICS, TABLE_METRICS, label

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



# -- the per-trial table (`sweep results --per-trial`) ------------------------------------------------------------

TrialColumnKind = Literal["trial", "setting", "outcome", "figure", "metric"]


@dataclass(frozen=True)
class TrialColumn:
    """A column of the per-trial table: which trial (`trial`), a setting, its outcome, a figure of its results that
    is no metric (`figure`), or a metric of the catalogue (`metric`: `Metric.per_trial`); `key` names the row's
    field or the metric, `header` heads the column."""

    key: str
    kind: TrialColumnKind
    header: str
    left: bool = False  # text, aligned left (numbers: right)
    headline: bool = False  # kept before the trial's settings when the table must fit the terminal


# which trial: its name, GPU and settings, its repeat, how it ended
_WHICH = (TrialColumn("trial", "trial", "trial", left=True), TrialColumn("gpu", "setting", "gpu", left=True),
          TrialColumn("batch_size", "setting", label("batch_size")),
          TrialColumn("precision", "setting", "precision", left=True),
          TrialColumn("compile", "setting", "compile", left=True), TrialColumn("repeat", "setting", "rep"),
          TrialColumn("outcome", "outcome", "outcome", left=True))
# the training loop's wall time (`timings.train_s`, its warm-up included): no metric, shown before the warm-up
TRAIN_S = TrialColumn("train_s", "figure", "train s")
# the settings in the order the table keeps them when it must fit: after the headline figures, before the rest
_SETTINGS_KEPT = ("batch_size", "precision", "compile", "repeat", "gpu")


def trial_columns() -> list[TrialColumn]:
    """The per-trial table's columns: which trial and how it ended, then the catalogue's metrics of `per_trial`
    in its order, the training time before the warm-up's (`warmup_s`; last where that is not shown)."""
    figures = [TrialColumn(m.name, "metric", m.label, headline=m.per_trial == "headline")
               for m in CATALOGUE if m.per_trial is not None]
    at = next((i for i, c in enumerate(figures) if c.key == "warmup_s"), len(figures))
    return [*_WHICH, *figures[:at], TRAIN_S, *figures[at:]]


def trial_fit_order(cols: list[TrialColumn]) -> list[int]:
    """The columns' indexes, most telling first (`table_fit`): which trial and how it ended, its headline figures,
    its settings, then the other figures in their order."""
    def rank(i: int) -> tuple[int, int]:
        c = cols[i]
        if c.kind in ("trial", "outcome"):
            return 0, i
        if c.headline:
            return 1, i
        if c.kind == "setting":
            return 2, _SETTINGS_KEPT.index(c.key) if c.key in _SETTINGS_KEPT else len(_SETTINGS_KEPT) + i
        return 3, i
    return sorted(range(len(cols)), key=rank)
