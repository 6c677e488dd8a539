"""Spec validation: every bad spec under tests/data/bad_specs gives the message its first line expects."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubesweep.plan import count_trials, plan
from kubesweep.sweep_spec import MaxBatchSearch, SpecError, TuneSearch, load_sweep_file, parse_sweep

ROOT = Path(__file__).parents[2]
BAD = sorted((ROOT / "tests" / "data" / "bad_specs").glob("*.yaml"))


def expected(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), f"{path} must start with '# expect: <message>'"
    return first.removeprefix("# expect: ")


def test_there_are_at_least_30_bad_specs() -> None:
    assert len(BAD) >= 30


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_bad_spec_message(path: Path) -> None:
    with pytest.raises(SpecError) as info:
        load_sweep_file(path)
    message = str(info.value)
    want = expected(path)
    line = f"{path}:{want}" if want[0].isdigit() else f"{path}: {want}"
    assert message.splitlines()[0] == line
    assert all(m.startswith(f"{path}") for m in message.splitlines()), "every problem names the file"


SHIPPED = sorted([*(ROOT / "sweeps").glob("*.yaml"), *(ROOT / "bench" / "specs").glob("*.yaml")])


@pytest.mark.parametrize("spec", SHIPPED, ids=lambda p: p.stem)
def test_shipped_specs_are_valid(spec: Path) -> None:
    """Each shipped spec loads as the Sweep its file names, with no warning, and makes trials (a grid plans them)."""
    sweep = load_sweep_file(spec)
    assert sweep.name == yaml.safe_load(spec.read_text())["metadata"]["name"]
    assert sweep.warnings == []
    assert count_trials(sweep) > 0
    if sweep.spec.search.strategy == "grid":
        assert plan(sweep).trials


def test_line_numbers_point_at_the_value() -> None:
    text = "apiVersion: kubesweep.io/v1alpha1\nkind: Sweep\nmetadata: {name: x}\nspec:\n  matrix:\n" \
           "    precision:\n      - fp32\n      - bf61\n"
    with pytest.raises(SpecError) as info:
        from kubesweep.sweep_spec import parse_sweep_text

        parse_sweep_text(text, source="sweeps/x.yaml")
    assert str(info.value) == "sweeps/x.yaml:8: spec.matrix.precision[1]: 'bf61' is not one of fp32, tf32, fp16, bf16"


def test_every_problem_is_reported_at_once() -> None:
    doc = {"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "x"},
           "spec": {"repeats": 0, "matrix": {"batch_size": [0], "precision": ["fp99"]}}}
    with pytest.raises(SpecError) as info:
        parse_sweep(doc, source="cr/x")
    assert len(info.value.problems) == 3


def test_allow_unpinned_accepts_a_tag() -> None:
    doc = {"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "x"},
           "spec": {"image": "registry.example/job:1.0"}}
    with pytest.raises(SpecError):
        parse_sweep(doc)
    assert parse_sweep(doc, allow_unpinned=True).image_reference() == "registry.example/job:1.0"


def test_compile_true_means_the_default_mode() -> None:
    doc = {"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "x"},
           "spec": {"job": {"compile": True}, "matrix": {"compile": [False, True, "max-autotune"]}}}
    sweep = parse_sweep(doc)
    assert sweep.spec.job.compile == "default"
    assert sweep.spec.matrix.compile == [False, "default", "max-autotune"]


@pytest.mark.parametrize(("data", "line", "what"), [
    (b"apiVersion: kubesweep.io/v1alpha1\nkind: Sweep\n\xba\xff", 3, "byte 0xba at offset 46 is not UTF-8"),
    (b"\x7fELF\x02\x01\x01\x00\x00\x00", 1, "it holds NUL bytes"),
])
def test_a_binary_file_is_not_a_spec(tmp_path: Path, data: bytes, line: int, what: str) -> None:
    path = tmp_path / "binary.yaml"
    path.write_bytes(data)
    with pytest.raises(SpecError) as info:
        load_sweep_file(path)
    assert str(info.value).startswith(f"{path}:{line}: not a text file: {what}")


def test_an_include_an_exclude_drops_is_a_warning() -> None:
    sweep = parse_sweep({"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "w"},
                         "spec": {"matrix": {"batch_size": [8, 16], "precision": ["fp32", "bf16"]},
                                  "exclude": [{"batch_size": 8}, {"precision": "bf16"}],
                                  "include": [{"batch_size": 32, "precision": "bf16"}, {"batch_size": 64}]}})
    assert sweep.warnings == ["<input>: spec.include[0]: batch_size=32, precision=bf16 matches exclude[1] "
                              "(precision=bf16) and runs anyway: include cells are added after the excludes"]


def test_fine_buckets_from_random_init_are_a_warning_where_they_apply() -> None:
    def warnings(spec: dict[str, Any]) -> list[str]:
        return parse_sweep({"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "w"},
                            "spec": spec}).warnings

    fine = {"random_init": True, "padding": "bucketed", "bucket_multiple": 8}
    assert warnings({"job": fine, "matrix": {"batch_size": [256]}}) == [
        "<input>: spec.job: bucketed padding with bucket_multiple 8 from random init: batches of one fine length "
        "class can keep the model at chance accuracy (use 16 or more for runs whose accuracy matters)"]
    # a matrix axis counts; pretrained weights (an include) and multiple 16 do not warn
    assert len(warnings({"job": {**fine, "bucket_multiple": 16}, "matrix": {"bucket_multiple": [8, 16]}})) == 1
    assert warnings({"job": {**fine, "random_init": False}, "matrix": {"batch_size": [256]},
                     "include": [{"batch_size": 64, "bucket_multiple": 16, "random_init": True}]}) == []
    assert warnings({"job": {**fine, "bucket_multiple": 16}, "matrix": {"batch_size": [256]}}) == []


@pytest.mark.parametrize(("spec", "problem"), [
    ({"matrix": {"batch_size": ["16"]}}, "spec.matrix.batch_size[0]: expected an integer, got '16'"),
    ({"matrix": {"batch_size": [16.0]}}, "spec.matrix.batch_size[0]: expected an integer, got 16.0"),
    ({"matrix": {"batch_size": [True]}}, "spec.matrix.batch_size[0]: expected an integer, got True"),
    ({"job": {"random_init": "true"}}, "spec.job.random_init: expected true or false, got 'true'"),
    ({"job": {"pin_memory": 1}}, "spec.job.pin_memory: expected true or false, got 1"),
    ({"job": {"learning_rate": "1e-4"}}, "spec.job.learning_rate: expected a number, got '1e-4'"),
    ({"job": {"epochs": True}}, "spec.job.epochs: expected a number, got True"),
    ({"resources": {"retries": "1"}}, "spec.resources.retries: expected an integer, got '1'"),
    ({"repeats": "2"}, "spec.repeats: expected an integer, got '2'"),
    ({"suspend": "false"}, "spec.suspend: expected true or false, got 'false'"),
    ({"search": {"strategy": "random", "num_samples": "4"}, "matrix": {"batch_size": [8]}},
     "spec.search.num_samples: expected an integer, got '4'"),
    ({"search": {"strategy": "tune", "space": {"batch_size": {"type": "choice", "values": ["16"]}}}},
     "spec.search.space.batch_size.values[0]: expected an integer, got '16'"),
])
def test_a_value_of_another_type_is_never_converted(spec: dict[str, Any], problem: str) -> None:
    """A file, a custom resource and a stored sweep are validated alike: a value has its setting's type."""
    doc = {"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "x"}, "spec": spec}
    with pytest.raises(SpecError) as info:
        parse_sweep(doc, source="cr/x")
    assert str(info.value) == f"cr/x: {problem}"


def test_an_integer_is_a_number() -> None:
    """JSON and the API server write 3.0 as 3: an integer where a number is expected is that number."""
    doc = {"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "x"},
           "spec": {"job": {"epochs": 3, "learning_rate": 1}, "matrix": {"warmup_ratio": [0, 0.1]}}}
    sweep = parse_sweep(doc)
    assert (sweep.spec.job.epochs, sweep.spec.job.learning_rate) == (3.0, 1.0)
    assert sweep.spec.matrix.warmup_ratio == [0.0, 0.1]


def test_a_deeply_nested_document_is_refused_without_recursing() -> None:
    value: Any = 1
    for _ in range(100_000):
        value = [value]
    doc = {"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "x"},
           "spec": {"job": {"model_overrides": {"x": value}}}}
    with pytest.raises(SpecError) as info:
        parse_sweep(doc, source="cr/x")
    assert str(info.value) == f"cr/x: spec.job.model_overrides.x{'[0]' * 60}: nested more than 64 levels deep; " \
                              "a sweep spec needs a few"


def test_the_readme_spec_is_the_shipped_gpu_matrix() -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## The sweep spec", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    shipped = (ROOT / "sweeps" / "gpu_matrix.yaml").read_text()
    assert block == "".join(line for line in shipped.splitlines(keepends=True) if not line.startswith("#"))


# -- searches (spec.search) -----------------------------------------------------------------------------


def sweep_doc(search: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "t"},
            "spec": {"search": search, **spec}}


def problems(search: dict[str, Any], **spec: Any) -> str:
    with pytest.raises(SpecError) as info:
        parse_sweep(sweep_doc(search, **spec))
    return str(info.value)


TEXT = """\
apiVersion: kubesweep.io/v1alpha1
kind: Sweep
metadata: {name: t}
spec:
  search:
    strategy: tune
    space:
      batch_size: {type: uniform, low: 8, high: 64}
"""


def test_errors_name_file_line_and_field() -> None:
    from kubesweep.sweep_spec import parse_sweep_text

    with pytest.raises(SpecError) as info:
        parse_sweep_text(TEXT, source="x.yaml")
    assert str(info.value) == ("x.yaml:8: spec.search.space.batch_size.type: axis 'batch_size' takes integers; "
                               "use randint, quniform or qloguniform")


@pytest.mark.parametrize(("search", "expected"), [
    ({"space": {"batch_sise": {"type": "choice", "values": [8]}}}, "did you mean 'batch_size'?"),
    ({"space": {}}, "needs at least one axis in space"),
    ({"space": {"learning_rate": {"type": "loguniform", "low": 0, "high": 1}}}, "loguniform needs low > 0"),
    ({"space": {"learning_rate": {"type": "uniform", "low": 2, "high": 1}}}, "must be > low"),
    ({"space": {"learning_rate": {"type": "uniform"}}}, "uniform needs low and high"),
    ({"space": {"learning_rate": {"type": "quniform", "low": 1, "high": 2}}}, "quniform needs q"),
    ({"space": {"precision": {"type": "choice", "values": ["fp32", "fp61"]}}}, "'fp61' is not one of"),
    ({"space": {"precision": {"type": "uniform", "low": 1, "high": 2}}}, "is not numeric; use choice"),
    ({"space": {"gpu": {"type": "choice", "values": ["h100"]}}}, "did you mean 'h100-80gb'?"),
    ({"space": {"batch_size": {"type": "choice", "values": [8]}}, "metric": ["samples_per_second", "accuracy"],
      "mode": ["max"]}, "1 modes for 2 metrics"),
    ({"space": {"batch_size": {"type": "choice", "values": [8]}}, "metric": "speed"}, "'speed' is not a tune metric"),
    ({"space": {"batch_size": {"type": "choice", "values": [8]}}, "metric": ["samples_per_second", "accuracy"],
      "mode": ["max", "max"], "algorithm": "random"}, "multi-objective search (2 metrics) needs algorithm optuna"),
    ({"space": {"learning_rate": {"type": "uniform", "low": 1, "high": 2}}, "algorithm": "grid"},
     "algorithm grid needs choice distributions"),
    ({"space": {"batch_size": {"type": "choice", "values": [8]}}, "algorithm": "hyperopt"},
     "hyperopt is not installed"),
    ({"space": {"batch_size": {"type": "choice", "values": [8]}},
      "constraints": [{"metric": "acc", "op": ">=", "value": 0.9}]}, "'acc' is not a tune metric"),
])
def test_tune_spec_problems(search: dict[str, Any], expected: str) -> None:
    if search.get("algorithm") == "hyperopt" and importlib.util.find_spec("hyperopt") is not None:
        pytest.skip("hyperopt is installed here")
    assert expected in problems({"strategy": "tune", **search})


def test_a_logged_metric_of_the_catalogue_is_a_tune_metric_and_objective() -> None:
    """A tune search may optimise or constrain any metric its trials' runs log (kubesweep.wire.metrics)."""
    sweep = parse_sweep(sweep_doc({"strategy": "tune", "space": {"batch_size": {"type": "choice", "values": [8]}},
                                   "metric": "tflops_per_s", "mode": "max",
                                   "constraints": [{"metric": "peak_mem_gib", "op": "<=", "value": 20}]}))
    assert sweep.spec.search is not None


def test_space_axis_must_not_be_a_matrix_axis() -> None:
    text = problems({"strategy": "tune", "space": {"batch_size": {"type": "choice", "values": [8, 16]}}},
                    matrix={"batch_size": [8]})
    assert "spec.search.space.batch_size: 'batch_size' is also a matrix axis" in text


def test_a_valid_multi_objective_search_with_constraints() -> None:
    sweep = parse_sweep(sweep_doc({
        "strategy": "tune", "metric": ["samples_per_second", "accuracy"], "mode": ["max", "max"],
        "constraints": [{"metric": "accuracy", "op": ">=", "value": 0.9}],
        "space": {"batch_size": {"type": "qloguniform", "low": 8, "high": 256, "q": 8},
                  "learning_rate": {"type": "loguniform", "low": 1e-5, "high": 1e-3},
                  "precision": {"type": "choice", "values": ["fp32", "bf16"]}}}))
    search = sweep.spec.search
    assert isinstance(search, TuneSearch)
    assert (search.metrics, search.modes) == (["samples_per_second", "accuracy"], ["max", "max"])


def test_max_batch_spec_problems() -> None:
    assert "spec.search.high: must be >= low (64)" in problems({"strategy": "max_batch", "low": 64, "high": 8})
    assert "leave batch_size out of the matrix" in problems({"strategy": "max_batch"}, matrix={"batch_size": [8]})


@pytest.mark.parametrize(("name", "strategy", "kind"), [("tune_example.yaml", "tune", TuneSearch),
                                                         ("max_batch.yaml", "max_batch", MaxBatchSearch)])
def test_shipped_search_examples_validate(name: str, strategy: str, kind: type) -> None:
    sweep = load_sweep_file(ROOT / "sweeps" / name)
    assert sweep.spec.search.strategy == strategy and isinstance(sweep.spec.search, kind)
    assert sweep.warnings == []


def _sweep(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "odd"}, "spec": spec}


@pytest.mark.parametrize(("spec", "where", "says"), [
    ({"resources": {"gpus_per_trial": 17}}, "spec.resources.gpus_per_trial", "must be <= 16, got 17"),
    ({"resources": {"num_nodes": 100_000}}, "spec.resources.num_nodes", "must be <= 512, got 100000"),
    ({"matrix": {"num_nodes": [1, 1000]}}, "spec.matrix.num_nodes[1]", "must be <= 512, got 1000"),
    ({"resources": {"cpu": "2000"}}, "spec.resources.cpu", "2000 is more than a pod can have (at most 1024 cores)"),
    ({"resources": {"memory": "100Ti"}}, "spec.resources.memory", "at most 64Ti"),
    ({"job": {"model": "m" * 300_000}}, "spec.job.model", "longer than 4096 characters"),
    ({"job": {"random_init": True, "model_overrides": {f"k{i}": "v" * 4000 for i in range(20)}}}, "spec.job",
     "the job settings are 79 KiB as JSON, over 64 KiB: each trial Job carries them in an annotation"),
    ({"matrix": {"seed": list(range(10_001))}}, "spec.matrix.seed", "at most 10000"),
])
def test_a_sweep_cannot_ask_for_more_than_a_cluster_or_an_object_holds(spec: dict[str, Any], where: str,
                                                                       says: str) -> None:
    """Bounds a Sweep author could otherwise push past: pods no cluster has, strings and settings larger than a
    Job's annotations hold (each create would be refused with 422, forever), axes past any trial cap."""
    with pytest.raises(SpecError) as err:
        parse_sweep(_sweep(**spec))
    text = str(err.value)
    assert f"{where}:" in text and says in text, text


def test_thousands_of_problems_are_reported_as_twenty_and_a_count() -> None:
    """2,000 duplicates of one GPU name: one problem each, but the message (the CLI's, and a Sweep's
    status.message, which was 12 MB for a large enough list) shows the first 20 and how many more."""
    with pytest.raises(SpecError) as err:
        parse_sweep(_sweep(matrix={"gpu": ["l4"] * 2_000}))
    assert len(err.value.problems) == 1_999
    lines = str(err.value).splitlines()
    assert len(lines) == 21 and lines[-1] == "<input>: ... and 1,979 more problems", lines[-1]
    assert lines[0] == "<input>: spec.matrix.gpu[1]: 'l4' is the same setting as gpu[0]; list each once"


def test_duplicates_are_found_for_values_equal_as_settings() -> None:
    """One pass over an axis (no list scan per value), with the same notion of 'the same setting': equal
    numbers, and mappings equal in any key order."""
    with pytest.raises(SpecError) as err:
        parse_sweep(_sweep(matrix={"learning_rate": [1, 2.0, 1.0, 2],
                                   "model_overrides": [{"a": 1, "b": 2}, {"b": 2, "a": 1}]}))
    messages = sorted(p.message for p in err.value.problems)
    assert messages == ["1.0 is the same setting as learning_rate[0]; list each once",
                        "2.0 is the same setting as learning_rate[1]; list each once",
                        "{'b': 2, 'a': 1} is the same setting as model_overrides[0]; list each once"], messages


def test_only_gpus_keeps_the_named_types_and_their_trial_ids() -> None:
    from kubesweep.plan import plan
    from kubesweep.sweep_spec import gpu_types, only_gpus

    sweep = load_sweep_file(ROOT / "sweeps" / "gpu_matrix.yaml")
    assert gpu_types(sweep) == ["a100-40gb", "v100-32gb", "rtx-3090", "l40s", "h100-80gb"]
    narrow = only_gpus(sweep, ["h100-80gb", "l40s"])
    assert gpu_types(narrow) == ["l40s", "h100-80gb"] and narrow.name == sweep.name
    kept = {t.id: t.name for t in plan(narrow).trials}
    assert kept and kept == {t.id: t.name for t in plan(sweep).trials if t.gpu in ("h100-80gb", "l40s")}
    with pytest.raises(SpecError, match=r"--gpu t4: not a GPU type of sweep 'bert-gpu-matrix' \(its GPU types are "
                                        r"a100-40gb, v100-32gb, rtx-3090, l40s, h100-80gb\)"):
        only_gpus(sweep, ["h100-80gb", "t4"])


@pytest.mark.parametrize(("target", "percent"), [("2.5%", 2.5), (" 12% ", 12.0), ("3%", 3.0), (4, 4.0), (0.5, 0.5)])
def test_a_repeat_target_is_a_percent_written_with_or_without_its_sign(target: object, percent: float) -> None:
    doc = _sweep(matrix={"batch_size": [8]}, repeats=2, repeat_until={"target": target})
    rule = parse_sweep(doc).spec.repeat_until
    assert rule is not None and rule.target == percent


def test_a_repeat_target_that_is_not_a_percent_is_refused_naming_it() -> None:
    with pytest.raises(SpecError, match=r"spec\.repeat_until\.target"):
        parse_sweep(_sweep(matrix={"batch_size": [8]}, repeats=2, repeat_until={"target": "a%"}))
