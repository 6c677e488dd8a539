"""What a warm trial pod and whoever drives it say to each other: the hand-over and the worker's events.

A warm pod (`python -m kubesweep.jobs.worker`) holds one GPU slot of one sweep and runs that sweep's trials one
after another. It has no API credentials, so both directions go through what Kubernetes already carries:

- **In: the hand-over.** The driver (the `--direct` backend or the operator) writes a `Handover` as JSON into the
  pod's annotation `kubesweep.io/handover`; the pod reads it as a file through the downward API, which the kubelet
  rewrites when the annotation changes. It lists the trials the pod is to run, in order, each as its resolved
  `TrialConfig`, and says whether more may come (`closed`). A trial taken out of the list while it runs is stopped.
- **Out: events.** The worker prints one line per event to its standard output, the pod's log, which the driver
  reads through the logs API: `kubesweep.worker {"event": "start", "trial": ID, ...}` when a trial starts, `end`
  (its exit code and outcome) when it has ended, `exit` when the worker itself ends. A trial's own output passes
  through the worker, which prints any of its lines that holds the event prefix anywhere with a prefix of its own
  (`escape`), so a trial cannot write an event.
- **Lines.** Both sides split a log at `LINE_END` (`\n`) alone, with `split_lines` / `log_lines`: never with
  `str.splitlines`, which also breaks at `\r \v \f \x1c-\x1e \x85 U+2028 U+2029`, so that a trial's one line
  `step 5\rkubesweep.worker {...}` would be read as a second line and an event.
- **Whose events.** A pod's events count for the trials handed to it alone. The driver records on the pod, beside
  the hand-over, every trial id it has ever handed to it (`HANDED_ANNOTATION`, the worker does not read it); an
  event naming any other trial is ignored (and logged by the driver as data).

Standard library and pydantic only (the contract floor).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, ValidationError

from kubesweep.wire.base import StrictModel

HANDOVER_ANNOTATION = "kubesweep.io/handover"
HANDOVER_FILE = "handover.json"  # in the pod's config directory (the downward API volume)
HANDED_ANNOTATION = "kubesweep.io/handed"  # the ids of every trial ever handed to the pod, space-separated
MAX_HANDED = 2000  # trials one pod is handed in its life: the record stays small (an annotation holds 256 KiB)
LINE_END = "\n"  # the one line separator of a worker's log, for the worker and its reader alike
EVENT_PREFIX = "kubesweep.worker "
ESCAPED_PREFIX = "| "  # put before a trial's line that would otherwise read as an event
# A trial id names files and directories in the pod (its output, its checkpoint): plain DNS-label characters only.
TRIAL_ID_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
MAX_HANDOVER_BYTES = 200_000  # an annotation holds 256 KiB; the hand-over stays well within it
EventKind = Literal["ready", "start", "end", "idle", "exit"]


class HandedTrial(StrictModel):
    """One trial of the hand-over: its id, its resolved trial config (the `TrialConfig` document) and its attempt
    (how often it ended before: a pod runs each attempt of a trial once)."""

    id: str = Field(pattern=TRIAL_ID_RE.pattern)
    config: dict[str, Any]
    attempt: int = Field(0, ge=0)


class Handover(StrictModel):
    """What the pod is to run: `trials` in order (the ones it has run stay listed or go, either way); `closed`:
    no trial will be added, so the pod ends once the listed ones have run."""

    sweep: str
    trials: list[HandedTrial] = Field(default_factory=list)
    closed: bool = False

    def to_annotation(self) -> str:
        text = self.model_dump_json()
        if len(text.encode()) > MAX_HANDOVER_BYTES:
            raise ValueError(f"a hand-over of {len(self.trials)} trials is {len(text.encode())} bytes, over "
                             f"{MAX_HANDOVER_BYTES}")
        return text


def read_handover(text: str) -> Handover | None:
    """The hand-over in `text`; None when it is empty (nothing handed over yet). ValueError, naming what is wrong,
    when it is not a hand-over."""
    if not text.strip():
        return None
    try:
        return Handover.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "hand-over"
        raise ValueError(f"{where}: {first['msg']}") from None


@dataclass(frozen=True)
class WorkerEvent:
    """One event line of a worker: `event` at `at` (epoch seconds); `trial` for start and end; `exit_code` and
    `outcome` for end; `reason` for idle and exit."""

    event: EventKind
    at: float
    trial: str | None = None
    exit_code: int | None = None
    outcome: str | None = None
    reason: str | None = None

    def line(self) -> str:
        fields = {k: v for k, v in (("event", self.event), ("at", round(self.at, 3)), ("trial", self.trial),
                                    ("exit_code", self.exit_code), ("outcome", self.outcome),
                                    ("reason", self.reason)) if v is not None}
        return EVENT_PREFIX + json.dumps(fields, sort_keys=True)


_KINDS = frozenset(("ready", "start", "end", "idle", "exit"))


def parse_event(line: str) -> WorkerEvent | None:
    """The event a log line carries, or None: any other line, and any malformed event line (text from a pod is
    data: nothing in it raises)."""
    if not line.startswith(EVENT_PREFIX):
        return None
    try:
        data = json.loads(line[len(EVENT_PREFIX):])
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("event") not in _KINDS:
        return None
    at, trial, code = data.get("at"), data.get("trial"), data.get("exit_code")
    outcome, reason = data.get("outcome"), data.get("reason")
    if not isinstance(at, int | float) or isinstance(at, bool):
        return None
    if trial is not None and not (isinstance(trial, str) and TRIAL_ID_RE.match(trial)):
        return None
    if code is not None and (not isinstance(code, int) or isinstance(code, bool)):
        return None
    if not all(v is None or isinstance(v, str) for v in (outcome, reason)):
        return None
    if data["event"] in ("start", "end") and trial is None:
        return None
    return WorkerEvent(data["event"], float(at), trial, code, outcome, reason)


def parse_events(lines: Iterable[str]) -> list[WorkerEvent]:
    """The events among a worker's log lines (`log_lines`), in order."""
    return [e for e in (parse_event(line) for line in lines) if e is not None]


def split_lines(buffered: str) -> tuple[list[str], str]:
    """The complete lines of `buffered` (each without its `LINE_END`) and what follows the last one (a line still
    being written, or ""). `LINE_END` alone ends a line: a carriage return, a form feed, U+2028 and the other
    characters `str.splitlines` breaks at are part of the line they are in."""
    *complete, rest = buffered.split(LINE_END)
    return complete, rest


def log_lines(text: str) -> list[str]:
    """A worker's whole log (or what of it there is) as lines, split as the worker wrote them (`split_lines`)."""
    complete, rest = split_lines(text)
    return [*complete, rest] if rest else complete


def escape(line: str) -> str:
    """A trial's output line (one line: `split_lines` made it) as the worker prints it: unchanged, unless it holds
    the event prefix anywhere or begins with the escape's own prefix."""
    return ESCAPED_PREFIX + line if EVENT_PREFIX in line or line.startswith(ESCAPED_PREFIX) else line


def unescape(line: str) -> str:
    """A trial's line as the trial printed it (`escape` undone)."""
    return line[len(ESCAPED_PREFIX):] if line.startswith(ESCAPED_PREFIX) else line


def handed_ids(text: str | None) -> frozenset[str]:
    """The trial ids a pod's `HANDED_ANNOTATION` records (anything in it that is not a trial id is dropped)."""
    return frozenset(t for t in (text or "").split() if TRIAL_ID_RE.match(t))


def handed_annotation(ids: Iterable[str]) -> str:
    """`HANDED_ANNOTATION`'s value for `ids`."""
    return " ".join(sorted(set(ids)))
