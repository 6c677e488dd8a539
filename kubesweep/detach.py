"""Detached processes: a sweep that goes on after the shell that submitted it returns (`sweep submit --detach`,
`sweep resume --detach`). Each runs `python -m kubesweep ...` in a session of its own (a closed terminal does not
end it), with its output appended to `<home>/sweeps/<sweep>/driver.log`."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from kubesweep.backend_factory import DEFAULT_BACKEND, Flags, configure
from kubesweep.backends.local_machine import default_home


def _spawn(argv: list[str], log: Path) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True)


def driver_log(home: Path, name: str) -> Path:
    return home / "sweeps" / name / "driver.log"


def spawn_driver(name: str, home: Path | None, *, backend: str = DEFAULT_BACKEND, namespace: str | None = None,
                 kubeconfig: Path | None = None, tracking_uri: str | None = None, no_tracking: bool = False) -> Path:
    """`sweep _drive NAME`: the driver of a sweep whose waiter drives it (a local sweep's supervisor; a
    `--direct` Kubernetes sweep's reconciler, which starts its Jobs as room frees up and hands its warm pods their
    trials), until every trial has ended."""
    home_path = home or default_home()
    log = driver_log(home_path, name)
    argv = [sys.executable, "-m", "kubesweep", "_drive", name, "--home", str(home_path)]
    config = configure(backend, Flags(direct=True))
    if config.asks_cluster:  # its cluster, driven from here (whoever waits on a `--direct` sweep drives it)
        argv += ["--backend", backend, "--direct"]
        argv += ["--namespace", namespace] if namespace else []
        argv += ["--kubeconfig", str(kubeconfig)] if kubeconfig else []
    if not config.kind().remembers_tracking:  # the driver finds the sweep's parent run again, where it is tracked
        argv += ["--tracking-uri", tracking_uri] if tracking_uri else []
        argv += ["--no-tracking"] if no_tracking else []
    _spawn(argv, log)
    return log


def spawn_search(file: Path, name: str, *, home: Path | None, backend: str, parallel: int, max_trials: int,
                 allow_unpinned: bool = False, any_gpu: bool = False, tracking_uri: str | None = None,
                 no_tracking: bool = False, namespace: str | None = None, kubeconfig: Path | None = None,
                 direct: bool = False, sets: Sequence[str] = ()) -> Path:
    """`sweep submit` of the same spec (sweep `name`) with the same options (the `sweep` flags of the same
    names; `sets`: the `--set` options, in order): the search runs on after this shell returns. The size of the
    sweep was confirmed here already (--yes)."""
    home_path = home or default_home()
    argv = [sys.executable, "-m", "kubesweep", "submit", str(file.resolve()), "--home", str(home_path),
            "--backend", backend, "--parallel", str(parallel), "--max-trials", str(max_trials)]
    argv += ["--allow-unpinned"] if allow_unpinned else []
    argv += ["--any-gpu"] if any_gpu else []
    argv += ["--tracking-uri", tracking_uri] if tracking_uri else []
    argv += ["--no-tracking"] if no_tracking else []
    argv += ["--namespace", namespace] if namespace else []
    argv += ["--kubeconfig", str(kubeconfig)] if kubeconfig else []
    argv += ["--direct"] if direct else []
    argv += [word for text in sets for word in ("--set", text)]
    argv += ["--yes"]
    log = driver_log(home_path, name)
    _spawn(argv, log)
    return log
