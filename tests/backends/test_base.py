"""The backend interface's shared rules (`kubesweep.backends.base`): a sweep's phase, when it is done, its
counts, what is a failure, which trials are settled, and how a trial reference is resolved."""

from __future__ import annotations

import pytest

from kubesweep.backends.base import (
    TERMINAL,
    AmbiguousTrial,
    Phase,
    SweepNotFound,
    SweepStatus,
    TrialStatus,
)
from kubesweep.wire.outcomes import Outcome


def sweep(*trials: tuple[Phase, Outcome | None]) -> SweepStatus:
    return SweepStatus("s", "local", [TrialStatus(f"id{i}", f"s-{i}", "", None, phase, outcome)
                                      for i, (phase, outcome) in enumerate(trials)])


DONE = (Phase.SUCCEEDED, Outcome.SUCCEEDED)
OOM = (Phase.FAILED, Outcome.OOM)
FAILED = (Phase.FAILED, Outcome.FAILED)
RUNNING = (Phase.RUNNING, None)
PENDING = (Phase.PENDING, None)


@pytest.mark.parametrize(("trials", "phase", "done"), [
    ((), "Empty", True),
    ((PENDING, DONE), "Pending", False),
    (((Phase.UNSCHEDULABLE, None),), "Pending", False),
    ((PENDING, RUNNING, DONE), "Running", False),
    ((RUNNING, FAILED), "Running", False),
    ((DONE, OOM, (Phase.FAILED, Outcome.GPU_MISMATCH), (Phase.STOPPED, Outcome.STOPPED)), "Succeeded", True),
    ((DONE, FAILED), "Failed", True),
    ((DONE, (Phase.CANCELLED, Outcome.CANCELLED), FAILED), "Cancelled", True),
    (((Phase.SKIPPED, Outcome.SKIPPED),), "Succeeded", True),
])
def test_the_sweeps_phase_and_when_it_is_done(trials: tuple[tuple[Phase, Outcome | None], ...], phase: str,
                                              done: bool) -> None:
    status = sweep(*trials)
    assert (status.phase, status.done) == (phase, done)


def test_counts_failures_and_settled_trials() -> None:
    status = sweep(DONE, DONE, OOM, FAILED, RUNNING)
    assert status.counts() == {"Succeeded": 2, "Failed": 2, "Running": 1}
    assert status.has_failures and not sweep(DONE, OOM, (Phase.FAILED, Outcome.GPU_MISMATCH)).has_failures
    assert [t.settled for t in status.trials] == [True, True, True, False, False]
    assert TrialStatus("x", "x", "", None, Phase.STOPPED, Outcome.STOPPED).settled  # the search's decision stands
    assert not TrialStatus("x", "x", "", None, Phase.CANCELLED, Outcome.CANCELLED).settled
    assert not TrialStatus("x", "x", "", None, Phase.RUNNING, Outcome.SUCCEEDED).settled  # not terminal yet
    assert {p for p in Phase if p.terminal} == TERMINAL == {
        Phase.SUCCEEDED, Phase.FAILED, Phase.SKIPPED, Phase.CANCELLED, Phase.STOPPED}


def test_a_trial_by_name_id_or_unique_prefix() -> None:
    status = SweepStatus("s", "local", [TrialStatus("abc123", "s-b8", "", None, Phase.PENDING),
                                        TrialStatus("abd456", "s-b16", "", None, Phase.PENDING),
                                        TrialStatus("ff0000", "s-b1", "", None, Phase.PENDING)])
    assert status.trial("s-b16").trial_id == "abd456"
    assert status.trial("abc").name == "s-b8"
    assert status.trial("s-b1").trial_id == "ff0000"  # an exact name wins over the names it prefixes
    with pytest.raises(AmbiguousTrial, match="'ab' matches 2 trials of sweep 's'") as info:
        status.trial("ab")
    assert "s-b8 (id abc123)" in str(info.value)
    with pytest.raises(SweepNotFound, match="no trial of sweep 's' matches 'zz'"):
        status.trial("zz")
    many = SweepStatus("m", "local", [TrialStatus(f"id{i}", f"m-{i}", "", None, Phase.PENDING) for i in range(13)])
    with pytest.raises(AmbiguousTrial, match=r"\.\.\. and 3 more"):
        many.trial("m-")
