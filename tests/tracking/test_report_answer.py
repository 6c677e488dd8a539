"""The answer's wording where an objective has no best setting (`kubesweep.tracking.report_answer.why_no_best`)."""

from __future__ import annotations

import dataclasses

import pytest

from kubesweep.tracking import aggregate as agg
from kubesweep.tracking.report_answer import why_no_best
from kubesweep.wire import metrics as wm
from kubesweep.wire import trial_metrics as tm
from tests.tracking.test_aggregate import CATALOG, record, results


def test_a_time_to_the_target_accuracy_that_no_trial_reached_is_known_by_its_definition(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A new time to accuracy (a metric whose repeats meet as the mean of those that reached the target) says that
    no trial reached the target, as the two the catalogue has do: `why_no_best` asks the catalogue
    (`Metric.to_target`), not a list of names."""
    new = dataclasses.replace(wm.METRICS["tta_s"], name="tta_eval_s", label="TTA eval s")
    monkeypatch.setattr(wm, "CATALOGUE", (*wm.CATALOGUE, new))
    monkeypatch.setattr(tm, "CATALOGUE", wm.CATALOGUE)
    monkeypatch.setitem(wm.METRICS, new.name, new)
    assert [m.name for m in wm.CATALOGUE if m.to_target] == ["tta_s", "tta_train_s", "tta_eval_s"]
    cells = agg.aggregate([record("a", res=results(1500.0))], catalog=CATALOG)  # 0.91, no evaluation on record
    for metric in ("tta_s", "tta_train_s", "tta_eval_s"):
        assert why_no_best(cells, metric, 0.95) == "no trial reached 0.95 dev accuracy (best 0.910)"
    assert why_no_best(cells, "latency_p99_ms", 0.95) == "not measured"
