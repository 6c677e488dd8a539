"""Validation errors in a person's words: pydantic's errors of a `Sweep` turned into `path: what was expected`
messages (with "did you mean" hints from the model's field names), and the field path cleaned of pydantic's union
tags. Used by `kubesweep.sweep_spec` (parsing) and `kubesweep.sweep_spec.checks` (values checked after parsing).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from kubesweep.sweep_spec.file import Problem as Problem
from kubesweep.sweep_spec.file import SpecError as SpecError
from kubesweep.sweep_spec.model import DNS1123_LABEL, QUANTITY, Sweep
from kubesweep.wire.base import StrictModel


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _fields_at(model: type[StrictModel], path: Sequence[str | int]) -> list[str] | None:
    """The field names of the model found at `path` from `model`, for 'did you mean' hints."""
    current: Any = model
    for part in path:
        if isinstance(part, int) or not (isinstance(current, type) and issubclass(current, StrictModel)):
            continue
        info = current.model_fields.get(part)
        if info is None:
            return None
        current = _unwrap_model(info.annotation)
    if isinstance(current, type) and issubclass(current, StrictModel):
        return list(current.model_fields)
    return None


def _unwrap_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, StrictModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _unwrap_model(arg)
        if found is not None:
            return found
    return None


def message(error: Mapping[str, Any], path: tuple[str | int, ...]) -> str:
    kind, ctx, value = error["type"], error.get("ctx") or {}, error.get("input")
    if kind == "literal_error":
        options = re.findall(r"'([^']*)'", str(ctx.get("expected", ""))) or [str(ctx.get("expected"))]
        return f"{short(value)} is not one of {', '.join(options)}"
    if kind == "extra_forbidden":
        known = _fields_at(Sweep, path[:-1]) or []
        hint = difflib.get_close_matches(str(path[-1]), known, n=1)
        suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
        listing = f" (expected one of: {', '.join(known)})" if known and not hint else ""
        return f"unknown field{suggestion}{listing}"
    if kind == "missing":
        return "required field is missing"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return f"expected an integer, got {short(value)}"
    if kind in ("float_parsing", "float_type"):
        return f"expected a number, got {short(value)}"
    if kind == "finite_number":
        return f"expected a finite number, got {short(value)}"
    if kind in ("bool_parsing", "bool_type"):
        return f"expected true or false, got {short(value)}"
    if kind == "string_type":
        return f"expected a string, got {short(value)}"
    if kind in ("list_type", "tuple_type"):
        return f"expected a list, got {short(value)}"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return f"expected a mapping, got {short(value)}"
    if kind == "too_short":
        return "must not be empty"
    if kind == "string_too_long":
        return f"{short(value)} is longer than {ctx.get('max_length')} characters"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        op = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}[kind]
        bound = next(iter(ctx.values()), "?")
        return f"must be {op} {bound}, got {short(value)}"
    if kind == "string_pattern_mismatch":
        if ctx.get("pattern") == DNS1123_LABEL:
            return f"{short(value)} is not a DNS-1123 label (lowercase letters, digits and '-')"
        if ctx.get("pattern") == QUANTITY:
            return f"{short(value)} is not a Kubernetes quantity (e.g. 8, 500m, 32Gi)"
        return f"{short(value)} does not match {ctx.get('pattern')}"
    if kind == "union_tag_invalid":
        return f"{ctx.get('tag')!r} is not one of {str(ctx.get('expected_tags')).replace(chr(39), '')}"
    if kind == "union_tag_not_found":
        return f"'{ctx.get('discriminator', 'strategy')}' is required"
    msg = str(error.get("msg", kind)).removeprefix("Value error, ")
    scalar = isinstance(value, (str, int, float, bool)) or value is None
    return f"{msg}, got {short(value)}" if kind == "value_error" and scalar else msg


def clean_path(loc: Sequence[str | int], data: Any) -> tuple[str | int, ...]:
    """Drop pydantic's union/validator tags from `loc`, keeping only keys that exist in the input data."""
    path: list[str | int] = []
    current = data
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(current, Mapping):
            if part in current:
                path.append(part)
                current = current[part]
            elif last or (isinstance(part, str) and not _is_tag(part)):
                path.append(part)
                current = None
        elif isinstance(current, list) and isinstance(part, int) and 0 <= part < len(current):
            path.append(part)
            current = current[part]
        elif current is None and not _is_tag(str(part)):
            path.append(part)
    return tuple(path)


def _is_tag(part: str) -> bool:
    return (
        "[" in part
        or part in ("int", "str", "bool", "float", "list", "dict", "none", "function-after", "function-before")
        or part in ("grid", "random", "tune", "max_batch")
    )
