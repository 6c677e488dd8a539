"""Planner properties: count = product - excluded - dropped, ids stable and unique, names valid DNS labels."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubesweep.gpus import default_catalog, load_catalog
from kubesweep.plan import MAX_NAME, Plan, _unique_names, interleave, make_trial, plan, trial_name
from kubesweep.sweep_spec import parse_sweep
from kubesweep.wire.config import JobConfig

DNS = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
GPUS = default_catalog().names


def sweep_doc(name: str, matrix: dict[str, Any], exclude: list[dict[str, Any]] | None = None,
              repeats: int = 1) -> dict[str, Any]:
    return {"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": name},
            "spec": {"matrix": matrix, "exclude": exclude or [], "repeats": repeats}}


names = st.from_regex(r"[a-z][a-z0-9-]{0,61}[a-z0-9]", fullmatch=True).filter(lambda s: "--" not in s)
matrices = st.fixed_dictionaries(
    {},
    optional={
        "gpu": st.lists(st.sampled_from(GPUS), min_size=1, max_size=4, unique=True),
        "batch_size": st.lists(st.integers(1, 4096), min_size=1, max_size=4, unique=True),
        "precision": st.lists(st.sampled_from(["fp32", "tf32", "fp16", "bf16"]), min_size=1, max_size=4, unique=True),
        "compile": st.lists(st.sampled_from([False, "default", "max-autotune"]), min_size=1, max_size=3, unique=True),
        "learning_rate": st.lists(st.floats(1e-6, 1e-2), min_size=1, max_size=3, unique=True),
    },
)


@settings(max_examples=150, deadline=None)
@given(name=names, matrix=matrices, repeats=st.integers(1, 3), data=st.data())
def test_plan_properties(name: str, matrix: dict[str, Any], repeats: int, data: st.DataObject) -> None:
    exclude: list[dict[str, Any]] = []
    if matrix:
        axis = data.draw(st.sampled_from(sorted(matrix)))
        exclude = [{axis: data.draw(st.sampled_from(matrix[axis]))}]
    sweep = parse_sweep(sweep_doc(name, matrix, exclude, repeats))
    p = plan(sweep)
    product = 1
    for values in matrix.values():
        product *= len(values)
    excluded = product // len(matrix[next(iter(exclude[0]))]) if exclude else 0
    assert len(p.trials) + len(p.dropped) * repeats == (product - excluded) * repeats
    ids = [t.id for t in p.trials]
    assert len(set(ids)) == len(ids)
    assert [t.id for t in plan(parse_sweep(sweep_doc(name, matrix, exclude, repeats))).trials] == ids
    names_ = [t.name for t in p.trials]
    assert len(set(names_)) == len(names_)
    assert all(len(n) <= 63 and DNS.match(n) for n in names_), names_
    for d in p.dropped:
        assert d.axes.get("gpu") and d.reason


def test_ids_ignore_key_order_and_settings_left_at_default() -> None:
    a = plan(parse_sweep(sweep_doc("s", {"batch_size": [8], "precision": ["fp32"]})))
    b = plan(parse_sweep({**sweep_doc("s", {"precision": ["fp32"], "batch_size": [8]}),
                          "spec": {"matrix": {"precision": ["fp32"], "batch_size": [8]},
                                   "job": {"epochs": 3.0}}}))
    assert [t.id for t in a.trials] == [t.id for t in b.trials]


def test_bf16_on_v100_is_dropped_with_the_reason() -> None:
    p = plan(parse_sweep(sweep_doc("s", {"gpu": ["v100-32gb", "a100-40gb"], "precision": ["fp32", "bf16"]})))
    assert len(p.trials) == 3
    assert [d.axes for d in p.dropped] == [{"gpu": "v100-32gb", "precision": "bf16"}]
    assert "bf16 is not supported on Tesla-V100-SXM2-32GB" in p.dropped[0].reason


def test_a_cpu_cell_with_gpu_only_attention_kernels_is_dropped_with_the_reason() -> None:
    """Caught when planned, not after the trial's start-up: the job refuses efficient/cudnn kernels on a CPU."""
    doc = sweep_doc("s", {"batch_size": [8]})
    doc["spec"]["job"] = {"sdpa_backend": "efficient"}
    doc["spec"]["include"] = [{"batch_size": 8, "gpus_per_trial": 0}, {"batch_size": 8, "gpus_per_trial": 0,
                                                                      "sdpa_backend": "auto"}]
    p = plan(parse_sweep(doc))
    assert [d.axes for d in p.dropped] == [{"batch_size": 8, "gpus_per_trial": 0}]
    assert p.dropped[0].reason == ("sdpa_backend efficient needs a CUDA GPU, and the cell runs on the CPU "
                                   "(gpus_per_trial 0)")
    assert len(p.trials) == 2  # the matrix's GPU cell and the CPU cell with PyTorch's own kernels


def test_gpu_types_interleave() -> None:
    p = plan(parse_sweep(sweep_doc("s", {"gpu": ["l4", "l40s", "h100-80gb"], "batch_size": [8, 16, 32]})))
    assert [t.gpu for t in p.trials[:3]] == ["l4", "l40s", "h100-80gb"]
    assert [t.gpu for t in p.trials[3:6]] == ["l4", "l40s", "h100-80gb"]


def test_interleave_keeps_each_types_order() -> None:
    p = plan(parse_sweep(sweep_doc("s", {"gpu": ["l4", "t4"], "batch_size": [1, 2, 3]})))
    again = interleave(p.trials)
    for gpu in ("l4", "t4"):
        assert [t.axes["batch_size"] for t in again if t.gpu == gpu] == [1, 2, 3]


def test_names_are_readable() -> None:
    p = plan(parse_sweep(sweep_doc("bert-gpu-matrix", {"gpu": ["h100-80gb"], "batch_size": [32],
                                                      "precision": ["bf16"], "compile": [True]})))
    assert re.fullmatch(r"bert-gpu-matrix-h100-80gb-bs32-bf16-c-[0-9a-f]{8}", p.trials[0].name)


def test_include_adds_cells_once() -> None:
    doc = sweep_doc("s", {"batch_size": [8, 16]})
    doc["spec"]["include"] = [{"batch_size": 64, "precision": "bf16"}, {"batch_size": 64, "precision": "bf16"}]
    p = plan(parse_sweep(doc))
    assert [t.axes for t in p.trials] == [
        {"batch_size": 8}, {"batch_size": 16}, {"batch_size": 64, "precision": "bf16"}
    ]


def test_random_search_draws_a_stable_subset() -> None:
    doc = sweep_doc("s", {"batch_size": [1, 2, 3, 4, 5, 6], "precision": ["fp32", "bf16"]})
    doc["spec"]["search"] = {"strategy": "random", "num_samples": 4, "seed": 7}
    first = plan(parse_sweep(doc))
    assert len(first.trials) == 4
    assert [t.id for t in plan(parse_sweep(doc)).trials] == [t.id for t in first.trials]


def test_exclude_rule_with_two_keys() -> None:
    doc = sweep_doc("s", {"gpu": ["l4", "a100-40gb"], "precision": ["fp32", "fp16"]},
                    exclude=[{"gpu": "l4", "precision": "fp16"}])
    cells = {(t.gpu, t.job.precision) for t in plan(parse_sweep(doc)).trials}
    assert cells == set(itertools.product(["l4", "a100-40gb"], ["fp32", "fp16"])) - {("l4", "fp16")}


def test_a_trials_label_names_its_device_its_other_axes_and_its_repeat() -> None:
    """The cell as status views and the trial's Job annotation show it: the device, each axis but the GPU as
    `name=value` (compile off as `off`), the repeat past the first."""
    doc = sweep_doc("s", {"gpu": ["h100-80gb"], "batch_size": [32], "compile": [False, "default"]}, repeats=2)
    labels = [t.label() for t in plan(parse_sweep(doc)).trials]
    assert sorted(labels) == [
        "h100-80gb batch_size=32 compile=default", "h100-80gb batch_size=32 compile=default repeat=1",
        "h100-80gb batch_size=32 compile=off", "h100-80gb batch_size=32 compile=off repeat=1"]
    cpu = plan(parse_sweep(sweep_doc("s", {"precision": ["fp32"], "learning_rate": [0.0001]}))).trials[0]
    assert cpu.label() == "any GPU learning_rate=0.0001 precision=fp32"
    assert cpu.label() is cpu.label()  # made once


def test_a_trial_name_says_its_cell_in_short() -> None:
    job = JobConfig(batch_size=32, precision="bf16")
    assert trial_name("s", "h100-80gb", job, 0, 1, "abcd1234") == "s-h100-80gb-bs32-bf16-abcd1234"
    assert trial_name("s", None, job, 0, 1, "abcd1234") == "s-bs32-bf16-abcd1234"
    marks = {mode: trial_name("s", None, job.model_copy(update={"compile": mode}), 0, 1, "h")
             for mode in ("default", "reduce-overhead", "max-autotune")}
    assert marks == {"default": "s-bs32-bf16-c-h", "reduce-overhead": "s-bs32-bf16-cro-h",
                     "max-autotune": "s-bs32-bf16-cma-h"}
    inference = JobConfig(batch_size=32, precision="bf16", task="inference")
    assert trial_name("s", "l4", inference, 2, 3, "h") == "s-inf-l4-bs32-bf16-r2-h"  # the repeat, of several


def test_a_long_sweep_name_is_cut_to_keep_the_cell_and_the_hash_in_63_characters() -> None:
    job = JobConfig(batch_size=32, precision="bf16")
    tail = "h100-80gb-bs32-bf16-abcd1234"
    name = trial_name("a" * 80, "h100-80gb", job, 0, 1, "abcd1234")
    assert name == "a" * (MAX_NAME - len(tail) - 1) + "-" + tail and len(name) == MAX_NAME
    # a cut that ends on a dash (room for 3 characters: "ab-") leaves none doubled
    suffix = "0" * (MAX_NAME - 3 - 1 - len("bs32-bf16-"))
    assert trial_name("ab-" + "c" * 80, None, job, 0, 1, suffix) == "ab-bs32-bf16-" + suffix
    # room for one character of the sweep's name: that character
    suffix = "0" * (MAX_NAME - 1 - 1 - len("bs32-bf16-"))
    assert trial_name("xy", None, job, 0, 1, suffix) == "x-bs32-bf16-" + suffix
    # no room at all: the cell and the hash alone, cut to 63, a valid DNS label
    assert trial_name("xy", None, job, 0, 1, "0" * 52 + "-" + "1" * 30) == "bs32-bf16-" + "0" * 52  # cut on a dash
    assert trial_name("a" * 30, None, job, 0, 1, "0" * 60) == ("bs32-bf16-" + "0" * 60)[:MAX_NAME]  # none of the name
    assert DNS.fullmatch(trial_name("x", None, job, 0, 1, "-" * 70))


def test_characters_a_name_cannot_have_become_dashes() -> None:
    job = JobConfig(batch_size=32, precision="bf16")
    assert trial_name("My.Sweep", None, job, 0, 1, "h") == "my-sweep-bs32-bf16-h"
    assert trial_name("..s", None, job, 0, 1, "h") == "s-bs32-bf16-h"


def test_a_trial_runs_on_its_catalogs_product_and_a_name_taken_gets_the_whole_id(tmp_path: Path) -> None:
    """The catalog the plan is given (not the shipped one) says which product a GPU type is; a trial made alone is
    the plan's (repeat 0 unless told); two trials of one name (the 8 hex digits of their ids alike) tell apart by
    the second's whole id."""
    path = tmp_path / "gpus.yaml"
    path.write_text("gpus:\n  h100-80gb: {product: Example-H100, memory_gib: 80, compute_capability: '9.0', "
                    "bf16: true, price_per_hour: 1.0}\n")
    catalog = load_catalog(path)
    sweep = parse_sweep(sweep_doc("s", {"gpu": ["h100-80gb"], "batch_size": [32]}))
    (trial,) = plan(sweep, catalog).trials
    assert trial.config.gpu_product == "Example-H100"
    assert make_trial(sweep, trial.axes, catalog=catalog) == trial
    first, second = _unique_names(sweep, [trial, trial], catalog)
    assert first == trial
    assert second.name == trial.name.removesuffix(trial.id[:8]) + trial.id and len(trial.id) == 10
    assert (second.id, second.config.gpu_product) == (trial.id, "Example-H100")


def test_a_plan_says_what_it_leaves_to_the_run() -> None:
    """Searches that make their trials as they run plan none and say so; a repeat rule and a random search that
    asks for more cells than the grid has are noted; a plain grid has no note."""
    def doc(**spec: Any) -> dict[str, Any]:
        return {"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "s"}, "spec": spec}

    space = {"batch_size": {"type": "choice", "values": [8, 16]}}
    tune = parse_sweep(doc(search={"strategy": "tune", "num_samples": 6, "algorithm": "random",
                                   "scheduler": "fifo", "space": space}))
    assert plan(tune) == Plan(sweep=tune, trials=[], dropped=[], notes=[
        "search strategy 'tune': the tuner proposes up to 6 trials (random + fifo) while it runs"])
    max_batch = parse_sweep(doc(matrix={"gpu": ["v100-32gb", "a100-40gb", "l4"], "precision": ["bf16"]},
                                search={"strategy": "max_batch", "low": 8, "high": 64, "step": 8}))
    assert plan(max_batch) == Plan(sweep=max_batch, trials=[], dropped=[], notes=[
        "search strategy 'max_batch': bisects batch sizes 8..64 (step 8) on OOM for each of 2 cells (GPU type x "
        "precision); probe trials are made as it runs"])  # bf16 on the V100 is no cell
    rule = parse_sweep(doc(matrix={"batch_size": [8]},
                           repeats=2, repeat_until={"max": 5, "target": "2.5%", "metric": "samples_per_s"}))
    assert plan(rule).notes == ["repeats: 2 of each cell, then more (up to 5) until the 95% interval of "
                                "samples_per_s is within ±2.5%; the extra repeats are made as it runs"]
    for asked, note in ((3, []), (4, ["random search asked for 4 cells; the grid has 3"])):
        drawn = parse_sweep(doc(matrix={"batch_size": [8, 16, 32]},
                                search={"strategy": "random", "num_samples": asked, "seed": 1}))
        assert (len(plan(drawn).trials), plan(drawn).notes) == (3, note)
    assert plan(parse_sweep(doc(matrix={"batch_size": [8]}))).notes == []


def test_settings_the_job_refuses_together_are_a_spec_error_naming_the_cell() -> None:
    """Each value valid alone, refused together by the job (HF Trainer has no step graph): the line of the include
    or the matrix, the cell and the job's reason; never a traceback from deep in the planner."""
    from kubesweep.sweep_spec import SpecError, parse_sweep_text

    text = ("apiVersion: kubesweep.io/v1alpha1\nkind: Sweep\nmetadata: {name: x}\nspec:\n  job: {step_graph: true}\n"
            "  matrix:\n    batch_size: [8]\n{rest}")
    include = text.replace("{rest}", "  include:\n    - {engine: hf-trainer, batch_size: 16}\n")
    with pytest.raises(SpecError) as info:
        plan(parse_sweep_text(include, source="s.yaml"))
    assert str(info.value) == ("s.yaml:9: spec.include[0]: the cell engine=hf-trainer, batch_size=16: step_graph "
                               "applies to kubesweep's own loops only (fine-tuning and inference)")
    matrix = text.replace("    batch_size: [8]\n{rest}", "    padding: [bucketed, packed]\n    task: [finetune, "
                                                          "inference]\n")
    with pytest.raises(SpecError) as info:
        plan(parse_sweep_text(matrix, source="s.yaml"))
    assert str(info.value).startswith("s.yaml:6: spec.matrix: the cell task=inference, padding=packed: padding "
                                      "packed applies to fine-tuning"), str(info.value)
