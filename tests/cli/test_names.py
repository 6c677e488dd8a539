"""Shell completion of sweep names (kubesweep/cli/names.py), through click's completion protocol against the real
`sweep` entry point in a subprocess, as bash asks it after `sweep --install-completion`: every command that takes
a sweep name offers the home's sweeps, filtered by what is typed, without MLflow, without the cluster, and without
writing a thing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kubesweep.backends._local_store import Store

COMMANDS = ("status", "results", "report", "logs", "ui", "cancel", "resume", "delete")


def complete(words: str, home: Path | None, **env: str) -> list[str]:
    environ = {k: v for k, v in os.environ.items() if k != "KUBESWEEP_HOME"}
    environ.update({"_SWEEP_COMPLETE": "complete_bash", "COMP_WORDS": words,
                    "COMP_CWORD": str(len(words.split(" ")) - 1), **env})
    if home is not None:
        environ["KUBESWEEP_HOME"] = str(home)
    done = subprocess.run([sys.executable, "-c", "from kubesweep.cli import main; main()"], env=environ,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and not done.stderr, done
    return done.stdout.split()


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("completion") / "home"
    store = Store(home)
    for name in ("smoke", "smoke-big", "bert-gpu-matrix"):
        store.add_sweep(name, {"name": name}, f"{name}.yaml", [], False, [])
    return home


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_taking_a_sweep_name_completes_it(home: Path, command: str) -> None:
    assert complete(f"sweep {command} ", home) == ["smoke", "smoke-big", "bert-gpu-matrix"]
    assert complete(f"sweep {command} smo", home) == ["smoke", "smoke-big"]


def test_the_home_on_the_command_line_and_the_backend_decide(home: Path, tmp_path: Path) -> None:
    assert complete(f"sweep results --home {home} b", None, HOME=str(tmp_path)) == ["bert-gpu-matrix"]
    assert complete("sweep status --backend kubernetes ", home) == []  # the cluster is not asked at every Tab
    assert complete("sweep report x", home) == []


def test_a_home_that_does_not_exist_offers_nothing_and_stays_absent(tmp_path: Path) -> None:
    started = time.monotonic()
    assert complete("sweep status ", tmp_path / "nohome") == []
    took = time.monotonic() - started
    assert not (tmp_path / "nohome").exists()
    assert took < 10, took  # about half a second on an idle machine: no MLflow, no cluster client


def test_completing_imports_no_mlflow(home: Path) -> None:
    script = ("import sys\nfrom kubesweep.cli import main\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
              "assert not [m for m in sys.modules if m.split('.')[0] in ('mlflow', 'kubernetes')], 'imported'\n")
    environ = {**os.environ, "_SWEEP_COMPLETE": "complete_bash", "COMP_WORDS": "sweep ui ", "COMP_CWORD": "2",
               "KUBESWEEP_HOME": str(home)}
    done = subprocess.run([sys.executable, "-c", script], env=environ, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done
    assert done.stdout.split() == ["smoke", "smoke-big", "bert-gpu-matrix"]
