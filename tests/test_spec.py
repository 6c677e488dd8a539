"""Spec validation: every bad spec under tests/data/bad_specs gives the message its first line expects."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubesweep.spec import SpecError, load_sweep_file, parse_sweep

ROOT = Path(__file__).parents[1]
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


@pytest.mark.parametrize("spec", sorted((ROOT / "sweeps").glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_specs_are_valid(spec: Path) -> None:
    sweep = load_sweep_file(spec)
    assert sweep.name


def test_line_numbers_point_at_the_value() -> None:
    text = "apiVersion: kubesweep.io/v1alpha1\nkind: Sweep\nmetadata: {name: x}\nspec:\n  matrix:\n" \
           "    precision:\n      - fp32\n      - bf61\n"
    with pytest.raises(SpecError) as info:
        from kubesweep.spec import parse_sweep_text

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


def test_the_readme_spec_is_the_shipped_gpu_matrix() -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## The sweep spec", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    shipped = (ROOT / "sweeps" / "gpu_matrix.yaml").read_text()
    assert block == "".join(line for line in shipped.splitlines(keepends=True) if not line.startswith("#"))
