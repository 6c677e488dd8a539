"""Reading a sweep spec: a file's bytes to one YAML document, within bounds, with the line of every field.

A spec is refused, with a `SpecError` line that names the file and, where there is one, the line, when it
- is larger than `MAX_SPEC_BYTES` (1 MiB; told from the file's size, before it is read),
- is not UTF-8 text, or not valid YAML, or not exactly one document,
- nests deeper than `MAX_DEPTH` levels,
- holds more than `MAX_NODES` YAML nodes (keys, values, lists and mappings, aliases counted as what they name),
- has aliases that add more than `MAX_ALIAS_NODES` nodes, or an alias inside the node it names,
- gives a key twice in one mapping (YAML would keep the last one silently).

The document is composed once, and every walk over it visits a node once however many aliases name it, so the
work is bounded by the limits above whatever the input. Numbers are read as YAML 1.2 reads them: `1e-4` and
`1.0e5` are floats (YAML 1.1, PyYAML's default, reads them as strings).

`kubesweep.sweep_spec` validates the document; this module knows nothing of its fields.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from yaml.events import AliasEvent

MAX_SPEC_BYTES = 1024 * 1024  # a spec file's size limit, 1 MiB
MAX_DEPTH = 64  # levels of nested mappings and lists
MAX_NODES = 50_000  # YAML nodes in a spec, aliases expanded
MAX_ALIAS_NODES = 10_000  # nodes that aliases add to a spec


@dataclass(frozen=True)
class Problem:
    path: tuple[str | int, ...]
    message: str
    line: int | None = None
    option: str | None = None  # the command-line option that set the value (`--set job.max_steps=0`), not a line

    @property
    def dotted(self) -> str:
        out = ""
        for part in self.path:
            if isinstance(part, int):
                out += f"[{part}]"
                continue
            text = part if len(part) <= 60 else part[:57] + "..."  # a key of any length
            out += f".{text}" if out else text
        return out or "<document>"


class SpecError(ValueError):
    """A spec that cannot be used. `str()` gives one `source:line: path: message` line per problem, the first
    SHOWN_PROBLEMS of them and how many more (a spec with 50,000 bad values is not 50,000 lines, nor a 12 MB
    status message)."""

    SHOWN_PROBLEMS = 20

    def __init__(self, source: str, problems: Sequence[Problem]):
        self.source = source
        self.problems = list(problems)
        super().__init__(self.format())

    def format(self) -> str:
        lines = []
        for p in self.problems[:self.SHOWN_PROBLEMS]:
            where = p.option or (f"{self.source}:{p.line}" if p.line else self.source)
            lines.append(f"{where}: {p.dotted}: {p.message}" if p.path else f"{where}: {p.message}")
        if len(self.problems) > self.SHOWN_PROBLEMS:
            more = len(self.problems) - self.SHOWN_PROBLEMS
            lines.append(f"{self.source}: ... and {more:,} more problem{'s' if more > 1 else ''}")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# Bytes to text


def read_spec_text(path: str | Path) -> str:
    """The text of the spec file at `path`; `SpecError` when it is missing, too large or not UTF-8 text."""
    source = str(path)
    try:
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            if size > MAX_SPEC_BYTES:
                raise _too_large(source, f"{size:,} bytes")
            data = file.read(MAX_SPEC_BYTES + 1)  # a pipe or a device has no size to check first
    except FileNotFoundError:
        raise SpecError(source, [Problem((), "file not found")]) from None
    except OSError as exc:
        raise SpecError(source, [Problem((), f"cannot read: {exc.strerror}")]) from None
    if len(data) > MAX_SPEC_BYTES:
        raise _too_large(source, f"more than {MAX_SPEC_BYTES:,} bytes")
    if b"\x00" in data:
        line = data.count(b"\n", 0, data.index(b"\x00")) + 1
        raise SpecError(source, [Problem((), "not a text file: it holds NUL bytes (a sweep spec is YAML text)",
                                         line)])
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise SpecError(source, [Problem((), f"not a text file: byte 0x{data[exc.start]:02x} at offset {exc.start} "
                                             "is not UTF-8 (a sweep spec is YAML text)", line)]) from None


def _too_large(source: str, size: str) -> SpecError:
    return SpecError(source, [Problem((), f"the file is {size}, over the limit of {MAX_SPEC_BYTES:,} bytes (1 MiB) "
                                          "for a sweep spec; nothing of it was read")])


# ---------------------------------------------------------------------------------------------------------
# Text to a document

_NULL_TAG = "tag:yaml.org,2002:null"
_FLOAT_TAG = "tag:yaml.org,2002:float"
# YAML 1.2's floats that YAML 1.1 reads as strings: an exponent with no dot (1e-4) or no sign (1.0e5)
_FLOAT_WITH_EXPONENT = re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$")


class _Refused(Exception):
    """A document past one of this module's bounds, at `mark`."""

    def __init__(self, message: str, mark: Any):
        super().__init__(message)
        self.message = message
        self.line: int | None = mark.line + 1 if mark is not None else None


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, composing within MAX_DEPTH, MAX_NODES and MAX_ALIAS_NODES.

    An alias is the node it names (PyYAML shares it), so a document is a graph that may be far smaller than
    the tree it stands for: the counts here are of that tree, and are exact. A node's extent (nodes, height)
    is known once it is composed; an alias to a node still being composed is a cycle.
    """

    def __init__(self, text: str):
        super().__init__(text)
        self.nodes = 0  # of the expanded tree so far
        self.alias_nodes = 0  # of those, the ones aliases add
        self.depth = 0  # of the node being composed (the root is at 1)
        self.heights: list[int] = []  # per open node, the height of its tallest child so far
        self.extents: dict[int, tuple[int, int]] = {}  # id(anchored node) -> (nodes, height)
        self.aliases: dict[tuple[int, int], int] = {}  # where an alias stands (see LineMap) -> its line

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event: Any = self.peek_event()  # type: ignore[no-untyped-call]
        if self.check_event(AliasEvent):
            # index: a sequence item's position, or a mapping value's key node
            where = (id(parent), index if isinstance(index, int) else id(index))
            self.aliases[where] = event.start_mark.line + 1
            return self._alias(event, super().compose_node(parent, index))
        self.depth += 1
        self.nodes += 1
        if self.depth > MAX_DEPTH:
            raise _Refused(f"nested more than {MAX_DEPTH} levels deep; a sweep spec needs a few", event.start_mark)
        if self.nodes > MAX_NODES:
            raise _Refused(f"more than {MAX_NODES:,} YAML nodes (keys, values, lists and mappings); a sweep spec "
                           "needs far fewer", event.start_mark)
        first = self.nodes
        self.heights.append(0)
        node = super().compose_node(parent, index)
        height = self.heights.pop() + 1
        self.depth -= 1
        if self.heights:
            self.heights[-1] = max(self.heights[-1], height)
        if event.anchor is not None:
            self.extents[id(node)] = (self.nodes - first + 1, height)
        return node

    def _alias(self, event: Any, node: yaml.Node | None) -> yaml.Node | None:
        name, mark = event.anchor, event.start_mark
        extent = self.extents.get(id(node))
        if extent is None:
            raise _Refused(f"the alias *{name} is inside the node it names (&{name}): a structure that holds itself",
                           mark)
        nodes, height = extent
        self.nodes += nodes
        self.alias_nodes += nodes
        if self.alias_nodes > MAX_ALIAS_NODES:
            raise _Refused(f"aliases expand to more than {MAX_ALIAS_NODES:,} nodes at *{name} ({nodes:,} nodes); "
                           "write the values out, or use fewer aliases", mark)
        if self.depth + height > MAX_DEPTH:
            raise _Refused(f"the alias *{name} nests the document more than {MAX_DEPTH} levels deep", mark)
        if self.nodes > MAX_NODES:
            raise _Refused(f"the alias *{name} takes the document past {MAX_NODES:,} YAML nodes", mark)
        if self.heights:
            self.heights[-1] = max(self.heights[-1], height)
        return node

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as exc:  # a date that is not one, an int of too many digits
            what = f"{_short(node.value)}: " if isinstance(node, yaml.ScalarNode) else ""
            raise yaml.constructor.ConstructorError(None, None, f"{what}{exc}", node.start_mark) from None


_Loader.add_implicit_resolver(_FLOAT_TAG, _FLOAT_WITH_EXPONENT, list("-+0123456789."))


def load_document(text: str, source: str) -> tuple[Any, LineMap]:
    """The one document in `text` and the line of each of its paths; `SpecError` when it is not one valid
    YAML document within the bounds, or when it gives a key twice."""
    loader = _Loader(text)
    try:
        try:
            nodes = []
            while loader.check_node():
                node = loader.get_node()
                if node is not None and not (isinstance(node, yaml.ScalarNode) and node.tag == _NULL_TAG):
                    nodes.append(node)
            if len(nodes) != 1:
                found = "no document" if not nodes else f"{len(nodes)} documents"
                raise SpecError(source, [Problem((), f"expected one Sweep document, found {found}")])
            duplicates = _duplicate_keys(nodes[0], (), set())
            if duplicates:
                raise SpecError(source, duplicates)
            lines = LineMap(nodes[0], loader.aliases)
            return loader.construct_document(nodes[0]), lines
        finally:
            loader.dispose()
    except _Refused as exc:
        raise SpecError(source, [Problem((), exc.message, exc.line)]) from None
    except yaml.YAMLError as exc:
        raise _not_yaml(source, exc) from None


def load_value(text: str, option: str) -> Any:
    """The one YAML scalar or flow value in `text` (a command line's `--set PATH=VALUE`: `200`, `2.0e-5`, `[16, 32]`,
    `{target: 3%, max: 10}`, a string), read as a spec file is, within its bounds; None for empty text. `SpecError`
    naming `option` (the option as typed) when it is not one such value."""
    if len(text.encode(errors="surrogatepass")) > MAX_SPEC_BYTES:
        raise SpecError(option, [Problem((), f"the value is over the limit of {MAX_SPEC_BYTES:,} bytes (1 MiB) for a "
                                             "sweep spec")])
    loader = _Loader(text)
    try:
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            if isinstance(node, yaml.CollectionNode) and not node.flow_style:
                raise SpecError(option, [Problem((), "expected one YAML value on the command line: a scalar (200, "
                                                     "true, a string) or a flow list or mapping ([16, 32], {max: 10}), "
                                                     "not a block one; quote a string that holds ': ' or '- '")])
            duplicates = _duplicate_keys(node, (), set())
            if duplicates:
                raise SpecError(option, [Problem((), f"{duplicates[0].dotted}: given twice; YAML would keep only the "
                                                     "last: give it once")])
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except _Refused as exc:
        raise SpecError(option, [Problem((), exc.message)]) from None
    except yaml.YAMLError as exc:
        raise _not_yaml(option, exc, lines=False) from None


def _not_yaml(source: str, exc: yaml.YAMLError, lines: bool = True) -> SpecError:
    mark = getattr(exc, "problem_mark", None)
    line = mark.line + 1 if mark is not None else None
    problem = getattr(exc, "problem", None) or str(exc)
    opened, context = getattr(exc, "context_mark", None), getattr(exc, "context", None) or ""
    if opened is not None and context.startswith("while parsing a flow ") and opened.line + 1 != line:
        # an unclosed `[` or `{`: the parser notices on a later line; the mistake is where it was opened
        kind = context.removeprefix("while parsing a ")
        problem = f"the {kind} opened here is not closed ({problem} on line {line})"
        line = opened.line + 1
    if not lines:  # a value on the command line: one line
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        if context.startswith("while parsing a flow "):
            problem = f"a '[' or '{{' is not closed ({problem})"
        elif "single document" in context:
            problem = "it holds more than one YAML document; give one value"
        return SpecError(source, [Problem((), f"not valid YAML: {problem}")])
    return SpecError(source, [Problem((), f"not valid YAML: {problem}", line)])


def _short(text: str) -> str:
    return repr(text) if len(text) <= 40 else repr(text[:37]) + "..."


def _key_name(key: yaml.Node) -> str | None:
    return key.value if isinstance(key, yaml.ScalarNode) else None


def _duplicate_keys(node: yaml.Node, path: tuple[str | int, ...], seen: set[int]) -> list[Problem]:
    """Keys given twice in one mapping: YAML keeps the last silently, so a second `matrix:` would replace the
    first. Each is reported at its second line, naming the first. A node aliases name is walked once."""
    if id(node) in seen:
        return []
    seen.add(id(node))
    problems: list[Problem] = []
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for key, value in node.value:
            name = _key_name(key)
            if name is not None and name != "<<":
                line = key.start_mark.line + 1
                if name in first:
                    problems.append(Problem((*path, name), f"given twice (lines {first[name]} and {line}); YAML "
                                                           "would keep only the last: merge them into one", line))
                else:
                    first[name] = line
            problems += _duplicate_keys(value, (*path, name if name is not None else "?"), seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, value in enumerate(node.value):
            problems += _duplicate_keys(value, (*path, i), seen)
    return problems


class LineMap:
    """Path → line number of each YAML node, so errors can point at the line; and path → the command-line option
    that set the value there (`options`: `--set job.max_steps=0`), which a problem at or under it names instead.

    A node is walked once, at its anchor; a path through an alias has the alias's line (`aliases`: the line of
    each alias by where it stands, (id(sequence), index) or (id(mapping), id(key node))).
    """

    def __init__(self, node: yaml.Node | None = None, aliases: Mapping[tuple[int, int], int] | None = None):
        self.lines: dict[tuple[str | int, ...], int] = {}
        self.options: dict[tuple[str | int, ...], str] = {}
        self.aliases = aliases or {}
        if node is not None:
            self._walk(node, (), node.start_mark.line + 1, set())

    def __eq__(self, other: object) -> bool:
        """Equal where they point at the same lines and options (a Sweep read back from where it was stored equals
        the one submitted); `aliases`, keyed by the parsed nodes' ids, is how they were found, not what they say."""
        if not isinstance(other, LineMap):
            return NotImplemented
        return self.lines == other.lines and self.options == other.options

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    def _walk(self, node: yaml.Node, path: tuple[str | int, ...], line: int, seen: set[int]) -> None:
        self.lines.setdefault(path, line)
        if id(node) in seen:
            return
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                name = _key_name(key)
                if name is None:
                    continue
                child = (*path, name)
                self.lines[child] = key.start_mark.line + 1
                where = self.aliases.get((id(node), id(key)), value.start_mark.line + 1)
                self._walk(value, child, where, seen)
        elif isinstance(node, yaml.SequenceNode):
            for i, value in enumerate(node.value):
                self._walk(value, (*path, i), self.aliases.get((id(node), i), value.start_mark.line + 1), seen)

    def line(self, path: tuple[str | int, ...]) -> int | None:
        for end in range(len(path), -1, -1):
            if path[:end] in self.lines:
                return self.lines[path[:end]]
        return None

    def set_by(self, path: tuple[str | int, ...], option: str) -> None:
        """The value at `path` is `option`'s (a later option replaces what an earlier one set under it)."""
        for known in [p for p in self.options if p[:len(path)] == path]:
            del self.options[known]
        self.options[path] = option

    def problem(self, path: tuple[str | int, ...], message: str) -> Problem:
        """A problem at `path`: named by the option that set its value (or a parent's), else by its line."""
        for end in range(len(path), -1, -1):
            if path[:end] in self.options:
                return Problem(path, message, None, self.options[path[:end]])
        return Problem(path, message, self.line(path))

    def copy(self) -> LineMap:
        other = LineMap()
        other.lines, other.options, other.aliases = dict(self.lines), dict(self.options), self.aliases
        return other


def too_deep(data: Any) -> tuple[str | int, ...] | None:
    """The path of the first value nested more than MAX_DEPTH levels deep in parsed data (a custom resource, a
    JSON document), or None. Iterative: any depth is answered without recursion."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(data, ())]
    while stack:
        value, path = stack.pop()
        if len(path) >= MAX_DEPTH:
            return path
        if isinstance(value, Mapping):
            stack.extend((v, (*path, str(k))) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, (*path, i)) for i, v in enumerate(value))
    return None
