"""Terminal captures of `sweep submit` for the docs: the live view while trials run and the answer at the end.

Runs the command in a real terminal (tmux, at the width asked), captures the pane with its colours while the sweep
runs and once it has ended, and writes each capture as an SVG (Rich's terminal export) and as text:

    python bench/terminal_shots.py --columns 80 --out docs/img/submit-80 -- sweep submit sweeps/smoke.yaml
    python bench/terminal_shots.py --columns 120 --out docs/img/submit-120 -- sweep submit sweeps/smoke.yaml

`--at S` (repeatable, default 45) takes a capture S seconds after the start; the last capture is taken when the
command has ended (at most `--timeout` seconds).
"""

from __future__ import annotations

import argparse
import io
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.text import Text

DONE = "__terminal_shots_done__"


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], check=True, capture_output=True, text=True).stdout


def capture(session: str) -> str:
    """The visible pane with its escape sequences, trailing blank lines dropped."""
    return tmux("capture-pane", "-p", "-e", "-t", session).rstrip("\n") + "\n"


def save(ansi: str, columns: int, path: Path, title: str) -> None:
    console = Console(record=True, width=columns, file=io.StringIO(), force_terminal=True, color_system="truecolor")
    console.print(Text.from_ansi(ansi.replace(DONE, "")), soft_wrap=True)
    console.save_svg(str(path.with_suffix(".svg")), title=title)
    path.with_suffix(".txt").write_text(Text.from_ansi(ansi.replace(DONE, "")).plain)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--columns", type=int, default=100)
    parser.add_argument("--rows", type=int, default=40)
    parser.add_argument("--at", type=float, action="append", help="seconds after the start of a capture")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--out", type=Path, required=True, help="path prefix of the captures (-live-N, -end)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or shutil.which("tmux") is None:
        parser.error("a command to run, and tmux on PATH, are needed")
    session = f"shots-{time.time_ns()}"
    script = f"{shlex.join(command)}; echo {DONE}; sleep 3600"
    tmux("new-session", "-d", "-s", session, "-x", str(args.columns), "-y", str(args.rows), "bash", "-c", script)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    title = f"$ {shlex.join(command)}"
    try:
        for n, at in enumerate(sorted(args.at or [45.0]), 1):
            time.sleep(max(0.0, start + at - time.monotonic()))
            save(capture(session), args.columns, Path(f"{args.out}-live-{n}"), title)
        while DONE not in capture(session):
            if time.monotonic() - start > args.timeout:
                print(f"the command did not end within {args.timeout:.0f} s", file=sys.stderr)
                return 1
            time.sleep(1)
        save(capture(session), args.columns, Path(f"{args.out}-end"), title)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False, capture_output=True)
    print(f"captures: {args.out}-live-*.svg, {args.out}-end.svg ({time.monotonic() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
