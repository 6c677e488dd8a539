"""The planner: a pure function from a `Sweep` to its trials.

One planner serves the CLI, the backends, the operator and the tuner; `make_trial` is the single place that
turns axis values into a named trial, so every path names a trial the same way.

- A trial's id is a hash of its resolved settings and repeat index: the same spec always gives the same ids,
  and a setting left at its default does not enter the hash (adding a job setting keeps old ids).
- A trial's name is a DNS-1123 label of at most 63 characters that a person can read:
  `bert-gpu-matrix-h100-80gb-bs32-bf16-c-1a2b3c4d`.
- Cells a GPU cannot run (bf16 on V100/T4, tf32 before Ampere) are dropped with the reason, not an error.
- Trials are ordered so GPU types interleave: one type's queue never sits in front of another's.
- Size is known before anything is expanded: `count_trials` counts a sweep's trials without building the
  product, and `plan` refuses (`SweepTooLarge`) a sweep over `max_trials` (default `DEFAULT_MAX_TRIALS`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from kubesweep.gpus import Catalog, load_catalog
from kubesweep.sweep_spec import (
    MaxBatchSearch,
    Problem,
    RandomSearch,
    SpecError,
    Sweep,
    TuneSearch,
    cell_text,
    set_axes,
)
from kubesweep.wire.config import CUDA_ONLY_SDPA, JOB_FIELDS, JobConfig, TrialConfig

MAX_NAME = 63
ID_LENGTH = 10
NAME_HASH = 8
_COMPILE_MARK = {"default": "c", "reduce-overhead": "cro", "max-autotune": "cma"}
_INVALID = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True)
class Trial:
    """One unit of work: the job's settings plus where it runs."""

    config: TrialConfig
    axes: dict[str, Any] = field(default_factory=dict, compare=False)
    num_nodes: int = 1

    @property
    def id(self) -> str:
        return self.config.trial_id

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def gpu(self) -> str | None:
        return self.config.gpu

    @property
    def repeat(self) -> int:
        return self.config.repeat

    @property
    def job(self) -> JobConfig:
        return self.config.job

    @property
    def gpus_per_trial(self) -> int:
        return self.config.gpus_per_trial

    def label(self) -> str:
        """A short human description of the cell: `h100-80gb bs32 bf16 compile=default` (made once: a step of
        the operator labels every trial)."""
        made: str | None = self.__dict__.get("_label")
        if made is None:
            parts = [self.config.device]
            parts += [f"{k}={_display(v)}" for k, v in self.axes.items() if k != "gpu"]
            if self.repeat:
                parts.append(f"repeat={self.repeat}")
            made = " ".join(parts)
            object.__setattr__(self, "_label", made)  # frozen: a cache, not a field
        return made


@dataclass(frozen=True)
class Dropped:
    axes: dict[str, Any]
    reason: str


@dataclass(frozen=True)
class Plan:
    sweep: Sweep
    trials: list[Trial]
    dropped: list[Dropped]
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.trials)

    def by_id(self) -> dict[str, Trial]:
        return {t.id: t for t in self.trials}

    def by_name(self) -> dict[str, Trial]:
        return {t.name: t for t in self.trials}


def _display(value: Any) -> str:
    if value is False:
        return "off"
    return str(value)


def trial_id(sweep_name: str, gpu: str | None, gpus_per_trial: int, num_nodes: int,
             job: JobConfig, repeat: int) -> str:
    payload = {
        "sweep": sweep_name,
        "gpu": gpu,
        "gpus_per_trial": gpus_per_trial,
        "num_nodes": num_nodes,
        "job": job.model_dump(mode="json", exclude_defaults=True),
        "repeat": repeat,
    }
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode())
    return digest.hexdigest()[:ID_LENGTH]


def trial_name(sweep_name: str, gpu: str | None, job: JobConfig, repeat: int, repeats: int,
               suffix: str) -> str:
    parts = [gpu] if gpu else []
    parts += [f"bs{job.batch_size}", job.precision]
    if job.compile:
        parts.append(_COMPILE_MARK.get(str(job.compile), "c"))
    if job.task == "inference":
        parts.insert(0, "inf")
    if repeats > 1:
        parts.append(f"r{repeat}")
    tail = "-".join([*parts, suffix])
    room = MAX_NAME - len(tail) - 1
    prefix = sweep_name[:room].rstrip("-") if room > 0 else ""
    name = f"{prefix}-{tail}" if prefix else tail
    return _INVALID.sub("-", name.lower()).strip("-")[:MAX_NAME].rstrip("-")


def make_trial(sweep: Sweep, axes: Mapping[str, Any], repeat: int = 0,
               catalog: Catalog | None = None, name_hash: int = NAME_HASH) -> Trial:
    """The trial for one cell of axis values (the grid, a random draw, or a tuner's suggestion)."""
    catalog = catalog or load_catalog()
    spec = sweep.spec
    job_updates = {k: v for k, v in axes.items() if k in JOB_FIELDS}
    job = spec.job.model_copy(update=job_updates) if job_updates else spec.job
    gpu = axes.get("gpu")
    gpus = int(axes.get("gpus_per_trial", spec.resources.gpus_per_trial))
    nodes = int(axes.get("num_nodes", spec.resources.num_nodes))
    tid = trial_id(sweep.name, gpu, gpus, nodes, job, repeat)
    try:
        config = TrialConfig(
            sweep=sweep.name,
            trial_id=tid,
            name=trial_name(sweep.name, gpu, job, repeat, spec.most_repeats, tid[:name_hash]),
            repeat=repeat,
            gpu=gpu,
            gpu_product=catalog[gpu].product if gpu else None,
            gpus_per_trial=gpus,
            job=job,
        )
    except ValidationError as err:  # settings each valid alone that the job refuses together (a clear error)
        cell = cell_text(axes) or "of the job alone"
        raise SpecError(sweep.source, [sweep.problem(_cell_path(sweep, axes), f"the cell {cell}: {_reason(err)}")
                                       ]) from None
    return Trial(config=config, axes=dict(axes), num_nodes=nodes)


def _cell_path(sweep: Sweep, axes: Mapping[str, Any]) -> tuple[str | int, ...]:
    """Where a cell comes from: the include that gives it, else the matrix (or the search's space)."""
    for i, cell in enumerate(sweep.spec.include):
        if set_axes(cell) == dict(axes):
            return ("spec", "include", i)
    return ("spec", "job") if not axes else ("spec", "matrix")


def _reason(err: ValidationError) -> str:
    """The job's own words for what it refuses, without pydantic's prefix."""
    return "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in err.errors())


# ---------------------------------------------------------------------------------------------------------
# Size: how many trials a sweep makes, known without expanding it

DEFAULT_MAX_TRIALS = 10_000
RAISE_HINT = "--max-trials to raise it"
_COUNT_WORK = 100_000  # steps an exact count may take before the size check falls back (see `_Grid`)


class SweepTooLarge(SpecError):
    """A sweep that makes more trials than the limit: a spec error (the CLI exits 2), with the numbers."""

    def __init__(self, source: str, message: str, count: int, limit: int):
        self.count = count
        self.limit = limit
        super().__init__(source, [Problem(("spec",), message)])


def count_cells(sweep: Sweep) -> int:
    """How many cells `cells(sweep)` yields (before the catalog drops any), without expanding the product."""
    grid = _Grid(sweep)
    return grid.total() + sum(1 for _ in _includes(sweep, grid))


def count_trials(sweep: Sweep) -> int:
    """The trials the sweep can make, counted without expanding it: for a grid search exactly
    `len(plan(sweep).trials)` before the catalog drops cells (cells x repeats; under sequential repeats, cells x
    the rule's max); for a search, its budget: random, min(num_samples, cells) x repeats; tune, num_samples
    (algorithm grid: the points of the choice grid); max_batch, cells x the most probes one cell's bisection can
    run."""
    search = sweep.spec.search
    if isinstance(search, TuneSearch):
        return _tune_budget(search)
    return _budget(sweep, count_cells(sweep))


def check_size(sweep: Sweep, limit: int = DEFAULT_MAX_TRIALS, *, source: str | None = None,
               hint: str = RAISE_HINT) -> int:
    """`count_trials(sweep)`, or `SweepTooLarge` when it is over `limit`, or when a search would enumerate a
    matrix of more than `limit` cells (random, max_batch). The message names the file, the count and the limit
    (`hint` says how to raise it), e.g. `sweeps/huge.yaml: spec: this sweep expands to 100,000,000 trials, over
    the limit of 10,000 (--max-trials to raise it)`.

    The count is exact. For a matrix with many overlapping exclude rules whose exact count would take long,
    the check falls back to bounds: a plain product within the limit is walked and counted exactly; otherwise
    the sweep is refused, as over the limit when the product less each rule's cells already is, else as too
    large to count (a limit of at least the product counts it)."""
    return _check(sweep, limit, source or sweep.source, hint, budgets=True)


def _tune_budget(search: TuneSearch) -> int:
    if search.algorithm == "grid":  # one pass over the grid of choice values (num_samples is not used)
        return math.prod(len(d.values) for d in search.space.values() if d.type == "choice" and d.values)
    return search.num_samples


def _budget(sweep: Sweep, n_cells: int) -> int:
    search, repeats = sweep.spec.search, sweep.spec.most_repeats
    if isinstance(search, RandomSearch):
        return min(search.num_samples, n_cells) * repeats
    if isinstance(search, MaxBatchSearch):
        return n_cells * max_batch_probes(search)
    return n_cells * repeats


def candidates(search: MaxBatchSearch) -> list[int]:
    """Batch sizes a max_batch search's answer may be: multiples of `step` within [low, high] (low itself when
    step is 1)."""
    start = search.low if search.step == 1 else max(search.step, -(-search.low // search.step) * search.step)
    return list(range(start, search.high + 1, search.step))


def next_probes(fit: int, oom: int, k: int) -> list[int]:
    """The bisection's next probes: up to k indices spread evenly strictly between `fit` (largest index known to
    fit, -1: none) and `oom` (smallest index known not to fit, len: none)."""
    gap = oom - fit - 1
    if gap <= 0:
        return []
    k = min(k, gap)
    picks = sorted({fit + max(1, min(gap, round((j + 1) * (oom - fit) / (k + 1)))) for j in range(k)})
    return picks


def max_batch_probes(search: MaxBatchSearch) -> int:
    """The most probe trials one cell's bisection can run: over every sequence of outcomes of `next_probes`,
    counted on the gap between the known fit and the known OOM."""
    start = search.low if search.step == 1 else max(search.step, -(-search.low // search.step) * search.step)
    n = max(0, (search.high - start) // search.step + 1)  # len(candidates(search)), without making the list
    worst: dict[int, int] = {}

    def probes(gap: int) -> int:  # the most probes to close a gap of `gap` open candidates
        if gap not in worst:
            picks = next_probes(-1, gap, search.probes)
            bounds = [-1, *picks, gap]
            worst[gap] = len(picks) + max(probes(b - a - 1) for a, b in itertools.pairwise(bounds)) if picks else 0
        return worst[gap]

    return probes(n)


def _check(sweep: Sweep, limit: int, source: str, hint: str, *, budgets: bool) -> int:
    """Refuse a sweep over `limit`. budgets=False (`plan`): only what `plan` itself expands, so not the trials a
    tune or max_batch search makes as it runs."""
    trials = _check_trials(sweep, limit, source, hint, budgets=budgets)
    nodes = most_nodes(sweep)
    if nodes > 1 and trials * nodes > limit:  # the limit counts pods: a trial of N nodes is N pods
        raise SweepTooLarge(source, f"this sweep asks for up to {trials * nodes:,} pods ({trials:,} trials x up to "
                                    f"{nodes} nodes each), over the limit of {limit:,} ({hint})",
                            trials * nodes, limit)
    return trials


def most_nodes(sweep: Sweep) -> int:
    """The most nodes (pods) one trial of the sweep can ask for: `resources.num_nodes`, the matrix's values, the
    include cells' and a tune search's choices."""
    spec = sweep.spec
    values = [spec.resources.num_nodes, *(getattr(spec.matrix, "num_nodes", None) or []),
              *(n for cell in spec.include if (n := getattr(cell, "num_nodes", None)) is not None)]
    if isinstance(spec.search, TuneSearch) and (dist := spec.search.space.get("num_nodes")) is not None:
        values += [int(v) for v in dist.values or [] if isinstance(v, int | float)]
    return int(max(values))


def _check_trials(sweep: Sweep, limit: int, source: str, hint: str, *, budgets: bool) -> int:
    search = sweep.spec.search
    over = f"over the limit of {limit:,} ({hint})"
    if isinstance(search, TuneSearch):
        trials = _tune_budget(search)
        if budgets and trials > limit:
            raise SweepTooLarge(source, f"this sweep's tune search can make up to {trials:,} trials, {over}",
                                trials, limit)
        return trials
    grid = _Grid(sweep, work=_COUNT_WORK)
    n_cells, exact = _count_capped(sweep, grid, limit)
    some = "" if exact else "at least "
    trials = _budget(sweep, n_cells)
    if trials > limit and isinstance(search, MaxBatchSearch):
        if budgets:
            raise SweepTooLarge(source, f"this sweep's max_batch search can make up to {some}{trials:,} probe "
                                        f"trials ({n_cells:,} cells x {max_batch_probes(search)}), {over}",
                                trials, limit)
    elif trials > limit:
        raise SweepTooLarge(source, f"this sweep expands to {some}{trials:,} trials, {over}", trials, limit)
    if n_cells > limit:  # a random or max_batch search enumerates the whole matrix
        raise SweepTooLarge(source, f"this sweep's {search.strategy} search draws from {some}{n_cells:,} matrix "
                                    f"cells, {over}", n_cells, limit)
    if not exact:
        raise SweepTooLarge(source, f"this sweep's {len(grid.rules)} exclude rules overlap too much to count its "
                                    f"trials quickly, and its matrix has {grid.product:,} cells, {over}",
                            grid.product, limit)
    return trials


def _count_capped(sweep: Sweep, grid: _Grid, limit: int) -> tuple[int, bool]:
    """(`count_cells`, True) within `_COUNT_WORK` steps; past them, a product within the limit is walked and
    counted, (exact, True), and a larger one gives (a lower bound, False)."""
    try:
        return grid.total() + sum(1 for _ in _includes(sweep, grid)), True
    except _TooComplex:
        pass
    if grid.product > limit:
        return grid.lower_bound(), False
    grid.look_ahead = False
    return sum(1 for _ in grid.walk()) + sum(1 for _ in _includes(sweep, grid)), True


class _TooComplex(Exception):
    """Counting the matrix took more steps than allowed (many exclude rules that overlap)."""


class _Grid:
    """The matrix minus its `exclude` rules, counted and walked without expanding the product.

    A cell matches a rule when it has every axis the rule names with an equal value (`value == rule value`, the
    comparison the planner has always used; no hashing, so dict and list values work). Per axis the rule names,
    a rule is the set of that axis's value indices it matches; a rule naming an axis outside the matrix, or a
    value equal to none of the axis's values, matches no cell and is left out; a rule naming no axis matches
    every cell.

    Axes are taken in matrix order. `count(d, active)` is how many ways the axes from `d` on complete a prefix
    that has matched the `active` rules on each of their axes before `d` (so a rule is dropped once the prefix
    misses it, and the prefix is excluded once it meets a rule's last axis). On axis `d` the values fall into
    classes by which active rules they satisfy, so a step costs the number of distinct values the rules name
    there, not the axis's length; once no rule is active the rest is the plain product. Results are memoized on
    `(d, active)`. This is exact. It is exponential only for many rules that overlap on many axes (counting
    matches of a DNF is #P-hard); `work` caps the steps and raises `_TooComplex` past it.
    """

    def __init__(self, sweep: Sweep, work: int | None = None):
        matrix = set_axes(sweep.spec.matrix)
        self.names: list[str] = list(matrix)
        self.values: list[list[Any]] = [list(matrix[n]) for n in self.names]
        index = {name: d for d, name in enumerate(self.names)}
        self.everything_excluded = False
        rules: list[dict[int, frozenset[int]]] = []
        for cell in sweep.spec.exclude:
            rule: dict[int, frozenset[int]] = {}
            for axis, wanted in set_axes(cell).items():
                d = index.get(axis)
                hits = frozenset() if d is None else frozenset(
                    i for i, v in enumerate(self.values[d]) if v == wanted)
                if d is None or not hits:
                    break  # the rule matches no cell
                rule[d] = hits
            else:
                if rule:
                    rules.append(rule)
                else:
                    self.everything_excluded = True
        self.rules = rules
        self.last = [max(rule) for rule in rules]
        n = len(self.names)
        self.fixing = [frozenset(j for j, rule in enumerate(rules) if d in rule) for d in range(n)]
        # per axis: the rules each value satisfies, and how many values satisfy the same rules
        self.accept = [[frozenset(j for j in self.fixing[d] if i in rules[j][d]) for i in range(len(self.values[d]))]
                       for d in range(n)]
        self.classes = [Counter(accepts) for accepts in self.accept]
        self.suffix = [1] * (n + 1)
        for d in reversed(range(n)):
            self.suffix[d] = self.suffix[d + 1] * len(self.values[d])
        self.work = work
        self.spent = 0
        self._memo: dict[tuple[int, frozenset[int]], int] = {}
        self.look_ahead = True

    @property
    def product(self) -> int:
        """Cells of the plain product, before the rules."""
        return self.suffix[0]

    def start(self) -> frozenset[int]:
        return frozenset(range(len(self.rules)))

    def total(self) -> int:
        """Cells of the product that match no rule."""
        return 0 if self.everything_excluded else self.count(0, self.start())

    def lower_bound(self) -> int:
        """The product less each rule's own cells: a bound below `total` that costs one pass over the rules."""
        if self.everything_excluded:
            return 0
        matched = sum(math.prod(len(rule[d]) if d in rule else len(self.values[d]) for d in range(len(self.names)))
                      for rule in self.rules)
        return max(0, self.product - matched)

    def _step(self, d: int, active: frozenset[int], accepts: frozenset[int]) -> frozenset[int] | None:
        """The rules still active after a value of axis d that satisfies `accepts`; None: the cell is excluded."""
        fixing = active & self.fixing[d]
        sig = accepts & fixing
        if any(self.last[j] == d for j in sig):
            return None
        return (active - fixing) | sig

    def count(self, d: int, active: frozenset[int]) -> int:
        if not active:
            return self.suffix[d]
        if d == len(self.names):  # not reached: a rule ends at its last axis
            return 0
        key = (d, active)
        found = self._memo.get(key)
        if found is not None:
            return found
        self.spent += len(self.classes[d])
        if self.work is not None and self.spent > self.work:
            raise _TooComplex
        total = 0
        for accepts, size in self.classes[d].items():
            after = self._step(d, active, accepts)
            if after is not None:
                total += size * self.count(d + 1, after)
        self._memo[key] = total
        return total

    def walk(self) -> Iterator[tuple[Any, ...]]:
        """The cells that match no rule, in product order, without visiting a prefix with none."""
        if not self.everything_excluded:
            yield from self._walk(0, self.start(), ())

    def _walk(self, d: int, active: frozenset[int], prefix: tuple[Any, ...]) -> Iterator[tuple[Any, ...]]:
        if not active:
            for rest in itertools.product(*self.values[d:]):
                yield prefix + rest
            return
        for i, value in enumerate(self.values[d]):
            after = self._step(d, active, self.accept[d][i])
            if after is not None and not self._none_after(d + 1, after):
                yield from self._walk(d + 1, after, (*prefix, value))

    def _none_after(self, d: int, active: frozenset[int]) -> bool:
        if self.look_ahead:
            try:
                return self.count(d, active) == 0
            except _TooComplex:  # past the budget, walk on without the look-ahead: as exact, only slower
                self.look_ahead = False
        return False

    def holds(self, cell: Mapping[str, Any]) -> bool:
        """Whether `walk` yields a cell equal to `cell` (as dicts: the same axes, equal values)."""
        if self.everything_excluded or set(cell) != set(self.names):
            return False
        options = [[i for i, v in enumerate(self.values[d]) if v == cell[name]] for d, name in enumerate(self.names)]
        return any(not any(all(choice[d] in hits for d, hits in rule.items()) for rule in self.rules)
                   for choice in itertools.product(*options))


def _includes(sweep: Sweep, grid: _Grid) -> Iterator[dict[str, Any]]:
    """`include` cells, each once, less those the matrix already has."""
    seen: list[dict[str, Any]] = []
    for rule in sweep.spec.include:
        extra = set_axes(rule)
        if extra not in seen:
            seen.append(extra)
            if not grid.holds(extra):
                yield extra


def cells(sweep: Sweep) -> Iterator[dict[str, Any]]:
    """The matrix product minus `exclude` rules, then the `include` cells not already present."""
    grid = _Grid(sweep, work=_COUNT_WORK)
    for values in grid.walk():
        yield dict(zip(grid.names, values, strict=True))
    yield from _includes(sweep, grid)


def drop_reason(sweep: Sweep, cell: Mapping[str, Any], catalog: Catalog) -> str | None:
    gpu = cell.get("gpu")
    gpus = int(cell.get("gpus_per_trial", sweep.spec.resources.gpus_per_trial))
    sdpa = cell.get("sdpa_backend", sweep.spec.job.sdpa_backend)
    if gpus == 0 and sdpa in CUDA_ONLY_SDPA:  # the job would refuse it after its start-up: say so now
        return f"sdpa_backend {sdpa} needs a CUDA GPU, and the cell runs on the CPU (gpus_per_trial 0)"
    if gpu is None:
        return None
    if gpus == 0:
        return f"gpu {gpu} asked for with gpus_per_trial 0"
    precision = cell.get("precision", sweep.spec.job.precision)
    return catalog[gpu].unsupported_precision(precision)


def interleave(trials: Iterable[Trial]) -> list[Trial]:
    """Round-robin over GPU types, keeping each type's own order."""
    queues: dict[str | None, list[Trial]] = {}
    for trial in trials:
        queues.setdefault(trial.gpu, []).append(trial)
    ordered: list[Trial] = []
    for group in itertools.zip_longest(*queues.values()):
        ordered.extend(t for t in group if t is not None)
    return ordered


def plan(sweep: Sweep, catalog: Catalog | None = None, *, max_trials: int | None = DEFAULT_MAX_TRIALS) -> Plan:
    """The sweep's trials. A sweep whose expansion here is over `max_trials` (None: no limit) is refused with
    `SweepTooLarge` before anything is built: its trials, and the matrix a random or max_batch search draws from.
    (The trials a tune or max_batch search makes as it runs are not built here; `check_size` counts those.)"""
    if max_trials is not None:
        _check(sweep, max_trials, sweep.source, RAISE_HINT, budgets=False)
    catalog = catalog or load_catalog()
    search = sweep.spec.search
    if isinstance(search, TuneSearch):
        note = (f"search strategy 'tune': the tuner proposes up to {search.num_samples} trials "
                f"({search.algorithm} + {search.scheduler}) while it runs")
        return Plan(sweep=sweep, trials=[], dropped=[], notes=[note])
    if isinstance(search, MaxBatchSearch):
        kept_cells = [c for c in cells(sweep) if not drop_reason(sweep, c, catalog)]
        note = (f"search strategy 'max_batch': bisects batch sizes {search.low}..{search.high} (step {search.step}) "
                f"on OOM for each of {len(kept_cells)} cells (GPU type x precision); probe trials are made as it runs")
        return Plan(sweep=sweep, trials=[], dropped=[], notes=[note])
    kept: list[dict[str, Any]] = []
    dropped: list[Dropped] = []
    for cell in cells(sweep):
        reason = drop_reason(sweep, cell, catalog)
        if reason:
            dropped.append(Dropped(cell, reason))
        else:
            kept.append(cell)
    notes: list[str] = []
    rule = sweep.spec.repeat_rule
    if rule is not None:
        notes.append(f"repeats: {rule.min} of each cell, then more (up to {rule.max}) until the 95% interval of "
                     f"{rule.metric} is within ±{rule.target:g}%; the extra repeats are made as it runs")
    if isinstance(search, RandomSearch):
        chosen = sorted(random.Random(search.seed).sample(range(len(kept)), min(search.num_samples, len(kept))))
        if search.num_samples > len(kept):
            notes.append(f"random search asked for {search.num_samples} cells; the grid has {len(kept)}")
        kept = [kept[i] for i in chosen]
    trials = [make_trial(sweep, cell, r, catalog) for r in range(sweep.spec.first_repeats) for cell in kept]
    return Plan(sweep=sweep, trials=interleave(_unique_names(sweep, trials, catalog)), dropped=dropped,
                notes=notes)


def _unique_names(sweep: Sweep, trials: list[Trial], catalog: Catalog) -> list[Trial]:
    """Two trials whose readable parts and hash prefix coincide get the full id in their names."""
    taken: set[str] = set()
    out = []
    for trial in trials:
        if trial.name in taken:
            trial = make_trial(sweep, trial.axes, trial.repeat, catalog, name_hash=ID_LENGTH)
        taken.add(trial.name)
        out.append(trial)
    return out
