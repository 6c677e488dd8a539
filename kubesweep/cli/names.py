"""The `sweep` commands' sweep-name arguments, and their shell completion.

Declared apart from `kubesweep.cli.options` because completing a name reads the local backend's sweeps (its
store under the kubesweep home), which the options' floor may not import. Completion (`sweep
--install-completion`, then NAME<Tab>) offers the local backend's sweeps of the home the command line names
(`--home`, $KUBESWEEP_HOME, ~/.kubesweep), read from its store as it is: no MLflow, no cluster, nothing written
(a home that does not exist offers nothing and stays so). With `--backend kubernetes` it offers none: listing a
cluster's sweeps would ask the cluster at every Tab.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from kubesweep.backend_factory import DEFAULT_BACKEND, LocalConfig
from kubesweep.backends.local import LocalBackend


def local_sweeps(home: Path | None) -> list[str]:
    """The local backend's sweeps in `home` (None: the default home), oldest first; none where it has no store
    (nothing is created)."""
    return LocalBackend(home).list_sweeps()


def complete_sweep_name(ctx: typer.Context, incomplete: str) -> list[str]:
    """The sweeps whose names start with what is typed, for the shell's completion; none on any error (a
    completion must not print a traceback into the shell)."""
    params: dict[str, Any] = ctx.params
    if (params.get("backend") or DEFAULT_BACKEND) != LocalConfig.name:  # a cluster's sweeps: not asked at a Tab
        return []
    home = params.get("home")
    try:
        names = local_sweeps(Path(home) if home else None)
    except Exception:  # an unreadable store: nothing to offer
        return []
    return [n for n in names if n.startswith(incomplete)]


NameArg = Annotated[str, typer.Argument(metavar="NAME", help="sweep name", autocompletion=complete_sweep_name)]
NamesArg = Annotated[list[str] | None, typer.Argument(
    metavar="NAME",
    help="sweep name; several merge into one comparison, each a sweep here or a directory of results files (a "
         "name with a '/' or a leading '.' or '~': a sweep's directory copied from another machine): trials meet "
         "in one cell when they ran the same settings on the same GPU type; omit to list the sweeps",
    show_default=False, autocompletion=complete_sweep_name)]
StatusNameArg = Annotated[str | None, typer.Argument(metavar="NAME", help="sweep name; omit to list sweeps",
                                                     show_default=False, autocompletion=complete_sweep_name)]
UiNameArg = Annotated[str | None, typer.Argument(metavar="NAME", help="sweep whose runs to open; omit for a link to "
                                                 "each sweep's", show_default=False,
                                                 autocompletion=complete_sweep_name)]
