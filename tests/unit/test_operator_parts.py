"""Operator parts that need no cluster: test-hook rules, the status view and when it is rewritten."""

from __future__ import annotations

import pytest

from kubesweep.backends.base import Phase, SweepStatus, TrialStatus
from kubesweep.operator import testhooks
from kubesweep.operator.controller import _changed
from kubesweep.operator.store import SweepStore, counts_for, recorded_outcomes
from kubesweep.outcomes import Outcome
from kubesweep.plan import plan
from kubesweep.spec import parse_sweep

DIGEST = "registry.example/job@sha256:" + "0" * 64


def _plan():  # type: ignore[no-untyped-def]
    sweep = parse_sweep({"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "s"},
                         "spec": {"image": DIGEST, "matrix": {"gpu": ["l4"], "batch_size": [8, 16]}}})
    return sweep, plan(sweep)


def test_hook_rules_match_by_axes_and_only_copy_test_annotations() -> None:
    _, p = _plan()
    rules = testhooks.parse_rules('[{"match": {"batch_size": 8}, "annotations": {"kubesweep.io/test-outcome": "oom"}},'
                                  ' {"annotations": {"kubesweep.io/test-duration": "1s"}}]')
    by_batch = {t.axes["batch_size"]: testhooks.annotations_for(t, rules) for t in p.trials}
    assert by_batch == {8: {"kubesweep.io/test-outcome": "oom"}, 16: {"kubesweep.io/test-duration": "1s"}}
    assert testhooks.parse_rules(None) == []
    with pytest.raises(testhooks.TestHookError, match=r"only kubesweep\.io/test-"):
        testhooks.parse_rules('{"sidecar.istio.io/inject": "true"}')
    with pytest.raises(testhooks.TestHookError, match="not JSON"):
        testhooks.parse_rules("{")


def test_status_view_counts_and_leaves_recorded_flags_alone() -> None:
    sweep, p = _plan()
    a, b = p.trials
    status = SweepStatus("s", "kubernetes", [
        TrialStatus(a.id, a.name, a.label(), a.gpu, Phase.FAILED, Outcome.OOM, "CUDA out of memory", 1, 10.0, 20.0),
        TrialStatus(b.id, b.name, b.label(), b.gpu, Phase.RUNNING, None, "", 1, 15.0)])
    view = SweepStore.status_view(status, sweep)
    assert view["phase"] == "Running" and view["progress"] == "1/2"
    assert view["counts"]["oom"] == 1 and view["counts"]["running"] == 1 and view["counts"]["failed"] == 0
    assert all("final" not in entry for entry in view["trials"].values())
    assert view["trials"][a.id]["startedAt"] == "1970-01-01T00:00:10Z"
    assert counts_for(status).done == 1

    stored = {**view, "trials": {tid: {k: v for k, v in e.items() if v is not None} | {"final": True}
                                 for tid, e in view["trials"].items()}}
    assert not _changed(view, stored)  # nulls are absent keys; `final` is not part of the view
    moved = {**view, "trials": {**view["trials"], b.id: {**view["trials"][b.id], "phase": "Succeeded"}}}
    assert _changed(moved, stored)
    assert set(recorded_outcomes(stored)) == {a.id}  # only entries with an outcome count as recorded
