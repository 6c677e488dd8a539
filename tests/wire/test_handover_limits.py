"""The hand-over's edges: an annotation of exactly the limit is written, one byte more is refused; a hand-over that
is not an object is named as the hand-over."""

from __future__ import annotations

import pytest

from kubesweep.wire.handover import MAX_HANDOVER_BYTES, HandedTrial, Handover, read_handover


def _handover(size: int) -> Handover:
    """A hand-over whose annotation is `size` bytes: trials whose settings hold 2,000-character strings, the last
    one's cut to fit."""
    trials: list[HandedTrial] = []
    while True:
        trials.append(HandedTrial(id=f"t{len(trials)}", config={"p": "x" * 2000}))
        over = len(Handover(sweep="s", trials=trials).model_dump_json().encode()) - size
        if over >= 0:
            trials[-1] = HandedTrial(id=trials[-1].id, config={"p": "x" * (2000 - over)})
            return Handover(sweep="s", trials=trials)


def test_a_handover_of_exactly_the_limit_is_written_and_one_byte_more_is_refused() -> None:
    text = _handover(MAX_HANDOVER_BYTES).to_annotation()
    assert len(text.encode()) == MAX_HANDOVER_BYTES
    with pytest.raises(ValueError, match=f"over {MAX_HANDOVER_BYTES}"):
        _handover(MAX_HANDOVER_BYTES + 1).to_annotation()


@pytest.mark.parametrize("text", ["[]", "1", '"a hand-over"'])
def test_a_handover_that_is_not_an_object_is_named_as_the_handover(text: str) -> None:
    with pytest.raises(ValueError, match=r"^hand-over: "):
        read_handover(text)
