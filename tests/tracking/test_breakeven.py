"""torch.compile's break-even (kubesweep/tracking/breakeven.py), by hand on known numbers."""

from __future__ import annotations

import math
from typing import Any

import pytest

from kubesweep.gpus import load_catalog
from kubesweep.tracking.aggregate import aggregate
from kubesweep.tracking.breakeven import break_evens
from kubesweep.tracking.records import TrialRecord
from kubesweep.wire.config import JobConfig
from tests.support.results_docs import make_results

ROWS = 67_349  # SST-2's training rows


def trial(name: str, compile_: Any, rate: float, warmup_s: float, *, batch: int = 64,
          task: str = "finetune") -> TrialRecord:
    results = {"outcome": "succeeded", "device": "cuda", "final_accuracy": 0.9, "data": {"train_rows": ROWS},
               "train": {"samples_per_s": rate, "epochs_completed": 1.0},
               "timings": {"train_s": 100.0, "compile_warmup_s": warmup_s}}
    job = {"task": task, "batch_size": batch, "precision": "bf16", "compile": compile_}
    return TrialRecord(name, name, 0, "h100-80gb", 1, "succeeded", JobConfig.model_validate(job),
                       make_results(**results))


def test_steps_and_epochs_until_compiling_pays_off() -> None:
    cells = aggregate([trial("e", False, 1000.0, 2.0), trial("c", True, 1280.0, 20.0)], catalog=load_catalog())
    [found] = break_evens(cells)
    # saved per step = 64 / 1000 - 64 / 1280 = 0.014 s; extra warm-up 18 s: 1,285.7 steps, rounded up
    assert found.extra_warmup_s == 18.0 and found.saved_per_step_s == pytest.approx(0.014)
    assert found.steps == math.ceil(18.0 / 0.014) == 1286
    assert found.epochs == pytest.approx(1286 / (ROWS / 64))  # 1.22 epochs of 1,052 steps
    assert found.text == "after 1,286 steps (1.2 epochs)"


def test_a_compiled_setting_that_is_not_faster_never_pays_off_and_one_that_warms_as_fast_at_once() -> None:
    slower = break_evens(aggregate([trial("e", False, 1000.0, 2.0), trial("c", True, 990.0, 20.0)],
                                   catalog=load_catalog()))
    assert [(b.steps, b.text) for b in slower] == [(None, "never: not faster per step")]
    free = break_evens(aggregate([trial("e", False, 1000.0, 5.0), trial("c", "default", 1100.0, 4.0)],
                                 catalog=load_catalog()))
    assert [(b.steps, b.text) for b in free] == [(0, "from the first step")]


def test_only_fine_tuning_cells_with_an_eager_twin_get_a_break_even() -> None:
    cells = aggregate([trial("c", True, 1280.0, 20.0),  # no eager twin at batch 64
                       trial("e2", False, 1000.0, 2.0, batch=128),
                       trial("i", False, 900.0, 1.0, task="inference"), trial("ic", True, 990.0, 9.0,
                                                                            task="inference")],
                      catalog=load_catalog())
    assert break_evens(cells) == []
