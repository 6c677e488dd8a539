"""The planner: a pure function from a `Sweep` to its trials.

One planner serves the CLI, the backends, the operator and the tuner; `make_trial` is the single place that
turns axis values into a named trial, so every path names a trial the same way.

- A trial's id is a hash of its resolved settings and repeat index: the same spec always gives the same ids,
  and a setting left at its default does not enter the hash (adding a job setting keeps old ids).
- A trial's name is a DNS-1123 label of at most 63 characters that a person can read:
  `bert-gpu-matrix-h100-80gb-bs32-bf16-c-1a2b3c4d`.
- Cells a GPU cannot run (bf16 on V100/T4, tf32 before Ampere) are dropped with the reason, not an error.
- Trials are ordered so GPU types interleave: one type's queue never sits in front of another's.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubesweep.gpus import Catalog, load_catalog
from kubesweep.jobs.config import JOB_FIELDS, JobConfig, TrialConfig
from kubesweep.spec import MaxBatchSearch, RandomSearch, Sweep, TuneSearch, set_axes

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
        """A short human description of the cell: `h100-80gb bs32 bf16 compile=default`."""
        parts = [self.gpu or "any"]
        parts += [f"{k}={_display(v)}" for k, v in self.axes.items() if k != "gpu"]
        if self.repeat:
            parts.append(f"repeat={self.repeat}")
        return " ".join(parts)


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
    config = TrialConfig(
        sweep=sweep.name,
        trial_id=tid,
        name=trial_name(sweep.name, gpu, job, repeat, spec.repeats, tid[:name_hash]),
        repeat=repeat,
        gpu=gpu,
        gpu_product=catalog[gpu].product if gpu else None,
        gpus_per_trial=gpus,
        job=job,
    )
    return Trial(config=config, axes=dict(axes), num_nodes=nodes)


def _matches(cell: Mapping[str, Any], rule: Mapping[str, Any]) -> bool:
    return all(k in cell and cell[k] == v for k, v in rule.items())


def cells(sweep: Sweep) -> Iterator[dict[str, Any]]:
    """The matrix product minus `exclude` rules, then the `include` cells not already present."""
    matrix = set_axes(sweep.spec.matrix)
    excludes = [set_axes(rule) for rule in sweep.spec.exclude]
    seen: list[dict[str, Any]] = []
    names = list(matrix)
    for values in itertools.product(*(matrix[n] for n in names)):
        cell = dict(zip(names, values, strict=True))
        if not any(_matches(cell, rule) for rule in excludes):
            yield cell
    for rule in sweep.spec.include:
        extra = set_axes(rule)
        if extra not in seen:
            seen.append(extra)
            yield extra


def drop_reason(sweep: Sweep, cell: Mapping[str, Any], catalog: Catalog) -> str | None:
    gpu = cell.get("gpu")
    if gpu is None:
        return None
    gpus = int(cell.get("gpus_per_trial", sweep.spec.resources.gpus_per_trial))
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


def plan(sweep: Sweep, catalog: Catalog | None = None) -> Plan:
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
    if isinstance(search, RandomSearch):
        chosen = sorted(random.Random(search.seed).sample(range(len(kept)), min(search.num_samples, len(kept))))
        if search.num_samples > len(kept):
            notes.append(f"random search asked for {search.num_samples} cells; the grid has {len(kept)}")
        kept = [kept[i] for i in chosen]
    trials = [make_trial(sweep, cell, r, catalog) for r in range(sweep.spec.repeats) for cell in kept]
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
