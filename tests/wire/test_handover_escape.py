"""A trial's output lines pass through the worker unchanged, but for those that would read as an event (or as an
escaped line): `unescape(escape(line))` is the line, whatever `| ` it holds and wherever."""

from __future__ import annotations

import pytest

from kubesweep.wire.handover import WorkerEvent, escape, parse_event, unescape

EVENT = WorkerEvent("end", 1.0, trial="t", exit_code=0, outcome="succeeded").line()


@pytest.mark.parametrize("line", [
    "a | b", "| ", "||", "a table | row | of | cells |", "| | nested", " | leading space", "x" + EVENT,
    EVENT, "| " + EVENT, "| | " + EVENT, "", "|", "|x",
])
def test_every_line_survives_escape_and_unescape(line: str) -> None:
    assert unescape(escape(line)) == line
    assert parse_event(escape(line)) is None


def test_a_line_with_a_bar_inside_is_printed_unchanged() -> None:
    for line in ("a | b", "|x", " | leading space", "epoch 1 | loss 0.3 | acc 0.9"):
        assert escape(line) == line
        assert unescape(line) == line
