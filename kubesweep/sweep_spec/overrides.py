"""`--set PATH=VALUE`: a spec file's values overridden from the command line, as Helm's `--set` does a chart's.

PATH is a dotted path under the document's `spec:` (`job.max_steps`, `matrix.batch_size`; a leading `spec.` is the
same) or under `metadata` (`metadata.name`); `\\.` is a dot inside a key (`images.torch-2\\.8-cu128`). VALUE is one
YAML scalar or flow value, read as a spec file's values are (`true`, `200`, `2.0e-5`, `[16, 32]`,
`{target: 3%, max: 10}`, a string); `null` (or nothing after `=`) removes the key, leaving the field's default.

The overrides are applied, in order, to the parsed document before it is validated, so a set value is checked
as a value of the file is, and a problem with it names the option as typed instead of a line of the file. A key
the document lacks is added (with the mappings above it); setting inside a value that is not a mapping is refused.
A malformed option is refused before the file is read. Every refusal is a `SpecError` naming the option.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubesweep.sweep_spec.file import MAX_DEPTH, LineMap, Problem, SpecError, load_value
from kubesweep.sweep_spec.model import SweepSpec

EXPECTED = ("expected PATH=VALUE: a dotted path under spec (job.max_steps, matrix.batch_size, storage.cache_claim) or "
            "metadata.name, '=', and a YAML value (200, true, [16, 32], a string)")


@dataclass(frozen=True)
class Override:
    """One `--set` option: `text` as typed after `--set`, the document `path` it sets and its `value`."""

    text: str
    path: tuple[str, ...]
    value: Any

    @property
    def option(self) -> str:
        """The option as typed, on one line: `--set job.max_steps=200`."""
        return shown(self.text)


def shown(text: str) -> str:
    return "--set " + text.replace("\n", "\\n").replace("\r", "\\r")


def parse_sets(texts: Iterable[str] | None) -> list[Override]:
    """Each `--set` option's text as an `Override`; `SpecError` (naming the option) for the first malformed one."""
    return [parse_set(text) for text in texts or ()]


def parse_set(text: str) -> Override:
    option = shown(text)
    if "=" not in text:
        raise _refused(option, f"no '=' in it: {EXPECTED}")
    path_text, value_text = text.split("=", 1)
    if not path_text.strip():
        raise _refused(option, f"the path before '=' is empty: {EXPECTED}")
    parts = _split(path_text)
    if any(not part for part in parts):
        raise _refused(option, f"the path {path_text!r} has an empty part (two dots, or one at an end): {EXPECTED}")
    if len(parts) > MAX_DEPTH:
        raise _refused(option, f"the path is more than {MAX_DEPTH} levels deep; a sweep spec needs a few")
    top = parts[0]
    if top in ("apiVersion", "kind"):
        raise _refused(option, f"{top} is not set from the command line (a sweep's is "
                               f"{'kubesweep.io/v1alpha1' if top == 'apiVersion' else 'Sweep'}): {EXPECTED}")
    if top == "spec":
        parts = parts[1:]
        if not parts:
            raise _refused(option, f"names the whole spec; name a field under it: {EXPECTED}")
        top = parts[0]
    elif top == "metadata":
        if len(parts) == 1:
            raise _refused(option, f"names the whole metadata; name a field under it (metadata.name): {EXPECTED}")
        return Override(text, tuple(parts), load_value(value_text, option))
    fields = list(SweepSpec.model_fields)
    if top not in fields:
        hint = difflib.get_close_matches(top, [*fields, "metadata"], n=1)
        known = f"did you mean {hint[0]!r}?" if hint else f"expected one of {', '.join(fields)}, or metadata.name"
        raise _refused(option, f"{top!r} is not a field of a sweep's spec; {known}")
    return Override(text, ("spec", *parts), load_value(value_text, option))


def _split(path: str) -> list[str]:
    """`a.b\\.c` → ['a', 'b.c']: dots part the path, `\\.` is a dot in a key."""
    parts, current, i = [], "", 0
    while i < len(path):
        if path.startswith("\\.", i):
            current, i = current + ".", i + 2
        elif path[i] == ".":
            parts.append(current)
            current, i = "", i + 1
        else:
            current, i = current + path[i], i + 1
    return [*parts, current]


def _refused(option: str, message: str) -> SpecError:
    return SpecError(option, [Problem((), message)])


def apply_overrides(data: Any, overrides: Sequence[Override], lines: LineMap) -> Any:
    """`data` (a parsed spec document) with `overrides` applied in order, each path's option noted in `lines`.
    `data` itself is left as it was: every mapping on an override's path is copied before it is changed (the same
    mapping may stand at several places of the document, through YAML aliases). `SpecError` naming the option
    for a path through a value that is not a mapping. A document that is not a mapping is left to validation."""
    if not overrides or not isinstance(data, Mapping):
        return data
    document: dict[Any, Any] = dict(data)
    for override in overrides:
        node = document
        for depth, key in enumerate(override.path[:-1]):
            child = node.get(key)
            if child is None:
                child = {}
            elif not isinstance(child, Mapping):
                where = ".".join(override.path[:depth + 1])
                raise _refused(override.option, f"{where} is {_short(child)}, not a mapping: nothing can be set "
                                                f"inside it (set {where} itself: --set {where}=VALUE)")
            node[key] = child = dict(child)
            node = child
        if override.value is None:
            node.pop(override.path[-1], None)
        else:
            node[override.path[-1]] = override.value
        lines.set_by(override.path, override.option)
    return document


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def value_at(document: Any, path: Sequence[str]) -> tuple[bool, Any]:
    """(True, the value at `path` of `document`), or (False, None) where there is none."""
    for key in path:
        if not isinstance(document, Mapping) or key not in document:
            return False, None
        document = document[key]
    return True, document
