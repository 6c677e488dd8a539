"""Escape sequences cut short at the end of a chunk of output (a log read in pieces, a line cut to its length) go
whole: no `31` of a colour `ESC [ 31 m` is left behind."""

from __future__ import annotations

import pytest

from kubesweep.cli.terminal_text import clean


@pytest.mark.parametrize(("raw", "shown"), [
    ("red\x1b[31", "red"),  # CSI without its final byte
    ("red\x1b[", "red"),
    ("red\x1b[38;5;196", "red"),
    ("a\x1b[31mb\x1b[0", "ab"),
    ("red\x9b31", "red"),  # C1 CSI, cut
    ("title\x1b]0;half a tit", "title"),  # OSC without its end
    ("title\x9d0;half", "title"),
])
def test_an_escape_cut_at_the_end_of_a_chunk_leaves_nothing_behind(raw: str, shown: str) -> None:
    assert clean(raw) == shown
    assert clean(raw, keep_lines=False) == shown


def test_text_after_a_complete_sequence_is_kept() -> None:
    assert clean("\x1b[31m31 tests\x1b[0m") == "31 tests"
