"""One tag vocabulary: every MLflow tag name kubesweep writes or reads is spelled once, in `kubesweep.wire.tags`;
no other module of the package spells one as a string of its own."""

from __future__ import annotations

import ast
from pathlib import Path

from kubesweep.wire import tags

PACKAGE = Path(tags.__file__).resolve().parents[1]


def tag_names() -> set[str]:
    """The vocabulary's tag names (those with a dot: `parent`, the parent run's role, is a value, not a name)."""
    return {v for k, v in vars(tags).items() if k.isupper() and isinstance(v, str) and "." in v}


def spelled_elsewhere(package: Path) -> list[str]:
    """`file:line: name` for each string constant outside wire/tags.py that is one of the vocabulary's names."""
    names, found = tag_names(), []
    for path in sorted(package.rglob("*.py")):
        if path == Path(tags.__file__).resolve():
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{path.relative_to(package.parent)}:{node.lineno}: {node.value}")
    return found


def test_the_vocabulary_names_each_tag_once() -> None:
    values = [v for k, v in vars(tags).items() if k.isupper() and isinstance(v, str)]
    assert len(values) == len(set(values))
    assert {"kubesweep.sweep", "kubesweep.trial_id", "mlflow.parentRunId", "kubesweep.owner-seal"} <= tag_names()


def test_no_module_spells_a_tag_name_of_its_own(tmp_path: Path) -> None:
    assert spelled_elsewhere(PACKAGE) == []
    planted = tmp_path / "kubesweep"
    planted.mkdir()
    (planted / "runner.py").write_text('TAGS = {"kubesweep.sweep": "s"}\n')
    assert spelled_elsewhere(planted) == ["kubesweep/runner.py:1: kubesweep.sweep"]
