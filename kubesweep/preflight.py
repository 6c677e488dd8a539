"""The checks a sweep passes before anything of it runs, for the backend it is meant for.

`sweep validate --backend B`, `sweep submit --backend B` and `sweep render` (Kubernetes) run the same checks, here
(`check`; the session layer's `Session.check`), after the spec has loaded and its plan is made and before any state
exists. A problem is a `NotRunnable`: a `SpecError` (exit 2), one `file:line: field: message` per problem.

- Every backend: the sweep makes a trial (its `exclude` rules, or the GPU capability rules, may remove every cell).
- a backend whose trials are processes of this machine (`Backend.runs_here`: local): the local paths its trials
  read exist (`dataset`, `model`, `tokenizer` starting with `/`, `.` or `~`; a relative one resolved against the
  spec file's directory, as the local backend resolves it), and the machine has a GPU its GPU trials can run on.
  With none of the spec's GPU types here (and no `--any-gpu`) nothing would run: refused, with the ways forward.
  With some of them here, the trials of the others are skipped as they run (`Skipped: gpu not present`), not
  refused. With `--any-gpu`, a machine without any NVIDIA GPU is refused.
- a backend on a cluster (`BackendConfig.asks_cluster`: kubernetes): an image its trials can run as
  (`manifests.image_problem`: named, built and locked, pinned). `check` asks no cluster: whether it can be
  reached is the backend's to say. What the cluster's nodes offer (`backends.k8s_gpus`) is split against the plan
  by `gpu_fit`, one line per GPU type (`fit_lines`), and where some trials cannot run, `fit_report` gives the ways
  forward as commands to type: only the types the cluster has (`--gpu`), or every trial (`--yes`; those no node
  can take end `unschedulable`).
"""

from __future__ import annotations

import math
import shlex
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubesweep.backend_factory import configure
from kubesweep.backends.local_machine import detect_gpus
from kubesweep.gpus import PRODUCT_LABEL, Catalog, load_catalog
from kubesweep.manifests import image_problem
from kubesweep.sweep_spec import Problem, SpecError, set_axes
from kubesweep.wire.config import PATH_SETTINGS, is_local_path, local_path

if TYPE_CHECKING:
    from kubesweep.backends.k8s_gpus import ClusterGpus
    from kubesweep.backends.local_machine import Device
    from kubesweep.plan import Plan
    from kubesweep.sweep_spec import Sweep

SMOKE_SPEC = "sweeps/smoke.yaml"  # the CPU sweep shipped with kubesweep


class NotRunnable(SpecError):
    """A valid spec that the chosen backend cannot run as it stands (exit 2, like any bad input)."""


def check(plan: Plan, backend: str, *, any_gpu: bool = False, allow_unpinned: bool = False,
          devices: Sequence[Device] | None = None, reach: Callable[[], object] | None = None) -> None:
    """Raise `NotRunnable` with every problem that keeps `backend` from running the plan (see the module).
    `devices`: this machine's GPUs (default: detected, `backends.local_machine.detect_gpus`). `reach`: for
    Kubernetes, raises when there is no cluster to run on (`submit`'s check): run once the spec has no problem of
    every backend's, before what it lacks for a cluster (its image), so that no cluster is said first."""
    sweep = plan.sweep
    config = configure(backend)
    problems = list(_no_trials(plan))
    if not problems and config.kind().runs_here:
        problems += _missing_paths(plan)
        problems += _no_gpu_here(plan, any_gpu, devices)
    if not problems and config.asks_cluster:
        if reach is not None:
            reach()
        problem = image_problem(sweep, allow_unpinned=allow_unpinned)
        if problem is not None:
            problems.append(sweep.problem(("spec", "image"), problem))
    if problems:
        raise NotRunnable(sweep.source, sorted(problems, key=lambda p: p.line or 0))


# -- every backend ----------------------------------------------------------------------------------------


def _no_trials(plan: Plan) -> Iterable[Problem]:
    """A sweep whose every cell is excluded or dropped has nothing to run (a search that makes its trials as it
    runs has none yet: not this)."""
    if plan.trials or plan.notes:
        return
    sweep, spec = plan.sweep, plan.sweep.spec
    if spec.exclude and not plan.dropped:
        product = math.prod(len(values) for values in set_axes(spec.matrix).values())
        rules = f"the {len(spec.exclude)} exclude rules" if len(spec.exclude) > 1 else "the exclude rule"
        yield sweep.problem(("spec", "exclude"), f"{rules} remove every cell of the matrix (all {product:,}): the "
                                                 "sweep has no trial to run; narrow or remove a rule")
        return
    reasons = Counter(d.reason for d in plan.dropped)
    reason, n = reasons.most_common(1)[0] if reasons else ("", 0)
    left = "every cell the exclude rules leave" if spec.exclude else "every cell"
    others = len(reasons) - 1
    more = f"; {others} other reason{'s' * (others > 1)}: `sweep plan {sweep.source}` lists them" if others else ""
    yield sweep.problem(("spec", "matrix"), f"{left} is dropped ({n} of {len(plan.dropped)}: {reason}{more}): the "
                                            "sweep has no trial to run")


# -- local ------------------------------------------------------------------------------------------------


def _missing_paths(plan: Plan) -> Iterable[Problem]:
    """Local paths the trials would read that are not directories here."""
    sweep = plan.sweep
    seen: set[tuple[str, str]] = set()
    for key, value in _path_settings(plan):
        if (key, value) in seen or not is_local_path(value):
            continue
        seen.add((key, value))
        path = local_path(value, sweep.base_dir)
        if path is None or path.is_dir():
            continue
        state = "is not a directory" if path.exists() else "does not exist"
        what = "a directory of GLUE TSVs (train.tsv, dev.tsv)" if key == "dataset" else \
            "a Hugging Face model directory"
        relative = "" if Path(value).expanduser().is_absolute() else \
            f" (relative to the spec file's directory, {sweep.base_dir.resolve()})"
        yield sweep.problem(_where(sweep, key, value),
                            f"{path} {state}: {value!r} names a local path{relative}, which should be {what}")


def _path_settings(plan: Plan) -> Iterable[tuple[str, str]]:
    """(setting, value) of each path setting the trials read: the planned trials', else (a search that makes
    its trials as it runs) the job section's and every value the matrix and include cells name."""
    if plan.trials:
        for trial in plan.trials:
            for key in PATH_SETTINGS:
                value = getattr(trial.config.job, key)
                if isinstance(value, str):
                    yield key, value
        return
    spec = plan.sweep.spec
    for key in PATH_SETTINGS:
        value = getattr(spec.job, key)
        if isinstance(value, str):
            yield key, value
        for cell in (spec.matrix, *spec.include):
            named = set_axes(cell).get(key)
            for v in named if isinstance(named, list) else [named]:
                if isinstance(v, str):
                    yield key, v


def _where(sweep: Sweep, key: str, value: Any) -> tuple[str | int, ...]:
    """The spec's field that gives `key` the value `value`: a matrix value, an include cell, else the job's."""
    spec = sweep.spec
    axis = set_axes(spec.matrix).get(key)
    if isinstance(axis, list) and value in axis:
        return ("spec", "matrix", key, axis.index(value))
    for i, cell in enumerate(spec.include):
        if set_axes(cell).get(key) == value:
            return ("spec", "include", i, key)
    return ("spec", "job", key)


def _no_gpu_here(plan: Plan, any_gpu: bool, devices: Sequence[Device] | None) -> Iterable[Problem]:
    """GPU trials that nothing on this machine can run: none of their GPU types here, or (`--any-gpu`) no GPU."""
    sweep = plan.sweep
    types, trials = _gpu_types(plan)
    if not types:
        return
    if devices is None:
        devices = detect_gpus()
    catalog = load_catalog()
    here = {d.product for d in devices}
    if any_gpu:
        if devices:
            return
        yield sweep.problem(_gpu_field(sweep), f"--any-gpu runs each GPU trial on whatever GPU this machine has, and "
                                               f"{_host(devices, catalog)}. "
                                               f"{_ways_forward(sweep, devices, catalog, any_gpu=True)}")
        return
    if any(catalog[t].product in here for t in types):
        return  # the trials of the types not here are skipped as they run
    count = {0: "no trial of this sweep can", 1: "this sweep's one trial cannot"}.get(
        trials, f"none of this sweep's {trials:,} trials can")
    needed = _either([f"{t} ({catalog[t].product})" for t in types])
    yield sweep.problem(_gpu_field(sweep), f"{count} run on the local backend here: each needs a GPU of type "
                                           f"{needed}, and {_host(devices, catalog)}. "
                                           f"{_ways_forward(sweep, devices, catalog, any_gpu=False)}")


def _gpu_types(plan: Plan) -> tuple[list[str], int]:
    """The GPU types the sweep's trials need, in the spec's order, and how many trials need one (0: not known
    yet, a search that makes its trials as it runs: the types its matrix, include cells and space name)."""
    if plan.trials:
        gpu_trials = [t.gpu for t in plan.trials if t.gpu]
        return list(dict.fromkeys(gpu_trials)), len(gpu_trials)
    spec = plan.sweep.spec
    named: list[Any] = list(set_axes(spec.matrix).get("gpu", []))
    named += [set_axes(cell).get("gpu") for cell in spec.include]
    space = getattr(spec.search, "space", None) or {}
    if "gpu" in space:
        named += list(space["gpu"].values or [])
    return list(dict.fromkeys(g for g in named if isinstance(g, str))), 0


def _gpu_field(sweep: Sweep) -> tuple[str | int, ...]:
    if "gpu" in set_axes(sweep.spec.matrix):
        return ("spec", "matrix", "gpu")
    for i, cell in enumerate(sweep.spec.include):
        if "gpu" in set_axes(cell):
            return ("spec", "include", i, "gpu")
    return ("spec", "search", "space", "gpu")


def _host(devices: Sequence[Device], catalog: Catalog) -> str:
    """What this machine has: `this machine has no NVIDIA GPU`, `this machine has 2 x NVIDIA-L4 (GPU type l4)`."""
    if not devices:
        return "this machine has no NVIDIA GPU"
    parts = []
    for product, n in Counter(d.product for d in devices).items():
        name = catalog.by_product(product)
        parts.append(f"{n} x {product} " + (f"(GPU type {name})" if name else "(a GPU the catalog does not name)"))
    return "this machine has " + _either(parts, "and")


def _ways_forward(sweep: Sweep, devices: Sequence[Device], catalog: Catalog, *, any_gpu: bool) -> str:
    again = shlex.join(["sweep", "submit", sweep.source, *sweep.set_options, "--backend", "kubernetes"])
    cluster = f"on a cluster with these GPUs, `{again}`"
    names = [n for n in dict.fromkeys(catalog.by_product(d.product) for d in devices) if n]
    if any_gpu:
        here = "on a machine with an NVIDIA GPU, the same command"
    elif not devices:
        here = ("on a machine with an NVIDIA GPU, `--any-gpu` (each trial on whatever GPU it has) or a `gpu` axis "
                "naming that GPU's type")
    elif names:
        here = (f"here, `--any-gpu` (each trial on whatever GPU this machine has) or a `gpu` axis naming what is "
                f"here (`gpu: [{', '.join(names)}]`)")
    else:
        here = ("here, `--any-gpu` (each trial on whatever GPU this machine has), or that GPU named in a catalog "
                "of your own (`--gpu-catalog FILE`) and in a `gpu` axis")
    return f"To run it: {cluster}; {here}; or, for a CPU sweep on this machine instead, `sweep submit {_smoke(sweep)}`."


def _smoke(sweep: Sweep) -> str:
    """The CPU smoke sweep: beside the spec when it is there (a checkout's sweeps/), else as the docs name it."""
    beside = Path(sweep.source).parent / "smoke.yaml"
    return str(beside) if beside.is_file() and beside.name != Path(sweep.source).name else SMOKE_SPEC


def _either(items: Sequence[str], word: str = "or") -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {word} {items[-1]}"


# -- kubernetes: the cluster's GPUs --------------------------------------------------------------------------


@dataclass(frozen=True)
class TypeFit:
    """The plan's trials of one GPU type against the cluster's nodes of it."""

    gpu: str
    product: str
    trials: int  # the plan's trials of this type (0: a search that makes its trials as it runs)
    runnable: int  # of them, those some node (or nodes, for a multi-node trial) can take
    nodes: int  # the cluster's nodes of this product
    gpus: int  # their allocatable GPUs, together
    why: str = ""  # why the others cannot run

    @property
    def stuck(self) -> int:
        return self.trials - self.runnable

    @property
    def missing(self) -> bool:
        """Something of this type cannot run here: trials no node can take, or (a search) no node of it."""
        return self.stuck > 0 or (self.trials == 0 and self.nodes == 0)


def gpu_fit(plan: Plan, cluster: ClusterGpus, catalog: Catalog | None = None) -> list[TypeFit]:
    """The plan's GPU trials split by type against the cluster's nodes, in the spec's order of types: how many of
    each type some node can take (its product label, at least `gpus_per_trial` allocatable GPUs, `num_nodes` such
    nodes), and why not the others."""
    catalog = catalog or load_catalog()
    types, _ = _gpu_types(plan)
    out = []
    for gpu in types:
        product = catalog[gpu].product
        per_node = cluster.products.get(product, [])
        mine = [t for t in plan.trials if t.gpu == gpu]
        runnable = [t for t in mine if cluster.fits(product, t.gpus_per_trial, t.num_nodes)]
        why = ""
        queue = cluster.queue
        if queue is not None and product not in queue.products:
            why = (f"no ResourceFlavor of it in ClusterQueue {queue.cluster_queue}, behind LocalQueue {queue.queue}"
                   if per_node else f"no node of it, nor a ResourceFlavor in ClusterQueue {queue.cluster_queue}")
        elif not per_node:
            why = "no node of it"
        elif len(runnable) < len(mine):
            fit = {t.id for t in runnable}
            stuck = [t for t in mine if t.id not in fit]
            asked = max(stuck, key=lambda t: (t.gpus_per_trial, t.num_nodes))
            biggest = max(per_node)
            why = (f"{'some ask' if len(stuck) > 1 else 'it asks'} {asked.gpus_per_trial} GPUs on each of "
                   f"{asked.num_nodes} node{'s' * (asked.num_nodes > 1)}; its nodes offer at most {biggest}"
                   if asked.num_nodes > 1 else
                   f"{'some ask' if len(stuck) > 1 else 'it asks'} {asked.gpus_per_trial} GPUs on one node; its "
                   f"nodes offer at most {biggest}")
        out.append(TypeFit(gpu, product, len(mine), len(runnable), len(per_node), sum(per_node), why))
    return out


def fit_lines(fits: Sequence[TypeFit]) -> list[str]:
    """One line per GPU type: `h100-80gb (NVIDIA-H100-80GB-HBM3): 2 nodes, 16 GPUs: all 18 trials can run`."""
    lines = []
    for f in fits:
        where = "no node" if not f.nodes else \
            f"{f.nodes} node{'s' * (f.nodes != 1)}, {f.gpus} GPU{'s' * (f.gpus != 1)}"
        if f.trials == 0:
            what = "its trials cannot run" if f.missing else "its trials can run"
        elif not f.stuck:
            what = f"all {f.trials} trials can run" if f.trials > 1 else "its trial can run"
        elif not f.runnable:
            what = f"none of its {f.trials} trials can run ({f.why})" if f.trials > 1 else \
                f"its trial cannot run ({f.why})"
        else:
            what = f"{f.runnable} of its {f.trials} trials can run ({f.why})"
        lines.append(f"{f.gpu} ({f.product}): {where}: {what}")
    return lines


def fit_report(plan: Plan, fits: Sequence[TypeFit], command: Sequence[str]) -> list[str]:
    """What `submit` says when some of the plan's GPU trials cannot run on the cluster: the types, then the ways
    forward as commands to type (`command`: the submit command as given, without `--gpu` and `--yes`)."""
    sweep = plan.sweep
    stuck = sum(f.stuck for f in fits)
    trials = sum(f.trials for f in fits)
    here = [f.gpu for f in fits if f.runnable or (f.trials == 0 and f.nodes)]
    bound = sweep.spec.resources.unschedulable_seconds
    head = (f"{stuck} of this sweep's {trials} GPU trials cannot run on this cluster (its nodes labelled "
            f"{PRODUCT_LABEL}):" if trials else "this search's GPU types on this cluster (its nodes labelled "
            f"{PRODUCT_LABEL}):")
    lines = [head, *(f"  {line}" for line in fit_lines(fits))]
    if here:
        gpus = [arg for gpu in here for arg in ("--gpu", gpu)]
        lines += ["Run only the GPU types this cluster has:", f"  {shlex.join([*command, *gpus])}"]
    else:
        lines += ["None of the sweep's GPU types has a node here: point --kubeconfig at a cluster that has them, "
                  "or:"]
    lines += [f"Or submit every trial: those no node can take end `unschedulable` after {bound:,} s "
              f"(spec.resources.unschedulable_seconds) and `sweep resume {sweep.name}` runs them again later:",
              f"  {shlex.join([*command, '--yes'])}"]
    return lines
