"""What a search found, as text (kubesweep/cli/search_view.py): max-batch answers, a tune search's best and Pareto
front, and what sequential repeats spent, from summaries whose values are data."""

from __future__ import annotations

from typing import Any

from kubesweep.cli import search_view
from kubesweep.wire.search import (
    MaxBatchCell,
    MaxBatchSummary,
    RepeatRule,
    RepeatsCell,
    RepeatsSummary,
    TuneSummary,
    TuneTrial,
)


def max_batch_cell(gpu: str | None, precision: str, found: int | None, probes: int, low: int = 8) -> MaxBatchCell:
    return MaxBatchCell(gpu=gpu, precision=precision, axes={"precision": precision}, max_batch=found,
                        smallest_oom=None, low=low, high=1024, probes=probes, history=[], error="")


def trial(name: str, outcome: str = "succeeded", metrics: dict[str, Any] | None = None,
          axes: dict[str, Any] | None = None) -> TuneTrial:
    return TuneTrial(trial_id=name, name=name, axes=axes or {}, outcome=outcome, metrics=metrics or {},
                     feasible=outcome == "succeeded", violations="", reports=None)


def test_search_lines_for_a_max_batch_search_give_each_cells_answer() -> None:
    summary = MaxBatchSummary(sweep="mb", cells=[max_batch_cell("h100-80gb", "bf16", 512, 6),
                                                 max_batch_cell(None, "fp32", None, 1)])
    assert search_view.search_lines(summary) == [
        "max batch size h100-80gb bf16: 512 (6 probes)",
        "max batch size cpu fp32: none fits (smallest tried: 8) (1 probes)",
    ]


def test_search_lines_for_a_tune_search_give_counts_the_best_trial_and_the_pareto_front() -> None:
    best = trial("t-7", metrics={"samples_per_s": 1234.5678}, axes={"batch_size": 64, "learning_rate": 3e-05})
    summary = TuneSummary(sweep="t", metrics=["samples_per_s", "accuracy"], modes=["max", "max"], resumed=True,
                          trials=[trial("a"), trial("b", "stopped"), trial("c")], best=best,
                          pareto=[trial("t-3", metrics={"samples_per_s": 900.0, "accuracy": 0.9123},
                                        axes={"batch_size": 32})])
    assert search_view.search_lines(summary) == [
        "tune: 3 trials (1 stopped, 2 succeeded); metric samples_per_s, accuracy (max, max); resumed",
        "best: t-7 (samples_per_s 1235) with batch_size=64 learning_rate=3e-05",
        "pareto: t-3 (samples_per_s 900, accuracy 0.9123) with batch_size=32",
    ]
    failed = TuneSummary(sweep="t", metrics=["samples_per_s"], modes=["max"], trials=[trial("x", "failed")],
                         best=None)
    assert search_view.search_lines(failed)[1] == "best: none (no trial succeeded within the constraints)"


def test_repeats_lines_show_a_summarys_values_as_text() -> None:
    """A summary file is data: markup or an escape sequence in a cell's axes is shown as text."""
    def cell(stopped: Any, axes: dict[str, Any], repeats: int, width: float | None) -> RepeatsCell:
        return RepeatsCell(axes=axes, task="finetune", gpu=None, repeats=repeats, ended=repeats, values=0,
                           mean=None, half_width_pct=width, stopped=stopped, trials=[])

    summary = RepeatsSummary(
        sweep="r", rule=RepeatRule(metric="samples_per_s", target=3.0, min=3, max=8), repeats=19, fixed_min=9,
        fixed_max=24, at_max=1, cells=[cell("reached", {"batch_size": 16}, 4, 2.0),
                                       cell("max", {"batch_size": 32}, 8, None),
                                       cell("no value", {"batch_size": "[bold]8\x1b[31m"}, 3, None),
                                       cell("host-bound", {"batch_size": 64}, 3, 7.31)])
    lines = search_view.search_lines(summary)
    assert lines[0] == ("repeats until the 95% interval of samples_per_s is within ±3% (3 to 8 per cell): 19 repeats "
                        "over 4 cells (a fixed 3: 9, a fixed 8: 24)")
    assert lines[1] == "  batch_size=32: stopped at the max of 8 repeats without an interval"
    assert lines[2].startswith("  batch_size=[bold]8") and "\x1b" not in lines[2]
    assert lines[3] == ("  batch_size=64: stopped after 3 repeats at ±7.3%: host-bound (its spread is the host's; "
                        "more repeats measure it again)")
    assert len(lines) == 4  # the cell that reached the target is not named
