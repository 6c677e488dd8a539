"""Size limits: `count_trials` is exact without expanding the product, and a sweep over the limit is refused up
front — by `plan`, by `check_size`, by the CLI (exit 2, one line, no traceback) and by the operator's flag."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubesweep import plan as plan_module
from kubesweep.cli import commands as cli
from kubesweep.gpus import default_catalog
from kubesweep.plan import (
    DEFAULT_MAX_TRIALS,
    SweepTooLarge,
    candidates,
    cells,
    check_size,
    count_cells,
    count_trials,
    max_batch_probes,
    most_nodes,
    next_probes,
    plan,
)
from kubesweep.sweep_spec import MaxBatchSearch, SpecError, Sweep, parse_sweep, set_axes

ROOT = Path(__file__).parents[1]
GPUS = default_catalog().names

# Axis -> values a spec may use. Some are unhashable (dicts, lists) or compare across types (1 == 1.0 == True):
# the count compares values with `==`, as the planner does.
POOL: dict[str, list[Any]] = {
    "gpu": list(GPUS[:5]),
    "batch_size": [1, 8, 16, 32, 64, 128],
    "precision": ["fp32", "tf32", "fp16", "bf16"],
    "compile": [False, "default", "max-autotune", "reduce-overhead"],
    "learning_rate": [1e-5, 2e-5, 5e-5, 1e-4],
    "epochs": [1, 2.5, 3, 4.0],
    "model_overrides": [{"num_hidden_layers": 2}, {"num_hidden_layers": 4}, {"hidden_dropout_prob": 0.2},
                        {"num_hidden_layers": 2.0, "x": True}],
    "export": [["onnx"], ["torchscript"], ["onnx", "torchscript"], []],
    "seed": [0, 1, 2, 3],
}


def doc(matrix: dict[str, Any], exclude: list[dict[str, Any]] | None = None,
        include: list[dict[str, Any]] | None = None, repeats: int = 1, name: str = "count",
        search: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"matrix": matrix, "exclude": exclude or [], "include": include or [],
                            "repeats": repeats, "job": {"random_init": True}}  # which model_overrides needs
    if search:
        spec["search"] = search
    return {"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": name}, "spec": spec}


def reference_cells(sweep: Sweep) -> list[dict[str, Any]]:
    """What `cells` means, by brute force: every cell of the product that matches no exclude rule (a rule matches
    a cell having each of its axes with an equal value), then each include once, unless the matrix has it."""
    matrix = set_axes(sweep.spec.matrix)
    rules = [set_axes(r) for r in sweep.spec.exclude]
    names = list(matrix)
    grid = []
    for values in itertools.product(*(matrix[n] for n in names)):
        cell = dict(zip(names, values, strict=True))
        if not any(all(k in cell and cell[k] == v for k, v in rule.items()) for rule in rules):
            grid.append(cell)
    out, seen = list(grid), []
    for rule in sweep.spec.include:
        extra = set_axes(rule)
        if extra not in seen:
            seen.append(extra)
            if extra not in grid:
                out.append(extra)
    return out


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    axes = draw(st.lists(st.sampled_from(sorted(POOL)), min_size=0, max_size=4, unique=True))
    matrix = {a: draw(st.lists(st.sampled_from(POOL[a]), min_size=1, max_size=4, unique_by=json.dumps))
              for a in axes}
    # the spec refuses a value listed twice (by ==): 1 and 1.0, {"n": 2} and {"n": 2.0}
    matrix = {a: [v for i, v in enumerate(vs) if v not in vs[:i]] for a, vs in matrix.items()}

    def value(axis: str) -> Any:  # mostly on the axis, sometimes a value it does not have
        on = matrix.get(axis)
        return draw(st.sampled_from(on)) if on and draw(st.integers(0, 3)) else draw(st.sampled_from(POOL[axis]))

    exclude = []
    for _ in range(draw(st.integers(0, 6)) if matrix else 0):
        keys = draw(st.lists(st.sampled_from(axes), min_size=1, max_size=min(3, len(axes)), unique=True))
        exclude.append({k: value(k) for k in keys})
    if exclude and draw(st.booleans()):
        exclude.append(dict(draw(st.sampled_from(exclude))))  # the same rule twice
    include = []
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["cell", "partial", "again"]))
        if kind == "again" and include:
            include.append(dict(draw(st.sampled_from(include))))
        elif kind == "cell" and matrix:  # a full cell: on the grid, excluded, or off it
            include.append({a: value(a) for a in axes})
        else:
            keys = draw(st.lists(st.sampled_from(sorted(POOL)), min_size=1, max_size=3, unique=True))
            include.append({k: value(k) for k in keys})
    return doc(matrix, exclude, include, repeats=draw(st.integers(1, 3)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=specs())
def test_count_is_exact_on_random_specs(data: dict[str, Any]) -> None:
    sweep = parse_sweep(data)
    expected = reference_cells(sweep)
    assert list(cells(sweep)) == expected  # the same cells, in the same order
    assert count_cells(sweep) == len(expected)
    assert count_trials(sweep) == len(expected) * sweep.spec.repeats
    p = plan(sweep)
    assert len(p.trials) + len(p.dropped) * sweep.spec.repeats == count_trials(sweep)
    if not sweep.spec.include:  # (an include may also name a cell by its defaults: the same trial, not counted)
        assert len({t.id for t in p.trials}) == len(p.trials)
    assert check_size(sweep, limit=max(1, count_trials(sweep))) == count_trials(sweep)


@settings(max_examples=60, deadline=None)
@given(data=specs(), work=st.integers(0, 4))
def test_count_is_exact_when_the_look_ahead_runs_out(data: dict[str, Any], work: int) -> None:
    """Past its step budget the walk goes on without pruning by count: the same cells, the same count."""
    sweep = parse_sweep(data)
    expected = reference_cells(sweep)
    limit = max(1, len(expected) * sweep.spec.repeats, plan_module._Grid(sweep).product)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plan_module, "_COUNT_WORK", work)
        assert list(cells(sweep)) == expected
        assert check_size(sweep, limit=limit) == len(expected) * sweep.spec.repeats


def test_include_already_in_the_matrix_is_one_trial() -> None:
    sweep = parse_sweep(doc({"batch_size": [8, 16], "precision": ["fp32", "bf16"]},
                            exclude=[{"batch_size": 16, "precision": "bf16"}],
                            include=[{"precision": "fp32", "batch_size": 8},   # on the grid: nothing new
                                     {"batch_size": 16, "precision": "bf16"},  # excluded: added back
                                     {"batch_size": 64},                       # partial: a new cell
                                     {"batch_size": 64}]))
    p = plan(sweep)
    assert count_trials(sweep) == len(p.trials) == 5
    assert len({t.id for t in p.trials}) == 5


def test_rule_values_compare_with_equality() -> None:
    """1 == 1.0 == True, dict values, a value on no axis: as the planner compares them."""
    sweep = parse_sweep(doc({"epochs": [1, 2.5], "model_overrides": [{"n": 1}, {"n": 2}], "seed": [0, 1, 2]},
                            exclude=[{"epochs": 1.0, "model_overrides": {"n": True}}, {"seed": 7},
                                     {"epochs": 1, "seed": 0}, {"seed": 0, "epochs": 1}]))
    assert count_trials(sweep) == len(reference_cells(sweep)) == 12 - 3 - 2 + 1


# -- a huge spec -------------------------------------------------------------------------------------------

HUGE_MATRIX: dict[str, list[Any]] = {
    "batch_size": list(range(1, 11)), "learning_rate": [i * 1e-5 for i in range(1, 11)], "seed": list(range(10)),
    "max_steps": list(range(1, 11)), "grad_accum": list(range(1, 11)), "num_workers": list(range(10)),
    "warmup_batches": list(range(10)), "log_every": list(range(1, 11)),
}


def huge(tmp_path: Path, **spec: Any) -> Path:
    path = tmp_path / "huge.yaml"
    body = doc(HUGE_MATRIX, name="huge")
    body["spec"].update(spec)
    path.write_text(yaml.safe_dump(body))
    return path


def test_a_huge_spec_is_counted_exactly_and_fast() -> None:
    exclude = [{"seed": 3}, {"batch_size": 5}, {"batch_size": 2, "seed": 3}, {"seed": 999},
               {"batch_size": 5, "seed": 3, "grad_accum": 4}]
    include = [{**{a: v[0] for a, v in HUGE_MATRIX.items()}},                   # on the grid
               {**{a: v[0] for a, v in HUGE_MATRIX.items()}, "batch_size": 5},  # excluded: added back
               {"batch_size": 11}, {"batch_size": 11}]                          # new, once
    sweep = parse_sweep(doc(HUGE_MATRIX, exclude, include, repeats=3, name="huge"))
    start = time.perf_counter()
    assert count_trials(sweep) == (10**8 - 10**7 - 10**7 + 10**6 + 2) * 3
    with pytest.raises(SweepTooLarge) as refused:
        plan(sweep)
    assert time.perf_counter() - start < 0.5
    assert refused.value.count == 243_000_006 and refused.value.limit == DEFAULT_MAX_TRIALS
    assert str(refused.value) == ("<input>: spec: this sweep expands to 243,000,006 trials, over the limit of "
                                  "10,000 (--max-trials to raise it)")
    assert isinstance(refused.value, SpecError)


def test_validate_refuses_a_huge_spec_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = huge(tmp_path)
    start = time.perf_counter()
    with pytest.raises(SystemExit) as exited:
        cli.main(["validate", str(path)])
    elapsed = time.perf_counter() - start
    out = capsys.readouterr()
    assert exited.value.code == 2, out
    assert elapsed < 1.0
    assert out.err == (f"{path}: spec: this sweep expands to 100,000,000 trials, over the limit of 10,000 "
                       "(--max-trials to raise it)\n")
    assert "Traceback" not in out.err + out.out


def test_every_command_that_expands_a_spec_refuses_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = huge(tmp_path)
    for args in (["plan", str(path)], ["plan", str(path), "-o", "json"], ["render", str(path)],
                 ["submit", str(path), "--home", str(tmp_path / "home"), "--no-tracking"]):
        with pytest.raises(SystemExit) as exited:
            cli.main(args)
        out = capsys.readouterr()
        assert exited.value.code == 2, (args, out)
        assert "100,000,000 trials, over the limit of 10,000" in out.err, args
    assert not (tmp_path / "home" / "sweeps").exists()


def test_the_cli_in_a_process_prints_one_line(tmp_path: Path) -> None:
    path = huge(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "kubesweep", "validate", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [f"{path}: spec: this sweep expands to 100,000,000 trials, over the limit "
                                        "of 10,000 (--max-trials to raise it)"]


def small(tmp_path: Path, batches: int, seeds: int) -> Path:
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(doc({"batch_size": list(range(1, batches + 1)), "seed": list(range(seeds))},
                                       exclude=[{"seed": 0, "batch_size": 1}], name="small")))
    return path


def test_max_trials_raises_the_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = small(tmp_path, 6, 10)  # 59 trials
    for args, code in ((["--max-trials", "58"], 2), (["--max-trials", "59"], 0), (["--max-trials", "1000"], 0)):
        with pytest.raises(SystemExit) as exited:
            cli.main(["validate", str(path), *args])
        out = capsys.readouterr()
        assert exited.value.code == code, (args, out)
        if code:
            assert out.err.strip().endswith("this sweep expands to 59 trials, over the limit of 58 "
                                            "(--max-trials to raise it)")
        else:
            assert "59 trials" in out.out
    monkeypatch.setenv("KUBESWEEP_MAX_TRIALS", "58")
    with pytest.raises(SystemExit) as exited:
        cli.main(["plan", str(path)])
    assert exited.value.code == 2
    assert "over the limit of 58" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        cli.main(["validate", str(path), "--max-trials", "0"])
    assert exited.value.code == 2
    assert "--max-trials" in capsys.readouterr().err
    assert "--max-trials" in cli_help(["validate", "--help"])


def cli_help(args: list[str]) -> str:
    from typer.testing import CliRunner

    return CliRunner().invoke(cli.app, args).output


def test_a_spec_at_exactly_the_limit_passes(capsys: pytest.CaptureFixture[str]) -> None:
    at = parse_sweep(doc({"batch_size": list(range(1, 101)), "seed": list(range(100))}))
    assert check_size(at) == count_trials(at) == DEFAULT_MAX_TRIALS
    over = parse_sweep(doc({"batch_size": list(range(1, 101)), "seed": list(range(100))},
                           include=[{"batch_size": 1000}]))
    with pytest.raises(SweepTooLarge, match=r"10,001 trials, over the limit of 10,000"):
        check_size(over, source="sweeps/over.yaml")
    with pytest.raises(SweepTooLarge, match=r"^sweeps/over\.yaml: spec: "):
        check_size(over, source="sweeps/over.yaml")
    assert check_size(over, 10_001) == 10_001
    assert len(plan(over, max_trials=10_001).trials) == 10_001


# -- searches ----------------------------------------------------------------------------------------------


def test_random_search_counts_its_samples_and_refuses_a_huge_matrix() -> None:
    sweep = parse_sweep(doc({"batch_size": [1, 2, 3, 4], "seed": [0, 1, 2]}, repeats=2,
                            search={"strategy": "random", "num_samples": 5, "seed": 1}))
    assert count_trials(sweep) == len(plan(sweep).trials) == 10
    few = parse_sweep(doc({"batch_size": [1, 2]}, repeats=3, search={"strategy": "random", "num_samples": 5}))
    assert count_trials(few) == len(plan(few).trials) == 6
    wide = parse_sweep(doc(HUGE_MATRIX, search={"strategy": "random", "num_samples": 10}))
    assert count_trials(wide) == 10
    for refuse in (lambda: check_size(wide), lambda: plan(wide)):
        with pytest.raises(SweepTooLarge, match=r"random search draws from 100,000,000 matrix cells, over the limit "
                                                r"of 10,000"):
            refuse()


def test_tune_search_counts_its_budget() -> None:
    space = {"batch_size": {"type": "choice", "values": [8, 16, 32]},
             "learning_rate": {"type": "loguniform", "low": 1e-5, "high": 1e-3}}
    many = parse_sweep(doc({}, search={"strategy": "tune", "num_samples": 20_000, "space": space}))
    assert count_trials(many) == 20_000
    with pytest.raises(SweepTooLarge, match=r"tune search can make up to 20,000 trials, over the limit of 10,000"):
        check_size(many)
    assert check_size(many, 20_000) == 20_000
    assert plan(many).trials == []  # the tuner makes its trials as it runs: plan builds none
    grid_space = {"batch_size": {"type": "choice", "values": [8, 16, 32]},
                  "precision": {"type": "choice", "values": ["fp32", "bf16"]}}
    grid = parse_sweep(doc({}, search={"strategy": "tune", "algorithm": "grid", "num_samples": 50,
                                       "space": grid_space}))
    assert count_trials(grid) == 6


@pytest.mark.parametrize("low,high,step,probes", [(1, 1, 1, 1), (8, 2048, 8, 2), (1, 300, 1, 1), (5, 299, 7, 3),
                                                  (3, 100, 1, 8), (9, 15, 8, 1), (1, 64, 1, 4), (3, 9, 2, 1)])
def test_max_batch_budget_is_the_worst_bisection(low: int, high: int, step: int, probes: int) -> None:
    search = MaxBatchSearch(strategy="max_batch", low=low, high=high, step=step, probes=probes)
    n = len(candidates(search))
    worst = 0
    for threshold in range(n + 1):  # sizes below the threshold fit; the search sees only that
        fit, oom, ran = -1, n, 0
        while picks := next_probes(fit, oom, probes):
            ran += len(picks)
            fit = max([fit, *(i for i in picks if i < threshold)])
            oom = min([oom, *(i for i in picks if i >= threshold)])
        worst = max(worst, ran)
    assert max_batch_probes(search) == worst


def test_bisection_probes() -> None:
    assert candidates(MaxBatchSearch(strategy="max_batch", low=8, high=64, step=8)) == [8, 16, 24, 32, 40, 48,
                                                                                         56, 64]
    assert candidates(MaxBatchSearch(strategy="max_batch", low=3, high=6)) == [3, 4, 5, 6]
    # a step of 2 (or any but 1) starts at its first multiple from low, not at low
    assert candidates(MaxBatchSearch(strategy="max_batch", low=3, high=9, step=2)) == [4, 6, 8]
    assert next_probes(-1, 8, 2) == [2, 5]
    assert next_probes(2, 5, 2) == [3, 4]
    assert next_probes(4, 5, 2) == []
    assert next_probes(-1, 8, 1) == [3]
    assert next_probes(-1, 1, 3) == [0]


def test_max_batch_counts_probes_per_cell() -> None:
    search = {"strategy": "max_batch", "low": 8, "high": 2048, "step": 8, "probes": 2}
    sweep = parse_sweep(doc({"gpu": ["l4", "a100-40gb"], "precision": ["fp32", "fp16", "bf16"]}, search=search))
    per_cell = max_batch_probes(sweep.spec.search)  # type: ignore[arg-type]
    assert count_trials(sweep) == 6 * per_cell
    with pytest.raises(SweepTooLarge, match=rf"max_batch search can make up to {6 * per_cell} probe trials"):
        check_size(sweep, 6 * per_cell - 1)
    assert plan(sweep, max_trials=6).trials == []  # plan enumerates the 6 cells only


# -- many overlapping rules ----------------------------------------------------------------------------------


def test_too_many_rules_to_count_fall_back_to_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_module, "_COUNT_WORK", 0)
    rules = [{"batch_size": b, "seed": s} for b in range(1, 4) for s in range(3)]
    sweep = parse_sweep(doc(HUGE_MATRIX, exclude=rules))
    assert count_trials(sweep) == 10**8 - 9 * 10**6  # count_trials itself is never cut short
    with pytest.raises(SweepTooLarge, match=r"expands to at least 91,000,000 trials, over the limit of 10,000"):
        check_size(sweep)
    covered = parse_sweep(doc({"batch_size": list(range(1, 101)), "seed": list(range(101))},
                              exclude=[{"batch_size": b} for b in range(1, 100)] + [{"seed": s} for s in range(100)]))
    assert count_trials(covered) == 1
    with pytest.raises(SweepTooLarge, match=r"199 exclude rules overlap too much to count its trials quickly, and "
                                            r"its matrix has 10,100 cells, over the limit of 10,000"):
        check_size(covered)
    assert check_size(covered, 10_100) == 1  # a product within the limit is walked and counted
    assert len(plan(covered, max_trials=10_100).trials) == 1


# -- the operator and its chart ----------------------------------------------------------------------------


def test_operator_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    from kubesweep.operator.__main__ import parser

    monkeypatch.delenv("KUBESWEEP_MAX_TRIALS", raising=False)
    assert parser().parse_args(["-A"]).max_trials == DEFAULT_MAX_TRIALS
    assert parser().parse_args(["-A", "--max-trials", "50000"]).max_trials == 50_000
    monkeypatch.setenv("KUBESWEEP_MAX_TRIALS", "123")
    assert parser().parse_args(["-A"]).max_trials == 123
    for bad in ("0", "many"):
        monkeypatch.setenv("KUBESWEEP_MAX_TRIALS", bad)
        with pytest.raises(SystemExit):
            parser().parse_args(["-A"])


def test_chart_passes_max_trials() -> None:
    chart = ROOT / "charts" / "kubesweep"
    values = yaml.safe_load((chart / "values.yaml").read_text())
    assert values["operator"]["maxTrials"] == DEFAULT_MAX_TRIALS
    schema = json.loads((chart / "values.schema.json").read_text())
    assert schema["properties"]["operator"]["properties"]["maxTrials"] == {"type": "integer", "minimum": 1}
    template = (chart / "templates" / "operator-deployment.yaml").read_text()
    assert "- name: KUBESWEEP_MAX_TRIALS\n              value: {{ .Values.operator.maxTrials | int | quote }}" \
        in template


def test_the_cap_counts_pods_not_trials() -> None:
    """`num_nodes` multiplies the pods of a trial: 2,000 trials of 8 nodes are 16,000 pods, over the 10,000 cap
    that 2,000 trials alone are under."""
    sweep = parse_sweep(doc({"seed": list(range(1000)), "num_nodes": [1, 8]}))
    with pytest.raises(SweepTooLarge, match=r"asks for up to 16,000 pods \(2,000 trials x up to 8 nodes each\), "
                                            r"over the limit of 10,000"):
        check_size(sweep)
    assert check_size(sweep, 16_000) == 2_000


def test_each_refusal_carries_the_file_its_count_and_the_limit() -> None:
    """`SweepTooLarge` is a spec error of the file, with the numbers (what the CLI and the operator report)."""
    space = {"batch_size": {"type": "choice", "values": [8, 16]}}
    tune = parse_sweep(doc({}, search={"strategy": "tune", "num_samples": 30, "space": space}), source="t.yaml")
    search = {"strategy": "max_batch", "low": 8, "high": 64, "step": 8, "probes": 1}
    max_batch = parse_sweep(doc({"gpu": ["l4", "t4"]}, search=search), source="m.yaml")
    per_cell = max_batch_probes(max_batch.spec.search)  # type: ignore[arg-type]
    pods = parse_sweep(doc({"seed": [1, 2, 3], "num_nodes": [1, 4]}), source="p.yaml")
    drawn = parse_sweep(doc({"seed": list(range(40))}, search={"strategy": "random", "num_samples": 5}),
                        source="r.yaml")  # 5 trials drawn from 40 cells: the cells are what a plan walks
    for sweep, limit, count in ((tune, 29, 30), (max_batch, 2 * per_cell - 1, 2 * per_cell), (pods, 23, 24),
                                (drawn, 39, 40)):
        with pytest.raises(SweepTooLarge) as err:
            check_size(sweep, limit)
        assert (err.value.source, err.value.count, err.value.limit) == (sweep.source, count, limit)
        assert check_size(sweep, count) > 0  # at the limit: taken


def test_the_most_nodes_of_a_trial_are_found_wherever_the_spec_names_them() -> None:
    """Two nodes a trial are two pods; the nodes come from resources, the matrix, an include cell, or a tune
    search's choices."""
    assert most_nodes(parse_sweep(doc({"seed": [1]}))) == 1
    two = parse_sweep(doc({"seed": [1, 2, 3]}, include=[{"seed": 9, "num_nodes": 2}]))
    assert most_nodes(two) == 2
    with pytest.raises(SweepTooLarge, match=r"up to 8 pods \(4 trials x up to 2 nodes each\), over the limit of 7"):
        check_size(two, 7)
    space = {"num_nodes": {"type": "choice", "values": [1, 3]}, "batch_size": {"type": "choice", "values": [8]}}
    assert most_nodes(parse_sweep(doc({}, search={"strategy": "tune", "num_samples": 4, "space": space}))) == 3
    bigger = doc({}, search={"strategy": "tune", "num_samples": 4, "space": space})
    bigger["spec"]["resources"] = {"num_nodes": 5}
    assert most_nodes(parse_sweep(bigger)) == 5  # the resources' nodes, beside the space's
    resources = doc({"seed": [1]})
    resources["spec"]["resources"] = {"num_nodes": 5}
    assert most_nodes(parse_sweep(resources)) == 5


def test_a_cells_precision_from_the_job_when_the_matrix_has_none() -> None:
    # bf16 on a V100 is dropped whether the matrix or the job names it
    sweep = doc({"gpu": ["v100-32gb", "a100-40gb"]})
    sweep["spec"]["job"]["precision"] = "bf16"
    p = plan(parse_sweep(sweep))
    assert [t.gpu for t in p.trials] == ["a100-40gb"]
    assert [d.axes for d in p.dropped] == [{"gpu": "v100-32gb"}] and "bf16" in p.dropped[0].reason


def test_counting_stops_past_its_budget_of_steps_and_not_at_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rules that overlap are counted in memoized steps; the budget is the most steps taken (a sweep that needs
    exactly the budget is counted; one step less and its size is refused as too costly to count)."""
    rules = [{"batch_size": b, "seed": s} for b in (1, 2) for s in (0, 1)] + [{"seed": 2, "precision": "fp16"},
                                                                            {"batch_size": 3, "precision": "bf16"}]
    sweep = parse_sweep(doc({"batch_size": [1, 2, 3, 4], "seed": [0, 1, 2, 3], "precision": ["fp32", "fp16", "bf16"]},
                            exclude=rules))
    expected = len(reference_cells(sweep))
    grid = plan_module._Grid(sweep)
    assert grid.total() == expected and grid.spent > 0
    need = grid.spent
    assert plan_module._Grid(sweep, work=need).total() == expected
    with pytest.raises(plan_module._TooComplex):
        plan_module._Grid(sweep, work=need - 1).total()
    monkeypatch.setattr(plan_module, "_COUNT_WORK", need - 1)
    with pytest.raises(SweepTooLarge, match="overlap too much to count its trials quickly") as err:
        check_size(sweep, limit=expected)  # the product (48 cells) is over the limit: the count was needed
    assert (err.value.source, err.value.count, err.value.limit) == (sweep.source, 48, expected)
    monkeypatch.setattr(plan_module, "_COUNT_WORK", need)
    assert check_size(sweep, limit=expected) == expected
