"""Text from outside the CLI (a trial's error, a results file, Kubernetes, MLflow) made safe to print on a terminal.

Such text is data: it is never read as Rich markup (a CUDA assert's `[/pytorch/aten/...cu:12]` is not a closing
tag), and its control characters are removed (escape sequences that recolour the terminal, set its title or move
the cursor; C0 and C1 control codes; a carriage return that overwrites the line). Characters that are invisible
yet change what the reader sees (Unicode format characters: bidi overrides and isolates such as U+202E that show
text in another order, zero-width ones; line and paragraph separators; lone surrogates) are shown as their
escapes (`\\u202e`). Newlines and tabs are kept where `keep_lines` says so; otherwise they become spaces. Every
line the CLI prints with such text in it goes through `plain` (a `rich.text.Text`) or, for text written straight
to a stream, `clean`.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from rich.text import Text

# ESC sequences: CSI (ESC [ ... final byte), OSC/DCS/SOS/PM/APC strings (ended by BEL or ST), other two-byte ones
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]?|\x1b[\]PX^_].*?(?:\x07|\x1b\\|$)|\x1b[\s\S]?", re.DOTALL)
# C1 introducers of the same sequences, as single code points (U+009B CSI, U+009D OSC, ...)
_C1_STRINGS = re.compile(r"\x9b[0-?]*[ -/]*[@-~]?|[\x90\x98\x9d\x9e\x9f].*?(?:\x07|\x9c|\x1b\\|$)", re.DOTALL)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_LINES = re.compile(r"[\t\n]")
_NON_ASCII = re.compile(r"[^\x00-\x7f]+")
# format characters (bidi controls, zero-width ones, ...), line and paragraph separators, surrogates
_SHOWN_AS_ESCAPES = frozenset({"Cf", "Zl", "Zp", "Cs"})


def _escape(match: re.Match[str]) -> str:
    return "".join((f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}")
                   if unicodedata.category(c) in _SHOWN_AS_ESCAPES else c for c in match.group())


def clean(value: Any, *, keep_lines: bool = True) -> str:
    """`str(value)` without escape sequences and control characters (newline and tab kept with `keep_lines`, else
    spaces), its format characters (U+202E and kin) as escapes."""
    text = _NON_ASCII.sub(_escape, _CONTROL.sub("", _C1_STRINGS.sub("", _ESCAPES.sub("", str(value)))))
    return text if keep_lines else _LINES.sub(" ", text)


def plain(value: Any, *, style: str = "", keep_lines: bool = True) -> Text:
    """`value` as literal text for Rich: cleaned, never parsed as markup."""
    return Text(clean(value, keep_lines=keep_lines), style=style)


def value_text(value: Any) -> str:
    """A setting or figure as a table cell shows it: `-` for none, `off` for false and `on` for true, 4 significant
    digits."""
    if value is None:
        return "-"
    if value is False:
        return "off"
    if value is True:
        return "on"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
