"""The sequential repeats rule at its edge: a cell whose 95% interval is exactly ±target stops; a hair wider, it
goes on."""

from __future__ import annotations

import math

from kubesweep.plan import make_trial
from kubesweep.sweep_spec import SequentialRepeats, parse_sweep
from kubesweep.tune.repeats import REACHED, CellRepeats, leaders

SWEEP = parse_sweep({"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "edge"},
                     "spec": {"matrix": {"batch_size": [8]}, "repeats": 3, "repeat_until": {"max": 6}}})


def cell(values: list[float]) -> CellRepeats:
    trials = [make_trial(SWEEP, {"batch_size": 8}, r) for r in range(len(values))]
    return CellRepeats({"batch_size": 8}, trials, ended=len(values), values=values)


def test_a_cell_exactly_at_the_target_stops_and_one_just_over_it_goes_on() -> None:
    # [97, 100, 103]: s = 3, half-width t(0.975, 2) x 3 / sqrt(3) = 4.303 x sqrt(3) = 7.45%: scaled by 3 / 7.45
    # around 100 the interval is ±3.0% to the last bit or so; the rule's target is set to the width it computes
    spread = 3.0 / (4.303 * math.sqrt(3))
    at = cell([100.0 - 3 * spread, 100.0, 100.0 + 3 * spread])
    width = at.half_width_pct
    assert width is not None and math.isclose(width, 3.0, rel_tol=1e-12)
    assert at.stopped(SequentialRepeats(min=3, max=6, target=width)) == REACHED
    assert at.stopped(SequentialRepeats(min=3, max=6, target=math.nextafter(width, 0.0))) is None
    assert at.stopped(SequentialRepeats(min=3, max=6, target=3.0 * (1 - 1e-9))) is None


def test_a_cell_about_a_zero_mean_has_no_finite_width_and_never_reaches_a_target() -> None:
    zero = cell([-1.0, 0.0, 1.0])
    assert zero.half_width_pct == math.inf
    assert zero.stopped(SequentialRepeats(min=3, max=6, target=3.0)) is None
    # repeats.json holds JSON: the width no number can say is written as none
    summary = zero.summary(SequentialRepeats(min=3, max=6, target=3.0))
    assert summary.half_width_pct is None and "Infinity" not in summary.model_dump_json()


def test_the_leader_is_the_best_mean_wherever_it_stands_and_a_zero_mean_can_lead() -> None:
    best, behind = cell([100.0, 101.0, 99.0]), cell([50.0, 51.0, 49.0])
    assert leaders([best, behind], higher_is_better=True) == {0}  # the best first, not last
    assert leaders([behind, best], higher_is_better=True) == {1}
    # lower is better: a cell measuring 0 (a loss, a latency rounded to nothing) is the best of its group
    nothing, some = cell([0.0, 0.0, 0.0]), cell([0.5, 0.5, 0.5])
    assert leaders([some, nothing], higher_is_better=False) == {1}


def test_a_cells_summary_names_its_gpu_type_or_none() -> None:
    rule = SequentialRepeats(min=3, max=6, target=3.0)
    on_gpu = cell([100.0, 100.0, 100.0])
    on_gpu.group = ("train", "h100-80gb")
    assert on_gpu.summary(rule).gpu == "h100-80gb"
    on_cpu = cell([100.0, 100.0, 100.0])
    on_cpu.group = ("train", "")
    assert on_cpu.summary(rule).gpu is None
