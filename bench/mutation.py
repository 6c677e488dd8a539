"""Mutation testing of the pure core: how many small changes to its code the fast unit tests catch.

mutmut (3.x, the `dev` extra) changes one thing at a time in the modules of `MODULES` (an operator, a constant, a
keyword argument, a returned value) and runs the fast tests that reach the changed function; a change no test fails
on ("a survivor") is a promise of the code that no test holds. The run works in a copy of the tree
(`build/mutation/`), so the checkout is never touched, and writes its score per module, with every survivor, to
`bench/results/mutation.json` and `bench/results/mutation.md` (the survivors' explanations come from
`EXPLAINED`).

    python bench/mutation.py                      # the whole run (about an hour of CPU on two cores)
    python bench/mutation.py kubesweep/plan.py    # some modules only (the results cover those)
    python bench/mutation.py --report             # rewrite the results from the last run, running nothing

`make mutation` runs it; it is not part of `make test`.
"""

from __future__ import annotations

import argparse
import ast
import configparser
import difflib
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "build" / "mutation"
RESULTS = ROOT / "bench" / "results"

# The pure core: the modules a user's promises rest on, with no cluster, server or GPU behind them.
MODULES = [
    "kubesweep/plan.py",
    "kubesweep/sweep_spec/model.py",
    "kubesweep/wire/config.py",
    "kubesweep/tracking/intervals.py",
    "kubesweep/tune/repeats.py",
    "kubesweep/tracking/busy.py",
    "kubesweep/tracking/records.py",
    "kubesweep/cli/terminal_text.py",
    "kubesweep/wire/handover.py",
    "kubesweep/operator/ownership.py",
]
# The fast tests of those modules (`make unit`'s markers); mutmut runs, for each mutant, those that reach it.
TESTS = [
    "tests/test_plan.py",
    "tests/test_plan_count.py",
    "tests/test_plan_ids.py",
    "tests/sweep_spec/test_spec.py",
    "tests/wire/test_config.py",
    "tests/wire/test_config_bounds.py",
    "tests/tracking/test_intervals.py",
    "tests/tracking/test_intervals_edges.py",
    "tests/tune/test_repeats.py",
    "tests/tune/test_repeats_target.py",
    "tests/tracking/test_busy.py",
    "tests/tracking/test_busy_gpus.py",
    "tests/tracking/test_records.py",
    "tests/tracking/test_records_limits.py",
    "tests/cli/test_terminal_text.py",
    "tests/cli/test_terminal_text_chunks.py",
    "tests/cli/test_terminal_text_plain.py",
    "tests/wire/test_handover.py",
    "tests/wire/test_handover_escape.py",
    "tests/wire/test_handover_limits.py",
    "tests/operator/test_ownership.py",
    "tests/operator/test_ownership_key.py",
]
FAST = "not cluster and not realnode and not images and not browser and not gpu and not slow"

# Survivors looked at: mutant name (a glob) -> why. "equivalent: ..." where no input tells the mutant from the code
# (it counts apart in the score); "open: ..." for one a test could kill, with what stands in the way. A survivor
# missing here is listed as open.
EXPLAINED: dict[str, str] = {
    "kubesweep.sweep_spec.model.x__job_axis_type__mutmut_*": "equivalent for this tool: runs once, at import, to "
    "build the Matrix model; mutmut switches a mutant on per test in a process that imported the module unchanged",
    "kubesweep.sweep_spec.model.x__axis_types__mutmut_*": "equivalent for this tool: runs once, at import (as above)",
    "kubesweep.operator.ownership.x_sealed_for__mutmut_7": "equivalent: a missing seal compared as '' or 'XXXX' "
    "matches no 64-hex-digit HMAC either way",
    "kubesweep.operator.ownership.x_seal__mutmut_[567]": "open: the seal's message (its domain tag and separator) "
    "is pinned only by a known seal value; the seal is being bound to the experiment's creation time, pin it then",
    "kubesweep.tracking.busy.x_gpu_busy__mutmut_7": "equivalent: widest starts at 0 or 1, and the GPUs are "
    "max(devices, widest, 1) either way",
    "kubesweep.tracking.busy.x_gpu_busy__mutmut_55": "equivalent: max(devices, widest) >= 1 wherever there is a "
    "wall (a trial of world >= 1)",
    "kubesweep.wire.handover.xǁWorkerEventǁline__mutmut_*": "open: the event line's exact text (key order, "
    "rounding) is read back by parse_event only; the line's separator is changing, pin its text after that",
    "kubesweep.sweep_spec.model.xǁSweepǁproblem__mutmut_*": "open: reached through kubesweep.preflight only, whose "
    "tests are not among this run's",
}


def _explained(name: str) -> str | None:
    return next((why for pattern, why in EXPLAINED.items() if fnmatch.fnmatch(name, pattern)), None)

# mutmut's exit codes of a mutant's test run (mutmut.stats)
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped", 36: "timeout",
          24: "timeout", -24: "timeout", 152: "timeout", 255: "timeout", 37: "caught by type check",
          None: "not checked"}


def _setup() -> None:
    """The copy mutmut works in: the package, the tests, the project file and mutmut's settings (every module of
    MODULES is mutated in the copy, whichever a run judges: mutmut puts a module it does not mutate back as it
    is)."""
    WORK.mkdir(parents=True, exist_ok=True)
    # the tracked files (tests read the specs, the chart, the docs), the benchmarks' results left out
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
    files = [f for f in tracked.stdout.split("\0") if f and not f.startswith(("bench/results/", ".ci/"))]
    for name in {f.split("/")[0] for f in files if "/" in f}:
        shutil.rmtree(WORK / name, ignore_errors=True)
    for name in files:
        if (ROOT / name).is_file():
            (WORK / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, WORK / name)
    for name in TESTS:  # new test files not yet committed
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, WORK / name)
    top = sorted({f.split("/")[0] for f in files} - {"kubesweep", "tests", "pyproject.toml"})
    settings = configparser.ConfigParser()
    settings["mutmut"] = {
        "source_paths": "kubesweep",
        "only_mutate": "\n" + "\n".join(MODULES),
        "pytest_add_cli_args_test_selection": "\n" + "\n".join(t for t in TESTS if (ROOT / t).exists()),
        "pytest_add_cli_args": "\n-m\n" + FAST + "\n-p\nno:cacheprovider\n-p\nno:xdist",
        "also_copy": "\n" + "\n".join(top),
        "use_git_change_detection": "false",
    }
    with (WORK / "setup.cfg").open("w") as out:
        settings.write(out)


def _codes(module: str) -> dict[str, int | None]:
    meta = WORK / "mutants" / (module + ".meta")
    return json.loads(meta.read_text())["exit_code_by_key"] if meta.exists() else {}  # type: ignore[no-any-return]


def run(modules: list[str], children: int, pending: bool) -> float:
    """mutmut over `modules`: every mutant not yet judged; with `pending`, again every one not killed (after new
    tests: mutmut keeps a verdict, and would not run a survivor again)."""
    _setup()
    if pending:
        names = [name for module in modules for name, code in _codes(module).items()
                 if STATUS.get(code, "suspicious") not in ("killed", "caught by type check")]
        if not names:
            return 0.0
    else:  # every mutant of the modules named (all of them: those not yet judged)
        names = [module.removesuffix(".py").replace("/", ".") + ".*" for module in modules if modules != MODULES]
    # the copy's package, not the checkout's, is the one under test
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != ROOT]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", str(children), *names], cwd=WORK,
                   env=env, check=False)
    return time.monotonic() - t0


def _functions(module: str) -> dict[str, str]:
    """The functions of the mutated copy of `module` by name (mutmut's trampolined originals and mutants)."""
    source = (WORK / "mutants" / module).read_text()
    return {node.name: ast.get_source_segment(source, node) or "" for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}


def _diff(functions: dict[str, str], name: str) -> str:
    """The lines a mutant changed, `- old / + new`."""
    mutant = name.rsplit(".", 1)[-1]
    orig = mutant.rsplit("__mutmut_", 1)[0] + "__mutmut_orig"
    original = functions.get(orig, "").replace(orig, "f").splitlines()
    changed = functions.get(mutant, "").replace(mutant, "f").splitlines()
    lines = [line for line in difflib.unified_diff(original, changed, lineterm="", n=0)
             if line.startswith(("-", "+")) and not line.startswith(("---", "+++"))]
    return " / ".join(line[0] + " " + line[1:].strip() for line in lines)


def report(modules: list[str], seconds: float | None) -> dict[str, Any]:
    per_module: dict[str, Any] = {}
    for module in modules:
        codes = _codes(module)
        if not codes:
            per_module[module] = {"run": False}
            continue
        counts: dict[str, int] = {}
        survivors = []
        functions = _functions(module)
        for name, code in sorted(codes.items()):
            status = STATUS.get(code, "suspicious")
            counts[status] = counts.get(status, 0) + 1
            if status in ("survived", "no tests", "suspicious"):
                survivors.append({"mutant": name, "status": status, "diff": _diff(functions, name),
                                  "explained": _explained(name)})
        judged = sum(v for k, v in counts.items() if k not in ("not checked", "skipped"))
        killed = counts.get("killed", 0) + counts.get("caught by type check", 0) + counts.get("timeout", 0)
        equivalent = sum(1 for s in survivors if (s["explained"] or "").startswith("equivalent"))
        per_module[module] = {"run": True, "mutants": len(codes), "judged": judged, "counts": counts, "killed": killed,
                              "equivalent": equivalent, "score": round(killed / judged, 4) if judged else None,
                              "score_without_equivalent": round(killed / (judged - equivalent), 4)
                              if judged - equivalent else None,
                              "survivors": survivors}
    ran = [m for m in per_module.values() if m["run"]]
    mutants = sum(m["mutants"] for m in ran)
    total = sum(m["judged"] for m in ran)  # the mutants a run has judged (not those left unrun)
    killed = sum(m["killed"] for m in ran)
    equivalent = sum(m["equivalent"] for m in ran)
    return {"tool": _version(), "modules": per_module, "mutants": mutants, "judged": total, "killed": killed,
            "equivalent": equivalent, "score": round(killed / total, 4) if total else None,
            "score_without_equivalent": round(killed / (total - equivalent), 4) if total - equivalent else None,
            "seconds": None if seconds is None else round(seconds), "tests": TESTS, "markers": FAST}


def _version() -> str:
    from importlib.metadata import version

    return f"mutmut {version('mutmut')}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def write(result: dict[str, Any]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "mutation.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    lines = ["# Mutation score of the pure core", "",
             f"`python bench/mutation.py` ({result['tool']}, fast tests: `-m \"{result['markers']}\"`). "
             f"Killed: {result['killed']} of the {result['judged']} mutants judged ({_pct(result['score'])}; "
             f"{result['mutants'] - result['judged']} of {result['mutants']} not yet run); "
             f"{result['equivalent']} survivors explained as equivalent "
             f"({_pct(result['score_without_equivalent'])} of the others killed).", "",
             "| module | mutants | killed | survived | no tests | timeout | not run | equivalent | score |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for module, m in result["modules"].items():
        if not m["run"]:
            lines.append(f"| `{module}` | not run | | | | | | | |")
            continue
        c = m["counts"]
        lines.append(f"| `{module}` | {m['mutants']} | {m['killed']} | {c.get('survived', 0)} | "
                     f"{c.get('no tests', 0)} | {c.get('timeout', 0)} | {c.get('not checked', 0)} | "
                     f"{m['equivalent']} | {_pct(m['score'])} |")
    lines += ["", "## Survivors", ""]
    for m in result["modules"].values():
        for s in m.get("survivors", []):
            why = s["explained"] or "open"
            lines.append(f"- `{s['mutant']}` ({s['status']}): `{s['diff']}` — {why}")
    (RESULTS / "mutation.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("modules", nargs="*", help="modules to mutate (default: all of MODULES)")
    parser.add_argument("--report", action="store_true", help="only rewrite the results from the last run")
    parser.add_argument("--pending", action="store_true",
                        help="run again the mutants of the last run that no test killed (after adding tests)")
    parser.add_argument("--children", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    args = parser.parse_args()
    modules = args.modules or MODULES
    if unknown := sorted(set(modules) - set(MODULES)):
        parser.error(f"not a module of the pure core: {', '.join(unknown)} (MODULES: {', '.join(MODULES)})")
    seconds = None if args.report else run(modules, args.children, args.pending)
    result = report(MODULES, seconds)
    write(result)
    print(f"mutation score {_pct(result['score'])}: {result['killed']} of {result['judged']} judged killed "
          f"(bench/results/mutation.md)")


if __name__ == "__main__":
    main()
