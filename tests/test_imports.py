"""The package's imports point one way (docs/architecture.md): the import graph of kubesweep's modules, read from
their source (imports inside functions and `if TYPE_CHECKING:` blocks included: a cycle for the type checker is one
for a reader too), has no cycle besides the ones still to break, listed here; a new one fails this test, and so
does a listed one that is gone (strike it from the list).

Every module stands on a floor (`FLOORS`) and imports only modules on its own floor or below: an import that runs
up a floor fails the test, naming the importing file, the module it imports and both floors, and so does a module
no floor holds. The floors, from the bottom:

0. the contracts (`wire`): what the job, the backends, the operator and the reports agree on; nothing of theirs.
1. the documents and the job: the spec (`spec`), the GPU catalog, the images (`images`), and `jobs`, which runs in
   a trial's pod with the `job` extra only.
2. the planner and the renderers: a `Sweep` into trials, Jobs and the CRD, pure functions of the documents.
3. the backends: where a plan's trials run.
4. tracking and results: what ran, read back from MLflow, results files and a backend's status.
5. what drives the backends: the operator, the searches (`tune`) and the factory that makes a backend by name
   (a kubernetes backend may be the operator's client).
6. one command's work: the session, the checks before a submit, detached drivers.
7. the front (`cli`): what the CLI shows and the CLI itself (its option table, whose `--backend` choices are the
   registered backends'), and every `__main__` (an entry point, which nothing imports).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "kubesweep"
STILL_TO_BREAK: list[set[str]] = []
# Each module's floor: its own entry, else its package's (the longest entry that is a prefix of it, at a dot).
FLOORS: dict[str, int] = {
    "kubesweep": 0,  # the package's version only
    "kubesweep.wire": 0,
    "kubesweep.jobs": 1,
    "kubesweep.sweep_spec": 1,
    "kubesweep.gpus": 1,
    "kubesweep.images": 1,
    "kubesweep.plan": 2,
    "kubesweep.manifests": 2,
    "kubesweep.crd": 2,
    "kubesweep.backends": 3,
    "kubesweep.tracking": 4,
    "kubesweep.results": 4,
    "kubesweep.operator": 5,
    "kubesweep.tune": 5,
    "kubesweep.backend_factory": 5,
    "kubesweep.session": 6,
    "kubesweep.preflight": 6,
    "kubesweep.detach": 6,
    "kubesweep.cli": 7,
    "kubesweep.__main__": 7,
    "kubesweep.jobs.__main__": 7,
    "kubesweep.operator.__main__": 7,
    "kubesweep.tune.__main__": 7,
}
# Imports that still run up a floor, each to go: (importer, imported). A listed one that is gone fails the test.
STILL_UPWARD: set[tuple[str, str]] = set()


def _name(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    modules = {_name(p, package): p for p in package.rglob("*.py")}
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
    assert not [m for m in graph["kubesweep.jobs.runner"] if m.startswith("kubesweep.jobs.forkserver")]


def floor_of(module: str, floors: dict[str, int] = FLOORS) -> int | None:
    """The module's floor: its own entry, else that of the longest entry it lies under (the package itself,
    `kubesweep`, holds only its `__init__`); None when none holds it."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        floor = floors.get(".".join(parts[:n]))
        if floor is not None and (n > 1 or n == len(parts)):
            return floor
    return None


def upward_imports(graph: dict[str, set[str]], floors: dict[str, int] = FLOORS,
                   package: Path = PACKAGE) -> list[str]:
    """One line per import that runs up a floor: the importing file, the module it imports, both floors."""
    found = []
    for module in sorted(graph):
        here = floor_of(module, floors)
        for dep in sorted(graph[module]):
            there = floor_of(dep, floors)
            if here is not None and there is not None and there > here:
                found.append(f"{_file(module, package)} (floor {here}) imports {dep} (floor {there})")
    return found


def _file(module: str, package: Path) -> str:
    path = package.parent.joinpath(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    return str(path.relative_to(package.parent))


def test_the_cycle_finder_finds_a_cycle_and_only_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_every_module_has_a_floor() -> None:
    assert [m for m in sorted(import_graph()) if floor_of(m) is None] == []
    assert floor_of("kubesweep.wire.tags") == 0 and floor_of("kubesweep.jobs.__main__") == 7
    assert floor_of("kubesweep.specs") is None  # a prefix counts at a dot only
    assert floor_of("kubesweep.new_module") is None and floor_of("kubesweep") == 0


def test_no_import_runs_up_a_floor() -> None:
    graph = import_graph()
    without_listed = {m: {d for d in deps if (m, d) not in STILL_UPWARD} for m, deps in graph.items()}
    up = upward_imports(without_listed)
    assert not up, "imports that run up a floor (docs/architecture.md, \"Imports point one way\"):\n" + "\n".join(up)
    gone = sorted((m, d) for m, d in STILL_UPWARD
                  if d not in graph.get(m, set()) or (floor_of(d) or 0) <= (floor_of(m) or 0))
    assert not gone, f"upward imports gone, still listed in STILL_UPWARD: {gone}"


def test_the_floor_check_names_a_planted_upward_import(tmp_path: Path) -> None:
    """A module of a small package on floor 0 that imports one on floor 2, inside a function: named, with its
    file and both floors; the same import downward is not."""
    package = tmp_path / "kubesweep"
    (package / "wire").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "wire" / "__init__.py").write_text("")
    (package / "wire" / "tags.py").write_text("def late() -> None:\n    import kubesweep.cli\n")
    (package / "cli.py").write_text("from kubesweep.wire import tags\n")
    floors = {"kubesweep": 0, "kubesweep.wire": 0, "kubesweep.cli": 2}
    graph = import_graph(package)
    assert graph["kubesweep.wire.tags"] == {"kubesweep.cli"} and graph["kubesweep.cli"] == {"kubesweep.wire.tags"}
    assert upward_imports(graph, floors, package) == [
        "kubesweep/wire/tags.py (floor 0) imports kubesweep.cli (floor 2)"]
    (package / "wire" / "tags.py").write_text(  # for the type checker only: it counts all the same
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from kubesweep import cli\n")
    assert upward_imports(import_graph(package), floors, package) == [
        "kubesweep/wire/tags.py (floor 0) imports kubesweep.cli (floor 2)"]


def backend_probes(package: Path = PACKAGE) -> list[str]:
    """One line per `getattr(<a name that says backend>, ...)` in the package's modules (`backend`,
    `self.backend`, `self._backend`, ...): a capability found by probing, where the `Backend` contract declares
    each with its default (docs/architecture.md, "One backend contract")."""
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in {
                    "getattr", "hasattr"} and node.args and "backend" in _last_name(node.args[0]):
                found.append(f"{path.relative_to(package.parent)}:{node.lineno}: {ast.unparse(node)}")
    return found


def _last_name(node: ast.expr) -> str:
    """The name an expression ends in (`self._backend`: `_backend`; a call or subscript: none), as spelled (torch's
    `SDPBackend` is a class of attention kernels, not a backend of kubesweep's)."""
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def test_no_module_probes_a_backend_with_getattr() -> None:
    probes = backend_probes()
    assert not probes, "a backend probed for a capability the `Backend` contract should declare:\n" + "\n".join(probes)


def test_the_probe_check_names_a_planted_probe(tmp_path: Path) -> None:
    """A probe of a backend is named with its file and line, whatever the name it is held by; an option named
    `backend` and torch's `SDPBackend` are not backends."""
    package = tmp_path / "kubesweep"
    package.mkdir()
    (package / "records.py").write_text(
        "def f(backend, self):\n"
        "    reader = getattr(backend, 'results', None)\n"
        "    return hasattr(self._backend, 'parent_run_id'), getattr(self.args, 'backend', None), \\\n"
        "        getattr(SDPBackend, 'FLASH')\n")
    assert backend_probes(package) == [
        "kubesweep/records.py:2: getattr(backend, 'results', None)",
        "kubesweep/records.py:3: hasattr(self._backend, 'parent_run_id')"]
