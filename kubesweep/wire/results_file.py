"""The one reader of a trial's results file (`kubesweep.wire.results.Results`), wherever it comes from: a local
trial's folder, an MLflow artifact, a directory of copied files. Each goes through `read_results_file` (or, for
bytes already in hand, `parse_results`), never through `json.loads`:

- bounded in size: at most `MAX_RESULTS_BYTES` read, and only from a regular file (a FIFO or a device in its place
  would block or never end);
- bounded in depth: pydantic-core's parser refuses nesting past its recursion limit (a few hundred levels) before
  any Python code recurses, so a `[[[[...` bomb is an error of that file, not a `RecursionError` of its reader;
- validated against the schema, numbers bounded (`MAX_MAGNITUDE`).

Anything wrong is a `ResultsFileError`: the file, the field path and what was expected, in one line. A trial whose
file is not valid has failed (its driver records that line as the reason); no reader lets the error reach a
command.
"""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from kubesweep.wire.results import RESULTS_SCHEMA, Results

MAX_RESULTS_BYTES = 64 * 2**20  # one results file; a trial's loss curve of a long run is a few MiB
# no measurement of a trial comes near this (bytes of memory, joules, seconds, samples): a number beyond it is damage,
# and would overflow the sums and the figures' axes
MAX_MAGNITUDE = 1e15
# but a count of model FLOPs is: one epoch of SST-2 on bert-base is about 7e14, a long run of a large model 1e21 and
# more; the bound of a FLOP count (`measured_flops`, `flops_per_step`, `flops_per_batch`) is the largest training
# runs' order and a margin (1e24)
MAX_FLOPS = 1e24
_FREE_FORM = ("environment", "model")  # not read as numbers


class ResultsFileError(ValueError):
    """One results file that is not valid: the file, the field path and what was expected, in one line."""


_EXPECTED = {"int_type": "expected an integer", "float_type": "expected a number",
             "string_type": "expected a string", "bool_type": "expected true or false",
             "model_type": "expected an object", "dict_type": "expected an object", "list_type": "expected a list",
             "missing": "required, missing", "extra_forbidden": f"not a field of {RESULTS_SCHEMA}",
             "enum": "not one of the outcomes", "literal_error": "not one of the values allowed"}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _field_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(the document)"


def _nullable(model: type[BaseModel] | None, loc: tuple[int | str, ...]) -> bool:
    """Whether the field of `model` at `loc` (a path into its document) may be null."""
    annotation: Any = model
    for part in loc:
        if isinstance(part, int):
            args = get_args(annotation)
            annotation = args[0] if args else None
            continue
        inner = next((a for a in (annotation, *get_args(annotation))
                      if isinstance(a, type) and issubclass(a, BaseModel)), None)
        info = inner.model_fields.get(part) if inner is not None else None
        if info is None:
            return False
        annotation = info.annotation
    return type(None) in get_args(annotation)


def magnitude_bound(loc: tuple[int | str, ...]) -> float:
    """The largest magnitude a number at `loc` may have: MAX_FLOPS for a FLOP count, else MAX_MAGNITUDE."""
    key = loc[-1] if loc else ""
    flops = isinstance(key, str) and (key.endswith("_flops") or key.startswith("flops_per_"))
    return MAX_FLOPS if flops else MAX_MAGNITUDE


def _finite(data: Any, loc: tuple[int | str, ...] = ()) -> Any:
    """`data` with each infinite or NaN number as None where the schema lets the field be null (a diverged run's
    loss; where it may not be, the number stays as the job wrote it); `ResultsFileError` args (path, value, bound)
    for a number beyond its `magnitude_bound` (outside the free-form parts)."""
    if isinstance(data, float) and not math.isfinite(data):
        return None if _nullable(Results, loc) else data
    if isinstance(data, (int, float)) and not isinstance(data, bool) and abs(data) > magnitude_bound(loc):
        raise ResultsFileError(_field_path(loc), data, magnitude_bound(loc))
    if isinstance(data, dict):
        return {k: v if not loc and k in _FREE_FORM else _finite(v, (*loc, k)) for k, v in data.items()}
    if isinstance(data, list):
        return [_finite(v, (*loc, i)) for i, v in enumerate(data)]
    return data


def parse_results(raw: bytes | str, where: str) -> Results:
    """A results document validated against its schema (`kubesweep.wire.results.Results`, from which
    docs/results.schema.json is generated; strict JSON types) and the free-form fields the views read, with each
    infinite or NaN number the schema lets be null as null. `ResultsFileError`: the first thing wrong with it, in
    one line starting with `where` (a document of more than MAX_RESULTS_BYTES, or nested past the parser's limit,
    included)."""
    if len(raw) > MAX_RESULTS_BYTES:
        raise ResultsFileError(f"{where}: {len(raw):,} bytes, more than a results file has ({MAX_RESULTS_BYTES:,})")
    try:
        results = Results.model_validate_json(raw, strict=True)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        if error["type"] == "json_invalid":
            raise ResultsFileError(f"{where}: not JSON: {error['msg'].removeprefix('Invalid JSON: ')}") from None
        if not error["loc"] and error["type"] == "model_type":
            raise ResultsFileError(f"{where}: expected a JSON object (a results file), got "
                                   f"{type(error['input']).__name__}") from None
        expected = _EXPECTED.get(error["type"], error["msg"])
        got = "" if error["type"] in ("missing", "extra_forbidden") else f", got {_short(error.get('input'))}"
        raise ResultsFileError(f"{where}: {_field_path(error['loc'])}: {expected}{got} ({RESULTS_SCHEMA}, "
                               "docs/results-schema.md)") from None
    if results.schema_ != RESULTS_SCHEMA:
        raise ResultsFileError(f"{where}: schema: {results.schema_!r} is not {RESULTS_SCHEMA}, the version read here")
    try:
        data = _finite(results.model_dump(mode="python", by_alias=True, exclude_unset=True))
    except ResultsFileError as exc:
        path, value, bound = exc.args
        raise ResultsFileError(f"{where}: {path}: expected a number within ±{bound:g}, got {_short(value)}") from None
    return Results.model_validate(data)


def read_results_file(path: Path, where: str | None = None) -> Results:
    """A results file, validated as `parse_results` says; at most MAX_RESULTS_BYTES are read, and only from a
    regular file. `ResultsFileError`: the first thing wrong with it, in one line naming the file (or `where`)."""
    where = str(path) if where is None else where
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ResultsFileError(f"{where}: cannot read it: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as handle:
        try:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise ResultsFileError(f"{where}: not a regular file")
            if info.st_size > MAX_RESULTS_BYTES:
                raise ResultsFileError(f"{where}: {info.st_size:,} bytes, more than a results file has "
                                       f"({MAX_RESULTS_BYTES:,})")
            raw = handle.read(MAX_RESULTS_BYTES + 1)  # a file that grew since: still no more than the cap
        except OSError as exc:
            raise ResultsFileError(f"{where}: cannot read it: {exc.strerror or exc}") from None
    return parse_results(raw, where)
