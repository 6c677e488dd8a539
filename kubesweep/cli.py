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
from kubesweep.spec import SpecError, Sweep, load_sweep_file

if TYPE_CHECKING:
    from kubesweep.backends.base import Backend, SweepStatus
    from kubesweep.plan import Plan

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
console = Console(highlight=False, soft_wrap=True)
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
AllowUnpinned = Annotated[bool, typer.Option("--allow-unpinned", help="accept image tags not pinned by digest")]
BackendOpt = Annotated[
    BackendName, typer.Option("--backend", "-b", envvar="KUBESWEEP_BACKEND", help="where trials run")
]
HomeOpt = Annotated[
    Path | None,
    typer.Option("--home", envvar="KUBESWEEP_HOME", help="local state directory [default: ~/.kubesweep]"),
]
NamespaceOpt = Annotated[str | None, typer.Option("--namespace", "-n", help="Kubernetes namespace")]
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
    try:
        return load_sweep_file(path, allow_unpinned=allow_unpinned)
    except SpecError as exc:
        fail(str(exc), EXIT_USAGE)
    except CatalogError as exc:
        fail(str(exc), EXIT_USAGE)


def make_plan(sweep: Sweep) -> Plan:
    from kubesweep.plan import plan

    return plan(sweep)


def get_backend(
    name: BackendName,
    home: Path | None = None,
    *,
    any_gpu: bool = False,
    parallel: int = 1,
    namespace: str | None = None,
    kubeconfig: Path | None = None,
    direct: bool = False,
) -> Backend:
    from kubesweep.backends import BackendError, make_backend

    try:
        return make_backend(
            name.value, home=home, any_gpu=any_gpu, cpu_slots=parallel, namespace=namespace, kubeconfig=kubeconfig,
            direct=direct,
        )
    except BackendError as exc:
        fail(str(exc), EXIT_BACKEND)


# ----------------------------------------------------------------------------------------------------------


@app.command()
def validate(file: SpecFile, allow_unpinned: AllowUnpinned = False) -> None:
    """Check a sweep spec; print each problem as FILE:LINE: FIELD: what was expected."""
    sweep = load(file, allow_unpinned)
    p = make_plan(sweep)
    console.print(f"{file}: valid — sweep {sweep.name!r}, {len(p.trials)} trials, {len(p.dropped)} cells dropped")


@app.command("plan")
def plan_cmd(
    file: SpecFile,
    output: Annotated[PlanFormat, typer.Option("--output", "-o", help="table or json")] = PlanFormat.table,
    allow_unpinned: AllowUnpinned = False,
) -> None:
    """Show the trials a spec expands to (and the cells dropped, with the reason)."""
    from kubesweep import views

    sweep = load(file, allow_unpinned)
    p = make_plan(sweep)
    if output == PlanFormat.json:
        console.print_json(json.dumps(views.plan_json(p)))
    else:
        views.print_plan(console, p)


@app.command()
def render(
    file: SpecFile,
    allow_unpinned: AllowUnpinned = False,
    namespace: NamespaceOpt = None,
) -> None:
    """Print the Kubernetes manifests (a YAML stream) the spec's trials run as."""
    from kubesweep.manifests import RenderError, render_plan, to_yaml

    sweep = load(file, allow_unpinned)
    try:
        objects = render_plan(make_plan(sweep), allow_unpinned=allow_unpinned, namespace=namespace)
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
) -> None:
    """Expand a spec into trials and run them. Submitting the same spec again starts nothing twice."""
    from kubesweep.backends import BackendError

    sweep = load(file, allow_unpinned)
    p = make_plan(sweep)
    b = get_backend(backend, home, any_gpu=any_gpu, parallel=parallel, namespace=namespace, kubeconfig=kubeconfig,
                    direct=direct)
    try:
        status = b.submit(p)
    except BackendError as exc:
        fail(str(exc), EXIT_BACKEND)
    console.print(f"sweep {sweep.name!r}: {len(p.trials)} trials on the {backend.value} backend ({status.message})")
    if p.dropped:
        console.print(f"{len(p.dropped)} cells dropped (see `sweep plan {file}`)")
    _follow(b, sweep.name, detach, home, backend)


def _follow(b: Backend, name: str, detach: bool, home: Path | None, backend: BackendName) -> None:
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
    _print_results(b, name, ResultsFormat.table)
    raise typer.Exit(_exit_for(status))


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
        console.print_json(json.dumps(views.status_json(s)))
    else:
        views.print_status(console, s)


def _code_for(exc: Exception) -> int:
    from kubesweep.backends import SweepNotFound

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
) -> None:
    """Run again only the trials that failed, were cancelled or are missing."""
    from kubesweep.backends import BackendError

    b = get_backend(backend, home, namespace=namespace, kubeconfig=kubeconfig, direct=direct)
    try:
        b.resume(name)
    except BackendError as exc:
        fail(str(exc), _code_for(exc))
    _follow(b, name, detach, home, backend)


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


@app.command()
def results(
    name: Annotated[str, typer.Argument(help="sweep name")],
    fmt: Annotated[ResultsFormat, typer.Option("--format", "-f", help="table, csv, json or markdown")] = (
        ResultsFormat.table
    ),
    backend: BackendOpt = BackendName.local,
    home: HomeOpt = None,
    namespace: NamespaceOpt = None,
    kubeconfig: KubeconfigOpt = None,
    direct: DirectOpt = False,
) -> None:
    """Each trial's measurements: samples/s, step time, peak memory, accuracy, time split."""
    from kubesweep.backends import BackendError

    b = get_backend(backend, home, namespace=namespace, kubeconfig=kubeconfig, direct=direct)
    try:
        _print_results(b, name, fmt)
    except BackendError as exc:
        fail(str(exc), _code_for(exc))


def _print_results(b: Backend, name: str, fmt: ResultsFormat) -> None:
    from kubesweep import views

    rows = views.result_rows(b, name)
    if fmt == ResultsFormat.table:
        views.print_results(console, name, rows)
        where = getattr(b, "trial_dir", None)
        if where is not None:
            console.print(f"results files: {Path(where(name, '')).resolve()}/<trial>/results.json")
    else:
        sys.stdout.write(views.format_rows(rows, fmt.value))


def main(argv: list[str] | None = None) -> Any:
    try:
        return app(args=argv, prog_name="sweep")
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(EXIT_INTERRUPTED)


if __name__ == "__main__":
    main()
