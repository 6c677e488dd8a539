"""`plain` keeps the caller's style and line handling: the text is cleaned as `clean` says, then styled."""

from __future__ import annotations

from kubesweep.cli.terminal_text import plain


def test_plain_keeps_its_style_and_its_lines_as_asked() -> None:
    text = plain("a\n\x1b[31mb\tc", style="bold red")
    assert (text.plain, str(text.style)) == ("a\nb\tc", "bold red")
    assert plain("a\nb\tc", keep_lines=False).plain == "a b c"
    assert str(plain("x").style) == ""
