"""`sweep`: validate, plan, run and inspect GPU benchmark sweeps.

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
import subprocess
import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console

from kubesweep import __version__
from kubesweep.gpus import CatalogError, load_catalog
from kubesweep.images import app as images_app
from kubesweep.plan import DEFAULT_MAX_TRIALS
from kubesweep.spec import SpecError, Sweep, load_sweep_file

if TYPE_CHECKING:
    from kubesweep.backends.base import Backend, SweepStatus
    from kubesweep.manifests import TrackingEnv
    from kubesweep.plan import Plan
    from kubesweep.tracking.target import TrackingTarget

EXIT_OK, EXIT_TRIALS_FAILED, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_BACKEND, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130

app = typer.Typer(
    name="sweep",
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


SpecFile = Annotated[Path, typer.Argument(help="sweep spec (YAML)", show_default=False)]
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


def fail(message: str, code: int) -> NoReturn:
    sys.stderr.write(("" if code == EXIT_USAGE else "error: ") + message.rstrip() + "\n")
    raise typer.Exit(code)


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
        try:
            load_catalog(gpu_catalog)
        except CatalogError as exc:
            fail(str(exc), EXIT_USAGE)


def load(path: Path, allow_unpinned: bool) -> Sweep:
    """The spec at `path` (exit 2 with every problem if it is not valid); its warnings go to stderr."""
    try:
        sweep = load_sweep_file(path, allow_unpinned=allow_unpinned)
    except SpecError as exc:
        fail(str(exc), EXIT_USAGE)
    except CatalogError as exc:
        fail(str(exc), EXIT_USAGE)
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

    try:
        check_size(sweep, max_trials)
        return plan(sweep, max_trials=max_trials)
    except SpecError as exc:
        fail(str(exc), EXIT_USAGE)


def get_backend(
    name: BackendName,
    home: Path | None = None,
    *,
    any_gpu: bool = False,
    parallel: int = 1,
    namespace: str | None = None,
    kubeconfig: Path | None = None,
    direct: bool = False,
    tracking: TrackingEnv | None = None,
) -> Backend:
    from kubesweep.backends import BackendError, make_backend

    try:
        return make_backend(
            name.value, home=home, any_gpu=any_gpu, cpu_slots=parallel, namespace=namespace, kubeconfig=kubeconfig,
            direct=direct,
            tracking=tracking,
        )
    except BackendError as exc:
        fail(str(exc), EXIT_BACKEND)


def home_dir(home: Path | None) -> Path:
    from kubesweep.backends.local import default_home

    return (home or default_home()).expanduser()


def tracking_target(name: str, spec: dict[str, Any] | None, backend: BackendName, home: Path | None,
                    uri: str | None, disabled: bool, experiment: str | None = None) -> TrackingTarget:
    """Where the sweep is tracked: flag, env, spec, else the local store (kubesweep.tracking.target)."""
    from kubesweep.tracking.target import resolve

    tracking = ((spec or {}).get("spec") or {}).get("tracking") or {}
    return resolve(experiment=experiment or tracking.get("experiment") or name, home=home_dir(home), flag=uri,
                   spec_uri=tracking.get("uri"), backend=backend.value, disabled=disabled)


def open_tracking(name: str, spec: dict[str, Any], trials: int, backend: BackendName, home: Path | None,
                  uri: str | None, disabled: bool) -> tuple[TrackingTarget, TrackingEnv | None]:
    """Find or create the sweep's parent run and say where tracking goes (once); off is not an error."""
    from kubesweep.tracking.sweep import open_parent

    target = tracking_target(name, spec, backend, home, uri, disabled)
    opened = open_parent(target, name, backend=backend.value, trials=trials, spec=spec)
    (err if opened.warning else console).print(opened.message)
    if opened.env is None and backend == BackendName.local:
        # local trials inherit this environment: keep them from logging when tracking is off
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    return target, opened.env


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
    from kubesweep import views

    sweep = load(file, allow_unpinned)
    p = make_plan(sweep, max_trials)
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
    home: HomeOpt = None,
    namespace: NamespaceOpt = None,
    kubeconfig: KubeconfigOpt = None,
    direct: DirectOpt = False,
    tracking_uri: TrackingUriOpt = None,
    no_tracking: NoTrackingOpt = False,
    max_trials: MaxTrialsOpt = DEFAULT_MAX_TRIALS,
    confirm_over: ConfirmOverOpt = CONFIRM_OVER,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="submit without asking, whatever the trial count")] = False,
) -> None:
    """Expand a spec into trials and run them. Submitting the same spec again starts nothing twice.

    A search (`strategy: tune` or `max_batch`) makes its trials as it runs: here for --backend local or --direct,
    else as the operator's tuner Job; submitted again, it continues from its saved state.
    Tracking: one MLflow parent run per sweep (found again on a later submit or resume), a child run per trial.
    """
    from kubesweep.backends import BackendError

    sweep = load(file, allow_unpinned)
    p = make_plan(sweep, max_trials)
    confirm_large(p, confirm_over, yes)
    searching = sweep.spec.search.strategy in SEARCHES and (backend == BackendName.local or direct)
    if searching and detach:
        _spawn_search(file, home, backend, allow_unpinned, tracking_uri, no_tracking, parallel, any_gpu,
                      namespace, kubeconfig, direct, max_trials)
        console.print(f"sweep {sweep.name!r}: {sweep.spec.search.strategy} search detached; follow with "
                      f"`sweep status {sweep.name}`")
        return
    target, env = open_tracking(sweep.name, sweep.to_document(), len(p.trials), backend, home, tracking_uri,
                                no_tracking)
    b = get_backend(backend, home, any_gpu=any_gpu, parallel=parallel, namespace=namespace, kubeconfig=kubeconfig,
                    direct=direct, tracking=env)
    if searching:
        _run_search(sweep, b, home, backend, target, env)
    try:
        status = b.submit(p)
    except BackendError as exc:
        fail(str(exc), EXIT_BACKEND)
    console.print(f"sweep {sweep.name!r}: {len(p.trials)} trials on the {backend.value} backend ({status.message})")
    if p.dropped:
        console.print(f"{len(p.dropped)} cells dropped (see `sweep plan {file}`)")
    _follow(b, sweep.name, detach, home, backend, target, env)


SEARCHES = ("tune", "max_batch")


def _strategy(doc: dict[str, Any] | None) -> str | None:
    """The search strategy of a sweep's document (None when the document is unknown)."""
    return (((doc or {}).get("spec") or {}).get("search") or {}).get("strategy")


def search_storage(home: Path | None, name: str) -> Path:
    """Where a search keeps its state (Ray Tune's experiment, the max-batch bisection): under the sweep's
    local directory, or $KUBESWEEP_TUNE_STORAGE/<sweep>."""
    root = os.environ.get("KUBESWEEP_TUNE_STORAGE")
    return Path(root) / name if root else home_dir(home) / "sweeps" / name / "search"


def _run_search(sweep: Sweep, b: Backend, home: Path | None, backend: BackendName,
                target: TrackingTarget | None, env: TrackingEnv | None) -> NoReturn:
    """Run (or continue) a tune or max-batch search to its end, then print what it found."""
    from kubesweep import views
    from kubesweep.backends import BackendError

    storage = search_storage(home, sweep.name)
    console.print(f"sweep {sweep.name!r}: {sweep.spec.search.strategy} search on the {backend.value} backend "
                  f"(state in {storage})")
    view = views.ProgressView(console)
    try:
        if sweep.spec.search.strategy == "tune":
            from kubesweep.tune.driver import run_tune

            summary = run_tune(sweep, b, storage=storage, tracking=env, progress=view.update).as_dict()
        else:
            from kubesweep.tune.maxbatch import run_max_batch

            summary = run_max_batch(sweep, b, storage=storage, tracking=env, progress=view.update).as_dict()
    except KeyboardInterrupt:
        view.stop()
        err.print(f"interrupted; the search state is kept. `sweep submit` of the same spec or "
                  f"`sweep resume {sweep.name}` continues it")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except BackendError as exc:
        view.stop()
        fail(str(exc), EXIT_BACKEND)
    view.stop()
    status = b.status(sweep.name)
    code = _exit_for(status)
    if target is not None:
        from kubesweep.tracking.sweep import finish_parent

        finish_parent(env, target, sweep.name, failed=code != EXIT_OK)
    _print_summary(b, sweep.name)
    _print_search(summary)
    raise typer.Exit(code)


def _print_search(summary: dict[str, Any]) -> None:
    from kubesweep import views

    for line in views.search_lines(summary):
        console.print(line)


def _spawn_search(file: Path, home: Path | None, backend: BackendName, allow_unpinned: bool,
                  tracking_uri: str | None, no_tracking: bool, parallel: int, any_gpu: bool,
                  namespace: str | None, kubeconfig: Path | None, direct: bool,
                  max_trials: int = DEFAULT_MAX_TRIALS) -> None:
    """`sweep submit` of the same spec, in the foreground of a new session with its output in driver.log: the
    search runs on after this shell returns."""
    from kubesweep.backends.local import default_home

    home_path = home or default_home()
    sweep = load(file, allow_unpinned)
    log = home_path / "sweeps" / sweep.name / "driver.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "kubesweep", "submit", str(file.resolve()), "--home", str(home_path),
            "--backend", backend.value, "--parallel", str(parallel), "--max-trials", str(max_trials)]
    argv += ["--allow-unpinned"] if allow_unpinned else []
    argv += ["--any-gpu"] if any_gpu else []
    argv += ["--tracking-uri", tracking_uri] if tracking_uri else []
    argv += ["--no-tracking"] if no_tracking else []
    argv += ["--namespace", namespace] if namespace else []
    argv += ["--kubeconfig", str(kubeconfig)] if kubeconfig else []
    argv += ["--direct"] if direct else []
    argv += ["--yes"]  # asked (or not needed) here already
    with log.open("ab") as out:
        subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True)


def _follow(b: Backend, name: str, detach: bool, home: Path | None, backend: BackendName,
            target: TrackingTarget | None = None, env: TrackingEnv | None = None) -> None:
    from kubesweep import views
    from kubesweep.backends import BackendError

    if detach:
        if backend == BackendName.local:
            _spawn_driver(name, home)
        console.print(f"detached; follow with `sweep status {name}`, results with `sweep results {name}`")
        return
    view = views.ProgressView(console)
    try:
        status = b.wait(name, progress=view.update)
    except KeyboardInterrupt:
        view.stop()
        err.print(
            f"interrupted; finished trials are kept. `sweep resume {name}` continues, `sweep cancel {name}` stops"
        )
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except BackendError as exc:
        view.stop()
        fail(str(exc), EXIT_BACKEND)
    view.stop()
    code = _exit_for(status)
    if target is not None:
        from kubesweep.tracking.sweep import finish_parent

        finish_parent(env, target, name, failed=code != EXIT_OK)
    _print_summary(b, name)
    raise typer.Exit(code)


def _exit_for(status: SweepStatus) -> int:
    from kubesweep.outcomes import Outcome

    return EXIT_TRIALS_FAILED if any(t.outcome == Outcome.FAILED for t in status.trials) else EXIT_OK


def _spawn_driver(name: str, home: Path | None) -> None:
    from kubesweep.backends.local import default_home

    home_dir = home or default_home()
    log = home_dir / "sweeps" / name / "driver.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        subprocess.Popen(
            [sys.executable, "-m", "kubesweep", "_drive", name, "--home", str(home_dir)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


@app.command("_drive", hidden=True)
def drive(name: str, home: HomeOpt = None) -> None:
    """Run a local sweep's supervisor until every trial is done (used by --detach)."""
    b = get_backend(BackendName.local, home)
    status = b.wait(name)
    raise typer.Exit(_exit_for(status))


@app.command()
def status(
    name: Annotated[str | None, typer.Argument(help="sweep name; omit to list sweeps", show_default=False)] = None,
    backend: BackendOpt = BackendName.local,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="keep the table live until the sweep ends")] = False,
    output: Annotated[PlanFormat, typer.Option("--output", "-o")] = PlanFormat.table,
    all_rows: AllRowsOpt = False,
    home: HomeOpt = None,
    namespace: NamespaceOpt = None,
    kubeconfig: KubeconfigOpt = None,
    direct: DirectOpt = False,
) -> None:
    """Show a sweep's trials and their phases (or list the sweeps)."""
    from kubesweep import views
    from kubesweep.backends import BackendError

    b = get_backend(backend, home, namespace=namespace, kubeconfig=kubeconfig, direct=direct)
    try:
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
    except BackendError as exc:
        fail(str(exc), _code_for(exc))
    if output == PlanFormat.json:
        sys.stdout.write(json.dumps(views.status_json(s), indent=2) + "\n")
    else:
        views.print_status(console, s, limit=None if all_rows else views.TABLE_ROWS)


def _code_for(exc: Exception) -> int:
    from kubesweep.backends import AmbiguousTrial, SweepNotFound

    if isinstance(exc, AmbiguousTrial):
        return EXIT_USAGE
    return EXIT_NOT_FOUND if isinstance(exc, SweepNotFound) else EXIT_BACKEND


@app.command()
def logs(
    name: Annotated[str, typer.Argument(help="sweep name")],
    trial: Annotated[str, typer.Argument(help="trial name or id (a unique prefix is enough)")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing until the trial ends")] = False,
    backend: BackendOpt = BackendName.local,
    home: HomeOpt = None,
    namespace: NamespaceOpt = None,
    kubeconfig: KubeconfigOpt = None,
    direct: DirectOpt = False,
) -> None:
    """Print a trial's log."""
    from kubesweep.backends import BackendError

    b = get_backend(backend, home, namespace=namespace, kubeconfig=kubeconfig, direct=direct)
    try:
        for chunk in b.logs(name, trial, follow=follow):
            sys.stdout.write(chunk)
            sys.stdout.flush()
    except BackendError as exc:
        fail(str(exc), _code_for(exc))


@app.command()
def cancel(
    name: Annotated[str, typer.Argument(help="sweep name")],
    backend: BackendOpt = BackendName.local,
    home: HomeOpt = None,
    namespace: NamespaceOpt = None,
    kubeconfig: KubeconfigOpt = None,
    direct: DirectOpt = False,
) -> None:
    """Stop a sweep's running trials and start no new ones; finished trials keep their results."""
    from kubesweep import views
    from kubesweep.backends import BackendError

    b = get_backend(backend, home, namespace=namespace, kubeconfig=kubeconfig, direct=direct)
    try:
        before = b.status(name)
        strategy = _strategy(_spec_of(b, name))
        if before.done and before.trials and strategy not in SEARCHES:  # a search may still make trials
            console.print(f"sweep {name!r} has already ended ({before.phase}): nothing to cancel; "
                          f"{views.counts_text(before)}")
            return
        s = b.cancel(name)
    except BackendError as exc:
        fail(str(exc), _code_for(exc))
    console.print(f"sweep {name!r} cancelled: {views.counts_text(s)}")


@app.command()
def resume(
    name: Annotated[str, typer.Argument(help="sweep name")],
    backend: BackendOpt = BackendName.local,
    detach: Annotated[bool, typer.Option("--detach", "-d", help="return at once")] = False,
    home: HomeOpt = None,
    namespace: NamespaceOpt = None,
    kubeconfig: KubeconfigOpt = None,
    direct: DirectOpt = False,
    tracking_uri: TrackingUriOpt = None,
    no_tracking: NoTrackingOpt = False,
) -> None:
    """Run again only the trials that failed, were cancelled or are missing (into the same MLflow runs); a search
    continues from its saved state."""
    from kubesweep.backends import BackendError

    b = get_backend(backend, home, namespace=namespace, kubeconfig=kubeconfig, direct=direct)
    spec = _spec_of(b, name)
    if spec is None:
        fail(f"no {backend.value} sweep named {name!r}", EXIT_NOT_FOUND)
    target, env = open_tracking(name, spec, len(b.status(name).trials), backend, home, tracking_uri, no_tracking)
    b = get_backend(backend, home, namespace=namespace, kubeconfig=kubeconfig, direct=direct, tracking=env)
    if backend == BackendName.local:
        _record_tracking(b, name, env)
    strategy = ((spec.get("spec") or {}).get("search") or {}).get("strategy")
    if strategy in SEARCHES and (backend == BackendName.local or direct):
        from kubesweep.spec import parse_sweep

        try:
            sweep = parse_sweep(spec, source=f"sweep {name}", allow_unpinned=True)
        except SpecError as exc:
            fail(str(exc), EXIT_USAGE)
        _run_search(sweep, b, home, backend, target, env)
    try:
        b.resume(name)
    except BackendError as exc:
        fail(str(exc), _code_for(exc))
    _follow(b, name, detach, home, backend, target, env)


def _spec_of(b: Backend, name: str) -> dict[str, Any] | None:
    from kubesweep.backends import BackendError

    reader = getattr(b, "spec_of", None)
    try:
        return reader(name) if reader is not None else None
    except BackendError as exc:
        fail(str(exc), _code_for(exc))


def _record_tracking(b: Backend, name: str, env: TrackingEnv | None) -> None:
    """Local backend: keep the sweep's tracking env current for the trials resume starts."""
    from kubesweep.backends.local import LocalBackend

    if isinstance(b, LocalBackend):
        b.record_tracking(name, env)


@app.command()
def delete(
    name: Annotated[str, typer.Argument(help="sweep name")],
    backend: BackendOpt = BackendName.local,
    home: HomeOpt = None,
    namespace: NamespaceOpt = None,
    kubeconfig: KubeconfigOpt = None,
    direct: DirectOpt = False,
) -> None:
    """Cancel a sweep and forget its state (local: its trial directories too)."""
    from kubesweep.backends import BackendError

    b = get_backend(backend, home, namespace=namespace, kubeconfig=kubeconfig, direct=direct)
    try:
        b.delete(name)
    except BackendError as exc:
        fail(str(exc), _code_for(exc))
    console.print(f"sweep {name!r} deleted")


class MetricName(StrEnum):
    samples_per_s = "samples_per_s"
    step_p50_ms = "step_p50_ms"
    peak_mem_gib = "peak_mem_gib"
    tta_s = "tta_s"
    accuracy = "accuracy"
    cost_per_epoch = "cost_per_epoch"


TargetOpt = Annotated[float, typer.Option("--target-accuracy", min=0.0, max=1.0,
                                          help="dev accuracy that time-to-accuracy measures the time to")]
BestByOpt = Annotated[MetricName, typer.Option("--best-by", help="metric that picks the best setting per GPU type")]
FilterOpt = Annotated[list[str] | None, typer.Option(
    "--filter", help="KEY=VALUE[,VALUE] (repeatable): gpu, task, gpus, batch_size, precision, compile, status, "
    "outcome, best, or any job setting; e.g. --filter gpu=h100-80gb --filter precision=bf16,fp16")]
class ResultsSource(StrEnum):
    auto = "auto"
    files = "files"
    mlflow = "mlflow"


FromOpt = Annotated[ResultsSource, typer.Option(
    "--from", help="auto: the results files this machine keeps (local backend), else MLflow; files or mlflow: "
    "only that one")]
ExperimentOpt = Annotated[str | None, typer.Option(
    "--experiment", help="MLflow experiment [default: the spec's tracking.experiment, else the sweep's name]")]


def _load_cells(name: str, backend: BackendName, home: Path | None, namespace: str | None,
                kubeconfig: Path | None, tracking_uri: str | None, no_tracking: bool, experiment: str | None,
                target_accuracy: float, best_by: MetricName, *, direct: bool = False,
                source: ResultsSource = ResultsSource.auto
                ) -> tuple[list[Any], Any, TrackingTarget, dict[str, Any] | None]:
    from kubesweep.backends import BackendError
    from kubesweep.backends import make_backend as make
    from kubesweep.tracking.aggregate import aggregate
    from kubesweep.tracking.runs import TrackingError
    from kubesweep.tracking.sweep import load_records

    b: Backend | None
    try:
        b = make(backend.value, home=home, namespace=namespace, kubeconfig=kubeconfig, direct=direct)
        spec = _spec_of(b, name)
    except BackendError as exc:
        err.print(f"note: {exc}")
        b, spec = None, None
    target = tracking_target(name, spec, backend, home, tracking_uri, no_tracking, experiment)
    try:
        loaded = load_records(target, name, b, source=source.value)
    except TrackingError as exc:
        fail(str(exc), EXIT_BACKEND)
    except BackendError as exc:
        fail(str(exc), _code_for(exc))
    if loaded.note:
        err.print(f"note: {loaded.note}")
    cells = aggregate(loaded.records, target=target_accuracy, best_by=best_by.value)
    return cells, loaded, target, spec


@app.command()
def results(
    name: Annotated[str, typer.Argument(help="sweep name")],
    fmt: Annotated[ResultsFormat, typer.Option("--format", "-f", help="table, csv, json or markdown")] = (
        ResultsFormat.table
    ),
    sort: Annotated[str | None, typer.Option(
        "--sort", help="metric (best first: samples_per_s, step_p50_ms, peak_mem_gib, tta_s, accuracy, "
        "cost_per_epoch, epoch_s) or axis (gpu, batch_size, precision, compile, ...)")] = None,
    reverse: Annotated[bool, typer.Option("--reverse", help="reverse the --sort order")] = False,
    filters: FilterOpt = None,
    target_accuracy: TargetOpt = 0.90,
    best_by: BestByOpt = MetricName.samples_per_s,
    per_trial: Annotated[bool, typer.Option("--per-trial", help="one row per trial from the results files, "
                                            "not aggregated")] = False,
    backend: BackendOpt = BackendName.local,
    home: HomeOpt = None,
    namespace: NamespaceOpt = None,
    kubeconfig: KubeconfigOpt = None,
    direct: DirectOpt = False,
    tracking_uri: TrackingUriOpt = None,
    no_tracking: NoTrackingOpt = False,
    experiment: ExperimentOpt = None,
    source: FromOpt = ResultsSource.auto,
) -> None:
    """The sweep's results aggregated over repeats: mean ±CV of samples/s, step p50, peak memory,
    time-to-accuracy, accuracy and $/epoch per setting; OOM and GPU-mismatch cells as such; * marks the best
    setting per GPU type. Reads the trials' MLflow runs (the local results files when tracking is off)."""
    from kubesweep.backends import BackendError
    from kubesweep.tracking import aggregate as agg

    if per_trial:
        b = get_backend(backend, home, namespace=namespace, kubeconfig=kubeconfig, direct=direct)
        try:
            _print_rows(b, name, fmt)
        except BackendError as exc:
            fail(str(exc), _code_for(exc))
        return
    cells, loaded, _, spec = _load_cells(name, backend, home, namespace, kubeconfig, tracking_uri, no_tracking,
                                   experiment, target_accuracy, best_by, direct=direct, source=source)
    try:
        cells = agg.sort_cells(agg.apply_filters(cells, agg.parse_filters(filters or [])), sort, reverse)
    except agg.QueryError as exc:
        fail(str(exc), EXIT_USAGE)
    strategy = _strategy(spec)
    searched = strategy in SEARCHES or spec is None  # a sweep this machine does not know may be a search
    found = _search_summary(name, home, loaded.parent_run_id, tracking_uri, backend) if searched else None
    if fmt == ResultsFormat.json:
        doc = agg.to_json(cells, sweep=name, source=loaded.source, target=target_accuracy, best_by=best_by.value)
        if found is not None:
            doc["search"] = found
        sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
    elif fmt == ResultsFormat.csv:
        sys.stdout.write(agg.to_csv(cells))
    elif fmt == ResultsFormat.markdown:
        sys.stdout.write(agg.to_markdown(cells))
    else:
        _print_cells(name, cells, loaded.source, target_accuracy, best_by.value)
        if found is not None:
            _print_search(found)


def _search_summary(name: str, home: Path | None, parent_run_id: str | None, tracking_uri: str | None,
                    backend: BackendName) -> dict[str, Any] | None:
    """What a tune or max-batch search found: its file under the search storage, else the parent run's
    artifact in MLflow (`tune/tune.json`, `max_batch/max_batch.json`)."""
    storage = search_storage(home, name)
    for file in ("tune.json", "max_batch.json"):
        try:
            data = json.loads((storage / file).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            return data
    if parent_run_id is None:
        return None
    import tempfile

    from kubesweep.tracking.runs import SweepRuns, TrackingError

    target = tracking_target(name, None, backend, home, tracking_uri, False)
    runs = SweepRuns(target, name)
    for folder, file in (("tune", "tune.json"), ("max_batch", "max_batch.json")):
        with tempfile.TemporaryDirectory(prefix="kubesweep-search-") as tmp:
            try:
                path = runs.client.download_artifacts(parent_run_id, f"{folder}/{file}", tmp)
                data = json.loads(Path(path).read_text())
            except (TrackingError, OSError, ValueError, Exception):
                continue
            if isinstance(data, dict):
                return data
    return None


def _print_cells(name: str, cells: list[Any], source: str, target: float, best_by: str) -> None:
    from rich.table import Table

    from kubesweep.tracking import aggregate as agg

    table = Table(title=f"sweep {name}: {len(cells)} settings", title_justify="left")
    for header in agg.headers(cells):
        table.add_column(header, justify="left" if header in ("task", "gpu", "precision", "compile", "status")
                         else "right")
    for cell, row in zip(cells, agg.text_rows(cells), strict=True):
        table.add_row(*row, style="bold" if cell.best else None)
    console.print(table)
    console.print(f"mean ±CV over repeats; TTA = training time to dev accuracy >= {target:g}; * best "
                  f"{agg.METRICS[best_by][0]} per GPU type; from {source}", style="dim")


def _print_summary(b: Backend, name: str) -> None:
    """After a sweep ends: the aggregated table from the backend's own files (no MLflow round trip)."""
    from kubesweep.tracking.aggregate import aggregate
    from kubesweep.tracking.records import from_backend

    cells = aggregate(from_backend(b, name))
    _print_cells(name, cells, f"results files ({b.name} backend)", 0.90, "samples_per_s")
    where = getattr(b, "trial_dir", None)
    if where is not None:
        console.print(f"results files: {Path(where(name, '')).resolve()}/<trial>/results.json")


def _print_rows(b: Backend, name: str, fmt: ResultsFormat) -> None:
    from kubesweep import views

    rows = views.result_rows(b, name)
    if fmt == ResultsFormat.table:
        views.print_results(console, name, rows)
        where = getattr(b, "trial_dir", None)
        if where is not None:
            console.print(f"results files: {Path(where(name, '')).resolve()}/<trial>/results.json")
    else:
        sys.stdout.write(views.format_rows(rows, fmt.value))


@app.command()
def report(
    name: Annotated[str, typer.Argument(help="sweep name")],
    output: Annotated[Path | None, typer.Option("--output", "-o", help="directory for report.html and the "
                                                "figures [default: <home>/sweeps/<sweep>/report]",
                                                show_default=False)] = None,
    target_accuracy: TargetOpt = 0.90,
    best_by: BestByOpt = MetricName.samples_per_s,
    upload: Annotated[bool, typer.Option("--upload/--no-upload", help="log the report as artifacts of the "
                                         "sweep's MLflow parent run")] = True,
    backend: BackendOpt = BackendName.local,
    home: HomeOpt = None,
    namespace: NamespaceOpt = None,
    kubeconfig: KubeconfigOpt = None,
    tracking_uri: TrackingUriOpt = None,
    no_tracking: NoTrackingOpt = False,
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

    cells, loaded, target, _ = _load_cells(name, backend, home, namespace, kubeconfig, tracking_uri, no_tracking,
                                        experiment, target_accuracy, best_by, source=source)
    if not cells:
        fail(f"sweep {name!r} has no trials to report on", EXIT_NOT_FOUND)
    directory = (output or home_dir(home) / "sweeps" / name / "report").resolve()
    built = build(cells, directory, sweep=name, source=loaded.source, target=target_accuracy,
                  best_by=best_by.value)
    console.print(f"report: {built.html_path} ({len(built.figures)} figures, {len(built.tables)} comparison tables)")
    for note in built.skipped + built.table_notes:
        console.print(f"  {note}", style="dim")
    if upload and loaded.parent_run_id:
        try:
            SweepRuns(target, name).log_report(loaded.parent_run_id, directory)
        except TrackingError as exc:
            fail(f"report written locally, but not logged to MLflow: {exc}", EXIT_BACKEND)
        console.print(f"logged as artifacts report/ of MLflow run {loaded.parent_run_id} ({target.uri})")
    elif upload:
        console.print("not logged to MLflow: the sweep has no parent run there", style="dim")


@app.command()
def ui(
    port: Annotated[int | None, typer.Option("--port", "-p", min=1, max=65535,
                                             help="port [default: a free one]", show_default=False)] = None,
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
    chosen = port or ui_mod.free_port()
    command = ui_mod.server_command(home_dir(home), chosen, backend_uri=configured)
    store = command[command.index("--backend-store-uri") + 1]
    base = f"http://127.0.0.1:{chosen}"
    console.print(f"MLflow UI: {base}  (store {store}; Ctrl-C or SIGTERM stops it and its workers)")
    views = ui_mod.sweep_views(store, base)
    if views:
        console.print("each sweep's runs, best samples/s first, with the comparison columns:")
        for experiment, url in views:
            console.print(f"  {experiment}: {url}", soft_wrap=True)
    # a UI-only server: no background job runner (MLflow's GenAI jobs), unless asked for in the environment
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}
    code = ui_mod.run_server(command, env)
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
