"""Text from outside the CLI as literal, clean text: escape sequences and control characters go, markup stays text."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from kubesweep.cli.terminal_text import clean, plain, value_text


@pytest.mark.parametrize(("raw", "shown"), [
    ("\x1b[31mred\x1b[0m", "red"),  # colour (CSI)
    ("a\x1b]0;title\x07b", "ab"),  # window title (OSC ended by BEL)
    ("a\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\b", "alinkb"),  # hyperlink (OSC ended by ST)
    ("a\x1bPq#0\x1b\\b", "ab"),  # DCS (sixel)
    ("a\x9b2Jb\x9d0;t\x9cc", "abc"),  # C1 CSI and OSC
    ("a\x1b[2J\x1b[Hb", "ab"),  # clear screen, cursor home
    ("a\x00b\x7fc\x08d\re\x85f", "abcdef"),  # NUL, DEL, backspace, carriage return, NEL
    ("unterminated \x1b]0;title", "unterminated "),
    ("end\x1b", "end"),
    ("[/pytorch/aten/foo.cu:12] [bold]x[/]", "[/pytorch/aten/foo.cu:12] [bold]x[/]"),  # markup: left as it is
])
def test_clean_removes_escape_sequences_and_control_characters(raw: str, shown: str) -> None:
    assert clean(raw) == shown


@pytest.mark.parametrize(("raw", "shown"), [
    ("a\u202etxt.exe\u202cb", "a\\u202etxt.exe\\u202cb"),  # right-to-left override, pop
    ("\u2066\u2069\u200e\u200f\u061c", "\\u2066\\u2069\\u200e\\u200f\\u061c"),  # isolates, marks
    ("zero\u200bwidth\u2060\ufeff", "zero\\u200bwidth\\u2060\\ufeff"),  # zero-width space, joiner, BOM
    ("line\u2028para\u2029", "line\\u2028para\\u2029"),  # line and paragraph separators
    ("tag\U000e0041", "tag\\U000e0041"),  # a tag character (invisible)
    ("lone \udc80", "lone \\udc80"),  # a lone surrogate: printing it would raise
    ("naïve 日本 ±1e15 — ok", "naïve 日本 ±1e15 — ok"),  # other text is left as it is
])
def test_format_characters_are_shown_as_escapes(raw: str, shown: str) -> None:
    assert clean(raw) == shown
    assert clean(raw, keep_lines=False) == shown


def test_newlines_and_tabs_are_kept_or_made_spaces() -> None:
    assert clean("a\nb\tc") == "a\nb\tc"
    assert clean("a\nb\tc", keep_lines=False) == "a b c"


def test_plain_is_printed_literally_by_rich() -> None:
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(plain("[/pytorch/aten/foo.cu:12] \x1b[31m[red]boom[/red]"))
    assert console.file.getvalue() == "[/pytorch/aten/foo.cu:12] [red]boom[/red]\n"  # type: ignore[attr-defined]


def test_a_table_cell_says_on_and_off_for_a_switch() -> None:
    """A boolean setting (step_graph, random_init) reads `on` beside `off`, not `True` beside `off`."""
    assert [value_text(v) for v in (True, False, None, 0, 1, 0.123456, "bf16")] == \
        ["on", "off", "-", "0", "1", "0.1235", "bf16"]
