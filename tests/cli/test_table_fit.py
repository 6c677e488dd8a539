"""Fitting a table to a width by whole columns (kubesweep/cli/table_fit.py)."""

from __future__ import annotations

import io

from rich.console import Console

from kubesweep.cli.table_fit import WRAP_MIN, Column, fit, width_of


def rendered(columns: list[Column], order: list[int], width: int) -> tuple[str, list[str]]:
    fitted = fit(columns, order, width)
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(fitted.table("t"))
    return console.file.getvalue(), fitted.hidden  # type: ignore[attr-defined]


def test_columns_are_taken_by_order_and_shown_in_place() -> None:
    cols = [Column("a", ["1" * 20]), Column("b", ["2" * 20]), Column("c", ["3" * 20])]
    out, hidden = rendered(cols, [2, 0, 1], 50)
    header = out.splitlines()[1]
    assert header.index("a") < header.index("c") and "b" not in header
    assert hidden == ["b"]
    assert "1" * 20 in out and "3" * 20 in out  # whole, not cut


def test_the_first_column_is_shown_even_when_nothing_fits() -> None:
    fitted = fit([Column("only", ["x" * 30]), Column("next", ["y"])], [0, 1], 10)
    assert [c.header for c in fitted.columns] == ["only"] and fitted.hidden == ["next"]


def test_a_wrapping_column_takes_the_rest_of_the_width_or_is_left_out() -> None:
    words = "OOM; chance accuracy (0.50); host-bound (GPU busy 37% of measured steps); n=1"
    cols = [Column("setting", ["bs256 bf16"]), Column("flags", [words], "left", wrap=True)]
    out, hidden = rendered(cols, [0, 1], 40)
    assert hidden == [] and max(len(line) for line in out.splitlines()) <= 40
    assert "".join(out.split()).count("host-bound") == 1  # all of it, wrapped over lines
    narrow = fit(cols, [0, 1], width_of(cols[:1]) + WRAP_MIN)
    assert narrow.hidden == ["flags"]
