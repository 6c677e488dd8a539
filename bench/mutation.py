"""Mutation testing of the pure core: how many small changes to its code the fast unit tests catch.

mutmut (3.x, the `dev` extra) changes one thing at a time in the modules of `MODULES` (an operator, a constant, a
keyword argument, a returned value) and runs the fast tests that reach the changed function; a change no test fails
on ("a survivor") is a promise of the code that no test holds. Each module is judged in a copy of the tree of its
own (`build/mutation/<module>/`), so the checkout is never touched, with its own tests only (`TESTS`), one mutant at
a time by default; the score per module, with every survivor, goes to `bench/results/mutation.json` and
`bench/results/mutation.md` after each module (the survivors' explanations come from `EXPLAINED`).

    python bench/mutation.py                      # every module (the results say how long it took)
    python bench/mutation.py kubesweep/plan.py    # some modules only (the results keep the others')
    python bench/mutation.py --pending            # after new tests: the survivors not explained as equivalent
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

# The pure core: the modules a user's promises rest on, with no cluster, server or GPU behind them, each with the fast
# tests that hold its promises (`make unit`'s markers). Each module is judged in a copy of its own with only its own
# tests: mutmut runs, for each mutant, those of them that reach the changed function (fastest first, up to the first
# failure), so a survivor costs its module's tests, not every test of the core (the sweeps that tune/repeats' tests
# run would otherwise run for every surviving mutant of the planner).
TESTS: dict[str, list[str]] = {
    "kubesweep/plan.py": ["tests/test_plan.py", "tests/test_plan_count.py", "tests/test_plan_ids.py",
                          "tests/sweep_spec/test_spec.py"],
    "kubesweep/sweep_spec/model.py": ["tests/sweep_spec/test_spec.py", "tests/sweep_spec/test_overrides.py",
                                      "tests/test_preflight.py", "tests/images/test_lock.py"],
    "kubesweep/wire/config.py": ["tests/wire/test_config.py", "tests/wire/test_config_bounds.py",
                                 "tests/sweep_spec/test_spec.py"],
    "kubesweep/tracking/intervals.py": ["tests/tracking/test_intervals.py", "tests/tracking/test_intervals_edges.py"],
    "kubesweep/tune/repeats.py": ["tests/tune/test_repeats.py", "tests/tune/test_repeats_target.py"],
    "kubesweep/tracking/busy.py": ["tests/tracking/test_busy.py", "tests/tracking/test_busy_gpus.py"],
    "kubesweep/tracking/records.py": ["tests/tracking/test_records.py", "tests/tracking/test_records_limits.py"],
    "kubesweep/cli/terminal_text.py": ["tests/cli/test_terminal_text.py", "tests/cli/test_terminal_text_chunks.py",
                                   "tests/cli/test_terminal_text_plain.py"],
    "kubesweep/wire/handover.py": ["tests/wire/test_handover.py", "tests/wire/test_handover_escape.py",
                                   "tests/wire/test_handover_limits.py"],
    "kubesweep/operator/ownership.py": ["tests/operator/test_ownership.py", "tests/operator/test_ownership_key.py",
                                        "tests/operator/test_mlflow_rest_refusal.py"],
}
MODULES = list(TESTS)
FAST = "not cluster and not realnode and not images and not browser and not gpu and not slow"

# Survivors looked at: mutant name (a glob) -> why. "equivalent: ..." where no input tells the mutant from the code
# (it counts apart in the score); "open: ..." for one a test could kill, with what stands in the way. A survivor
# missing here is listed as open.
EXPLAINED: dict[str, str] = {
    # kubesweep/plan.py
    "kubesweep.plan.x__tune_budget__mutmut_5": "equivalent: the spec refuses a choice without values and values on "
    "any other type, so `choice and values` and `choice or values` pick the same dimensions",
    "kubesweep.plan.x_candidates__mutmut_2": "equivalent: low >= 1, so for a step of 1 the multiples' start, "
    "max(1, low), is low",
    "kubesweep.plan.x_max_batch_probes__mutmut_2": "equivalent: low >= 1 (as for candidates)",
    "kubesweep.plan.x_next_probes__mutmut_5": "equivalent: a gap of 0 makes k 0, so no probe either way",
    "kubesweep.plan.xǁ_Gridǁ_none_after__mutmut_[278]": "equivalent in what is planned: the look-ahead only spares "
    "the walk prefixes with no cell below them (a walk without it yields the same cells, later)",
    "kubesweep.plan.xǁ_Gridǁlower_bound__mutmut_1": "equivalent: lower_bound is asked only when counting gave up, "
    "which a sweep whose every cell is excluded never does (total() is 0 at once)",
    "kubesweep.plan.xǁ_Gridǁlower_bound__mutmut_13": "equivalent in outcome: asked only for a product over the "
    "limit, which is refused either way; a bound of 1 for 0 changes which refusal words it, and only where the "
    "limit is below the repeats",
    "kubesweep.plan.x_make_trial__mutmut_9": "equivalent: a copy of the job with no update equals the job",
    "kubesweep.plan.x_trial_id__mutmut_1[2467]": "equivalent: every JobConfig value is a JSON value (strings, "
    "numbers, booleans, lists, mappings), which model_dump gives alike in python and json mode (and in a mode it "
    "does not know, which it takes as python)",
    "kubesweep.plan.x_plan__mutmut_6": "equivalent: budgets=None is false, as False is",
    "kubesweep.plan.x__count_capped__mutmut_1[12]": "equivalent in what is counted: the look-ahead only spares the "
    "walk work, and one past its budget turns itself off at once",
    "kubesweep.plan.xǁ_Gridǁ_walk__mutmut_15": "equivalent in what is planned: a look-ahead asked of no rules "
    "never prunes, so the walk yields the same cells, later",
    "kubesweep.plan.x_cells__mutmut_[35]": "equivalent in what is planned: the walk's look-ahead without a budget "
    "takes longer on overlapping rules, and yields the same cells",
    "kubesweep.plan.x_cells__mutmut_{9,12,13}": "equivalent: a cell's values are as many as the matrix's names, "
    "so zip's strict check never fails",
    "kubesweep.plan.x_most_nodes__mutmut_{8,15}": "equivalent: the Matrix and include cell models have every axis "
    "as a field (None when not named), so getattr needs no default",
    "kubesweep.plan.x__unique_names__mutmut_9": "equivalent: an id is ID_LENGTH characters, so the whole id "
    "([:None]) and its first ID_LENGTH are one",
    "kubesweep.plan.x_trial_name__mutmut_23": "equivalent: the name is lowered whole, so 'INF' is 'inf'",
    "kubesweep.plan.x_plan__mutmut_99": "open: reached only when two trials' names collide (8 hex digits of their "
    "ids alike) in a plan given a catalog other than the shipped one; no sweep small enough for a test has such a "
    "collision, and _unique_names' own test passes its catalog",
    "kubesweep.plan.xǁ_Gridǁ__init____mutmut_{17,23,29,30}": "equivalent: the spec refuses an exclude rule "
    "naming an axis outside the matrix or no axis; a value of no cell makes a rule that matches nothing either "
    "way (dropped, or kept and never met)",
    "kubesweep.plan.xǁ_Gridǁtotal__mutmut_[13]": "equivalent: everything is excluded only by a rule naming no "
    "axis, which the spec refuses",
    "kubesweep.plan.xǁ_Gridǁ__init____mutmut_{9,62,63}": "equivalent in what is counted: everything_excluded None "
    "is false as False is; the look-ahead (on, off or None) only spares the walk work",
    "kubesweep.plan.xǁ_Gridǁ__init____mutmut_51": "equivalent: one more 1 at the end of the suffix products is "
    "never read",
    "kubesweep.plan.xǁ_Gridǁ__init____mutmut_60": "equivalent: the step budget counted from 1 is one step less of "
    "an arbitrary budget (_COUNT_WORK); the budget's edge itself is tested",
    "kubesweep.plan.xǁ_Gridǁcount__mutmut_3": "equivalent: not reached (a rule ends at its last axis, so no active "
    "rule is left past the last one)",
    "kubesweep.plan.xǁ_Gridǁcount__mutmut_{5,6,32}": "equivalent in what is counted: without the memo the same count "
    "takes more steps",
    "kubesweep.plan.xǁ_Gridǁ_walk__mutmut_18": "open: the look-ahead asked one axis too early prunes only where "
    "no completion from the earlier axis matches either; the random specs of test_count_is_exact_on_random_specs "
    "(count against brute force) have not met such a case",
    "kubesweep.plan.x_trial_name__mutmut_{8,10,12,13}": "equivalent: compile is normalised to a mode of "
    "COMPILE_MODES, each with its mark, so the mark's fallback is never used",
    "kubesweep.plan.x_trial_name__mutmut_{39,55,56}": "equivalent: the name is lower case by then (a sweep's name is "
    "a DNS name, and the whole is lowered), so it holds no 'X' to strip",
    "kubesweep.plan.x_trial_name__mutmut_40": "equivalent: no room (0) cuts the sweep's name to '' either way",
    "kubesweep.plan.x_trial_name__mutmut_45": "equivalent: an empty prefix gives '-' + tail, whose dash the final "
    "strip('-') removes",
    # kubesweep/sweep_spec/model.py
    "kubesweep.sweep_spec.model.x__job_axis_type__mutmut_*": "equivalent for this tool: runs once, at import, to "
    "build the Matrix model; mutmut switches a mutant on per test in a process that imported the module unchanged",
    "kubesweep.sweep_spec.model.x__axis_types__mutmut_*": "equivalent for this tool: runs once, at import (as above)",
    "kubesweep.sweep_spec.model.xǁSweepǁimage_reference__mutmut_{8,9,10}": "equivalent: that branch is taken for a "
    "name of spec.images only, so get's default is never used",
    "kubesweep.sweep_spec.model.xǁSweepǁto_document__mutmut_*": "equivalent: no field of a Sweep has an alias or a "
    "value that is not JSON (so python and json mode dump alike), and exclude_defaults=False is model_dump's default",
    # kubesweep/wire/config.py
    "kubesweep.wire.config.x_gpu_type_of__mutmut_2": "equivalent: None as the text 'None' is read as no GPU type "
    "too (what earlier versions logged)",
    # kubesweep/cli/terminal_text.py
    "kubesweep.cli.terminal_text.x__escape__mutmut_{9,10}": "equivalent: the characters shown as escapes (format, line "
    "and paragraph separators, surrogates) include neither U+FFFF (unassigned) nor U+10000 (a letter)",
    # kubesweep/tune/repeats.py
    "kubesweep.tune.repeats.x_run_repeats__mutmut_[45]": "equivalent: the text of an assertion no caller can "
    "fail (each runs run_repeats only for a sweep with repeat_until)",
    "kubesweep.tune.repeats.x_run_repeats__mutmut_{73,74}": "open: the wait after a cancel while other trials still "
    "run; the test's cancel finds them all ended at once",
    "kubesweep.tune.repeats.x_run_repeats__mutmut_{14,78}": "open: the metric's direction decides only which leaders "
    "go first when the sweep's concurrency cannot give every wanting cell its repeat at once; the sweeps of "
    "test_repeats.py can (next_repeats' ordering by direction is tested on its own)",
    "kubesweep.tune.repeats.x_run_repeats__mutmut_{97,100,101}": "equivalent: one trial is made for each pick, so "
    "zip's strict check never fails",
    "kubesweep.tune.repeats.xǁ_Readerǁupdate__mutmut_28": "equivalent: samples_per_s is aggregate's default best_by",
    "kubesweep.tune.repeats.xǁ_Readerǁupdate__mutmut_31": "equivalent: the trials of one cell aggregate to one cell, "
    "so the first one or two are the same one",
    "kubesweep.tune.repeats.xǁ_Readerǁ_records__mutmut_*": "open: each repeat's figure read from MLflow, on a "
    "backend that keeps no results (Kubernetes); the fast tests run the local backend, which keeps them "
    "(tests/tune/test_repeats_cluster.py runs this path on the test cluster, not among the fast tests)",
    "kubesweep.tune.repeats.x_run_repeats__mutmut_54": "open: the reader's tracking is read only on a backend that "
    "keeps no results (as _Reader._records)",
    "kubesweep.tune.repeats.x_run_repeats__mutmut_{38,44}": "open: a resumed sweep's repeats added by an earlier "
    "run; the test's second run finds every cell decided, so it adds none whether it knows them or not",
    "kubesweep.tune.repeats.x__extend_known__mutmut_{1,10}": "open: as run_repeats' resumption (the earlier run's "
    "repeats): a test needs a sweep stopped while repeats were still wanted",
    "kubesweep.tune.repeats.x_run_repeats__mutmut_64": "open: the status handed to the progress callback; the fast "
    "tests pass no callback (the CLI's view does)",
    "kubesweep.tune.repeats.x_run_repeats__mutmut_{129,130}": "open: repeats.json logged to MLflow (as _log)",
    "kubesweep.tune.repeats.x_run_repeats__mutmut_{120,122,124}": "open: a search storage whose parent directory is "
    "missing; the tests' homes make it",
    "kubesweep.tune.repeats.x__key__mutmut_*": "open: a cell's key from its axes; the axes of one cell come in one "
    "order and hold JSON values in the tests' sweeps, so neither sort_keys nor default=str decides",
    "kubesweep.tune.repeats.x_next_repeats__mutmut_{4,5,12,14,29}": "open: the extra repeats in flight counted "
    "against the width, at its edges (a running cell at exactly the min, in flight equal to the width); the test of "
    "next_repeats has one cell in flight below the width",
    "kubesweep.tune.repeats.xǁCellRepeatsǁsummary__mutmut_23": "open in this run only: "
    "test_a_cell_about_a_zero_mean_has_no_finite_width_and_never_reaches_a_target fails on this change applied by "
    "hand, but mutmut did not map that test (added after its stats) to the function",
    "kubesweep.tune.repeats.x_run_repeats__mutmut_{110,112}": "open: the poll interval of the last wait, which in the "
    "tests' sweeps finds every trial ended and never sleeps; one still running at that point would need a "
    "sweep whose last repeat outlives every cell's decision",
    "kubesweep.tune.repeats.xǁ_Readerǁupdate__mutmut_{12,35,36}": "open: a cell whose records aggregate to none, and "
    "the GPU type a cell is grouped by; the sweeps of the tests are CPU sweeps of cells that all measure",
    "kubesweep.tune.repeats.x__log__mutmut_*": "open: repeats.json logged to the sweep's parent run in MLflow; the "
    "fast tests' sweeps are untracked (a tracked one needs the MLflow server of the slow tests)",
    "kubesweep.tune.repeats.x_run_repeats__mutmut_1": "equivalent: the default poll interval says only how often "
    "the sweep's state is read",
    # kubesweep/tracking/records.py
    "kubesweep.tracking.records.x_record_from_child__mutmut_35": "equivalent: a GPU count that is not a number "
    "is read as 1 either way",
    "kubesweep.tracking.records.x_record_from_status__mutmut_3": "equivalent: the trial file read beside the "
    "results is not used (the results name the job and the GPUs)",
    "kubesweep.tracking.records.x__trial_file__mutmut_10": "equivalent: a file of more than the limit is left out "
    "whether one byte or two past it are read",
    "kubesweep.tracking.records.x__trial_file__mutmut_8": "open: reading the whole file gives the same record; "
    "the bound only keeps a trial's file of gigabytes out of memory, which no fast test measures",
    "kubesweep.tracking.records.x_from_backend__mutmut_10": "open: a backend without trial directories "
    "(Kubernetes) is where the path would be None; reading its trials' states needs a cluster, which the fast "
    "tests have not",
    "kubesweep.tracking.records.x_from_mlflow__mutmut_2[2-6]": "open: a trial with a run whose backend still "
    "runs it (no outcome, phase not terminal) is shown in its phase; the fast test's backend has ended every "
    "trial, and one caught running needs a sweep stopped mid-run",
    # kubesweep/wire/handover.py
    "kubesweep.wire.handover.x_handed_ids__mutmut_3": "equivalent: 'XXXX' is not a trial id (they are lower case), "
    "so no annotation and an empty one hand over nothing either way",
    # kubesweep/operator/ownership.py
    "kubesweep.operator.ownership.x_sealed_for__mutmut_7": "equivalent: a missing seal compared as '' or 'XXXX' "
    "matches no 64-hex-digit HMAC either way",
    # kubesweep/tracking/busy.py
    "kubesweep.tracking.busy.x_gpu_busy__mutmut_7": "equivalent: widest starts at 0 or 1, and the GPUs are "
    "max(devices, widest, 1) either way",
    "kubesweep.tracking.busy.x_gpu_busy__mutmut_49": "equivalent: max(devices, widest) >= 1 wherever there is a "
    "wall (a trial of world >= 1)",
}


# Earlier scores, shown above the table.
HISTORY: list[str] = [
    "Before: the first run, with one test selection for the whole core, judged 953 of the 2,386 mutants in about "
    "an hour of the shared two-core machine and killed 800 (84.0%); 1,433 were not run (the whole was estimated at "
    "about four hours).",
    "",
    "First pass of this layout (each module with its own tests, one mutant at a time), before most of the tests "
    "written from its survivors: 1,723 of the 2,026 mutants judged killed (85.0%); plan 81.6% (998 s), "
    "tracking/records 80.7%, spec_model 47.4% (17 of its 30 survivors run only at import), tune/repeats 85.5% of "
    "the 193 judged in 1,182 s (its tests run local sweeps, and 20 mutants that loop ran to their timeout), 163 of "
    "its 356 left for later; every other module 95.4% or more. The survivors that a test could kill were then "
    "killed by new tests (the `tests:` commits that name the mutation run) and judged again (`--pending`); the "
    "table is the result.",
    "",
]


def _explained(name: str) -> str | None:
    """Why a survivor survives (EXPLAINED's patterns: fnmatch globs, `{a,b}` for alternatives)."""
    for pattern, why in EXPLAINED.items():
        head, brace, rest = pattern.partition("{")
        options, _, tail = rest.partition("}")
        if any(fnmatch.fnmatch(name, head + option + tail) for option in (options.split(",") if brace else [""])):
            return why
    return None

# mutmut's exit codes of a mutant's test run (mutmut.stats)
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped", 36: "timeout",
          24: "timeout", -24: "timeout", 152: "timeout", 255: "timeout", 37: "caught by type check",
          None: "not checked"}


def _work(module: str) -> Path:
    """The copy mutmut judges `module` in (build/mutation/kubesweep.plan, ...)."""
    return WORK / module.removesuffix(".py").replace("/", ".")


def _setup(module: str) -> None:
    """The copy mutmut works in for `module`: the tracked tree (tests read the specs, the chart, the docs), with
    mutmut's settings: only `module` mutated, only its tests run."""
    work = _work(module)
    work.mkdir(parents=True, exist_ok=True)
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
    files = [f for f in tracked.stdout.split("\0") if f and not f.startswith(("bench/results/", ".ci/"))]
    for name in {f.split("/")[0] for f in files if "/" in f}:
        shutil.rmtree(work / name, ignore_errors=True)
    for name in [*files, *TESTS[module]]:  # the module's test files, committed or not yet
        if (ROOT / name).is_file():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, work / name)
    top = sorted({f.split("/")[0] for f in files} - {"kubesweep", "tests", "pyproject.toml"})
    settings = configparser.ConfigParser()
    settings["mutmut"] = {
        "source_paths": "kubesweep",
        "only_mutate": module,
        "pytest_add_cli_args_test_selection": "\n" + "\n".join(TESTS[module]),
        "pytest_add_cli_args": "\n-m\n" + FAST + "\n-p\nno:cacheprovider\n-p\nno:xdist",
        "also_copy": "\n" + "\n".join(top),
        "use_git_change_detection": "false",
        # a mutant that loops is stopped after twice its tests' CPU time and 2 s, counted killed (a timeout)
        "timeout_multiplier": "2.0",
        "timeout_constant": "2.0",
    }
    with (work / "setup.cfg").open("w") as out:
        settings.write(out)


def _codes(module: str) -> dict[str, int | None]:
    meta = _work(module) / "mutants" / (module + ".meta")
    return json.loads(meta.read_text())["exit_code_by_key"] if meta.exists() else {}  # type: ignore[no-any-return]


def run(module: str, children: int, pending: bool) -> float:
    """mutmut over `module`: every mutant not yet judged (mutmut keeps each verdict, and judges again a mutant
    whose function changed); with `pending`, again every one not killed and not explained as equivalent (after
    new tests)."""
    _setup(module)
    names: list[str] = []
    if pending:
        names = [name for name, code in _codes(module).items()
                 if STATUS.get(code, "suspicious") not in ("killed", "caught by type check", "timeout")
                 and not (_explained(name) or "").startswith("equivalent")]
        if not names:
            return 0.0
    # the copy's package, not the checkout's, is the one under test
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != ROOT]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    mutmut = Path(sys.executable).with_name("mutmut")  # its script: `python -m mutmut` imports its main twice
    t0 = time.monotonic()
    subprocess.run([str(mutmut), "run", "--max-children", str(children), *names], cwd=_work(module), env=env,
                   check=False)
    return time.monotonic() - t0


def _functions(module: str) -> dict[str, str]:
    """The functions of the mutated copy of `module` by name (mutmut's trampolined originals and mutants)."""
    path = _work(module) / "mutants" / module
    if not path.exists():
        return {}
    source = path.read_text()
    lines = source.splitlines()
    return {node.name: "\n".join(lines[node.lineno - 1:node.end_lineno]) for node in ast.walk(ast.parse(source))
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


def _seconds(module: str) -> int | None:
    """The wall-clock seconds the runs over `module` took, all together."""
    timing = _work(module) / "seconds.json"
    return json.loads(timing.read_text()) if timing.exists() else None  # type: ignore[no-any-return]


def report(modules: list[str]) -> dict[str, Any]:
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
                              "seconds": _seconds(module), "tests": TESTS[module], "survivors": survivors}
    ran = [m for m in per_module.values() if m["run"]]
    mutants = sum(m["mutants"] for m in ran)
    total = sum(m["judged"] for m in ran)  # the mutants a run has judged (not those left unrun)
    killed = sum(m["killed"] for m in ran)
    equivalent = sum(m["equivalent"] for m in ran)
    return {"tool": _version(), "modules": per_module, "mutants": mutants, "judged": total, "killed": killed,
            "equivalent": equivalent, "score": round(killed / total, 4) if total else None,
            "score_without_equivalent": round(killed / (total - equivalent), 4) if total - equivalent else None,
            "seconds": sum(m["seconds"] or 0 for m in ran), "markers": FAST}


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
             f"({_pct(result['score_without_equivalent'])} of the others killed). "
             f"Its runs took {result['seconds'] / 60:.0f} minutes of wall time all together (the first pass and "
             "the `--pending` runs after new tests; the `seconds` column per module), one mutant at a time, each "
             "module with its own tests (the `tests` of `mutation.json`).", "", *HISTORY,
             "| module | mutants | killed | survived | no tests | timeout | not run | equivalent | score | seconds |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for module, m in result["modules"].items():
        if not m["run"]:
            lines.append(f"| `{module}` | not run | | | | | | | | |")
            continue
        c = m["counts"]
        lines.append(f"| `{module}` | {m['mutants']} | {m['killed']} | {c.get('survived', 0)} | "
                     f"{c.get('no tests', 0)} | {c.get('timeout', 0)} | {c.get('not checked', 0)} | "
                     f"{m['equivalent']} | {_pct(m['score'])} | {m['seconds'] or '-'} |")
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
                        help="run again the mutants of the last run that no test killed, but those explained as "
                        "equivalent (after adding tests)")
    parser.add_argument("--children", type=int, default=1, help="mutants judged at once (default 1)")
    args = parser.parse_args()
    modules = args.modules or MODULES
    if unknown := sorted(set(modules) - set(MODULES)):
        parser.error(f"not a module of the pure core: {', '.join(unknown)} (MODULES: {', '.join(MODULES)})")
    for module in [] if args.report else modules:  # one module at a time, the results written after each
        seconds = run(module, args.children, args.pending)
        timing = _work(module) / "seconds.json"
        spent = json.loads(timing.read_text()) if timing.exists() else 0
        timing.write_text(json.dumps(round(spent + seconds)))
        write(report(MODULES))
    result = report(MODULES)
    write(result)
    print(f"mutation score {_pct(result['score'])}: {result['killed']} of {result['judged']} judged killed "
          f"(bench/results/mutation.md)")


if __name__ == "__main__":
    main()
