"""The Sweep resource's status as the operator writes it (`kubesweep.operator.store`): the bounded view, its
counts and the trials it names."""

from __future__ import annotations

from typing import Any

import pytest

from kubesweep.backends.base import Phase, SweepNotFound, SweepStatus, TrialStatus
from kubesweep.operator.controller import _changed
from kubesweep.operator.store import ATTENTION, SweepResourceStore, counts_for, status_view
from kubesweep.wire.outcomes import Outcome
from tests.support.operator_sweeps import two_trial_plan


def test_status_view_is_bounded_counts_and_names_the_trials_to_look_at() -> None:
    sweep, p = two_trial_plan()
    a, b = p.trials
    status = SweepStatus("s", "kubernetes", [
        TrialStatus(a.id, a.name, a.label(), a.gpu, Phase.FAILED, Outcome.OOM, "CUDA out of memory", 1, 10.0, 20.0),
        TrialStatus(b.id, b.name, b.label(), b.gpu, Phase.RUNNING, None, "", 1, 15.0)])
    view = status_view(status, sweep, slices=1)
    assert view["phase"] == "Running" and view["progress"] == "1/2" and view["trialSlices"] == 1
    assert view["counts"]["oom"] == 1 and view["counts"]["running"] == 1 and view["counts"]["failed"] == 0
    assert "trials" not in view
    assert view["attention"] == [{"name": a.name, "phase": "Failed", "outcome": "oom",
                                  "reason": "CUDA out of memory"}]
    assert counts_for(status).done == 1
    stored = {k: v for k, v in view.items() if v is not None}
    assert not _changed(view, stored)  # nulls are absent keys
    assert _changed({**view, "progress": "2/2"}, stored)

    many = SweepStatus("s", "kubernetes", [
        TrialStatus(f"t{i}", f"s-{i}", "", None, Phase.FAILED, Outcome.FAILED, "x" * 5000, 1, float(i), float(i))
        for i in range(10_000)])
    view = status_view(many, sweep)
    assert len(view["attention"]) == ATTENTION and view["attention"][0]["name"] == "s-9999"  # newest first
    assert all(len(note["reason"]) <= 240 for note in view["attention"])


def test_a_status_write_to_a_sweep_deleted_since_it_was_read_is_sweep_not_found() -> None:
    """The API server answers 404 to a status patch of a Sweep deleted while its step ran: that is the Sweep
    gone (SweepNotFound, which ends the step as a Sweep gone at load does), not an error retried with a
    traceback."""

    class NotFound(Exception):
        pass

    def write(fn: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotFound("sweeps.kubesweep.io \"gone\" not found")

    class Custom:  # the API calls the store names; the answer comes from `write`
        def __getattr__(self, name: str) -> Any:
            return name

    store = SweepResourceStore(Custom(), "ns", call=write, write=write, not_found=NotFound)
    store.resources["gone"] = {"metadata": {"name": "gone"}}
    with pytest.raises(SweepNotFound, match="no sweep named 'gone' in namespace ns"):
        store.patch_status("gone", {"phase": "Running"})
    assert "gone" not in store.resources
