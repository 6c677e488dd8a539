"""`sweep`: validate, plan, run and inspect GPU benchmark sweeps.

The commands parse their arguments, ask the session layer (`kubesweep.session`: backends, tracking, searches)
and print (`kubesweep.views`). What a command reports as an error (an invalid spec, an unknown sweep, a backend
or tracking server that failed) becomes its message and exit code in one place, `Commands.invoke`.

Exit codes:
  0  success (OOM and GPU-mismatch cells are results, not failures)
  1  one or more trials failed
  2  bad input: an invalid spec, flag or argument
  3  not found: no such sweep or trial
  4  backend error: the cluster, the state store or a process could not do what was asked
  130 interrupted (Ctrl-C); running trials are left to finish or are cancelled as the message says
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from typer.core import TyperGroup

from kubesweep import __version__, views
from kubesweep.gpus import load_catalog
from kubesweep.images import app as images_app
from kubesweep.plan import DEFAULT_MAX_TRIALS
from kubesweep.session import EXIT_BACKEND, EXIT_INTERRUPTED, EXIT_NOT_FOUND, EXIT_USAGE, Options, Session, error_code
from kubesweep.spec import Sweep, load_sweep_file

if TYPE_CHECKING:
    from kubesweep.backends.base import ProgressCallback
    from kubesweep.plan import Plan
    from kubesweep.session import Ended


def fail(message: str, code: int) -> NoReturn:
    sys.stderr.write(("" if code == EXIT_USAGE else "error: ") + message.rstrip() + "\n")
    raise typer.Exit(code)


class Commands(TyperGroup):
    """Every command's errors in one place: a spec, catalog, backend or tracking error is printed with the exit
    code `kubesweep.session.error_code` gives it; anything else is a bug and keeps its traceback."""

    def invoke(self, ctx: Any) -> Any:  # a typer Context
        try:
            return super().invoke(ctx)
        except Exception as exc:
            code = error_code(exc)
            if code is None:
                raise
            fail(str(exc), code)


app = typer.Typer(
    name="sweep",
    cls=Commands,
    help="Benchmark GPU training setups for BERT: sweeps of GPU type x batch size x precision x compile, "
    "run as Kubernetes Jobs or local processes, tracked in MLflow.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    epilog="Exit codes: 0 ok, 1 trials failed, 2 bad input, 3 not found, 4 backend error, 130 interrupted.",
)
app.add_typer(images_app, name="images")
# Piped output (CI logs, files) gets wide tables instead of 80 columns of ellipses.
console = Console(highlight=False, soft_wrap=True,
                  width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 200)
err = Console(stderr=True, highlight=False)


class BackendName(StrEnum):
    local = "local"
    kubernetes = "kubernetes"


class PlanFormat(StrEnum):
    table = "table"
    json = "json"


class ResultsFormat(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"
    markdown = "markdown"


class MetricName(StrEnum):
    samples_per_s = "samples_per_s"
    step_p50_ms = "step_p50_ms"
    peak_mem_gib = "peak_mem_gib"
    tta_s = "tta_s"
    accuracy = "accuracy"
    cost_per_epoch = "cost_per_epoch"


class ResultsSource(StrEnum):
    auto = "auto"
    files = "files"
    mlflow = "mlflow"


SpecFile = Annotated[Path, typer.Argument(help="sweep spec (YAML)", show_default=False)]
NameArg = Annotated[str, typer.Argument(help="sweep name")]
AllRowsOpt = Annotated[bool, typer.Option("--all", help="print every row of a long table (otherwise the first 50 "
                                                      "and how many more there are)")]
AllowUnpinned = Annotated[bool, typer.Option("--allow-unpinned", help="accept image tags not pinned by digest")]
MaxTrialsOpt = Annotated[
    int,
    typer.Option("--max-trials", envvar="KUBESWEEP_MAX_TRIALS", min=1,
                 help="refuse a spec that makes more trials than this (a search: the most it can make), counted "
                      "before anything is expanded"),
]
CONFIRM_OVER = 1_000
ConfirmOverOpt = Annotated[
    int,
    typer.Option("--confirm-over", envvar="KUBESWEEP_CONFIRM_OVER", min=0,
                 help="ask before submitting a sweep of more trials than this (without a terminal: refuse "
                      "unless --yes)"),
]
BackendOpt = Annotated[
    BackendName, typer.Option("--backend", "-b", envvar="KUBESWEEP_BACKEND", help="where trials run")
]
HomeOpt = Annotated[
    Path | None,
    typer.Option("--home", envvar="KUBESWEEP_HOME", help="local state directory [default: ~/.kubesweep]"),
]
NamespaceOpt = Annotated[str | None, typer.Option("--namespace", "-n", help="Kubernetes namespace")]
TrackingUriOpt = Annotated[
    str | None,
    typer.Option("--tracking-uri", help="MLflow tracking URI [default: $MLFLOW_TRACKING_URI, the spec's "
                 "tracking.uri, else the local store sqlite:///<home>/mlflow.db]", show_default=False),
]
NoTrackingOpt = Annotated[
    bool, typer.Option("--no-tracking", envvar="KUBESWEEP_NO_TRACKING", help="do not log to MLflow")
]
KubeconfigOpt = Annotated[Path | None, typer.Option("--kubeconfig", envvar="KUBECONFIG", help="kubeconfig file")]
DirectOpt = Annotated[
    bool,
    typer.Option("--direct", envvar="KUBESWEEP_DIRECT",
                 help="kubernetes: drive the Jobs from this shell (state in a ConfigMap) instead of through the "
                      "Sweep resource and the operator"),
]
TargetOpt = Annotated[float, typer.Option("--target-accuracy", min=0.0, max=1.0,
                                          help="dev accuracy that time-to-accuracy measures the time to")]
BestByOpt = Annotated[MetricName, typer.Option("--best-by", help="metric that picks the best setting per GPU type")]
FilterOpt = Annotated[list[str] | None, typer.Option(
    "--filter", help="KEY=VALUE[,VALUE] (repeatable): gpu, task, gpus, batch_size, precision, compile, status, "
    "outcome, best, or any job setting; e.g. --filter gpu=h100-80gb --filter precision=bf16,fp16")]
FromOpt = Annotated[ResultsSource, typer.Option(
    "--from", help="auto: the results files this machine keeps (local backend), else MLflow; files or mlflow: "
    "only that one")]
ExperimentOpt = Annotated[str | None, typer.Option(
    "--experiment", help="MLflow experiment [default: the spec's tracking.experiment, else the sweep's name]")]

ResultsFormatOpt = Annotated[ResultsFormat, typer.Option("--format", "-f", help="table, csv, json or markdown")]
SortOpt = Annotated[str | None, typer.Option(
    "--sort", help="metric (best first: samples_per_s, step_p50_ms, peak_mem_gib, tta_s, accuracy, "
    "cost_per_epoch, epoch_s) or axis (gpu, batch_size, precision, compile, ...)")]
PerTrialOpt = Annotated[bool, typer.Option("--per-trial", help="one row per trial from the results files, "
                                           "not aggregated")]
ReportDirOpt = Annotated[Path | None, typer.Option("--output", "-o", help="directory for report.html and the "
                                                   "figures [default: <home>/sweeps/<sweep>/report]",
                                                   show_default=False)]
UploadOpt = Annotated[bool, typer.Option("--upload/--no-upload", help="log the report as artifacts of the "
                                         "sweep's MLflow parent run")]
PortOpt = Annotated[int | None, typer.Option("--port", "-p", min=1, max=65535, help="port [default: a free one]",
                                             show_default=False)]


def version_callback(value: bool) -> None:
    if value:
        console.print(f"kubesweep {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    gpu_catalog: Annotated[
        Path | None,
        typer.Option("--gpu-catalog", envvar="KUBESWEEP_GPU_CATALOG", help="GPU catalog replacing the shipped one"),
    ] = None,
    version: Annotated[
        bool, typer.Option("--version", callback=version_callback, is_eager=True, help="print the version")
    ] = False,
) -> None:
    if gpu_catalog is not None:
        os.environ["KUBESWEEP_GPU_CATALOG"] = str(gpu_catalog)
        load_catalog(gpu_catalog)


def load(path: Path, allow_unpinned: bool) -> Sweep:
    """The spec at `path` (exit 2 with every problem if it is not valid); its warnings go to stderr."""
    sweep = load_sweep_file(path, allow_unpinned=allow_unpinned)
    for warning in sweep.warnings:
        err.print(f"warning: {warning}", markup=False, soft_wrap=True)
    return sweep


def warn_if_large(p: Plan, confirm_over: int) -> None:
    if len(p.trials) > confirm_over:
        err.print(f"warning: {len(p.trials):,} trials, over the confirmation threshold of {confirm_over:,}: "
                  "`sweep submit` asks first (--yes skips the question, --confirm-over moves the threshold)",
                  markup=False, soft_wrap=True)


def confirm_large(p: Plan, confirm_over: int, yes: bool) -> None:
    """A sweep over `confirm_over` trials runs only when confirmed: --yes, or an answer at a terminal."""
    n = len(p.trials)
    if n <= confirm_over or yes:
        return
    question = f"sweep {p.sweep.name!r} makes {n:,} trials (over {confirm_over:,}). Submit them?"
    if not sys.stdin.isatty():
        fail(f"{question.rsplit('. ', 1)[0]}: nothing submitted. Pass --yes to submit it, or --confirm-over "
             f"{n} to move the threshold", EXIT_USAGE)
    if not typer.confirm(question, default=False, err=True):
        fail("nothing submitted", EXIT_USAGE)


def make_plan(sweep: Sweep, max_trials: int = DEFAULT_MAX_TRIALS) -> Plan:
    """The sweep's plan, after its size is checked against `max_trials` (over it: exit 2, nothing expanded)."""
    from kubesweep.plan import check_size, plan

    check_size(sweep, max_trials)
    return plan(sweep, max_trials=max_trials)


def session(backend: BackendName = BackendName.local, home: Path | None = None, namespace: str | None = None,
            kubeconfig: Path | None = None, direct: bool = False, **more: Any) -> Session:
    """The session of one command; what it has to say goes to stdout, warnings and notes to stderr."""
    def notify(message: str, warning: bool) -> None:
        (err if warning else console).print(message)

    return Session(Options(backend.value, home, namespace, kubeconfig, direct, **more), notify=notify)


def _watch(run: Callable[[ProgressCallback], Ended], interrupted: str) -> Ended:
    """Follow a sweep to its end behind a live progress view; Ctrl-C: exit 130, saying what is kept."""
    view = views.ProgressView(console)
    try:
        return run(view.update)
    except KeyboardInterrupt:
        view.stop()
        err.print(interrupted)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    finally:
        view.stop()


def _follow(s: Session, name: str, detach: bool) -> None:
    if detach:
        s.detach(name)
        console.print(f"detached; follow with `sweep status {name}`, results with `sweep results {name}`")
        return
    ended = _watch(lambda progress: s.follow(name, progress), f"interrupted; finished trials are kept. "
                   f"`sweep resume {name}` continues, `sweep cancel {name}` stops")
    views.print_ended(console, s.backend, name)
    raise typer.Exit(ended.code)


def _search(s: Session, sweep: Sweep) -> NoReturn:
    """Run (or continue) a tune or max-batch search here to its end, then print what it found."""
    console.print(f"sweep {sweep.name!r}: {sweep.spec.search.strategy} search on the {s.options.backend} backend "
                  f"(state in {s.search_storage(sweep.name)})")
    ended = _watch(lambda progress: s.run_search(sweep, progress), f"interrupted; the search state is kept. "
                   f"`sweep submit` of the same spec or `sweep resume {sweep.name}` continues it")
    views.print_ended(console, s.backend, sweep.name)
    views.print_search(console, ended.found or {})
    raise typer.Exit(ended.code)


# ----------------------------------------------------------------------------------------------------------


@app.command()
def validate(file: SpecFile, allow_unpinned: AllowUnpinned = False,
             max_trials: MaxTrialsOpt = DEFAULT_MAX_TRIALS, confirm_over: ConfirmOverOpt = CONFIRM_OVER) -> None:
    """Check a sweep spec; print each problem as FILE:LINE: FIELD: what was expected."""
    sweep = load(file, allow_unpinned)
    p = make_plan(sweep, max_trials)
    warn_if_large(p, confirm_over)
    console.print(f"{file}: valid — sweep {sweep.name!r}, {len(p.trials)} trials, {len(p.dropped)} cells dropped")


@app.command("plan")
def plan_cmd(
    file: SpecFile,
    output: Annotated[PlanFormat, typer.Option("--output", "-o", help="table or json")] = PlanFormat.table,
    all_rows: AllRowsOpt = False,
    allow_unpinned: AllowUnpinned = False,
    max_trials: MaxTrialsOpt = DEFAULT_MAX_TRIALS,
    confirm_over: ConfirmOverOpt = CONFIRM_OVER,
) -> None:
    """Show the trials a spec expands to (and the cells dropped, with the reason)."""
    p = make_plan(load(file, allow_unpinned), max_trials)
    warn_if_large(p, confirm_over)
    if output == PlanFormat.json:
        sys.stdout.write(json.dumps(views.plan_json(p), indent=2) + "\n")
    else:
        views.print_plan(console, p, limit=None if all_rows else views.TABLE_ROWS)


@app.command()
def render(
    file: SpecFile,
    allow_unpinned: AllowUnpinned = False,
    namespace: NamespaceOpt = None,
    max_trials: MaxTrialsOpt = DEFAULT_MAX_TRIALS,
) -> None:
    """Print the Kubernetes manifests (a YAML stream) the spec's trials run as."""
    from kubesweep.manifests import RenderError, render_plan, to_yaml

    sweep = load(file, allow_unpinned)
    try:
        objects = render_plan(make_plan(sweep, max_trials), allow_unpinned=allow_unpinned, namespace=namespace)
    except RenderError as exc:
        fail(str(exc), EXIT_USAGE)
    sys.stdout.write(to_yaml(objects))


@app.command()
def crd() -> None:
    """Print the Sweep CustomResourceDefinition (generated from the spec model) as YAML."""
    from kubesweep.crd import crd_yaml

    sys.stdout.write(crd_yaml())


@app.command()
def submit(
    file: SpecFile,
    backend: BackendOpt = BackendName.local,
    detach: Annotated[bool, typer.Option("--detach", "-d", help="return at once; follow with `sweep status`")] = False,
    any_gpu: Annotated[bool, typer.Option("--any-gpu", help="local: run trials on whatever GPU is here")] = False,
    parallel: Annotated[int, typer.Option("--parallel", min=1, help="local: CPU-only trials at once")] = 1,
    allow_unpinned: AllowUnpinned = False,
    home: HomeOpt = None, namespace: NamespaceOpt = None, kubeconfig: KubeconfigOpt = None,
    direct: DirectOpt = False,
    tracking_uri: TrackingUriOpt = None, no_tracking: NoTrackingOpt = False,
    max_trials: MaxTrialsOpt = DEFAULT_MAX_TRIALS,
    confirm_over: ConfirmOverOpt = CONFIRM_OVER,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="submit without asking, whatever the trial count")] = False,
) -> None:
    """Expand a spec into trials and run them. Submitting the same spec again starts nothing twice.

    A search (`strategy: tune` or `max_batch`) makes its trials as it runs: here for --backend local or --direct,
    else as the operator's tuner Job; submitted again, it continues from its saved state.
    Tracking: one MLflow parent run per sweep (found again on a later submit or resume), a child run per trial.
    """
    sweep = load(file, allow_unpinned)
    p = make_plan(sweep, max_trials)
    confirm_large(p, confirm_over, yes)
    s = session(backend, home, namespace, kubeconfig, direct, any_gpu=any_gpu, parallel=parallel,
                tracking_uri=tracking_uri, no_tracking=no_tracking)
    if detach and s.search_runs_here(sweep):
        s.detach_search(file, sweep.name, allow_unpinned=allow_unpinned, max_trials=max_trials)
        console.print(f"sweep {sweep.name!r}: {sweep.spec.search.strategy} search detached; follow with "
                      f"`sweep status {sweep.name}`")
        return
    status = s.submit(sweep, p)
    if status is None:
        _search(s, sweep)
    console.print(f"sweep {sweep.name!r}: {len(p.trials)} trials on the {backend.value} backend ({status.message})")
    if p.dropped:
        console.print(f"{len(p.dropped)} cells dropped (see `sweep plan {file}`)")
    _follow(s, sweep.name, detach)


@app.command("_drive", hidden=True)
def drive(name: str, home: HomeOpt = None) -> None:
    """Run a local sweep's supervisor until every trial is done (used by --detach)."""
    raise typer.Exit(session(home=home).follow(name).code)


@app.command()
def status(
    name: Annotated[str | None, typer.Argument(help="sweep name; omit to list sweeps", show_default=False)] = None,
    backend: BackendOpt = BackendName.local,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="keep the table live until the sweep ends")] = False,
    output: Annotated[PlanFormat, typer.Option("--output", "-o")] = PlanFormat.table,
    all_rows: AllRowsOpt = False,
    home: HomeOpt = None, namespace: NamespaceOpt = None, kubeconfig: KubeconfigOpt = None,
    direct: DirectOpt = False,
) -> None:
    """Show a sweep's trials and their phases (or list the sweeps)."""
    b = session(backend, home, namespace, kubeconfig, direct).backend
    if name is None:
        names = b.list_sweeps()
        if names:
            views.print_sweeps(console, [b.status(n) for n in names])
        else:
            console.print("no sweeps")
        return
    if watch:
        view = views.ProgressView(console)
        try:
            b.wait(name, progress=view.update)
        finally:
            view.stop()
        return
    s = b.status(name)
    if output == PlanFormat.json:
        sys.stdout.write(json.dumps(views.status_json(s), indent=2) + "\n")
    else:
        views.print_status(console, s, limit=None if all_rows else views.TABLE_ROWS)


@app.command()
def logs(
    name: NameArg,
    trial: Annotated[str, typer.Argument(help="trial name or id (a unique prefix is enough)")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing until the trial ends")] = False,
    backend: BackendOpt = BackendName.local, home: HomeOpt = None, namespace: NamespaceOpt = None,
    kubeconfig: KubeconfigOpt = None, direct: DirectOpt = False,
) -> None:
    """Print a trial's log."""
    for chunk in session(backend, home, namespace, kubeconfig, direct).backend.logs(name, trial, follow=follow):
        sys.stdout.write(chunk)
        sys.stdout.flush()


@app.command()
def cancel(
    name: NameArg,
    backend: BackendOpt = BackendName.local, home: HomeOpt = None, namespace: NamespaceOpt = None,
    kubeconfig: KubeconfigOpt = None, direct: DirectOpt = False,
) -> None:
    """Stop a sweep's running trials and start no new ones; finished trials keep their results."""
    cancelled, s = session(backend, home, namespace, kubeconfig, direct).cancel(name)
    if cancelled:
        console.print(f"sweep {name!r} cancelled: {views.counts_text(s)}")
    else:
        console.print(f"sweep {name!r} has already ended ({s.phase}): nothing to cancel; {views.counts_text(s)}")


@app.command()
def resume(
    name: NameArg,
    backend: BackendOpt = BackendName.local,
    detach: Annotated[bool, typer.Option("--detach", "-d", help="return at once")] = False,
    home: HomeOpt = None, namespace: NamespaceOpt = None, kubeconfig: KubeconfigOpt = None,
    direct: DirectOpt = False,
    tracking_uri: TrackingUriOpt = None, no_tracking: NoTrackingOpt = False,
) -> None:
    """Run again only the trials that failed, were cancelled or are missing (into the same MLflow runs); a search
    continues from its saved state."""
    s = session(backend, home, namespace, kubeconfig, direct, tracking_uri=tracking_uri, no_tracking=no_tracking)
    sweep, resumed = s.resume(name)
    if resumed is None:
        _search(s, sweep)
    _follow(s, name, detach)


@app.command()
def delete(
    name: NameArg,
    backend: BackendOpt = BackendName.local, home: HomeOpt = None, namespace: NamespaceOpt = None,
    kubeconfig: KubeconfigOpt = None, direct: DirectOpt = False,
) -> None:
    """Cancel a sweep and forget its state (local: its trial directories too)."""
    session(backend, home, namespace, kubeconfig, direct).backend.delete(name)
    console.print(f"sweep {name!r} deleted")


@app.command()
def results(
    name: NameArg,
    fmt: ResultsFormatOpt = ResultsFormat.table,
    sort: SortOpt = None,
    reverse: Annotated[bool, typer.Option("--reverse", help="reverse the --sort order")] = False,
    filters: FilterOpt = None,
    target_accuracy: TargetOpt = 0.90,
    best_by: BestByOpt = MetricName.samples_per_s,
    per_trial: PerTrialOpt = False,
    backend: BackendOpt = BackendName.local, home: HomeOpt = None, namespace: NamespaceOpt = None,
    kubeconfig: KubeconfigOpt = None, direct: DirectOpt = False,
    tracking_uri: TrackingUriOpt = None, no_tracking: NoTrackingOpt = False,
    experiment: ExperimentOpt = None,
    source: FromOpt = ResultsSource.auto,
) -> None:
    """The sweep's results aggregated over repeats: mean ±CV of samples/s, step p50, peak memory,
    time-to-accuracy, accuracy and $/epoch per setting; OOM and GPU-mismatch cells as such; * marks the best
    setting per GPU type. Reads the trials' MLflow runs (the local results files when tracking is off)."""
    from kubesweep.tracking import aggregate as agg

    s = session(backend, home, namespace, kubeconfig, direct, tracking_uri=tracking_uri, no_tracking=no_tracking)
    if per_trial:
        rows = views.result_rows(s.backend, name)
        if fmt == ResultsFormat.table:
            views.print_results(console, name, rows)
            views.print_files_hint(console, s.backend, name)
        else:
            sys.stdout.write(views.format_rows(rows, fmt.value))
        return
    r = s.results(name, experiment=experiment, target_accuracy=target_accuracy, best_by=best_by.value,
                  source=source.value)
    try:
        cells = agg.sort_cells(agg.apply_filters(r.cells, agg.parse_filters(filters or [])), sort, reverse)
    except agg.QueryError as exc:
        fail(str(exc), EXIT_USAGE)
    found = s.search_found(name, r.sweep, r.loaded.parent_run_id) if r.searched else None
    views.print_aggregated(console, fmt.value, name, cells, r.loaded.records, source=r.loaded.source,
                           target=target_accuracy, best_by=best_by.value, found=found)


@app.command()
def report(
    name: NameArg,
    output: ReportDirOpt = None,
    target_accuracy: TargetOpt = 0.90,
    best_by: BestByOpt = MetricName.samples_per_s,
    upload: UploadOpt = True,
    backend: BackendOpt = BackendName.local, home: HomeOpt = None, namespace: NamespaceOpt = None,
    kubeconfig: KubeconfigOpt = None,
    tracking_uri: TrackingUriOpt = None, no_tracking: NoTrackingOpt = False,
    experiment: ExperimentOpt = None,
    source: FromOpt = ResultsSource.auto,
) -> None:
    """An HTML report with PNG figures (throughput, compile speed-up, peak memory, time-to-accuracy, $/epoch,
    the matrix heatmap) and the comparison tables, written locally and logged to the sweep's parent run."""
    try:
        from kubesweep.tracking.report import build
    except ImportError as exc:  # pragma: no cover - depends on the install
        fail(f"the report needs matplotlib ({exc}): pip install 'kubesweep[tracking]'", EXIT_USAGE)
    from kubesweep.tracking.runs import SweepRuns, TrackingError

    s = session(backend, home, namespace, kubeconfig, tracking_uri=tracking_uri, no_tracking=no_tracking)
    r = s.results(name, experiment=experiment, target_accuracy=target_accuracy, best_by=best_by.value,
                  source=source.value)
    if not r.cells:
        fail(f"sweep {name!r} has no trials to report on", EXIT_NOT_FOUND)
    directory = (output or s.options.home_dir / "sweeps" / name / "report").resolve()
    built = build(r.cells, directory, sweep=name, source=r.loaded.source, target=target_accuracy,
                  best_by=best_by.value)
    console.print(f"report: {built.html_path} ({len(built.figures)} figures, {len(built.tables)} comparison tables)")
    for note in built.skipped + built.table_notes:
        console.print(f"  {note}", style="dim")
    if upload and r.loaded.parent_run_id:
        try:
            SweepRuns(r.target, name).log_report(r.loaded.parent_run_id, directory)
        except TrackingError as exc:
            fail(f"report written locally, but not logged to MLflow: {exc}", EXIT_BACKEND)
        console.print(f"logged as artifacts report/ of MLflow run {r.loaded.parent_run_id} ({r.target.uri})")
    elif upload:
        console.print("not logged to MLflow: the sweep has no parent run there", style="dim")


@app.command()
def ui(
    port: PortOpt = None,
    backend: BackendOpt = BackendName.local,
    home: HomeOpt = None,
    namespace: NamespaceOpt = None,
    tracking_uri: TrackingUriOpt = None,
) -> None:
    """Start the MLflow UI over the local store (127.0.0.1), or print how to reach the cluster's."""
    from kubesweep.tracking import ui as ui_mod
    from kubesweep.tracking.target import URI_ENV, mlflow_installed

    if backend == BackendName.kubernetes:
        console.print(ui_mod.cluster_directions(namespace or "kubesweep", tracking_uri or os.environ.get(URI_ENV)))
        return
    configured = tracking_uri or os.environ.get(URI_ENV)
    if configured and configured.startswith(("http://", "https://")):
        console.print(f"tracking goes to the MLflow server at {configured}: open it in a browser")
        return
    if not mlflow_installed():
        fail("mlflow is not installed: pip install 'kubesweep[tracking]'", EXIT_USAGE)
    code = ui_mod.serve(Options(home=home).home_dir, port, configured, say=console.print)
    if code is None:
        err.print("stopped the MLflow UI")
    elif code != 0:
        fail(f"mlflow server exited with code {code}", EXIT_BACKEND)


def main(argv: list[str] | None = None) -> Any:
    try:
        return app(args=argv, prog_name="sweep")
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(EXIT_INTERRUPTED)


if __name__ == "__main__":
    main()
