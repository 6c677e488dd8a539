"""`python -m kubesweep.tune --spec FILE`: a spec it cannot use is one line on stderr and exit code 2, read within
the size limit of a spec file, YAML or JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kubesweep.tune.__main__ import main

DOC = {"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "t"},
       "spec": {"search": {"strategy": "max_batch"}, "matrix": {"precision": ["fp32"]}}}


def run(spec: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["--spec", str(spec), "--backend", "local", "--storage", str(tmp_path / "storage"),
                 "--home", str(tmp_path / "home")])
    return code, capsys.readouterr().err


def test_a_spec_over_the_size_limit_is_refused_unread(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "sweep.json"
    with spec.open("wb") as file:
        file.truncate(50 * 1024 * 1024)
    code, err = run(spec, tmp_path, capsys)
    assert (code, err) == (2, f"{spec}: the file is 52,428,800 bytes, over the limit of 1,048,576 bytes (1 MiB) "
                              "for a sweep spec; nothing of it was read\n")


def test_json_nested_past_what_json_reads_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "sweep.json"
    spec.write_text("[" * 100_000 + "]" * 100_000)
    code, err = run(spec, tmp_path, capsys)
    assert code == 2 and err.startswith(f"{spec}: not valid JSON: maximum recursion depth exceeded")
    assert len(err.splitlines()) == 1


def test_a_json_spec_is_validated_strictly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "sweep.json"
    spec.write_text(json.dumps({**DOC, "spec": {**DOC["spec"], "search": {"strategy": "max_batch", "high": "64"}}}))
    code, err = run(spec, tmp_path, capsys)
    assert (code, err) == (2, f"{spec}: spec.search.high: expected an integer, got '64'\n")
