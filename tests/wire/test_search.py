"""The summaries searches write (`kubesweep.wire.search`): a file in the shape every earlier version wrote reads and
writes back byte for byte, and a file of another shape is one line naming the file and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kubesweep.wire.search import (
    MaxBatchSummary,
    RepeatsSummary,
    SummaryError,
    TuneSummary,
    read_summary,
    summary_json,
)

# as `tune.json`, `max_batch.json` and `repeats.json` were written before these models (json.dumps(as_dict(),
# indent=2)): the same text must come back
BEST = {"trial_id": "3f2a9c", "name": "tune-demo-t0", "axes": {"batch_size": 64, "learning_rate": 3e-05},
        "outcome": "succeeded", "metrics": {"samples_per_s": 1234.5, "accuracy": 0.91}, "feasible": True,
        "violations": "", "reports": 12}
TUNE = {"sweep": "tune-demo", "metrics": ["samples_per_s", "accuracy"], "modes": ["max", "max"], "trials": [
    BEST,
    {"trial_id": "77b1e0", "name": "tune-demo-t1", "axes": {"batch_size": 8, "learning_rate": 0.0001},
     "outcome": "stopped", "metrics": {"samples_per_s": 310, "accuracy": None}, "feasible": False,
     "violations": "accuracy >= 0.8", "reports": None}],
    "best": BEST, "pareto": [BEST], "resumed": False}
MAX_BATCH = {"sweep": "mb", "strategy": "max_batch", "cells": [
    {"gpu": "h100-80gb", "precision": "bf16", "axes": {"gpu": "h100-80gb", "precision": "bf16"}, "max_batch": 192,
     "smallest_oom": 256, "low": 64, "high": 512, "probes": 2,
     "history": [{"batch_size": 192, "outcome": "succeeded", "trial": "mb-bs192"},
                 {"batch_size": 256, "outcome": "oom", "trial": "mb-bs256"}], "error": ""},
    {"gpu": None, "precision": "fp32", "axes": {}, "max_batch": None, "smallest_oom": None, "low": None,
     "high": None, "probes": 1, "history": [{"batch_size": 8, "outcome": None, "trial": "mb-bs8"}],
     "error": "probe mb-bs8 (batch 8) ended failed: exit 1"}]}
REPEATS = {"sweep": "reps", "strategy": "repeats",
           "rule": {"min": 3, "max": 5, "target": 3.0, "metric": "samples_per_s"},
           "repeats": 8, "fixed_min": 6, "fixed_max": 10, "at_max": 1, "cells": [
               {"axes": {"batch_size": 16, "learning_rate": 0.321}, "task": "finetune", "gpu": None, "repeats": 3,
                "ended": 3, "values": 3, "mean": 1012.4, "half_width_pct": 1.7, "stopped": "reached",
                "trials": ["reps-bs16-r0", "reps-bs16-r1", "reps-bs16-r2"]},
               {"axes": {"batch_size": 32}, "task": "finetune", "gpu": "h100-80gb", "repeats": 5, "ended": 5,
                "values": 0, "mean": None, "half_width_pct": None, "stopped": "max", "trials": []}]}


@pytest.mark.parametrize(("doc", "model"), [(TUNE, TuneSummary), (MAX_BATCH, MaxBatchSummary),
                                            (REPEATS, RepeatsSummary)])
def test_a_summary_in_the_shape_earlier_versions_wrote_reads_and_writes_back_the_same(doc: object,
                                                                                        model: type) -> None:
    text = json.dumps(doc, indent=2) + "\n"
    summary = read_summary(json.loads(text), "search/x.json")
    assert isinstance(summary, model)
    assert summary_json(summary) == text  # same keys, order and numbers (an integer stays one)


def test_a_max_batch_summary_without_its_strategy_is_still_one() -> None:
    doc = {k: v for k, v in MAX_BATCH.items() if k != "strategy"}
    assert isinstance(read_summary(doc, "x"), MaxBatchSummary)


@pytest.mark.parametrize(("doc", "said"), [
    ([1, 2], "x.json: not a search summary (expected a JSON object, got list)"),
    ({**REPEATS, "cells": "many"}, "x.json: not a valid RepeatsSummary at cells: Input should be a valid list"),
    ({**REPEATS, "cells": [{**REPEATS["cells"][0], "stopped": "bored"}]},  # type: ignore[index, dict-item]
     "x.json: not a valid RepeatsSummary at cells.0.stopped: Input should be 'reached', 'max', 'no value' or "
     "'host-bound'"),
    ({k: v for k, v in TUNE.items() if k != "trials"}, "x.json: not a valid TuneSummary at trials: Field required"),
    ({**TUNE, "modes": ["up"], "best": 3},
     "x.json: not a valid TuneSummary at modes.0: Input should be 'max' or 'min' (and 1 more)"),
    ({**MAX_BATCH, "cells": [{**MAX_BATCH["cells"][0], "rows": 2}]},  # type: ignore[index, dict-item]
     "x.json: not a valid MaxBatchSummary at cells.0.rows: Extra inputs are not permitted"),
])
def test_a_summary_of_another_shape_is_one_line_naming_the_file_and_the_field(doc: object, said: str) -> None:
    with pytest.raises(SummaryError) as caught:
        read_summary(doc, "x.json")
    assert str(caught.value) == said and "\n" not in said


def test_the_summaries_earlier_versions_wrote_on_real_machines_read_and_write_back_the_same() -> None:
    """The `repeats.json` files bench/results keeps, written on H200 machines before these models."""
    root = Path(__file__).parents[2] / "bench" / "results"
    files = sorted(root.glob("*/home/sweeps/*/search/*.json"))
    assert files, f"no search summary under {root}"
    for path in files:
        text = path.read_text()
        assert summary_json(read_summary(json.loads(text), str(path))) == text, path
