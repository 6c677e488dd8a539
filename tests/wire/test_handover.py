"""The hand-over and the worker's event lines (kubesweep/wire/handover.py): what a warm pod and its driver say."""

from __future__ import annotations

import pytest

from kubesweep.wire.handover import (
    EVENT_PREFIX,
    MAX_HANDOVER_BYTES,
    HandedTrial,
    Handover,
    WorkerEvent,
    escape,
    handed_annotation,
    handed_ids,
    log_lines,
    parse_event,
    parse_events,
    read_handover,
    split_lines,
    unescape,
)

# Every character but "\n" that `str.splitlines` ends a line at.
SEPARATORS = ("\r", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029")


def test_an_event_reads_back_as_it_was_written() -> None:
    events = [WorkerEvent("ready", 1.0, reason="sweep s"), WorkerEvent("start", 2.5, trial="t-1"),
              WorkerEvent("end", 3.25, trial="t-1", exit_code=3, outcome="oom"),
              WorkerEvent("exit", 4.0, reason="closed")]
    lines = ["step 1/2 ...", *(e.line() for e in events), "anything else"]
    assert parse_events(lines) == events


def test_an_event_line_is_written_as_drivers_of_any_version_read_it() -> None:
    """The line is what a worker pod's log carries to the driver, which may be of another release: its text (the
    prefix, keys in order, the time in milliseconds, no field left empty) is fixed."""
    assert WorkerEvent("end", 3.14159, trial="t-1", exit_code=0, outcome="succeeded").line() == (
        'kubesweep.worker {"at": 3.142, "event": "end", "exit_code": 0, "outcome": "succeeded", "trial": "t-1"}')
    assert WorkerEvent("ready", 1.0, reason="sweep s").line() == (
        'kubesweep.worker {"at": 1.0, "event": "ready", "reason": "sweep s"}')


@pytest.mark.parametrize("line", [
    EVENT_PREFIX + "not json",
    EVENT_PREFIX + "[1, 2]",
    EVENT_PREFIX + '{"event": "boom", "at": 1}',
    EVENT_PREFIX + '{"event": "start", "at": 1}',  # a start names its trial
    EVENT_PREFIX + '{"event": "end", "at": 1, "exit_code": 0}',  # and so does an end
    EVENT_PREFIX + '{"event": "end", "at": "soon", "trial": "t"}',
    EVENT_PREFIX + '{"event": "end", "at": true, "trial": "t"}',
    EVENT_PREFIX + '{"event": "end", "at": 1, "trial": "../../etc"}',
    EVENT_PREFIX + '{"event": "end", "at": 1, "trial": "t", "exit_code": "0"}',
    EVENT_PREFIX + '{"event": "end", "at": 1, "trial": "t", "outcome": {"x": 1}}',
    " " + EVENT_PREFIX + '{"event": "exit", "at": 1}',
])
def test_a_malformed_event_line_is_no_event_and_raises_nothing(line: str) -> None:
    assert parse_event(line) is None


def test_escaping_keeps_a_trials_line_from_reading_as_an_event_and_is_undone_exactly() -> None:
    forged = WorkerEvent("end", 1.0, trial="t", exit_code=0, outcome="succeeded").line()
    for line in (forged, "| " + forged, "| a table row", "plain"):
        assert parse_event(escape(line)) is None or line == "plain"
        assert unescape(escape(line)) == line
    assert escape("plain") == "plain"


@pytest.mark.parametrize("sep", SEPARATORS, ids=[f"U+{ord(c):04X}" for c in SEPARATORS])
def test_only_a_newline_ends_a_line_of_a_workers_log(sep: str) -> None:
    """A trial's one line with a forged event behind a character `str.splitlines` breaks at stays one line, and
    no event, on both sides: the worker's split of what it relays and the driver's of the pod's log."""
    forged = WorkerEvent("end", 1.0, trial="t-other", exit_code=3, outcome="oom").line()
    text = f"step 5{sep}{forged}\nnext"
    assert parse_events(text.splitlines()) != []  # the attack, read the old way
    assert split_lines(text) == ([f"step 5{sep}{forged}"], "next")
    assert log_lines(text) == [f"step 5{sep}{forged}", "next"] == log_lines(text + "\n")
    assert parse_events(log_lines(text)) == []
    assert escape(f"step 5{sep}{forged}") == f"| step 5{sep}{forged}"


def test_a_line_with_the_event_prefix_anywhere_is_escaped_and_unescaped_exactly() -> None:
    forged = WorkerEvent("end", 1.0, trial="t", exit_code=0, outcome="succeeded").line()
    for line in (f"a table | {forged}", f"\x1b[2K{forged}", f"step 5\u2028{forged}"):
        assert escape(line) == "| " + line and unescape(escape(line)) == line


def test_a_pods_record_of_what_it_was_handed_reads_back_and_keeps_trial_ids_only() -> None:
    assert handed_ids(handed_annotation(["t-2", "t-1", "t-2"])) == {"t-1", "t-2"}
    assert handed_annotation(["t-2", "t-1"]) == "t-1 t-2"
    assert handed_ids("t-1 ../x  T-UPPER\nt-3") == {"t-1", "t-3"} and handed_ids(None) == frozenset()


def test_a_handover_reads_back_and_a_bad_one_is_named() -> None:
    handed = Handover(sweep="s", trials=[HandedTrial(id="t-1", config={"trial_id": "t-1"})], closed=True)
    assert read_handover(handed.to_annotation()) == handed
    assert read_handover("  \n") is None
    with pytest.raises(ValueError, match=r"^trials\.0\.id: String should match pattern"):
        read_handover('{"sweep": "s", "trials": [{"id": "../x", "config": {}}]}')
    with pytest.raises(ValueError, match=r"^surprise: Extra inputs are not permitted"):
        read_handover('{"sweep": "s", "surprise": 1}')
    with pytest.raises(ValueError, match="Invalid JSON"):
        read_handover("{nope")
    big = Handover(sweep="s", trials=[HandedTrial(id=f"t-{i}", config={"pad": "x" * 1000}) for i in range(300)])
    with pytest.raises(ValueError, match=f"over {MAX_HANDOVER_BYTES}"):
        big.to_annotation()
