"""What a search found, as text (kubesweep/search_view.py): max-batch answers, a tune search's best and Pareto front,
and what sequential repeats spent, from summaries whose values are data."""

from __future__ import annotations

from kubesweep import search_view


def test_search_lines_for_a_max_batch_search_give_each_cells_answer() -> None:
    summary = {"cells": [{"gpu": "h100-80gb", "precision": "bf16", "max_batch": 512, "probes": 6},
                         {"gpu": None, "precision": "fp32", "max_batch": None, "low": 8, "probes": 1}]}
    assert search_view.search_lines(summary) == [
        "max batch size h100-80gb bf16: 512 (6 probes)",
        "max batch size cpu fp32: none fits (smallest tried: 8) (1 probes)",
    ]


def test_search_lines_for_a_tune_search_give_counts_the_best_trial_and_the_pareto_front() -> None:
    summary = {"trials": [{"outcome": "succeeded"}, {"outcome": "stopped"}, {"outcome": "succeeded"}],
               "metrics": ["samples_per_s", "accuracy"], "modes": ["max", "max"], "resumed": True,
               "best": {"name": "t-7", "metrics": {"samples_per_s": 1234.5678}, "axes": {"batch_size": 64,
                                                                                          "learning_rate": 3e-05}},
               "pareto": [{"name": "t-3", "metrics": {"samples_per_s": 900.0, "accuracy": 0.9123},
                           "axes": {"batch_size": 32}}]}
    assert search_view.search_lines(summary) == [
        "tune: 3 trials (1 stopped, 2 succeeded); metric samples_per_s, accuracy (max, max); resumed",
        "best: t-7 (samples_per_s 1235) with batch_size=64 learning_rate=3e-05",
        "pareto: t-3 (samples_per_s 900, accuracy 0.9123) with batch_size=32",
    ]
    failed = {"trials": [{"outcome": "failed"}], "metrics": ["samples_per_s"], "modes": ["max"]}
    assert search_view.search_lines(failed)[1] == "best: none (no trial succeeded within the constraints)"


def test_repeats_lines_show_a_summarys_values_as_text_whatever_their_type() -> None:
    """A summary file is data: a value of the wrong type, markup or an escape sequence is shown as text."""
    summary = {"strategy": "repeats", "rule": {"metric": "samples_per_s", "target": "3", "min": 3, "max": None},
               "repeats": "many", "cells": [
                   "not a cell", {"stopped": "max", "axes": "not a mapping", "half_width_pct": "wide", "repeats": 8},
                   {"stopped": "no value", "axes": {"batch_size": "[bold]8\x1b[31m"}, "repeats": 3}]}
    lines = search_view.search_lines(summary)
    assert lines[0].startswith("repeats until the 95% interval of samples_per_s is within ±3% (3 to - per cell): "
                               "many repeats over 3 cells")
    assert lines[1] == "  : stopped at the max of 8 repeats without an interval"
    assert lines[2].startswith("  batch_size=[bold]8") and "\x1b" not in lines[2]


def test_a_tune_or_max_batch_summary_of_the_wrong_shape_is_shown_not_a_crash() -> None:
    tune = {"trials": [{"outcome": "succeeded"}, "junk", {"outcome": ["x"]}], "metrics": "samples_per_s",
            "modes": None, "best": {"name": "[red]t-1\x1b[2J", "metrics": "fast", "axes": ["bs"]},
            "pareto": [7, {"name": "t-2"}]}
    lines = search_view.search_lines(tune)
    assert lines[0] == "tune: 2 trials (1 ['x'], 1 succeeded); metric  ()"
    assert lines[1] == "best: [red]t-1 () with " and "\x1b" not in "".join(lines)
    assert lines[2] == "pareto: t-2 () with "
    assert search_view.search_lines({"cells": ["junk", {"gpu": None, "max_batch": 8, "probes": 2}]}) == [
        "max batch size cpu None: 8 (2 probes)"]
