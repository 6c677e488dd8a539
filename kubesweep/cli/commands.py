"""`sweep`: validate, plan, run and inspect GPU benchmark sweeps.

The commands parse their arguments, ask the session layer (`kubesweep.session`: backends, tracking, searches)
and print (`kubesweep.cli.views`). What a command reports as an error (an invalid spec, an unknown sweep, a backend
or tracking server that failed) becomes its message and exit code in one place, `Commands.invoke`.

Exit codes:
  0  success (OOM and GPU-mismatch cells are results, not failures)
  1  one or more trials failed
  2  bad input: an invalid spec, flag or argument
  3  not found: no such sweep or trial
  4  backend error: the cluster, the state store or a process could not do what was asked
  130 interrupted (Ctrl-C, SIGTERM, SIGHUP); running trials are left to finish or are cancelled as the message says
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from rich.console import Console

from kubesweep.backend_factory import DEFAULT_BACKEND, KubernetesConfig, configure
from kubesweep.backends.base import BackendError, Phase
from kubesweep.backends.k8s_client import require_configuration
from kubesweep.cli import names as name_args
from kubesweep.cli import options as opts
from kubesweep.cli import views
from kubesweep.cli.images import app as images_app
from kubesweep.cli.options import CONFIRM_OVER, MetricName, PlanFormat, ResultsFormat, ResultsSource
from kubesweep.cli.terminal_text import clean, plain
from kubesweep.crd import crd_yaml
from kubesweep.gpus import load_catalog
from kubesweep.manifests import RenderError, render_plan, to_yaml
from kubesweep.plan import DEFAULT_MAX_TRIALS, check_size, plan
from kubesweep.preflight import fit_lines, fit_report
from kubesweep.session import EXIT_BACKEND, EXIT_INTERRUPTED, EXIT_NOT_FOUND, EXIT_USAGE, Options, Session, error_code
from kubesweep.session import Results as SweepResults
from kubesweep.sweep_spec import Override, SpecError, Sweep, gpu_types, load_sweep_file, only_gpus, parse_sets
from kubesweep.tracking import aggregate as agg
from kubesweep.tracking import ui as ui_mod
from kubesweep.tracking.records import ResultsDirError, names_a_directory
from kubesweep.tracking.report_files import ReportPathError
from kubesweep.tracking.runs import SweepRuns, TrackingError
from kubesweep.tracking.sweep import log_answer
from kubesweep.tracking.target import URI_ENV, mlflow_installed

if TYPE_CHECKING:
    from kubesweep.backends.base import ProgressCallback
    from kubesweep.plan import Plan
    from kubesweep.session import Ended


def fail(message: str, code: int) -> NoReturn:
    sys.stderr.write(("" if code == EXIT_USAGE else "error: ") + clean(message).rstrip() + "\n")
    raise typer.Exit(code)


class Commands(opts.Group):
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
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode=None,
    epilog="Exit codes: 0 ok, 1 trials failed, 2 bad input, 3 not found, 4 backend error, 130 interrupted.",
)
app.add_typer(images_app, name="images")
# Piped output (CI logs, files) gets wide tables instead of 80 columns of ellipses.
console = Console(highlight=False, soft_wrap=True,
                  width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 200)
err = Console(stderr=True, highlight=False)


@app.callback()
def main_options(gpu_catalog: opts.GpuCatalogOpt = None, version: opts.VersionOpt = False) -> None:
    if gpu_catalog is not None:
        os.environ["KUBESWEEP_GPU_CATALOG"] = str(gpu_catalog)
        load_catalog(gpu_catalog)


def load(path: Path, allow_unpinned: bool, overrides: list[Override]) -> Sweep:
    """The spec at `path` with the `--set` overrides applied (exit 2 with every problem if it is not valid); its
    warnings go to stderr."""
    sweep = load_sweep_file(path, allow_unpinned=allow_unpinned, overrides=overrides)
    views.print_warnings(err, sweep.warnings)
    return sweep


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


def narrowed(sweep: Sweep, gpus: list[str] | None, allow_unpinned: bool) -> Sweep:
    """The sweep with only the GPU types of `--gpu` (all of them without it)."""
    return only_gpus(sweep, gpus, allow_unpinned=allow_unpinned) if gpus else sweep


def submit_command(file: Path, *flags: tuple[str, object]) -> list[str]:
    """`sweep submit FILE` with the options given, as a person types it again: (flag, value) pairs, a bool value a
    bare flag when true, a list's items the flag each (`--set` options, in order), None or False left out."""
    words = ["sweep", "submit", str(file)]
    for flag, value in flags:
        if value is True:
            words.append(flag)
        elif isinstance(value, list):
            words += [word for item in value for word in (flag, str(item))]
        elif value not in (None, False):
            words += [flag, str(value)]
    return words


def confirm_gpus(s: Session, p: Plan, command: list[str], yes: bool) -> None:
    """Kubernetes: what the cluster's nodes offer the plan's GPU trials, before anything is applied. Where some
    cannot run, the GPU types and the ways forward (stderr), then: --yes goes on, a terminal is asked, anything
    else is refused (exit 2, nothing submitted). A user who may not list nodes is told so in one line."""
    fits = s.cluster_fit(p) if gpu_types(p.sweep) else None
    if not fits:
        return
    if not any(f.missing for f in fits):
        views.print_lines(console, [f"this cluster's GPUs: {line}" for line in fit_lines(fits)])
        return
    views.print_lines(err, fit_report(p, fits, command))
    if yes:
        return
    if not sys.stdin.isatty():
        fail("nothing submitted: choose one of the commands above", EXIT_USAGE)
    if not typer.confirm("Submit every trial anyway?", default=False, err=True):
        fail("nothing submitted", EXIT_USAGE)


def make_plan(sweep: Sweep, max_trials: int = DEFAULT_MAX_TRIALS) -> Plan:
    """The sweep's plan, after its size is checked against `max_trials` (over it: exit 2, nothing expanded)."""
    check_size(sweep, max_trials)
    return plan(sweep, max_trials=max_trials)


def session(backend: str = DEFAULT_BACKEND, home: Path | None = None, namespace: str | None = None,
            kubeconfig: Path | None = None, direct: bool = False, **more: Any) -> Session:
    """The session of one command; what it has to say goes to stdout, warnings and notes to stderr."""
    return Session(Options(backend, home, namespace, kubeconfig, direct, **more),
                   notify=lambda message, warning: (err if warning else console).print(plain(message),
                                                                                      soft_wrap=True))


def _watch(run: Callable[[ProgressCallback], Ended], interrupted: str, s: Session, name: str) -> Ended:
    """Follow a sweep to its end behind a live progress view (each running trial's progress from its log);
    Ctrl-C: exit 130, saying what is kept and what goes on running without this process."""
    try:
        return views.watch(console, run, peek=lambda trial: s.backend.logs(name, trial.trial_id))
    except KeyboardInterrupt:
        err.print(plain(f"{interrupted}{_still_running(s, name)}"))
        raise typer.Exit(EXIT_INTERRUPTED) from None


def _still_running(s: Session, name: str) -> str:
    """What an interrupted command leaves running: a trial already started carries on to its end (its results
    are kept), and where the backend drives the sweep without this process, the sweep carries on too."""
    try:
        status = s.backend.status(name)
    except (BackendError, KeyboardInterrupt):
        return ""
    running = [t.name for t in status.trials if t.phase == Phase.RUNNING]
    if not s.backend.driven_by_waiter:
        return f". The sweep carries on without this process: `sweep cancel {name}` stops it"
    if not running:
        return ""
    shown = ", ".join(running[:3]) + (f" and {len(running) - 3} more" if len(running) > 3 else "")
    return (f". Still running without this process, to their end: {len(running)} trial"
            f"{'' if len(running) == 1 else 's'} ({shown}); `sweep cancel {name}` stops "
            f"{'it' if len(running) == 1 else 'them'}")


def _follow(s: Session, name: str, detach: bool) -> None:
    if detach:
        views.print_detached(console, name, s.detach(name))
        return
    ended = _watch(lambda progress: s.follow(name, progress), f"interrupted; finished trials are kept, "
                   f"`sweep resume {name}` continues the sweep", s, name)
    views.print_ended(console, s.backend, name, s.tta_target(name), s.ended_records(name))
    raise typer.Exit(ended.code)


def _print_overrides(overrides: list[Override]) -> None:
    if overrides:
        console.print(plain(views.overrides_text(overrides), keep_lines=False))


def _search(s: Session, sweep: Sweep, overrides: list[Override]) -> NoReturn:
    """Run (or continue) a tune or max-batch search here to its end, then print what it found."""
    views.print_search_start(console, sweep, s.options.backend, s.search_storage(sweep.name))
    _print_overrides(overrides)
    ended = _watch(lambda progress: s.run_search(sweep, progress), f"interrupted; the search state is kept. "
                   f"`sweep submit` of the same spec or `sweep resume {sweep.name}` continues it", s, sweep.name)
    views.print_ended(console, s.backend, sweep.name, sweep.spec.tta_target, s.ended_records(sweep.name))
    if ended.found is not None:
        views.print_search(console, ended.found)
    raise typer.Exit(ended.code)


# ----------------------------------------------------------------------------------------------------------


@app.command()
def validate(
    file: opts.SpecFile, backend: opts.BackendOpt = DEFAULT_BACKEND, any_gpu: opts.AnyGpuOpt = False,
    allow_unpinned: opts.AllowUnpinned = False, max_trials: opts.MaxTrialsOpt = DEFAULT_MAX_TRIALS,
    confirm_over: opts.ConfirmOverOpt = CONFIRM_OVER, gpu: opts.GpuOpt = None, namespace: opts.NamespaceOpt = None,
    kubeconfig: opts.KubeconfigOpt = None, sets: opts.SetOpt = None,
) -> None:
    """Check a sweep spec, and everything `submit` checks before it runs on the backend (--backend; nothing runs);
    print each problem as FILE:LINE: FIELD: what was expected (a value given with --set: the option). With --set,
    also each overridden path's value as the sweep has it. With --backend kubernetes and a cluster configured,
    also what the cluster's nodes offer each GPU type (a cluster that cannot be asked is a note, not an error)."""
    overrides = parse_sets(sets)
    p = make_plan(narrowed(load(file, allow_unpinned, overrides), gpu, allow_unpinned), max_trials)
    s = session(backend, namespace=namespace, kubeconfig=kubeconfig, any_gpu=any_gpu, allow_unpinned=allow_unpinned)
    s.check(p)
    views.warn_if_large(err, p, confirm_over)
    views.print_valid(console, file, p, backend, overrides)
    if s.options.config.asks_cluster:
        _cluster_gpus(s, p, submit_command(file, ("--backend", backend), ("--namespace", namespace),
                                           ("--kubeconfig", kubeconfig), ("--allow-unpinned", allow_unpinned),
                                           ("--set", [o.text for o in overrides])))


def _cluster_gpus(s: Session, p: Plan, command: list[str]) -> None:
    """`validate`'s word on the cluster's GPUs: per GPU type what can run, and the ways forward where some cannot;
    nothing without a cluster configured, a note where it cannot be asked."""
    try:
        require_configuration(s.options.kubeconfig)
    except BackendError:
        return
    if not gpu_types(p.sweep):
        return
    try:
        fits = s.cluster_fit(p)
    except BackendError as exc:
        err.print(plain(f"note: the cluster's GPU types are not checked: {exc}"), soft_wrap=True)
        return
    if fits:
        missing = any(f.missing for f in fits)
        views.print_lines(err if missing else console, fit_report(p, fits, command) if missing else
                          [f"this cluster's GPUs: {line}" for line in fit_lines(fits)])


@app.command("plan")
def plan_cmd(
    file: opts.SpecFile, output: opts.PlanOutputOpt = PlanFormat.table, all_rows: opts.AllRowsOpt = False,
    allow_unpinned: opts.AllowUnpinned = False, max_trials: opts.MaxTrialsOpt = DEFAULT_MAX_TRIALS,
    sets: opts.SetOpt = None,
) -> None:
    """Show the trials a spec expands to (and the cells dropped, with the reason)."""
    overrides = parse_sets(sets)
    p = make_plan(load(file, allow_unpinned, overrides), max_trials)
    views.show_plan(console, p, output.value, all_rows)


@app.command()
def render(
    file: opts.SpecFile, allow_unpinned: opts.AllowUnpinned = False, namespace: opts.NamespaceOpt = None,
    max_trials: opts.MaxTrialsOpt = DEFAULT_MAX_TRIALS, tuner_image: opts.TunerImageOpt = None,
    sets: opts.SetOpt = None,
) -> None:
    """Print the Kubernetes manifests (a YAML stream) the spec's trials run as (after the checks `submit
    --backend kubernetes` runs): a warm pod's Job per GPU slot kind (spec.warm_pods, the default; false: a Job per
    trial); a search sweep's tuner Job as the operator runs it, in --tuner-image."""
    overrides = parse_sets(sets)
    p = make_plan(load(file, allow_unpinned, overrides), max_trials)
    session(KubernetesConfig.name, allow_unpinned=allow_unpinned).check(p)
    try:
        objects = render_plan(p, allow_unpinned=allow_unpinned, namespace=namespace, tuner_image=tuner_image)
    except RenderError as exc:
        fail(str(exc), EXIT_USAGE)
    sys.stdout.write(to_yaml(objects))


@app.command()
def crd() -> None:
    """Print the Sweep CustomResourceDefinition (generated from the spec model) as YAML."""
    sys.stdout.write(crd_yaml())


@app.command()
def submit(
    file: opts.SpecFile, backend: opts.BackendOpt = DEFAULT_BACKEND, detach: opts.SubmitDetachOpt = False,
    any_gpu: opts.AnyGpuOpt = False, parallel: opts.ParallelOpt = 1, allow_unpinned: opts.AllowUnpinned = False,
    home: opts.HomeOpt = None, namespace: opts.NamespaceOpt = None, kubeconfig: opts.KubeconfigOpt = None,
    direct: opts.DirectOpt = False, tracking_uri: opts.TrackingUriOpt = None, no_tracking: opts.NoTrackingOpt = False,
    max_trials: opts.MaxTrialsOpt = DEFAULT_MAX_TRIALS, confirm_over: opts.ConfirmOverOpt = CONFIRM_OVER,
    yes: opts.YesOpt = False, gpu: opts.GpuOpt = None, sets: opts.SetOpt = None,
) -> None:
    """Expand a spec (with its --set overrides) into trials and run them. Submitting the same spec again starts
    nothing twice.

    Kubernetes: before anything is applied, what the cluster's nodes offer each GPU type (label
    nvidia.com/gpu.product, allocatable nvidia.com/gpu); where some trials cannot run, the ways forward: --gpu
    TYPE for only the types it has, or --yes for every trial (those no node takes end `unschedulable`).

    A search (`strategy: tune` or `max_batch`) makes its trials as it runs: here for --backend local or --direct,
    else as the operator's tuner Job; submitted again, it continues from its saved state.
    Tracking: one MLflow parent run per sweep (found again on a later submit or resume), a child run per trial.
    """
    overrides = parse_sets(sets)
    sweep = narrowed(load(file, allow_unpinned, overrides), gpu, allow_unpinned)
    p = make_plan(sweep, max_trials)
    s = session(backend, home, namespace, kubeconfig, direct, any_gpu=any_gpu, parallel=parallel,
                tracking_uri=tracking_uri, no_tracking=no_tracking, allow_unpinned=allow_unpinned)
    s.check(p, cluster=True)  # what `validate` checks, and first whether there is a cluster to ask
    if s.options.config.asks_cluster:
        confirm_gpus(s, p, submit_command(
            file, ("--backend", backend), ("--namespace", namespace), ("--kubeconfig", kubeconfig),
            ("--direct", direct), ("--allow-unpinned", allow_unpinned), ("--tracking-uri", tracking_uri),
            ("--no-tracking", no_tracking), ("--detach", detach),
            ("--max-trials", max_trials if max_trials != DEFAULT_MAX_TRIALS else None),
            ("--set", [o.text for o in overrides])), yes)
    confirm_large(p, confirm_over, yes)
    if detach and s.search_runs_here(sweep):
        s.detach_search(file, sweep.name, allow_unpinned=allow_unpinned, max_trials=max_trials,
                        sets=[o.text for o in overrides])
        views.print_search_detached(console, sweep)
        _print_overrides(overrides)
        return
    status = s.submit(sweep, p)
    if status is None:
        _search(s, sweep, overrides)
    views.print_submitted(console, file, p, backend, status.message, overrides)
    _follow(s, sweep.name, detach)


@app.command("_drive", hidden=True)
def drive(
    name: str, home: opts.HomeOpt = None, backend: opts.BackendOpt = DEFAULT_BACKEND,
    namespace: opts.NamespaceOpt = None, kubeconfig: opts.KubeconfigOpt = None, direct: opts.DirectOpt = False,
    tracking_uri: opts.TrackingUriOpt = None, no_tracking: opts.NoTrackingOpt = False,
) -> None:
    """Drive a sweep until every trial is done (used by --detach): a local sweep's supervisor, or a `--direct`
    Kubernetes sweep's reconciler."""
    s = session(backend, home, namespace, kubeconfig, direct, tracking_uri=tracking_uri, no_tracking=no_tracking)
    raise typer.Exit(s.drive(name).code)


@app.command()
def status(
    name: name_args.StatusNameArg = None, backend: opts.BackendOpt = DEFAULT_BACKEND, watch: opts.WatchOpt = False,
    output: opts.StatusOutputOpt = PlanFormat.table, all_rows: opts.AllRowsOpt = False, home: opts.HomeOpt = None,
    namespace: opts.NamespaceOpt = None, kubeconfig: opts.KubeconfigOpt = None, direct: opts.DirectOpt = False,
) -> None:
    """Show a sweep's trials and their phases (or list the sweeps)."""
    b = session(backend, home, namespace, kubeconfig, direct).backend
    if name is None:
        views.print_sweeps(console, [b.status(n) for n in b.list_sweeps()])
    elif watch:
        views.watch(console, lambda progress: b.wait(name, progress=progress),
                    peek=lambda trial: b.logs(name, trial.trial_id))
    else:
        views.show_status(console, b.status(name), output.value, all_rows)


@app.command()
def logs(
    name: name_args.NameArg, trial: opts.TrialArg = None, follow: opts.FollowOpt = False, raw: opts.RawLogOpt = False,
    backend: opts.BackendOpt = DEFAULT_BACKEND, home: opts.HomeOpt = None, namespace: opts.NamespaceOpt = None,
    kubeconfig: opts.KubeconfigOpt = None, direct: opts.DirectOpt = False,
) -> None:
    """Print a trial's log as text (its escape sequences and control characters removed; --raw: as written); with
    no TRIAL, list the sweep's trials."""
    b = session(backend, home, namespace, kubeconfig, direct).backend
    if trial is None:
        views.print_trial_list(console, b.status(name))
        return
    for chunk in b.logs(name, trial, follow=follow):
        sys.stdout.write(chunk if raw else clean(chunk))
        sys.stdout.flush()


@app.command()
def cancel(
    name: name_args.NameArg, backend: opts.BackendOpt = DEFAULT_BACKEND, home: opts.HomeOpt = None,
    namespace: opts.NamespaceOpt = None, kubeconfig: opts.KubeconfigOpt = None, direct: opts.DirectOpt = False,
) -> None:
    """Stop a sweep's running trials and start no new ones; finished trials keep their results."""
    cancelled, s = session(backend, home, namespace, kubeconfig, direct).cancel(name)
    views.print_cancelled(console, name, cancelled, s)


@app.command()
def resume(
    name: name_args.NameArg, backend: opts.BackendOpt = DEFAULT_BACKEND, detach: opts.ResumeDetachOpt = False,
    home: opts.HomeOpt = None, namespace: opts.NamespaceOpt = None, kubeconfig: opts.KubeconfigOpt = None,
    direct: opts.DirectOpt = False, tracking_uri: opts.TrackingUriOpt = None, no_tracking: opts.NoTrackingOpt = False,
) -> None:
    """Run again only the trials that failed, were cancelled, ended unschedulable (no node could take them) or are
    missing (into the same MLflow runs), and continue those not ended (pending ones start, running ones are
    followed); a search continues from its saved state."""
    s = session(backend, home, namespace, kubeconfig, direct, tracking_uri=tracking_uri, no_tracking=no_tracking)
    sweep, resumed = s.resume(name)
    if resumed is None:
        _search(s, sweep, [])
    if resumed.done:  # nothing to rerun: said so
        return
    _follow(s, name, detach)


@app.command()
def delete(
    name: name_args.NameArg, yes: opts.DeleteYesOpt = False, backend: opts.BackendOpt = DEFAULT_BACKEND,
    home: opts.HomeOpt = None, namespace: opts.NamespaceOpt = None, kubeconfig: opts.KubeconfigOpt = None,
    direct: opts.DirectOpt = False, tracking_uri: opts.TrackingUriOpt = None, no_tracking: opts.NoTrackingOpt = False,
) -> None:
    """Forget a sweep and its state (local: its trial directories too; its results files and MLflow runs stay).
    A sweep still running is stopped first, after asking (at a terminal) or with --yes; its MLflow runs left
    running end as KILLED."""
    s = session(backend, home, namespace, kubeconfig, direct, tracking_uri=tracking_uri, no_tracking=no_tracking)
    status = s.backend.status(name)
    active = [t for t in status.trials if not t.phase.terminal]
    if active and not yes:
        running = sum(1 for t in active if t.phase == Phase.RUNNING)
        what = f"sweep {name!r} is still running: {running} trial{'' if running == 1 else 's'} running, " \
               f"{len(active) - running} to start"
        if not sys.stdin.isatty():
            fail(f"{what}; `sweep delete {name} --yes` stops and deletes it", EXIT_USAGE)
        if not typer.confirm(plain(f"{what}. Stop it and delete it?").plain, default=False, err=True):
            fail("not deleted", EXIT_USAGE)
    killed = s.delete(name)
    console.print(plain(f"sweep {name!r} deleted" + (f"; {killed} MLflow run{'' if killed == 1 else 's'} left "
                                                     "running ended as KILLED" if killed else "")))


@app.command()
def results(
    names: name_args.NamesArg = None, fmt: opts.ResultsFormatOpt = ResultsFormat.table, sort: opts.SortOpt = None,
    reverse: opts.ReverseOpt = False, filters: opts.FilterOpt = None, target_accuracy: opts.TargetOpt = None,
    best_by: opts.BestByOpt = MetricName.samples_per_s, per_trial: opts.PerTrialOpt = False,
    backend: opts.BackendOpt = DEFAULT_BACKEND, home: opts.HomeOpt = None, namespace: opts.NamespaceOpt = None,
    kubeconfig: opts.KubeconfigOpt = None, direct: opts.DirectOpt = False, tracking_uri: opts.TrackingUriOpt = None,
    no_tracking: opts.NoTrackingOpt = False, experiment: opts.ExperimentOpt = None,
    source: opts.FromOpt = ResultsSource.auto, wide: opts.WideOpt = False,
) -> None:
    """The sweep's results aggregated over repeats: mean ±95% interval of samples/s, step p50, peak memory,
    time-to-accuracy, accuracy, $/epoch and kWh/epoch per setting; OOM and GPU-mismatch cells as such; * marks
    the best setting per GPU type. Reads the trials' MLflow runs (the local results files when tracking is off).
    Several sweeps (or directories of results files) merge into one comparison; a directory's results file that
    is not valid is skipped, with one line naming it, its field and what was expected."""
    s = session(backend, home, namespace, kubeconfig, direct, tracking_uri=tracking_uri, no_tracking=no_tracking)
    if not names:
        _list_sweeps(s, "results")
        return
    name = " + ".join(names)
    if per_trial and len(names) > 1:
        fail("--per-trial shows one sweep: name one", EXIT_USAGE)
    r = _merged(s, names, experiment, target_accuracy, best_by.value, source.value)
    if per_trial:
        views.show_trial_rows(console, s.backend, name, fmt.value, r.loaded.records)
        return
    try:
        cells = agg.sort_cells(agg.apply_filters(r.cells, agg.parse_filters(filters or [])), sort, reverse)
    except agg.QueryError as exc:
        fail(str(exc), EXIT_USAGE)
    found = s.search_found(name, r.sweep, r.loaded.parent_run_id) if r.searched else None
    views.print_aggregated(console, fmt.value, name, cells, [] if len(names) > 1 else r.loaded.records,
                           source=r.loaded.source,
                           target=r.target_accuracy, best_by=best_by.value, found=found, wide=wide)


def _list_sweeps(s: Session, command: str) -> None:
    """For a command given no sweep: the sweeps there are, and how to name one."""
    known = s.backend.list_sweeps()
    views.print_sweeps(console, [s.backend.status(n) for n in known])
    example = known[0] if known else "NAME"
    console.print(plain(f"name a sweep (or a directory of results files): `sweep {command} {example}`"))


def _merged(s: Session, names: list[str], experiment: str | None, target: float | None, best_by: str,
            source: str) -> SweepResults:
    """`Session.merged_results`; a directory with a file that is not a results file is a usage error."""
    try:
        return s.merged_results(names, experiment=experiment, target_accuracy=target, best_by=best_by,
                                source=source)
    except ResultsDirError as exc:
        fail(str(exc), EXIT_USAGE)


@app.command()
def report(
    names: name_args.NamesArg = None, output: opts.ReportDirOpt = None, target_accuracy: opts.TargetOpt = None,
    best_by: opts.BestByOpt = MetricName.samples_per_s, upload: opts.UploadOpt = True,
    backend: opts.BackendOpt = DEFAULT_BACKEND, home: opts.HomeOpt = None, namespace: opts.NamespaceOpt = None,
    kubeconfig: opts.KubeconfigOpt = None, tracking_uri: opts.TrackingUriOpt = None,
    no_tracking: opts.NoTrackingOpt = False, experiment: opts.ExperimentOpt = None,
    source: opts.FromOpt = ResultsSource.auto,
) -> None:
    """An HTML report with PNG figures (throughput, compile speed-up, peak memory, time-to-accuracy, $/epoch,
    energy, the matrix heatmap) and the comparison tables (GPU types, torch.compile break-even, inference),
    written locally and logged to the sweep's parent run. Several sweeps (or directories of results files, e.g.
    the same sweep run on another machine) merge into one report. --output DIR is made if missing; the report's
    own files in it are replaced whole (written aside, then moved into place), other files are left alone; a
    DIR that is a file or cannot be written is exit 2."""
    try:
        from kubesweep.tracking.report import build
    except ImportError as exc:  # pragma: no cover - depends on the install
        fail(f"the report needs matplotlib ({exc}): pip install 'kubesweep[tracking]'", EXIT_USAGE)
    s = session(backend, home, namespace, kubeconfig, tracking_uri=tracking_uri, no_tracking=no_tracking)
    if not names:
        _list_sweeps(s, "report")
        return
    name = " + ".join(names)
    r = _merged(s, names, experiment, target_accuracy, best_by.value, source.value)
    if not r.cells:
        fail(f"sweep {name!r} has no trials to report on", EXIT_NOT_FOUND)
    one_sweep = len(names) == 1 and not names_a_directory(names[0])
    default = (s.options.home_dir / "sweeps" / names[0] / "report" if one_sweep
               else s.options.home_dir / "reports" / "+".join(Path(n).name or "results" for n in names))
    directory = (output or default).expanduser().resolve()
    try:
        built = build(r.cells, directory, sweep=name, source=r.loaded.source, target=r.target_accuracy,
                      best_by=best_by.value, merged=len(names) > 1, repeats=s.repeats_spent(names))
    except ReportPathError as exc:  # --output names a bad place: bad input; the home's own directory: the store's
        fail(str(exc), EXIT_USAGE if output is not None else EXIT_BACKEND)
    views.print_report(console, built)
    if upload and r.loaded.parent_run_id:
        try:
            runs = SweepRuns(r.target, name)
            runs.log_report(r.loaded.parent_run_id, directory)
            if one_sweep:  # the answer on the parent run (a sweep the operator ran ends without one)
                log_answer(runs, r.loaded.parent_run_id, r.cells, r.target_accuracy)
        except TrackingError as exc:
            fail(f"report written locally, but not logged to MLflow: {exc}", EXIT_BACKEND)
        console.print(plain(f"logged as artifacts report/ of MLflow run {r.loaded.parent_run_id} ({r.target.uri})"))
    elif upload:
        console.print("not logged to MLflow: the sweep has no parent run there", style="dim")


@app.command()
def ui(
    name: name_args.UiNameArg = None, port: opts.PortOpt = None, backend: opts.BackendOpt = DEFAULT_BACKEND,
    home: opts.HomeOpt = None, namespace: opts.NamespaceOpt = None, tracking_uri: opts.TrackingUriOpt = None,
) -> None:
    """Start the MLflow UI over the local store (127.0.0.1), or print how to reach the cluster's. Its URL is
    printed once it answers: NAME's runs view, or a link to each sweep's. The server's output goes to
    <home>/ui.log. Kubernetes: with NAME and --tracking-uri of the cluster's server (a port-forward), NAME's runs
    view and answer there, from the operator's record of its parent run."""
    if configure(backend).asks_cluster:
        uri = tracking_uri or os.environ.get(URI_ENV)
        if name is not None and uri and uri.startswith(("http://", "https://")):
            _cluster_views(session(backend, namespace=namespace, tracking_uri=uri), name, uri)
            return
        console.print(plain(ui_mod.cluster_directions(uri)))
        return
    configured = tracking_uri or os.environ.get(URI_ENV)
    if configured and configured.startswith(("http://", "https://")):
        console.print(plain(f"tracking goes to the MLflow server at {configured}: open it in a browser"))
        return
    if not mlflow_installed():
        fail("mlflow is not installed: pip install 'kubesweep[tracking]'", EXIT_USAGE)
    experiment = None
    if name is not None:  # the sweep's experiment, as its trials were tracked
        s = session(home=home, tracking_uri=tracking_uri)
        try:
            known = s.backend.sweep_of(name)
        except SpecError:
            known = None
        experiment = s.tracking_target(name, known).experiment
    home_dir = Options(home=home).home_dir
    code = ui_mod.serve(home_dir, port, configured, say=lambda line: console.print(plain(line)), sweep=name,
                        experiment=experiment)
    if code is None:
        err.print("stopped the MLflow UI")
    elif code != 0:
        fail(f"mlflow server exited with code {code}; its log: {home_dir / ui_mod.LOG_FILE}", EXIT_BACKEND)


def _cluster_views(s: Session, name: str, uri: str) -> None:
    """The sweep's runs view and its answer on the cluster's tracking server (through a port-forward, say), as
    the operator records its parent run."""
    try:
        views_found = s.recorded_views(name)
    except TrackingError as exc:
        fail(f"sweep {name!r}: {exc}", EXIT_BACKEND)
    except BackendError as exc:
        fail(str(exc), error_code(exc) or EXIT_BACKEND)
    if views_found is None:
        fail(f"sweep {name!r}: the backend records no MLflow parent run for it (yet): `sweep status {name}` says "
             "where it stands", EXIT_NOT_FOUND)
    runs, answer = views_found
    console.print(plain(f"sweep {name}'s runs on {uri}: {runs}"))
    console.print(plain(f"its answer in full (the parent run's description): {answer}"))


def main(argv: list[str] | None = None) -> Any:
    try:
        return app(args=argv, prog_name="sweep")
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(EXIT_INTERRUPTED)


if __name__ == "__main__":
    main()
