"""Detached processes: a sweep that goes on after the shell that submitted it returns (`sweep submit --detach`,
`sweep resume --detach`). Each runs `python -m kubesweep ...` in a session of its own (a closed terminal does not
end it), with its output appended to `<home>/sweeps/<sweep>/driver.log`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kubesweep.session import Options


def _spawn(argv: list[str], log: Path) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True)


def driver_log(home: Path, name: str) -> Path:
    return home / "sweeps" / name / "driver.log"


def spawn_driver(name: str, home: Path | None) -> Path:
    """`sweep _drive NAME`: the supervisor of a local sweep, which starts its trials until every one has ended."""
    from kubesweep.backends.local_machine import default_home

    home_path = home or default_home()
    log = driver_log(home_path, name)
    _spawn([sys.executable, "-m", "kubesweep", "_drive", name, "--home", str(home_path)], log)
    return log


def spawn_search(file: Path, name: str, options: Options, *, allow_unpinned: bool, max_trials: int) -> Path:
    """`sweep submit` of the same spec (sweep `name`) with the same options: the search runs on after this shell
    returns. The size of the sweep was confirmed here already (--yes)."""
    from kubesweep.backends.local_machine import default_home

    home_path = options.home or default_home()
    argv = [sys.executable, "-m", "kubesweep", "submit", str(file.resolve()), "--home", str(home_path),
            "--backend", options.backend, "--parallel", str(options.parallel), "--max-trials", str(max_trials)]
    argv += ["--allow-unpinned"] if allow_unpinned else []
    argv += ["--any-gpu"] if options.any_gpu else []
    argv += ["--tracking-uri", options.tracking_uri] if options.tracking_uri else []
    argv += ["--no-tracking"] if options.no_tracking else []
    argv += ["--namespace", options.namespace] if options.namespace else []
    argv += ["--kubeconfig", str(options.kubeconfig)] if options.kubeconfig else []
    argv += ["--direct"] if options.direct else []
    argv += ["--yes"]
    log = driver_log(home_path, name)
    _spawn(argv, log)
    return log
