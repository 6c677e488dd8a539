"""The `Sweep` document: one typed, validated schema for spec files, the CLI and the custom resource.

    apiVersion: kubesweep.io/v1alpha1
    kind: Sweep
    metadata: {name: bert-gpu-matrix}
    spec: {image, images, job, matrix, include, exclude, repeats, resources, concurrency, tracking, search}

`load_sweep_file` and `parse_sweep` turn input into a `Sweep` or raise `SpecError`, whose message names the
file, the line, the field path and what was expected, one problem per line:

    sweeps/x.yaml:12: spec.matrix.precision[2]: 'bf61' is not one of fp32, tf32, fp16, bf16

Reading the file (its size, its YAML, its lines) is `sweep_spec.file`'s; the model (fields, bounds, axes) is
`sweep_spec.model`, the checks the schema cannot say `sweep_spec.checks`, the wording of validation errors
`sweep_spec.errors`; this module parses with them and is where callers import the model from. Values are
validated strictly: a value has its field's type (`"16"` is not an integer, `16.0` is not one either, `"true"` is
not a boolean).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kubesweep.gpus import Catalog, load_catalog
from kubesweep.sweep_spec.checks import axis_is_int as axis_is_int
from kubesweep.sweep_spec.checks import cell_text as cell_text
from kubesweep.sweep_spec.checks import semantic_problems, warnings_of
from kubesweep.sweep_spec.errors import clean_path, message
from kubesweep.sweep_spec.file import MAX_DEPTH, LineMap, load_document, read_spec_text, too_deep
from kubesweep.sweep_spec.file import Problem as Problem
from kubesweep.sweep_spec.file import SpecError as SpecError
from kubesweep.sweep_spec.model import DIGEST_RE as DIGEST_RE
from kubesweep.sweep_spec.model import SEARCH_RUNNERS as SEARCH_RUNNERS
from kubesweep.sweep_spec.model import Constraint as Constraint
from kubesweep.sweep_spec.model import Distribution as Distribution
from kubesweep.sweep_spec.model import MaxBatchSearch as MaxBatchSearch
from kubesweep.sweep_spec.model import RandomSearch as RandomSearch
from kubesweep.sweep_spec.model import RepeatUntil as RepeatUntil
from kubesweep.sweep_spec.model import SequentialRepeats as SequentialRepeats
from kubesweep.sweep_spec.model import Sweep as Sweep
from kubesweep.sweep_spec.model import SweepSpec as SweepSpec
from kubesweep.sweep_spec.model import TuneSearch as TuneSearch
from kubesweep.sweep_spec.model import set_axes as set_axes
from kubesweep.sweep_spec.overrides import Override as Override
from kubesweep.sweep_spec.overrides import apply_overrides
from kubesweep.sweep_spec.overrides import parse_sets as parse_sets

# ---------------------------------------------------------------------------------------------------------
# Loading


def load_sweep_file(
    path: str | Path, *, allow_unpinned: bool = False, catalog: Catalog | None = None,
    overrides: Sequence[Override] = (),
) -> Sweep:
    """The spec file at `path`, with `overrides` (`--set`) applied, as a `Sweep`; `SpecError` when it cannot be
    read (see `kubesweep.sweep_spec.file`) or is not valid."""
    source = str(path)
    text = read_spec_text(path)
    return parse_sweep_text(text, source=source, allow_unpinned=allow_unpinned, catalog=catalog, overrides=overrides)


def parse_sweep_text(
    text: str, *, source: str = "<input>", allow_unpinned: bool = False, catalog: Catalog | None = None,
    overrides: Sequence[Override] = (),
) -> Sweep:
    data, lines = load_document(text, source)
    data = apply_overrides(data, overrides, lines)
    sweep = parse_sweep(data, source=source, lines=lines, allow_unpinned=allow_unpinned, catalog=catalog)
    sweep._sets = [o.text for o in overrides]
    return sweep


def parse_sweep(
    data: Any,
    *,
    source: str = "<input>",
    lines: LineMap | None = None,
    allow_unpinned: bool = False,
    catalog: Catalog | None = None,
) -> Sweep:
    """Validate a mapping (a parsed file, a custom resource's body) into a `Sweep`, or raise `SpecError`.

    Strictly: a value of another type than its field's is an error, never converted (`"16"` for an integer).
    """
    lines = lines if lines is not None else LineMap()
    if not isinstance(data, Mapping):
        raise SpecError(source, [Problem((), f"expected a mapping with apiVersion, kind, metadata and spec, "
                                              f"got {type(data).__name__}", 1)])
    deep = too_deep(data)
    if deep is not None:
        raise SpecError(source, [lines.problem(deep, f"nested more than {MAX_DEPTH} levels deep; a sweep spec "
                                                     "needs a few")])
    try:
        sweep = Sweep.model_validate(data, strict=True)
    except ValidationError as exc:
        problems: dict[tuple[str | int, ...], Problem] = {}
        for error in exc.errors():
            path = clean_path(error["loc"], data)
            if error["type"] == "union_tag_invalid":
                path = (*path, str((error.get("ctx") or {}).get("discriminator", "")).strip("'"))
            problems.setdefault(path, lines.problem(path, message(error, path)))
        raise SpecError(source, sorted(problems.values(), key=lambda p: p.line or 0)) from None
    sweep._source = source
    sweep._lines = lines
    sweep._warnings = [lines.problem(w.path, w.message) for w in warnings_of(sweep)]
    problems_list = list(semantic_problems(sweep, catalog or load_catalog(), allow_unpinned))
    if problems_list:
        raise SpecError(source, [lines.problem(p.path, p.message) for p in problems_list])
    return sweep




# ---------------------------------------------------------------------------------------------------------
# Narrowing


def gpu_types(sweep: Sweep) -> list[str]:
    """The GPU types the sweep names, in its order: its matrix's `gpu` values, its include cells' and its search
    space's."""
    spec = sweep.spec
    named: list[Any] = list(set_axes(spec.matrix).get("gpu") or [])
    named += [set_axes(cell).get("gpu") for cell in spec.include]
    space = getattr(spec.search, "space", None) or {}
    if "gpu" in space:
        named += list(space["gpu"].values or [])
    return list(dict.fromkeys(g for g in named if isinstance(g, str)))


def only_gpus(sweep: Sweep, gpus: list[str], *, allow_unpinned: bool = False) -> Sweep:
    """The sweep with only the GPU types `gpus` (`--gpu`): the other values of its matrix's `gpu` axis and of its
    search space's, and the include cells of other types, left out; trial ids are unchanged. `SpecError` (naming
    the flag) for a type the sweep does not name, or one that leaves its matrix no GPU type."""
    named = gpu_types(sweep)
    unknown = [g for g in dict.fromkeys(gpus) if g not in named]
    if unknown:
        theirs = f"its GPU types are {', '.join(named)}" if named else "it names no GPU type"
        raise SpecError(sweep.source, [Problem((), f"--gpu {unknown[0]}: not a GPU type of sweep {sweep.name!r} "
                                                    f"({theirs})", None)])
    keep = set(gpus)
    document = sweep.to_document()
    spec = document["spec"]
    matrix = spec.get("matrix") or {}
    if isinstance(matrix.get("gpu"), list):
        matrix["gpu"] = [g for g in matrix["gpu"] if g in keep]
        if not matrix["gpu"]:
            raise SpecError(sweep.source, [sweep.problem(("spec", "matrix", "gpu"), f"--gpu {' --gpu '.join(gpus)} "
                                                         "leaves the matrix's gpu axis no value")])
    spec["include"] = [c for c in spec.get("include") or [] if c.get("gpu") is None or c.get("gpu") in keep]
    space = (spec.get("search") or {}).get("space") or {}
    if isinstance(space.get("gpu"), Mapping) and isinstance(space["gpu"].get("values"), list):
        space["gpu"]["values"] = [g for g in space["gpu"]["values"] if g in keep]
    narrow = parse_sweep(document, source=sweep.source, lines=sweep._lines.copy(), allow_unpinned=allow_unpinned)
    narrow._sets = list(sweep._sets)
    return narrow
