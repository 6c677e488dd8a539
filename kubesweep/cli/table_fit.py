"""A table that fits the terminal: its columns taken in the order of what they tell, until the width runs out.

Rich squeezes a table wider than the terminal by cutting every cell ("finet…"); a results table of 16 columns at
80 columns is then unreadable. `fit` instead keeps whole columns, most telling first (the settings that set the
rows apart, the objective, whether they ran), leaves the rest out by name, and lets only the flags column wrap.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

Justify = Literal["left", "right"]
WRAP_MIN = 16  # the narrowest a wrapping column is shown at; narrower, it is left out


@dataclass
class Column:
    header: str
    values: list[str]
    justify: Justify = "right"
    wrap: bool = False  # may wrap over several lines (free text); a column that may not is never cut


@dataclass
class Fitted:
    columns: list[Column]  # the columns shown, in their given order
    hidden: list[str] = field(default_factory=list)  # the headers left out, most telling first
    wrap_width: int | None = None  # the widest a wrapping column may be

    def table(self, title: str | Text, row_styles: Sequence[str | None] = ()) -> Table:
        return table(title, self.columns, row_styles=row_styles, wrap_width=self.wrap_width)


def table(title: str | Text, columns: Sequence[Column], *, row_styles: Sequence[str | None] = (),
          wrap_width: int | None = None) -> Table:
    """The columns as a compact table (no outer frame); a wrapping column at most `wrap_width` wide."""
    out = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for column in columns:
        out.add_column(column.header, justify=column.justify, no_wrap=not column.wrap,
                       overflow="fold" if column.wrap else "ellipsis",
                       max_width=wrap_width if column.wrap else None)
    rows = max((len(c.values) for c in columns), default=0)
    for i in range(rows):
        style = row_styles[i] if i < len(row_styles) else None
        out.add_row(*(Text(c.values[i]) for c in columns), style=style)
    return out


def width_of(columns: Sequence[Column], wrap_width: int | None = None) -> int:
    """The widest line of the table of these columns, as rendered: of one row holding each column's widest value
    (the same widths, at the cost of one row however many there are)."""
    probe = [Column(c.header, [max(c.values, key=cell_len)] if c.values else [], c.justify, c.wrap) for c in columns]
    sink = Console(file=io.StringIO(), width=100_000, color_system=None, highlight=False)
    sink.print(table("", probe, wrap_width=wrap_width))
    return max((len(line) for line in sink.file.getvalue().splitlines()), default=0)  # type: ignore[attr-defined]


def least_width(column: Column) -> int:
    """The narrowest a wrapping column is shown at: `WRAP_MIN`, or less where all of it is shorter."""
    return min(max(WRAP_MIN, len(column.header)), max((len(v) for v in [column.header, *column.values]), default=0))


def fit(columns: Sequence[Column], order: Sequence[int], width: int) -> Fitted:
    """The columns that fit `width`, taken by `order` (indexes into `columns`, most telling first; the first one
    is always shown), shown in their given order. A wrapping column is counted at its least width while the others
    are taken, and is then given what width is left."""
    chosen: list[int] = []
    hidden: list[str] = []
    for n, index in enumerate(order):
        trial = sorted([*chosen, index])
        shown = [columns[i] for i in trial]
        least = max((least_width(c) for c in shown if c.wrap), default=None)
        if n == 0 or width_of(shown, least) <= width:
            chosen = trial
        else:
            hidden.append(columns[index].header)
    shown = [columns[i] for i in chosen]
    if not any(c.wrap for c in shown):
        return Fitted(shown, hidden)
    wrap_width = max(1, width - width_of([c for c in shown if not c.wrap]) - 2)
    while wrap_width > 1 and width_of(shown, wrap_width) > width:
        wrap_width -= 1
    return Fitted(shown, hidden, wrap_width)
