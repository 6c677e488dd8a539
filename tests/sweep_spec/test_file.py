"""Reading a spec file: hostile and odd input gets one clear line and exit code 2, fast, through `sweep validate`;
the bounds (size, nesting, nodes, aliases) are exact; YAML 1.2 floats; line numbers through aliases."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kubesweep.sweep_spec import SpecError, load_sweep_file, parse_sweep_text
from kubesweep.sweep_spec.file import (
    MAX_ALIAS_NODES,
    MAX_DEPTH,
    MAX_NODES,
    MAX_SPEC_BYTES,
    load_document,
    read_spec_text,
)

ROOT = Path(__file__).parents[2]
BAD = ROOT / "tests" / "data" / "bad_specs"
HEAD = "apiVersion: kubesweep.io/v1alpha1\nkind: Sweep\nmetadata: {name: s}\nspec:\n"


def cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def validate(path: Path) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """`sweep validate PATH` as a person runs it, and the seconds it took: wall clock, and CPU (which a busy
    machine does not stretch)."""
    env = {**os.environ, "KUBESWEEP_HOME": str(path.parent / "home"), "COLUMNS": "200"}
    start, cpu = time.monotonic(), cpu_of_children()
    proc = subprocess.run([sys.executable, "-m", "kubesweep", "validate", str(path)], capture_output=True,
                          text=True, env=env, timeout=60)
    return proc, time.monotonic() - start, cpu_of_children() - cpu


def refused(path: Path, line: str) -> None:
    """`sweep validate` exits 2 with the one line `line`, no traceback, in under 5 s of CPU (30 s of wall clock
    on a machine however busy: a hang is minutes)."""
    proc, elapsed, cpu = validate(path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [line], proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert cpu < 5 and elapsed < 30, f"{cpu:.1f} s of CPU, {elapsed:.1f} s"


def test_an_anchor_bomb_is_refused_at_its_alias() -> None:
    bomb = BAD / "52-anchor-bomb.yaml"
    assert len(bomb.read_bytes()) < 600  # the classic: nine levels of nine aliases, 10^9 strings when expanded
    refused(bomb, f"{bomb}:10: aliases expand to more than 10,000 nodes at *d (7,381 nodes); write the values "
                  "out, or use fewer aliases")


def test_200_deep_nesting_is_refused_at_its_line() -> None:
    deep = BAD / "53-nested-200-deep.yaml"
    refused(deep, f"{deep}:7: nested more than 64 levels deep; a sweep spec needs a few")


def test_a_string_for_an_integer_is_refused_with_its_field() -> None:
    bad = BAD / "48-string-for-int.yaml"
    refused(bad, f"{bad}:7: spec.matrix.batch_size[0]: expected an integer, got '16'")


def test_a_file_over_the_size_limit_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text(HEAD + "# padding\n" * (MAX_SPEC_BYTES // 10))
    size = big.stat().st_size
    assert size > MAX_SPEC_BYTES
    refused(big, f"{big}: the file is {size:,} bytes, over the limit of 1,048,576 bytes (1 MiB) for a sweep "
                 "spec; nothing of it was read")


def test_a_50_mb_file_is_refused_without_reading_it(tmp_path: Path) -> None:
    huge = tmp_path / "huge.yaml"
    with huge.open("wb") as file:
        file.truncate(50 * 1024 * 1024)  # sparse: 50 MB of NUL bytes that take no disk
    refused(huge, f"{huge}: the file is 52,428,800 bytes, over the limit of 1,048,576 bytes (1 MiB) for a sweep "
                  "spec; nothing of it was read")
    start = time.process_time()
    with pytest.raises(SpecError):
        load_sweep_file(huge)
    assert time.process_time() - start < 0.5  # told from its size: reading 50 MB would take longer


def test_the_size_limit_is_exact(tmp_path: Path) -> None:
    spec = HEAD + "  repeats: 2\n"
    at = tmp_path / "at.yaml"
    at.write_text(spec + "#" * (MAX_SPEC_BYTES - len(spec) - 1) + "\n")
    assert at.stat().st_size == MAX_SPEC_BYTES
    assert load_sweep_file(at).spec.repeats == 2
    over = tmp_path / "over.yaml"
    over.write_bytes(at.read_bytes() + b"\n")
    with pytest.raises(SpecError, match="the file is 1,048,577 bytes, over the limit"):
        load_sweep_file(over)


def test_a_stream_with_no_size_is_read_up_to_the_limit() -> None:
    with pytest.raises(SpecError) as info:
        read_spec_text("/dev/zero")  # a device: no size to tell, and no end
    assert str(info.value) == ("/dev/zero: the file is more than 1,048,576 bytes, over the limit of 1,048,576 bytes "
                               "(1 MiB) for a sweep spec; nothing of it was read")


def test_a_file_of_too_many_nodes_is_refused_fast(tmp_path: Path) -> None:
    many = tmp_path / "many.yaml"
    many.write_text(HEAD + "  matrix:\n    batch_size:\n" + "    - 1\n" * (MAX_NODES + 10))
    assert many.stat().st_size < MAX_SPEC_BYTES
    # 15 nodes before the items, which start at line 7: the root; 4 keys; 2 strings; metadata's mapping, key
    # and value; spec's mapping; matrix's key and mapping; batch_size's key and list. Node 50,001 is refused.
    line = 7 + (MAX_NODES + 1 - 15) - 1
    refused(many, f"{many}:{line}: more than 50,000 YAML nodes (keys, values, lists and mappings); a sweep spec "
                  "needs far fewer")


@pytest.mark.parametrize("depth", [MAX_DEPTH, MAX_DEPTH + 1])
def test_the_depth_limit_is_exact(depth: int) -> None:
    # the root mapping, `spec`'s value and model_overrides' value are 3 levels; the innermost list holds a scalar
    lists = depth - 4
    text = HEAD + "  job:\n    model_overrides: " + "[" * lists + "1" + "]" * lists + "\n"
    if depth <= MAX_DEPTH:
        data, _ = load_document(text, "d.yaml")
        assert data["spec"]["job"]["model_overrides"]
    else:
        with pytest.raises(SpecError, match=r"^d\.yaml:6: nested more than 64 levels deep"):
            load_document(text, "d.yaml")


def test_the_alias_bound_is_exact() -> None:
    # an anchored list of 99 scalars is 100 nodes: 100 aliases to it add 10,000 nodes, one more is refused
    anchored = "  a: &a [" + ", ".join(["1"] * 99) + "]\n"
    at = HEAD + anchored + "  b: [" + ", ".join(["*a"] * (MAX_ALIAS_NODES // 100)) + "]\n"
    data, _ = load_document(at, "a.yaml")
    assert len(data["spec"]["b"]) == 100
    with pytest.raises(SpecError, match=r"^a\.yaml:7: aliases expand to more than 10,000 nodes at \*a \(100 nodes\)"):
        load_document(at + "  c: *a\n", "a.yaml")


def test_an_alias_that_nests_past_the_depth_limit_is_refused() -> None:
    deep = "[" * 40 + "1" + "]" * 40
    text = HEAD + f"  a: &deep {deep}\n  b: {'[' * 30}*deep{']' * 30}\n"
    with pytest.raises(SpecError, match=r"^x\.yaml:6: the alias \*deep nests the document more than 64 levels deep$"):
        load_document(text, "x.yaml")


def test_a_spec_with_anchors_and_merge_keys_loads() -> None:
    text = HEAD + """\
  matrix:
    batch_size: &sizes [8, 16]
    precision: [fp32, bf16]
  include:
    - &big {batch_size: 256, precision: bf16}
    - {<<: *big, batch_size: 512}
  exclude:
    - {batch_size: 8, precision: bf16}
  search: {strategy: random, num_samples: 2, seed: 1}
"""
    sweep = parse_sweep_text(text, source="anchors.yaml")
    assert [c.batch_size for c in sweep.spec.include] == [256, 512]
    assert [c.precision for c in sweep.spec.include] == ["bf16", "bf16"]


def test_a_path_through_an_alias_has_the_alias_line() -> None:
    text = HEAD + "  include:\n    - &cell {batch_size: 8, precision: fp61}\n    - *cell\n"
    with pytest.raises(SpecError) as info:
        parse_sweep_text(text, source="x.yaml")
    assert str(info.value).splitlines() == [
        "x.yaml:6: spec.include[0].precision: 'fp61' is not one of fp32, tf32, fp16, bf16",
        "x.yaml:7: spec.include[1].precision: 'fp61' is not one of fp32, tf32, fp16, bf16"]


def test_a_key_twice_in_an_aliased_mapping_is_reported_once() -> None:
    text = HEAD + "  include:\n    - &cell {batch_size: 8, batch_size: 16}\n" + "    - *cell\n" * 50
    with pytest.raises(SpecError) as info:
        parse_sweep_text(text, source="x.yaml")
    assert str(info.value) == ("x.yaml:6: spec.include[0].batch_size: given twice (lines 6 and 6); YAML would "
                               "keep only the last: merge them into one")


@pytest.mark.parametrize(("written", "value"), [
    ("1e-4", 1e-4), ("1.0e5", 1e5), ("-2E-5", -2e-5), ("2.0e-5", 2e-5), (".5e3", 500.0), ("3", 3), ("0.1", 0.1),
])
def test_numbers_are_read_as_yaml_1_2_reads_them(written: str, value: float) -> None:
    """YAML 1.1 reads 1e-4 and 1.0e5 as strings; a spec means a number."""
    data, _ = load_document(f"x: {written}\n", "n.yaml")
    assert data["x"] == value and type(data["x"]) is type(value)


def test_a_learning_rate_in_exponent_form_is_a_number() -> None:
    sweep = parse_sweep_text(HEAD + "  job: {learning_rate: 1e-4}\n  matrix: {learning_rate: [1e-5, 3.0e-5]}\n")
    assert sweep.spec.job.learning_rate == 1e-4
    assert sweep.spec.matrix.learning_rate == [1e-5, 3e-5]


def test_an_integer_of_too_many_digits_is_refused_at_its_line() -> None:
    with pytest.raises(SpecError) as info:
        parse_sweep_text(HEAD + "  job:\n    batch_size: " + "1" * 5000 + "\n", source="x.yaml")
    message = str(info.value)
    assert message.startswith("x.yaml:6: not valid YAML: '1111111111") and "digits" in message
    assert len(message) < 300


@pytest.mark.parametrize(("opened", "line"), [("  matrix:\n    batch_size: [8, 16\n  repeats: 1\n", 6),
                                              ("  job: {epochs: 1\n  repeats: 1\n", 5)])
def test_an_unclosed_bracket_is_reported_where_it_was_opened(opened: str, line: int) -> None:
    """The parser notices an unclosed `[` or `{` on a later line; the message names the line it was opened on."""
    with pytest.raises(SpecError) as info:
        parse_sweep_text(HEAD + opened, source="x.yaml")
    message = str(info.value)
    assert message.startswith(f"x.yaml:{line}: not valid YAML: the flow "), message
    assert "opened here is not closed" in message and f"on line {line + 1})" in message
