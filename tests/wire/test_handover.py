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
    parse_event,
    parse_events,
    read_handover,
    unescape,
)


def test_an_event_reads_back_as_it_was_written() -> None:
    events = [WorkerEvent("ready", 1.0, reason="sweep s"), WorkerEvent("start", 2.5, trial="t-1"),
              WorkerEvent("end", 3.25, trial="t-1", exit_code=3, outcome="oom"),
              WorkerEvent("exit", 4.0, reason="closed")]
    lines = ["step 1/2 ...", *(e.line() for e in events), "anything else"]
    assert parse_events(lines) == events


@pytest.mark.parametrize("line", [
    EVENT_PREFIX + "not json",
    EVENT_PREFIX + "[1, 2]",
    EVENT_PREFIX + '{"event": "boom", "at": 1}',
    EVENT_PREFIX + '{"event": "start", "at": 1}',  # a start names its trial
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
