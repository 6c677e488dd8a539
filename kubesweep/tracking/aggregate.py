"""Trials aggregated over their repeats: the cells (settings) `sweep results` and the report show.

One trial's numbers are defined in the metric catalogue (`kubesweep.wire.metrics`, read by
`kubesweep.wire.trial_metrics`) and its flags in `kubesweep.wire.flags` (docs/tracking.md says the same, with
examples); here they meet per setting, as numbers (their text is `kubesweep.tracking.columns`'):

- mean over the repeats that succeeded, with its 95% interval (`kubesweep.tracking.intervals`: Student's t over
  n - 1 degrees of freedom) shown as ± its half-width in percent of the mean; CV (coefficient of variation) =
  sample standard deviation / mean, in the JSON and CSV; with one repeat there is neither;
- best: per task and GPU type, the cell with the best mean of the chosen metric, leaving out cells with a repeat at
  chance accuracy (a setting that does not learn answers no question about speed); settings whose intervals
  overlap the best one's are tied with it (`tied_with`);
- flags, beside a cell's numbers: repeats that ran out of memory, ran on another GPU than asked or failed;
  repeats whose final accuracy is at chance (SST-2 has two balanced classes: <= 0.55); a single measured repeat
  (no spread); a repeat whose TFLOP/s fail the physics check (`flags.physics_error`: above the GPU's GEMM probe or
  above 95% of its dense peak), a measurement error: such a cell is never the best nor tied with it.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubesweep.gpus import Catalog, load_catalog
from kubesweep.tracking import intervals, machines, sharing
from kubesweep.tracking.busy import node_name
from kubesweep.tracking.records import TrialRecord
from kubesweep.wire import trial_metrics
from kubesweep.wire.config import ANY_GPU, CPU, PATH_SETTINGS, JobConfig, is_local_path
from kubesweep.wire.flags import (
    FLAGGED,
    OUTCOME_TEXT,
    RANDOM_INIT,
    at_chance,
    chance_flag,
    final_accuracy,
    finite,
    gpu_busy_flag,
    gpu_busy_low,
    host_bound_flag,
    host_bound_share,
    measured_host,
    random_init,
)
from kubesweep.wire.metrics import ACCURACY_METRICS, METRICS, fmt_number
from kubesweep.wire.trial_metrics import DEFAULT_TARGET_ACCURACY

AXES = ("task", "gpu", "gpus", "batch_size", "precision", "compile")
# settings that differ between repeats of one cell, or only say where the trial kept its files (a Kubernetes
# trial's checkpoint directory is its own: /checkpoints/<sweep>/<trial id>)
_NOT_AXES = frozenset({"seed", "checkpoint_dir"})


def gpu_type(record: TrialRecord, catalog: Catalog) -> str | None:
    """The trial's GPU type: the one it asked for, else the one it ran on, as the catalog names the product."""
    return trial_metrics.gpu_type(record.gpu, record.results, catalog.by_product)


def record_metrics(record: TrialRecord, catalog: Catalog, target: float) -> dict[str, float | None]:
    """One trial's value of every metric (`kubesweep.wire.trial_metrics`), priced and held against its peak by the
    catalog."""
    price, peak = catalog.price_and_peak(gpu_type(record, catalog), record.job.precision)
    return trial_metrics.trial_metrics(record.results, record.outcome, gpus=record.gpus, price_per_hour=price,
                                       target=target, peak_tflops=peak)


@dataclass
class Stat:
    values: list[float]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float | None:
        return sum(self.values) / self.n if self.values else None

    @property
    def std(self) -> float | None:
        if self.n < 2:
            return None
        mean = sum(self.values) / self.n
        return math.sqrt(sum((v - mean) ** 2 for v in self.values) / (self.n - 1))

    @property
    def cv(self) -> float | None:
        mean, std = self.mean, self.std
        return std / abs(mean) if std is not None and mean else None

    @property
    def half_width(self) -> float | None:
        """The 95% interval's half-width (None with one value)."""
        return intervals.half_width(self.values)

    @property
    def interval(self) -> intervals.Interval | None:
        return intervals.interval(self.values)

    @property
    def relative_half_width(self) -> float | None:
        hw, mean = self.half_width, self.mean
        return hw / abs(mean) if hw is not None and mean else None

    def as_dict(self) -> dict[str, Any]:
        ci = self.interval if self.n > 1 else None
        return {"mean": self.mean, "cv": self.cv, "std": self.std, "n": self.n, "values": self.values,
                "ci95": [ci.low, ci.high] if ci is not None else None, "ci95_half_width": self.half_width}


@dataclass(frozen=True)
class CellAxes:
    """A cell's standard axes (`AXES`): its task, GPU type (`cpu`, or `any GPU` for a trial that took any and has
    no results), GPUs per trial, batch size, precision and compile (`off`, `on` or a mode)."""

    task: str
    gpu: str
    gpus: int
    batch_size: int | None
    precision: str | None
    compile: str

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class Cell:
    """One setting of the matrix, aggregated over its repeats."""

    axes: CellAxes
    trials: list[TrialRecord]
    metrics: dict[str, Stat]
    outcomes: Counter[str]
    best: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    left_out: list[TrialRecord] = field(default_factory=list)  # repeats of a machine that disagreed (machines.py)
    machine_flag: str = ""
    physics: list[str] = field(default_factory=list)  # the physics check's measurement errors of its repeats

    @property
    def task(self) -> str:
        return self.axes.task or "finetune"

    @property
    def status(self) -> str:
        """`ok`, or what happened: `OOM`, `GPU mismatch`, ... or a mix like `2 ok, 1 OOM`."""
        if set(self.outcomes) == {"succeeded"}:
            return "ok"
        if len(self.outcomes) == 1:
            return OUTCOME_TEXT.get(next(iter(self.outcomes)), next(iter(self.outcomes)))
        return ", ".join(f"{n} {'ok' if o == 'succeeded' else OUTCOME_TEXT.get(o, o)}"
                         for o, n in sorted(self.outcomes.items(), key=lambda kv: kv[0] != "succeeded"))

    def value(self, metric: str) -> float | None:
        stat = self.metrics.get(metric)
        return stat.mean if stat else None

    @property
    def random_init(self) -> bool:
        """A speed run of an untrained model: its accuracy is not meaningful, and is never held against it."""
        return any(random_init(t.job) for t in self.trials)

    @property
    def at_chance(self) -> list[TrialRecord]:
        """The repeats that succeeded with a final accuracy at chance: their training did not learn (none for a
        random-init speed run, whose accuracy is not meaningful)."""
        if self.random_init:
            return []
        return [t for t in self.trials if t.outcome == "succeeded" and at_chance(t.results)]

    @property
    def host_bound(self) -> bool:
        """A repeat that succeeded measured the host, not the GPU: an inference GPU that waited for the host to
        issue its batches, or a training GPU idle for most of its measured steps (`kubesweep.wire.flags`)."""
        return any(measured_host(t.results) for t in self.trials if t.outcome == "succeeded")

    @property
    def flags(self) -> list[str]:
        """What a reader must know beside this cell's numbers: `OOM`, `1/3 GPU mismatch`, `chance accuracy
        (0.50)`, `host-bound (99% issuing)` or `host-bound (GPU busy 37% of measured steps)` (the mean of the
        host-bound repeats), `n=1`."""
        out = []
        total = len(self.trials)
        for outcome in FLAGGED:
            k = self.outcomes.get(outcome, 0)
            if k:
                out.append(OUTCOME_TEXT[outcome] if k == total else f"{k}/{total} {OUTCOME_TEXT[outcome]}")
        if self.random_init and self.task != "inference":  # inference measures no accuracy to mark
            out.append(RANDOM_INIT)
        chance = self.at_chance
        if chance:
            accuracy = min(final_accuracy(t.results) or 0.0 for t in chance)
            share = "" if len(chance) == self.outcomes.get("succeeded") else f"{len(chance)}/{total} "
            out.append(share + chance_flag(accuracy))
        succeeded = [t.results for t in self.trials if t.outcome == "succeeded"]
        for measure, flag in ((host_bound_share, host_bound_flag), (gpu_busy_low, gpu_busy_flag)):
            bound = [v for v in map(measure, succeeded) if v is not None]
            if bound:
                of = "" if len(bound) == len(succeeded) else f"{len(bound)}/{total} "
                out.append(of + flag(sum(bound) / len(bound)))
        if self.outcomes.get("succeeded") == 1:
            out.append("n=1")
        if self.machine_flag:
            out.append(self.machine_flag)
        if self.physics:  # the highest figure's, with how many repeats failed the check
            share = "" if len(self.physics) == self.outcomes.get("succeeded") else f"{len(self.physics)}/{total} "
            out.append(share + self.physics[0])
        moved = sharing.interference(self.trials)
        if moved is not None and moved.flag():
            out.append(str(moved.flag()))
        return out

    @property
    def marks(self) -> list[str]:
        """The flags a figure writes beside this cell's number: all but `n=1` and the random-init mark (figures
        draw speed, memory, cost and energy, none of them an accuracy; a random-init cell has no time to
        accuracy to draw)."""
        return [f for f in self.flags if f not in ("n=1", RANDOM_INIT)]

    def key_values(self) -> dict[str, Any]:
        return {**self.axes.as_dict(), **self.extra}


def probe_note(trials: list[TrialRecord]) -> Callable[[str], str]:
    """` (GEMM probe 712 TFLOP/s)`: the mean GEMM probe of a machine's trials among `trials` (one GPU type, one
    precision: one setting), for the flag of machines that disagree; "" where none of them ran the probe."""
    probes: dict[str, list[float]] = {}
    for t in trials:
        name = machine_of(t)
        probe = t.results.probe if t.results is not None else None
        if name and probe is not None and (value := finite(probe.tflops_per_s)):
            probes.setdefault(name, []).append(value)

    def note(name: str) -> str:
        values = probes.get(name)
        return f" (GEMM probe {sum(values) / len(values):,.0f} TFLOP/s)" if values else ""
    return note


def machine_of(record: TrialRecord) -> str | None:
    """The machine a trial ran on: its node (`busy.node_name`: the name, told apart from another machine of the same
    name by the kernel's boot id) or, in results written before the job recorded the boot id, the name and the
    UUIDs of the trial's GPUs (`vm (2f2f41ff)`); None where the node is unknown."""
    res = record.results
    node = node_name(res) if res is not None else None
    if res is None or node is None or res.environment.boot_id:
        return node
    gpus = ",".join(sorted(g.uuid[:8] for g in res.environment.gpus if g.uuid))
    return f"{node} ({gpus})" if gpus else node


def _local_names(records: list[TrialRecord]) -> dict[str, str]:
    """How a cell key names each local dataset or model path: by its last part, so that one spec run from two
    checkouts (`/home/a/kubesweep/data/sst2`, `/tmp/ks/data/sst2`) on two machines meets in one cell; by the whole
    path where two paths of one last part held different data (rows read, model size) and are not the same."""
    content: dict[str, set[str]] = {}
    for record in records:
        for key in PATH_SETTINGS:
            value = record.settings.get(key)
            if isinstance(value, str) and is_local_path(value):
                content.setdefault(_last_part(value), set()).add(_content(record, key))
    return {name: name for name, seen in content.items() if len(seen - {""}) <= 1}


def _last_part(ref: str) -> str:
    return ref.rstrip("/").rsplit("/", 1)[-1] or ref


def _content(record: TrialRecord, key: str) -> str:
    """What a trial's results say of the data or model it read at `key` ("" where nothing was read)."""
    res = record.results
    if res is None:
        return ""
    if key == "dataset":
        data = res.data or {}
        return json.dumps([data.get("train_rows"), data.get("eval_rows")]) if data.get("train_rows") else ""
    if key == "model":
        model = res.model or {}
        return json.dumps([model.get("architecture"), model.get("parameters")]) if model.get("parameters") else ""
    return ""


def _identity(record: TrialRecord, names: dict[str, str]) -> dict[str, Any]:
    """The job settings that tell a trial's cell apart: its named settings less those that differ between repeats,
    a local path by the name `_local_names` gives it."""
    out = {}
    for key, value in record.settings.items():
        if key in _NOT_AXES:
            continue
        if key in PATH_SETTINGS and isinstance(value, str) and is_local_path(value):
            value = names.get(_last_part(value), value)
        out[key] = value
    return out


def _cell_key(record: TrialRecord, catalog: Catalog, names: dict[str, str]) -> str:
    """A cell is a GPU type and the job's settings: trials of sweeps merged from several machines meet in one cell
    when they ran the same settings on the same GPU type (named by NVML where the sweep did not ask for one)."""
    return json.dumps({"gpu": gpu_type(record, catalog), "gpus": record.gpus, "job": _identity(record, names)},
                      sort_keys=True, default=str)


def _compile_text(value: Any) -> str:
    return "off" if value in (False, None, "false", "False", "off") else ("on" if value is True else str(value))


def aggregate(records: list[TrialRecord], *, target: float = DEFAULT_TARGET_ACCURACY,
              catalog: Catalog | None = None, best_by: str = "samples_per_s") -> list[Cell]:
    """Cells in first-seen order, repeats merged, the best cell per (task, GPU type) marked."""
    catalog = catalog or load_catalog()
    sharing.annotate(records)
    names = _local_names(records)
    groups: dict[str, list[TrialRecord]] = {}
    for record in records:
        groups.setdefault(_cell_key(record, catalog, names), []).append(record)
    varying = _varying(groups, names)
    cells = []
    for trials in groups.values():
        first = trials[0]
        ran = next((t for t in trials if t.results), first)
        gpu = gpu_type(ran, catalog) or (ANY_GPU if first.gpus and not ran.results else CPU)
        axes = CellAxes(task=first.job.task, gpu=gpu, gpus=first.gpus, batch_size=first.job.batch_size,
                        precision=first.job.precision, compile=_compile_text(first.job.compile))
        measured = [(t, record_metrics(t, catalog, target)) for t in trials]
        verdict = machines.compare(measured, lambda tm: machine_of(tm[0]), lambda tm: tm[1][best_by],
                                   unit=METRICS[best_by].label, fmt=fmt_number, note=probe_note(trials))
        odd = {m.name for m in verdict.left_out}
        kept = [(t, pt) for t, pt in measured if machine_of(t) not in odd]
        stats = {m: Stat([v for _, pt in kept if (v := pt[m]) is not None]) for m in METRICS}
        errors = sorted(((pt["tflops_per_s"] or 0.0, e) for _, pt in kept if (e := trial_metrics.physics(pt))),
                        reverse=True)
        cells.append(Cell(axes=axes, trials=sorted((t for t, _ in kept), key=lambda t: t.repeat), metrics=stats,
                          outcomes=Counter(t.outcome for t, _ in kept),
                          extra={k: _setting(first.job, k) for k in varying[_family(first, names)]},
                          left_out=[t for t, _ in measured if machine_of(t) in odd], machine_flag=verdict.flag,
                          physics=[e for _, e in errors]))
    mark_best(cells, best_by)
    return cells


def _setting(job: JobConfig, key: str) -> Any:
    """A job setting by name, as a JSON value (`None` for a name that is not a setting)."""
    return job.model_dump(mode="json", include={key}).get(key)


def _family(record: TrialRecord, names: dict[str, str]) -> tuple[str, str]:
    """(task, model): the kind of run a cell is, a local model path by its `_local_names` name."""
    return record.job.task, str(_identity(record, names).get("model", record.job.model))


def _varying(groups: dict[str, list[TrialRecord]], names: dict[str, str]) -> dict[tuple[str, str], list[str]]:
    """Per (task, model), the job settings beyond the standard axes that vary among its cells: a cell's extra
    columns. `model` itself where a task ran several. A sweep that mixes a speed study and a run to accuracy
    names, for each cell, only what sets it apart from its own kind."""
    families: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for trials in groups.values():
        families.setdefault(_family(trials[0], names), []).append(_identity(trials[0], names))
    models_per_task: dict[str, set[str]] = {}
    for task, model in families:
        models_per_task.setdefault(task, set()).add(model)
    out = {}
    for family, jobs in families.items():
        keys = sorted(k for k in {k for j in jobs for k in j}
                      if k not in AXES and k not in _NOT_AXES and k != "model"
                      and len({json.dumps(j.get(k), default=str) for j in jobs}) > 1)
        out[family] = (["model"] if len(models_per_task[family[0]]) > 1 else []) + keys
    return out


def best_cell(cells: list[Cell], metric: str) -> Cell | None:
    """The cell with the best mean of `metric` (higher or lower, as the metric goes) among those that have it;
    a setting with a repeat whose training stayed at chance accuracy, or whose figures fail the physics check (a
    measurement error), is never the best, however fast; a random-init speed run is never the best on accuracy or
    time to accuracy."""
    rated = [c for c in cells if c.value(metric) is not None and not c.at_chance and not c.physics
             and not (c.random_init and metric in ACCURACY_METRICS)]
    if not rated:
        return None
    return (max if METRICS[metric].higher else min)(rated, key=lambda c: c.value(metric) or 0.0)


def tied_with(best: Cell, cells: list[Cell], metric: str) -> list[Cell]:
    """The settings tied with `best` on `metric`: those (that learned, and pass the physics check) whose 95%
    interval overlaps its interval, best first by mean (`kubesweep.tracking.intervals` gives the rule)."""
    mine = best.metrics[metric].interval
    if mine is None:
        return []
    tied = [c for c in cells if c is not best and not c.at_chance and not c.physics
            and (other := c.metrics[metric].interval)
            is not None and other.overlaps(mine)]
    return sorted(tied, key=lambda c: c.value(metric) or 0.0, reverse=METRICS[metric].higher)


def mark_best(cells: list[Cell], metric: str) -> None:
    """Mark the best cell per (task, GPU type), as `best_cell` picks it."""
    groups: dict[tuple[str, str], list[Cell]] = {}
    for cell in cells:
        cell.best = False
        groups.setdefault((cell.task, str(cell.axes.gpu)), []).append(cell)
    for group in groups.values():
        if (chosen := best_cell(group, metric)) is not None:
            chosen.best = True


# -- sort and filter ---------------------------------------------------------------------------------------


class QueryError(ValueError):
    pass


def parse_filters(items: list[str]) -> list[tuple[str, list[str]]]:
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise QueryError(f"--filter {item!r}: expected KEY=VALUE[,VALUE...], e.g. gpu=h100-80gb")
        out.append((key.strip(), [v.strip() for v in value.split(",")]))
    return out


def _norm(value: Any) -> str:
    if value is True:
        return "true"
    if value is False or value is None:
        return "off" if value is False else "none"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).lower()


def apply_filters(cells: list[Cell], filters: list[tuple[str, list[str]]]) -> list[Cell]:
    if not filters:
        return cells
    known = set(AXES) | {"status", "outcome", "best"} | {k for c in cells for k in c.trials[0].settings}
    for key, _ in filters:
        if key not in known:
            raise QueryError(f"--filter: unknown key {key!r}; known: {', '.join(sorted(known))}")
    out = []
    for cell in cells:
        ok = True
        for key, values in filters:
            wanted = {_norm(v) for v in values} | ({"off"} if {"false", "no"} & {v.lower() for v in values} else set())
            if key in ("status",):
                have = {cell.status.lower()}
            elif key == "outcome":
                have = {o.lower() for o in cell.outcomes} | {OUTCOME_TEXT.get(o, o).lower() for o in cell.outcomes}
            elif key == "best":
                have = {"true" if cell.best else "false", "yes" if cell.best else "no"}
            elif key in AXES:
                have = {_norm(cell.axes.as_dict()[key])}
            else:
                have = {_norm(_setting(cell.trials[0].job, key))}
            if not have & wanted:
                ok = False
                break
        if ok:
            out.append(cell)
    return out


def sort_cells(cells: list[Cell], key: str | None, reverse: bool = False) -> list[Cell]:
    """By a metric (best first: higher for samples/s and accuracy, lower otherwise; missing last) or an axis."""
    if key is None:
        return cells
    if key in METRICS:
        higher = METRICS[key].higher
        present = [c for c in cells if c.value(key) is not None]
        missing = [c for c in cells if c.value(key) is None]
        present.sort(key=lambda c: c.value(key) or 0.0, reverse=higher != reverse)
        return present + missing
    if key in AXES or any(key in c.extra for c in cells):
        return sorted(cells, key=lambda c: (_sortable(c.key_values().get(key))), reverse=reverse)
    raise QueryError(f"--sort: unknown key {key!r}; metrics: {', '.join(METRICS)}; axes: {', '.join(AXES)}")


def _sortable(value: Any) -> tuple[int, float, str]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, float(value), "")
    return (1, 0.0, str(value))


# -- the settings a table names, and the machine formats (CSV, JSON) -------------------------------------------


def columns(cells: list[Cell]) -> list[str]:
    """The settings that name the cells' rows: task and GPU type, GPUs per trial where some cell has other than
    one, batch size, precision, compile, then the settings beyond these that vary (`Cell.extra`)."""
    cols = ["task", "gpu"]
    if any(c.axes.gpus != 1 for c in cells):
        cols.append("gpus")
    cols += ["batch_size", "precision", "compile"]
    cols += sorted({k for c in cells for k in c.extra})
    return cols


def setting_text(value: Any) -> str:
    """A setting's value as a table writes it: `-` for none, `off` for false."""
    if value is None:
        return "-"
    if value is False:
        return "off"
    return str(value)


def to_csv(cells: list[Cell]) -> str:
    cols = columns(cells)
    fields = [*cols, "n", "status", "best", "flags"]
    for m in METRICS:
        fields += [f"{m}_mean", f"{m}_cv", f"{m}_ci95_half_width", f"{m}_n"]
    fields += ["trials"]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for cell in cells:
        row: dict[str, Any] = {c: setting_text(cell.key_values().get(c)) for c in cols}
        row.update({"n": len(cell.trials), "status": cell.status, "best": int(cell.best),
                    "flags": "; ".join(cell.flags), "trials": " ".join(t.name for t in cell.trials)})
        for m in METRICS:
            stat = cell.metrics[m]
            row[f"{m}_mean"] = "" if stat.mean is None else repr(stat.mean)
            row[f"{m}_cv"] = "" if stat.cv is None else repr(stat.cv)
            row[f"{m}_ci95_half_width"] = "" if stat.half_width is None else repr(stat.half_width)
            row[f"{m}_n"] = stat.n
        writer.writerow(row)
    return buf.getvalue()


def to_json(cells: list[Cell], *, sweep: str, source: str, target: float, best_by: str,
            busy: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "sweep": sweep,
        "source": source,
        "target_accuracy": target,
        "best_by": best_by,
        "gpu_busy": busy,
        "cells": [
            {**cell.key_values(), "n": len(cell.trials), "status": cell.status, "outcomes": dict(cell.outcomes),
             "best": cell.best, "flags": cell.flags, "metrics": {m: s.as_dict() for m, s in cell.metrics.items()},
             "trials": [{"id": t.trial_id, "name": t.name, "repeat": t.repeat, "outcome": t.outcome,
                         "reason": t.reason, "run_id": t.run_id} for t in cell.trials],
             "left_out": [{"id": t.trial_id, "name": t.name, "machine": machine_of(t)} for t in cell.left_out]}
            for cell in cells
        ],
    }
