"""The package's imports point one way (docs/architecture.md): the import graph of kubesweep's modules, read from
their source (imports inside functions and `if TYPE_CHECKING:` blocks included: a cycle for the type checker is one
for a reader too), has no cycle besides the ones still to break, listed here; a new one fails this test, and so
does a listed one that is gone (strike it from the list)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "kubesweep"
STILL_TO_BREAK = [
    {"kubesweep.backends.base", "kubesweep.plan", "kubesweep.tune.maxbatch"},
    {"kubesweep.detach", "kubesweep.session"},
]


def _name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    modules = {_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("kubesweep"):
                module = node.module or ""
                deps.update(f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module for a in node.names)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.startswith("kubesweep"))
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The graph's strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def test_the_cycle_finder_finds_a_cycle_and_only_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_but_those_still_to_break() -> None:
    found = cycles(import_graph())
    new = [sorted(c) for c in found if c not in STILL_TO_BREAK]
    assert not new, f"new import cycles: {new}"
    gone = [sorted(c) for c in STILL_TO_BREAK if c not in found]
    assert not gone, f"broken cycles still listed in STILL_TO_BREAK: {gone}"


def test_the_job_runs_without_the_fork_server_or_the_cli() -> None:
    """The job's own modules form no cycle (jobs cli -> runner -> forkserver -> cli was one)."""
    graph = import_graph()
    assert not [c for c in cycles(graph) if any(m.startswith("kubesweep.jobs") for m in c)]
    assert "kubesweep.jobs.forkserver" not in graph["kubesweep.jobs.runner"]
