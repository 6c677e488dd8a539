"""What the CLI shows: plan and status tables, what a command did, the live progress display, the results table
and exports."""

from __future__ import annotations

import csv
import io
import json
import os
import shlex
import sys
import time
from collections import Counter
from typing import TYPE_CHECKING, Any, TypeVar

import yaml
from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from kubesweep.backends.base import Backend, Phase, ProgressCallback, SweepStatus, TrialStatus
from kubesweep.cli import results_view
from kubesweep.cli.search_view import search_lines
from kubesweep.cli.table_fit import Column, fit
from kubesweep.cli.terminal_text import clean, plain, value_text
from kubesweep.cli.trial_progress import Peek, ProgressReader, duration
from kubesweep.plan import Plan
from kubesweep.results import ResultRow, row_of
from kubesweep.sweep_spec.overrides import Override, value_at
from kubesweep.tracking import aggregate as agg
from kubesweep.tracking.aggregate import aggregate
from kubesweep.tracking.busy import busy_text, gpu_busy
from kubesweep.tracking.columns import trial_columns, trial_fit_order
from kubesweep.tracking.sweep import Loaded
from kubesweep.wire.search import SearchSummary

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from kubesweep.sweep_spec import Sweep

T = TypeVar("T")
UNFINISHED = ("pending", "running")  # a record's outcome while its trial has not ended
PIPED_WIDTH = 100  # the results table's width where output is not a terminal and COLUMNS is not set

PHASE_STYLE = {
    Phase.PENDING: "dim",
    Phase.UNSCHEDULABLE: "yellow",
    Phase.RUNNING: "cyan",
    Phase.SUCCEEDED: "green",
    Phase.FAILED: "red",
    Phase.SKIPPED: "dim",
    Phase.CANCELLED: "magenta",
    Phase.STOPPED: "blue",
}


def _row(table: Table, *cells: Any, style: str | None = None) -> None:
    """A table row whose cells are literal text (`kubesweep.cli.terminal_text.plain`), never markup."""
    table.add_row(*(cell if isinstance(cell, Text) else plain(cell) for cell in cells), style=style)


def _say(console: Console, line: Any, style: str = "", keep_lines: bool = True) -> None:
    """One line with text from a trial, a results file, Kubernetes or MLflow in it, printed as literal text."""
    console.print(plain(line, style=style, keep_lines=keep_lines))


_fmt = value_text


# -- plan ------------------------------------------------------------------------------------------------


def plan_json(plan: Plan) -> dict[str, Any]:
    return {
        "sweep": plan.sweep.name,
        "trials": [
            {"id": t.id, "name": t.name, "gpu": t.gpu, "repeat": t.repeat, "axes": t.axes,
             "gpus_per_trial": t.gpus_per_trial, "job": t.job.model_dump(mode="json")}
            for t in plan.trials
        ],
        "dropped": [{"axes": d.axes, "reason": d.reason} for d in plan.dropped],
        "notes": plan.notes,
    }


def show_plan(console: Console, plan: Plan, fmt: str, all_rows: bool) -> None:
    """`sweep plan`: JSON, or the table (the first `TABLE_ROWS` rows unless `all_rows`)."""
    if fmt == "json":
        sys.stdout.write(json.dumps(plan_json(plan), indent=2) + "\n")
    else:
        print_plan(console, plan, limit=None if all_rows else TABLE_ROWS)


# a table longer than this shows its first rows and says how many it left out (`--all`: every row)
TABLE_ROWS = 50


def _more(console: Console, hidden: int, what: str) -> None:
    if hidden > 0:
        console.print(f"... {hidden:,} more {what} not shown (--all prints every row)", style="dim")


def print_plan(console: Console, plan: Plan, *, limit: int | None = TABLE_ROWS) -> None:
    axes = list(dict.fromkeys(k for t in plan.trials for k in t.axes))
    table = Table(title=plain(f"sweep {plan.sweep.name}: {trials_text(plan)}"), title_justify="left")
    table.add_column("#", justify="right", style="dim")
    table.add_column("trial")
    table.add_column("id", style="dim")
    for axis in axes:
        table.add_column(axis)
    if plan.sweep.spec.most_repeats > 1:
        table.add_column("repeat", justify="right")
    for i, t in enumerate(plan.trials[:limit], 1):
        cells = [str(i), t.name, t.id, *(_fmt(t.axes.get(a)) for a in axes)]
        if plan.sweep.spec.most_repeats > 1:
            cells.append(str(t.repeat))
        _row(table, *cells)
    console.print(table)
    _more(console, len(plan.trials) - len(plan.trials[:limit]), "trials")
    if plan.dropped:
        dropped = Table(title=f"{len(plan.dropped):,} cells dropped", title_justify="left")
        dropped.add_column("cell")
        dropped.add_column("reason")
        for d in plan.dropped[:limit]:
            _row(dropped, " ".join(f"{k}={_fmt(v)}" for k, v in d.axes.items()), d.reason)
        console.print(dropped)
        _more(console, len(plan.dropped) - len(plan.dropped[:limit]), "dropped cells")
    for note in plan.notes:
        _say(console, f"note: {note}")


# -- commands ---------------------------------------------------------------------------------------------


def print_warnings(err: Console, warnings: Sequence[str]) -> None:
    for warning in warnings:
        err.print(plain(f"warning: {warning}"), soft_wrap=True)


def warn_if_large(err: Console, plan: Plan, confirm_over: int) -> None:
    """A plan over the confirmation threshold, said at `validate` and `plan` time."""
    if len(plan.trials) > confirm_over:
        err.print(f"warning: {len(plan.trials):,} trials, over the confirmation threshold of {confirm_over:,}: "
                  "`sweep submit` asks first (--yes skips the question, --confirm-over moves the threshold)",
                  markup=False, soft_wrap=True)


def print_lines(console: Console, lines: Sequence[str]) -> None:
    """Lines whose text may hold what a cluster says (its nodes' labels), printed as text, each whole: a command in
    them is never broken at the terminal's width, so it can be copied as it is."""
    for line in lines:
        console.print(plain(line), soft_wrap=True)


def trials_text(plan: Plan) -> str:
    """`36 trials`, or under sequential repeats `36 trials to start, up to 96`."""
    rule = plan.sweep.spec.repeat_rule
    if rule is None or rule.max == rule.min:
        return f"{len(plan.trials):,} trials"
    return f"{len(plan.trials):,} trials to start, up to {len(plan.trials) // rule.min * rule.max:,}"


def print_valid(console: Console, file: Path, plan: Plan, backend: str, overrides: Sequence[Override] = ()) -> None:
    _say(console, f"{file}: valid for the {backend} backend — sweep {plan.sweep.name!r}, {trials_text(plan)}, "
                  f"{len(plan.dropped)} cells dropped")
    document = plan.sweep.to_document()
    for override in overrides:  # each --set path's value as the sweep has it (defaults filled in, values normalized)
        found, value = value_at(document, override.path)
        effective = _flow(value) if found else "(not set)"
        _say(console, f"  {'.'.join(override.path)}: {effective}  ({override.option})")


def _flow(value: Any) -> str:
    """A value as one line of YAML flow style: `200`, `true`, `[16, 32]`, `{target: 3.0, max: 10}`."""
    text = yaml.safe_dump(value, default_flow_style=True, width=2**31, allow_unicode=True, sort_keys=False)
    return str(text).strip().removesuffix("\n...").strip()


def overrides_text(overrides: Sequence[Override]) -> str:
    """`with --set job.max_steps=200, --set 'matrix.batch_size=[16, 32]'`: the overrides, as typed again."""
    return "with " + ", ".join(shlex.join(["--set", o.text]) for o in overrides)


def print_submitted(console: Console, file: Path, plan: Plan, backend: str, message: str,
                    overrides: Sequence[Override] = ()) -> None:
    _say(console, f"sweep {plan.sweep.name!r}: {trials_text(plan)} on the {backend} backend ({message})")
    if overrides:
        _say(console, overrides_text(overrides), keep_lines=False)
    if plan.dropped:
        again = shlex.join(["sweep", "plan", str(file), *(w for o in overrides for w in ("--set", o.text))])
        _say(console, f"{len(plan.dropped)} cells dropped (see `{again}`)")


def print_search_detached(console: Console, sweep: Sweep) -> None:
    _say(console, f"sweep {sweep.name!r}: {sweep.spec.search_title} detached; follow with `sweep status {sweep.name}`")


def print_search_start(console: Console, sweep: Sweep, backend: str, storage: Path) -> None:
    _say(console, f"sweep {sweep.name!r}: {sweep.spec.search_title} on the {backend} backend (state in {storage})")


def print_detached(console: Console, name: str, log: Path | None = None) -> None:
    driver = f" (its driver's log: {log})" if log is not None else ""
    _say(console, f"detached{driver}; follow with `sweep status {name}`, results with `sweep results {name}`")


def print_cancelled(console: Console, name: str, cancelled: bool, status: SweepStatus) -> None:
    if cancelled:
        _say(console, f"sweep {name!r} cancelled: {counts_text(status)}")
    else:
        _say(console, f"sweep {name!r} has already ended ({status.phase}): nothing to cancel; {counts_text(status)}")


def print_report(console: Console, built: Any) -> None:
    """What `sweep report` wrote (a `kubesweep.tracking.report` build)."""
    left_out = len(built.skipped) + len(built.table_notes) + len(built.unanswered)
    _say(console, f"report: {built.html_path} ({len(built.figures)} figures, {len(built.tables)} comparison tables"
                  + (f"; {left_out} left out, each with why, at its end" if left_out else "") + ")")


# -- status ----------------------------------------------------------------------------------------------


def counts_text(status: SweepStatus) -> str:
    """`5/8 done, 4 succeeded, 1 oom, 2 running, 1 pending`: outcomes of finished trials, phases of the others
    (`3/3 done` when every trial succeeded)."""
    done = [t for t in status.trials if t.phase.terminal]
    parts = [f"{len(done)}/{len(status.trials)} done"]
    outcomes = Counter(t.outcome.value if t.outcome else t.phase.value.lower() for t in done)
    all_succeeded = len(done) == len(status.trials) and set(outcomes) == {"succeeded"}
    parts += [f"{n} {o}" for o, n in sorted(outcomes.items(), key=lambda item: item[0] != "succeeded")
              if not all_succeeded]
    active = Counter(t.phase.value.lower() for t in status.trials if not t.phase.terminal)
    parts += [f"{n} {p}" for p, n in active.items()]
    return ", ".join(parts)


def print_sweeps(console: Console, statuses: Sequence[SweepStatus]) -> None:
    """`sweep status` without a name: one row per sweep, or `no sweeps`."""
    if not statuses:
        console.print("no sweeps")
        return
    table = Table(title="sweeps", title_justify="left")
    for column in ("sweep", "phase", "trials"):
        table.add_column(column)
    for s in statuses:
        _row(table, s.name, s.phase, counts_text(s))
    console.print(table)


def status_json(status: SweepStatus) -> dict[str, Any]:
    return {
        "sweep": status.name,
        "backend": status.backend,
        "phase": status.phase,
        "interrupted": status.interrupted or None,
        "counts": dict(status.counts()),
        "trials": [
            {"id": t.trial_id, "name": t.name, "label": t.label, "phase": t.phase.value,
             "outcome": t.outcome.value if t.outcome else None, "reason": t.reason, "attempts": t.attempts,
             "results": t.results_path}
            for t in status.trials
        ],
    }


def _title(status: SweepStatus) -> Text:
    return plain(f"sweep {status.name} [{status.phase}] {counts_text(status)}")


def _elapsed(t: TrialStatus) -> str:
    if t.started_at is None:
        return ""
    end = t.finished_at or time.time()
    return f"{end - t.started_at:.0f}s"


_FIRST = (Phase.RUNNING, Phase.UNSCHEDULABLE, Phase.FAILED)


def status_table(status: SweepStatus, limit: int | None = None) -> Table:
    """The sweep's trials; with `limit`, running, unschedulable and failed trials come first."""
    table = Table(title=_title(status), title_justify="left")
    for column in ("trial", "cell", "phase", "outcome", "time", "reason"):
        # a name folds, never cut: trials of one sweep share a long prefix, and cut names would read as one
        table.add_column(column, overflow="fold" if column in ("trial", "reason") else "ellipsis")
    trials = status.trials
    if limit is not None and len(trials) > limit:
        trials = sorted(trials, key=lambda t: t.phase not in _FIRST)[:limit]
    for t in trials:
        _row(table, t.name, t.label, Text(t.phase.value, style=PHASE_STYLE[t.phase]),
             t.outcome.value if t.outcome else "", _elapsed(t), t.reason)
    return table


def live_table(status: SweepStatus, progress: dict[str, str], limit: int | None = None) -> Table:
    """The live view's trials: those running or waiting for room, each with its progress (`progress`, by trial
    id) and its reason where it has one; compact, for a terminal of 80 columns."""
    trials = [t for t in status.trials if t.phase in (Phase.RUNNING, Phase.UNSCHEDULABLE)][:limit]
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    columns = ["trial", "cell", "phase", "time"]
    columns += ["progress"] if any(t.trial_id in progress for t in trials) else []
    columns += ["reason"] if any(t.reason for t in trials) else []
    for column in columns:
        table.add_column(column, overflow="fold" if column in ("trial", "reason", "cell") else "ellipsis",
                         no_wrap=column in ("progress", "phase", "time"))
    for t in trials:
        cells = {"trial": t.name, "cell": t.label, "phase": Text(t.phase.value, style=PHASE_STYLE[t.phase]),
                 "time": _elapsed(t), "progress": progress.get(t.trial_id, ""), "reason": t.reason}
        _row(table, *(cells[c] for c in columns))
    return table


def print_status(console: Console, status: SweepStatus, *, limit: int | None = TABLE_ROWS) -> None:
    console.print(status_table(status, limit=limit))
    _more(console, len(status.trials) - min(len(status.trials), limit or len(status.trials)), "trials")
    if status.message:
        _say(console, status.message, style="dim")


def print_trial_list(console: Console, status: SweepStatus) -> None:
    """`sweep logs NAME`: the sweep's trials (name, phase, outcome) and how to ask for one's log."""
    table = Table(title=_title(status), title_justify="left")
    for column in ("trial", "phase", "outcome"):
        table.add_column(column)
    for t in status.trials:
        _row(table, t.name, Text(t.phase.value, style=PHASE_STYLE[t.phase]), t.outcome.value if t.outcome else "")
    console.print(table)
    example = status.trials[0].name if status.trials else "TRIAL"
    _say(console, f"a trial's log: `sweep logs {status.name} TRIAL [--follow]`, TRIAL a name or id above or a "
                  f"unique prefix of one (e.g. `sweep logs {status.name} {example}`)")


def show_status(console: Console, status: SweepStatus, fmt: str, all_rows: bool) -> None:
    """`sweep status NAME`: JSON, or the table (the first `TABLE_ROWS` rows unless `all_rows`)."""
    if fmt == "json":
        sys.stdout.write(json.dumps(status_json(status), indent=2) + "\n")
    else:
        print_status(console, status, limit=None if all_rows else TABLE_ROWS)


class ProgressView:
    """Live table on a terminal; one line per trial transition otherwise (CI logs, pipes). With `peek` (a running
    trial's log), each running trial's step, rate and ETA and the sweep's ETA: a column of the live table, or a
    line per trial at most every `LINE_EVERY_S` seconds."""

    LINE_EVERY_S = 30.0

    def __init__(self, console: Console, peek: Peek | None = None):
        self.console = console
        self.live: Live | None = None
        self.seen: dict[str, tuple[Phase, str]] = {}
        self.said: dict[str, float] = {}
        self.interactive = console.is_terminal and sys.stdout.isatty()
        self.reader = ProgressReader(peek) if peek is not None else None

    def update(self, status: SweepStatus) -> None:
        progress = self.reader.read(status) if self.reader is not None else {}
        eta = self.reader.sweep_eta(status, progress) if self.reader is not None else None
        if self.interactive:
            bar = _bar(status, eta)
            active = any(t.phase in (Phase.RUNNING, Phase.UNSCHEDULABLE) for t in status.trials)
            view = Group(bar, live_table(status, {k: p.text() for k, p in progress.items()}, limit=TABLE_ROWS)
                         ) if active else Group(bar)
            if self.live is None:
                self.live = Live(view, console=self.console, refresh_per_second=4, transient=False)
                self.live.start()
            else:
                self.live.update(view)
            return
        total = len(status.trials)
        done = sum(1 for t in status.trials if t.phase.terminal)
        for t in status.trials:
            key = (t.phase, t.reason if t.phase == Phase.UNSCHEDULABLE else "")
            if self.seen.get(t.trial_id) == key:
                continue
            first = t.trial_id not in self.seen
            self.seen[t.trial_id] = key
            if first and t.phase == Phase.PENDING:
                continue
            detail = f" {t.outcome.value}" if t.outcome and t.outcome.value != t.phase.value.lower() else ""
            reason = f" ({t.reason})" if t.reason and t.phase != Phase.SUCCEEDED else ""
            took = f" in {_elapsed(t)}" if t.phase.terminal and t.started_at else ""
            _say(self.console, f"[{done}/{total}] {t.name}: {t.phase.value}{detail}{took}{reason}")
        now = time.monotonic()
        for t in status.trials:
            p = progress.get(t.trial_id)
            if p is None or now - self.said.get(t.trial_id, -self.LINE_EVERY_S) < self.LINE_EVERY_S:
                continue
            self.said[t.trial_id] = now
            sweep_eta = f"; sweep ETA {duration(eta)}" if eta is not None else ""
            _say(self.console, f"[{done}/{total}] {t.name}: {p.text()}{sweep_eta}")

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


def watch(console: Console, run: Callable[[ProgressCallback], T], peek: Peek | None = None) -> T:
    """`run(progress)` behind a progress view (with each running trial's progress from `peek`, its log), stopped
    however `run` ends."""
    view = ProgressView(console, peek)
    try:
        return run(view.update)
    finally:
        view.stop()


def _bar(status: SweepStatus, eta_s: float | None = None) -> Text:
    total = max(1, len(status.trials))
    done = sum(1 for t in status.trials if t.phase.terminal)
    width = 12
    filled = int(width * done / total)
    return Text.assemble(("█" * filled, "green"), ("░" * (width - filled), "dim"),
                         plain(f" {counts_text(status)}"
                               + (f"; ETA {duration(eta_s)}" if eta_s is not None and done < total else "")))


# -- results ---------------------------------------------------------------------------------------------


def print_results(console: Console, sweep: str, rows: Sequence[ResultRow]) -> None:
    """`sweep results --per-trial`: a row per trial, whole columns fitted to the terminal (`table_fit`)."""
    cols = trial_columns()
    columns = [Column(c.header, [clean(_fmt(row.value(c)), keep_lines=False) for row in rows],
                      "left" if c.left else "right") for c in cols]
    width = fit_width(console)
    fitted = fit(columns, trial_fit_order(cols), width)
    console.print(plain(f"sweep {sweep}: results", style="italic"), width=width, soft_wrap=False)
    console.print(fitted.table(""), width=width)
    if fitted.hidden:
        _say(console, f"left out to fit {width} columns: {', '.join(fitted.hidden)}; `-f json` has every field",
             style="dim")


def show_trial_rows(console: Console, backend: Backend, sweep: str, fmt: str, records: Sequence[Any]) -> None:
    """`sweep results --per-trial`: a row per trial record (results files or MLflow, as the aggregate reads them),
    as the table and where the results files are, or an export (csv, json, markdown)."""
    rows = [row_of(r) for r in records]
    if fmt == "table":
        print_results(console, sweep, rows)
        print_files_hint(console, backend, sweep)
    else:
        sys.stdout.write(format_rows(rows, fmt))  # text exports: cleaned in format_rows


def print_files_hint(console: Console, backend: Backend, sweep: str) -> None:
    """Where the trials' results files are, when they are on this machine."""
    where = backend.trial_dir(sweep, "")
    if where is not None:
        _say(console, f"results files: {where.resolve()}/<trial>/results.json")


def fit_width(console: Console) -> int:
    """The width the results table fits: the terminal's, else (output to a file or a pipe) `COLUMNS` or 100."""
    if console.is_terminal or os.environ.get("COLUMNS"):
        return console.width
    return PIPED_WIDTH


def print_cells(console: Console, sweep: str, cells: list[Any], source: str, target: float,
                best_by: str, *, wide: bool = False, partial: str = "") -> None:
    """The settings aggregated over repeats (`kubesweep.tracking.aggregate`), the best per GPU type in bold: the
    answer, then the table fitted to the terminal (`results_view`)."""
    results_view.print_cells(console, sweep, cells, source=source, target=target, best_by=best_by,
                             width=fit_width(console), wide=wide, partial=partial,
                             more=f"`sweep results {sweep} --wide`")


def partial_text(records: Sequence[Any]) -> str:
    """`3 of 8 trials still to end`, for a sweep some of whose trials are pending or running; else ``."""
    left = sum(1 for r in records if r.outcome in UNFINISHED)
    return f"{left} of {len(records)} trials still to end" if left else ""


def print_busy(console: Console, records: Sequence[Any]) -> None:
    """How busy the sweep kept its GPUs (nothing for a sweep without GPU trials)."""
    busy = gpu_busy(list(records))
    if busy is not None:
        _say(console, busy_text(busy))


def print_ended(console: Console, backend: Backend, sweep: str, target: float, loaded: Loaded) -> None:
    """After a sweep ends: the aggregated table of its trials as `Session.ended_records` read them (`loaded`: the
    backend's own files, else MLflow); time to accuracy to `target`."""
    records = loaded.records
    print_cells(console, sweep, aggregate(records, target=target), loaded.source, target, "samples_per_s",
                partial=partial_text(records))
    if loaded.note:
        _say(console, f"note: {loaded.note}")
    print_busy(console, records)
    print_files_hint(console, backend, sweep)


def print_aggregated(console: Console, fmt: str, sweep: str, cells: Sequence[Any], records: Sequence[Any], *,
                     source: str, target: float, best_by: str, found: SearchSummary | None,
                     wide: bool = False) -> None:
    """`sweep results` in one of its formats (table, json, csv, markdown), with what a search found (`found`)."""
    if fmt == "json":
        doc = agg.to_json(list(cells), sweep=sweep, source=source, target=target, best_by=best_by,
                          busy=gpu_busy(list(records)))
        if found is not None:
            doc["search"] = found.model_dump(mode="json")
        doc["unfinished_trials"] = sum(1 for r in records if r.outcome in UNFINISHED)
        sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
    elif fmt == "csv":
        sys.stdout.write(clean(agg.to_csv(list(cells))))
    elif fmt == "markdown":
        sys.stdout.write(results_view.markdown(list(cells), sweep, source=source, target=target, best_by=best_by,
                                               partial=partial_text(records)))
    else:
        print_cells(console, sweep, list(cells), source, target, best_by, wide=wide, partial=partial_text(records))
        print_busy(console, records)
        if found is not None:
            print_search(console, found)


def print_search(console: Console, summary: SearchSummary) -> None:
    for line in search_lines(summary):
        _say(console, line)


def format_rows(rows: Sequence[ResultRow], fmt: str) -> str:
    dicts = [row.as_dict() for row in rows]
    if fmt == "json":
        return json.dumps(dicts, indent=2) + "\n"  # control characters as JSON escapes
    cols = trial_columns()
    keys = [c.key for c in cols] + ["reason"]
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=keys, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(dicts)
        return clean(buf.getvalue())
    headers = [c.header for c in cols] + ["reason"]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(clean(_fmt(d.get(k)), keep_lines=False) for k in keys) + " |" for d in dicts]
    return "\n".join(lines) + "\n"
