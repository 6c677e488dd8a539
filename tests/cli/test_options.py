"""The command line's shared options (`kubesweep.cli.options`): each declared with its flags, environment
variable and bounds, and shown so by the commands that take it."""

from __future__ import annotations

import re
import typing
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from kubesweep import __version__
from kubesweep.cli import options as cli_options
from kubesweep.cli.commands import app

ENVVARS = {"GpuCatalogOpt": "KUBESWEEP_GPU_CATALOG", "MaxTrialsOpt": "KUBESWEEP_MAX_TRIALS",
           "ConfirmOverOpt": "KUBESWEEP_CONFIRM_OVER", "BackendOpt": "KUBESWEEP_BACKEND", "HomeOpt": "KUBESWEEP_HOME",
           "NoTrackingOpt": "KUBESWEEP_NO_TRACKING", "KubeconfigOpt": "KUBECONFIG", "DirectOpt": "KUBESWEEP_DIRECT",
           "TunerImageOpt": "KUBESWEEP_TUNER_IMAGE"}


def declared() -> dict[str, Any]:
    """Every alias of the module: its typer.Option / typer.Argument."""
    out = {}
    for name, value in vars(cli_options).items():
        if typing.get_origin(value) is typing.Annotated:
            (info,) = [m for m in value.__metadata__ if isinstance(m, typer.models.ParameterInfo)]
            out[name] = info
    return out


def test_every_option_has_its_declared_envvar_and_no_other() -> None:
    infos = declared()
    assert len(infos) == 42  # the sweep-name arguments are kubesweep.cli.names
    assert {n: i.envvar for n, i in infos.items() if getattr(i, "envvar", None)} == ENVVARS
    for name, info in infos.items():
        if isinstance(info, typer.models.OptionInfo):
            flags = [info.default, *info.param_decls] if isinstance(info.default, str) else list(info.param_decls)
            assert all(f.startswith("-") for f in flags) and flags, name
            assert info.help or name in ("StatusOutputOpt",), f"{name} has no help text"


def test_bounds_as_declared() -> None:
    infos = declared()
    assert (infos["MaxTrialsOpt"].min, infos["ConfirmOverOpt"].min, infos["ParallelOpt"].min) == (1, 0, 1)
    assert (infos["TargetOpt"].min, infos["TargetOpt"].max) == (0.0, 1.0)
    assert (infos["PortOpt"].min, infos["PortOpt"].max) == (1, 65535)
    assert cli_options.CONFIRM_OVER == 1000
    assert [m.value for m in cli_options.MetricName] == ["samples_per_s", "step_p50_ms", "peak_mem_gib", "tta_s",
                                                         "accuracy", "cost_per_epoch"]


def plain(text: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"\x1b\[[0-9;]*m|[│╭╮╰╯─]", " ", text))


def test_submit_help_shows_the_options_with_their_envvars() -> None:
    result = CliRunner().invoke(app, ["submit", "--help"], env={"COLUMNS": "300", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    text = plain(result.output)
    for flag, env in [("--backend", "KUBESWEEP_BACKEND"), ("--home", "KUBESWEEP_HOME"),
                      ("--max-trials", "KUBESWEEP_MAX_TRIALS"), ("--confirm-over", "KUBESWEEP_CONFIRM_OVER"),
                      ("--no-tracking", "KUBESWEEP_NO_TRACKING"), ("--kubeconfig", "KUBECONFIG"),
                      ("--direct", "KUBESWEEP_DIRECT")]:
        assert re.search(re.escape(flag) + r".*?\[env var: " + env + r"[;\]]", text), (flag, text)
    for flag in ("--detach", "--parallel", "--any-gpu", "--yes", "--tracking-uri", "--allow-unpinned", "--set"):
        assert flag in text
    for command in ("validate", "plan", "render"):  # every command that reads a spec file takes --set
        shown = plain(CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "300", "NO_COLOR": "1"}).output)
        assert "--set PATH=VALUE" in shown, command


@pytest.mark.parametrize("value", ["0", "x"])
def test_a_value_out_of_bounds_is_a_usage_error(value: str) -> None:
    result = CliRunner().invoke(app, ["submit", "spec.yaml", "--max-trials", value])
    assert result.exit_code == 2


def test_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"kubesweep {__version__}"
