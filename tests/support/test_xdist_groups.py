"""The root conftest's xdist groups hold under the pytest and pytest-xdist this project installs: tests that need a
component one process must own run on one worker (a group split across workers builds the images twice, or
installs the operator's chart release twice on one cluster).

A small suite in a temporary directory, with the project's own grouping hook, runs on two workers: each test
writes the worker it ran on, and every test of the group must have run on the same one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CONFTEST = '''\
import pytest

from tests.conftest import pytest_collection_modifyitems  # the project's grouping hook


def pytest_configure(config):
    config.addinivalue_line("markers", "images: needs the images")
'''

MODULE = '''\
import os
import time
from pathlib import Path

import pytest

pytestmark = {mark}


@pytest.mark.parametrize("n", range(3))
def test_where(n):
    time.sleep(0.2)
    Path(os.environ["GROUP_OUT"], f"{{__name__}}-{{n}}").write_text(os.environ["PYTEST_XDIST_WORKER"])
'''


def test_a_group_runs_on_one_worker_and_the_rest_spread(tmp_path: Path) -> None:
    suite, out = tmp_path / "suite", tmp_path / "out"
    suite.mkdir()
    out.mkdir()
    (suite / "conftest.py").write_text(CONFTEST)
    for name in ("test_images_a", "test_images_b"):
        (suite / f"{name}.py").write_text(MODULE.format(mark="pytest.mark.images"))
    for name in ("test_free_a", "test_free_b"):
        (suite / f"{name}.py").write_text(MODULE.format(mark="[]"))
    env = {**os.environ, "GROUP_OUT": str(out), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                           "--dist", "loadgroup", "--rootdir", str(suite), str(suite)],
                          capture_output=True, text=True, env=env, cwd=suite, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    workers = {p.name: p.read_text() for p in out.iterdir()}
    assert len(workers) == 12, workers
    grouped = {w for name, w in workers.items() if name.startswith("test_images")}
    assert len(grouped) == 1, workers
    assert set(workers.values()) == {"gw0", "gw1"}, workers  # the rest is spread, so both workers ran
