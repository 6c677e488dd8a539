"""The `sweep` command line's arguments and options, declared once and shared by the commands (`commands`).

Each alias is one typer argument or option: its flags, environment variable, bounds and help text. A command
lists the aliases it takes as parameters, in the order its `--help` shows them.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from typer.core import TyperArgument, TyperGroup

from kubesweep import __version__
from kubesweep.backend_factory import BACKENDS

E = TypeVar("E", bound=StrEnum)


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


def choice(kind: type[E]) -> Callable[[str], E]:
    """A parser for an option whose values are `kind`'s: a value that is not one is one plain line, naming them."""

    def parse(value: str | E) -> E:
        if isinstance(value, kind):
            return value
        try:
            return kind(value)
        except ValueError:
            raise typer.BadParameter(f"{value!r} is not one of {', '.join(repr(m.value) for m in kind)}") from None

    return parse


def one_of(names: tuple[str, ...]) -> Callable[[str], str]:
    """A parser for an option whose values are `names` (read from where they are registered): a value that is not
    one is one plain line, naming them."""

    def parse(value: str) -> str:
        if value not in names:
            raise typer.BadParameter(f"{value!r} is not one of {', '.join(repr(n) for n in names)}")
        return value

    return parse


def choices(kind: type[StrEnum]) -> str:
    """`local|kubernetes`: the option's values, for its help."""
    return "|".join(m.value for m in kind)


def version_callback(value: bool) -> None:
    if value:
        typer.echo(f"kubesweep {__version__}")
        raise typer.Exit()


# -- the top level -----------------------------------------------------------------------------------------

GpuCatalogOpt = Annotated[
    Path | None,
    typer.Option("--gpu-catalog", envvar="KUBESWEEP_GPU_CATALOG", metavar="FILE",
                 help="GPU catalog replacing the shipped one"),
]
VersionOpt = Annotated[
    bool, typer.Option("--version", callback=version_callback, is_eager=True, help="print the version")
]

# -- specs and plans ---------------------------------------------------------------------------------------

SpecFile = Annotated[Path, typer.Argument(metavar="FILE", help="sweep spec (YAML)", show_default=False)]
TrialArg = Annotated[str | None, typer.Argument(metavar="TRIAL", help="trial name or id (a unique prefix is enough); "
                                                "omit to list the sweep's trials", show_default=False)]
AllRowsOpt = Annotated[bool, typer.Option("--all", help="print every row of a long table (otherwise the first 50 "
                                                      "and how many more there are)")]
SetOpt = Annotated[list[str] | None, typer.Option(
    "--set", metavar="PATH=VALUE", show_default=False,
    help="override a value of the spec file (repeatable, in order), as Helm's --set: PATH a dotted path under spec "
         "(job.max_steps, matrix.batch_size, concurrency.max_parallel, storage.cache_claim; a leading spec. is the "
         "same) or metadata.name, VALUE one YAML value (200, true, 2.0e-5, [16, 32], {target: 3%, max: 10}, a "
         "string; null removes the key); a key the file lacks is added")]
AllowUnpinned = Annotated[bool, typer.Option("--allow-unpinned", help="accept image tags not pinned by digest")]
TunerImageOpt = Annotated[str | None, typer.Option(
    "--tuner-image", envvar="KUBESWEEP_TUNER_IMAGE", metavar="IMAGE",
    help="the image a search sweep's tuner Job runs: the operator's own (the chart's operator image), never the "
         "sweep's; needed to render a search sweep")]
MaxTrialsOpt = Annotated[
    int,
    typer.Option("--max-trials", envvar="KUBESWEEP_MAX_TRIALS", min=1, metavar="N",
                 help="refuse a spec that makes more trials than this (a search: the most it can make), counted "
                      "before anything is expanded"),
]
CONFIRM_OVER = 1_000
ConfirmOverOpt = Annotated[
    int,
    typer.Option("--confirm-over", envvar="KUBESWEEP_CONFIRM_OVER", min=0, metavar="N",
                 help="ask before submitting a sweep of more trials than this (without a terminal: refuse "
                      "unless --yes)"),
]
PlanOutputOpt = Annotated[PlanFormat, typer.Option("--output", "-o", parser=choice(PlanFormat),
                                                   metavar=choices(PlanFormat), help="table or json")]
StatusOutputOpt = Annotated[PlanFormat, typer.Option("--output", "-o", parser=choice(PlanFormat),
                                                     metavar=choices(PlanFormat))]

# -- where trials run and are tracked ----------------------------------------------------------------------

BackendOpt = Annotated[  # the registered backends (`backend_factory.REGISTRY`)
    str, typer.Option("--backend", "-b", envvar="KUBESWEEP_BACKEND", parser=one_of(BACKENDS),
                      metavar="|".join(BACKENDS), help="where trials run")
]
HomeOpt = Annotated[
    Path | None,
    typer.Option("--home", envvar="KUBESWEEP_HOME", metavar="DIR",
                 help="local state directory [default: ~/.kubesweep]"),
]
NamespaceOpt = Annotated[str | None, typer.Option("--namespace", "-n", metavar="NS", help="Kubernetes namespace")]
TrackingUriOpt = Annotated[
    str | None,
    typer.Option("--tracking-uri", metavar="URI", help="MLflow tracking URI [default: $MLFLOW_TRACKING_URI, the spec's "
                 "tracking.uri, else the local store sqlite:///<home>/mlflow.db]", show_default=False),
]
NoTrackingOpt = Annotated[
    bool, typer.Option("--no-tracking", envvar="KUBESWEEP_NO_TRACKING", help="do not log to MLflow")
]
KubeconfigOpt = Annotated[Path | None, typer.Option("--kubeconfig", envvar="KUBECONFIG", metavar="FILE",
                                                   help="kubeconfig file")]
DirectOpt = Annotated[
    bool,
    typer.Option("--direct", envvar="KUBESWEEP_DIRECT",
                 help="kubernetes: drive the Jobs from this shell (state in a ConfigMap) instead of through the "
                      "Sweep resource and the operator"),
]

# -- running and following ---------------------------------------------------------------------------------

SubmitDetachOpt = Annotated[bool, typer.Option("--detach", "-d", help="return at once; follow with `sweep status`")]
ResumeDetachOpt = Annotated[bool, typer.Option("--detach", "-d", help="return at once")]
AnyGpuOpt = Annotated[bool, typer.Option("--any-gpu", help="local: run trials on whatever GPU is here")]
ParallelOpt = Annotated[int, typer.Option("--parallel", min=1, metavar="N", help="local: CPU-only trials at once")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="submit without asking, whatever the trial count, and "
                                      "(kubernetes) every trial, also those no node of the cluster can take")]
GpuOpt = Annotated[list[str] | None, typer.Option(
    "--gpu", metavar="TYPE", show_default=False,
    help="only the trials of this GPU type (repeatable; one of the spec's `gpu` values): e.g. the types the "
         "cluster has, as `submit --backend kubernetes` names them")]
DeleteYesOpt = Annotated[bool, typer.Option("--yes", "-y", help="delete a sweep that is still running without "
                                                                "asking (its trials are stopped)")]
WatchOpt = Annotated[bool, typer.Option("--watch", "-w", help="keep the table live until the sweep ends")]
FollowOpt = Annotated[bool, typer.Option("--follow", "-f", help="keep printing until the trial ends")]
RawLogOpt = Annotated[bool, typer.Option("--raw", help="the log as the trial wrote it, escape sequences and all "
                                         "(by default they are removed, format characters shown as escapes)")]

# -- results and reports -----------------------------------------------------------------------------------

TargetOpt = Annotated[float | None, typer.Option(
    "--target-accuracy", min=0.0, max=1.0, metavar="A",
    help="dev accuracy that time-to-accuracy measures the time to [default: the spec's target_accuracy, else 0.9]")]
BestByOpt = Annotated[MetricName, typer.Option("--best-by", parser=choice(MetricName), metavar="METRIC",
                                               help=f"metric that picks the best setting per GPU type: "
                                                    f"{', '.join(m.value for m in MetricName)}")]
FilterOpt = Annotated[list[str] | None, typer.Option(
    "--filter", metavar="KEY=VALUE", help="KEY=VALUE[,VALUE] (repeatable): gpu, task, gpus, batch_size, precision, "
    "compile, status, "
    "outcome, best, or any job setting; e.g. --filter gpu=h100-80gb --filter precision=bf16,fp16")]
FromOpt = Annotated[ResultsSource, typer.Option(
    "--from", parser=choice(ResultsSource), metavar=choices(ResultsSource),
    help="auto: the results files this machine keeps (local backend), else MLflow; files or mlflow: only that one")]
ExperimentOpt = Annotated[str | None, typer.Option(
    "--experiment", metavar="NAME",
    help="MLflow experiment [default: the spec's tracking.experiment, else the sweep's name]")]
ResultsFormatOpt = Annotated[ResultsFormat, typer.Option("--format", "-f", "--output", "-o",
                                                         parser=choice(ResultsFormat), metavar=choices(ResultsFormat),
                                                         help="table, csv, json or markdown (-o as plan and status "
                                                         "take it)")]
SortOpt = Annotated[str | None, typer.Option(
    "--sort", metavar="METRIC", help="metric (best first: samples_per_s, step_p50_ms, peak_mem_gib, tta_s, accuracy, "
    "cost_per_epoch, epoch_s) or axis (gpu, batch_size, precision, compile, ...)")]
ReverseOpt = Annotated[bool, typer.Option("--reverse", help="reverse the --sort order")]
WideOpt = Annotated[bool, typer.Option("--wide", help="the table with every column, however wide (by default it "
                                     "fits the terminal, 100 columns when piped, and names what it left out)")]
PerTrialOpt = Annotated[bool, typer.Option("--per-trial", help="one row per trial, not aggregated (read as "
                                           "the aggregate is: results files or MLflow)")]
ReportDirOpt = Annotated[Path | None, typer.Option("--output", "-o", metavar="DIR",
                                                  help="directory for report.html and the "
                                                  "figures, made if missing; the report's files in it are "
                                                  "replaced, others left alone [default: "
                                                  "<home>/sweeps/<sweep>/report]",
                                                  show_default=False)]
UploadOpt = Annotated[bool, typer.Option("--upload/--no-upload", help="log the report as artifacts of the "
                                         "sweep's MLflow parent run")]
PortOpt = Annotated[int | None, typer.Option("--port", "-p", min=1, max=65535, metavar="PORT",
                                             help="port [default: a free one]", show_default=False)]


class Argument(TyperArgument):
    """A positional argument whose help line is its name and what it is (`NAME  sweep name; ...`), without the
    Python type typer would add (`NAME <list[str]>`): the help text says what it takes."""

    def display_type_rich(self, ctx: Any) -> str | None:  # a typer (click) Context
        return None


class Group(TyperGroup):
    """A command group whose commands' positional arguments are `Argument`s (typer makes them with no way to
    choose their class)."""

    def get_command(self, ctx: Any, cmd_name: str) -> Any:  # a typer (click) Context and Command
        command = super().get_command(ctx, cmd_name)
        for param in command.params if command else ():
            if type(param) is TyperArgument:
                param.__class__ = Argument
        return command
