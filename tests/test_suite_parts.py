"""The suite's two parts (tests/conftest.py: `--part`, `--early-while`, `--early-record`), as `make test` runs them
on a fresh machine: the early part beside the cluster's build until it ends, then the rest. Together they must be
the whole suite, each test once. Run over two small modules (one with early tests, one without) in pytest
processes of their own."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import process_running

ROOT = Path(__file__).resolve().parents[1]
# jobs/test_mlflow_client.py: three tests that use the MLflow server (the early part) and one that does not;
# test_plan_count.py: none.
MODULES = ["tests/jobs/test_mlflow_client.py", "tests/test_plan_count.py"]
EARLY = "tests/jobs/test_mlflow_client.py::test_the_rest_client_says_what_the_server_refused_in_mlflows_words"


def _pytest(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_ADDOPTS"))}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=env, check=False)


def _collected(*args: str) -> list[str]:
    proc = _pytest("--collect-only", *args, *MODULES)
    assert proc.returncode in (0, 5), proc.stdout + proc.stderr
    return [line for line in proc.stdout.splitlines() if "::" in line]


def _ended_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_the_early_and_the_rest_part_are_the_whole_suite_each_test_once() -> None:
    everything = _collected()
    early, rest = _collected("--part", "early"), _collected("--part", "rest")
    assert early, "no early test in a module whose tests use the MLflow server"
    assert all(nodeid.startswith(MODULES[0]) for nodeid in early)
    assert not set(early) & set(rest)
    assert sorted(early + rest) == sorted(everything)


def test_the_rest_runs_the_early_tests_the_early_part_did_not_start(tmp_path: Path) -> None:
    record = tmp_path / "early.txt"
    # The build has already ended: the early part starts nothing, records nothing, and the rest takes every test.
    proc = _pytest("--part", "early", "--early-while", str(_ended_pid()), "--early-record", str(record), *MODULES)
    assert proc.returncode in (0, 5), proc.stdout + proc.stderr
    assert "left to --part rest" in proc.stdout
    assert record.read_text() == ""
    assert sorted(_collected("--part", "rest", "--early-record", str(record))) == sorted(_collected())

    # While the build runs, the early part runs its tests and records them; the rest then leaves them out.
    with subprocess.Popen(["sleep", "300"]) as build:
        try:
            proc = _pytest("--part", "early", "--early-while", str(build.pid), "--early-record", str(record),
                           "-k", EARLY.rsplit("::", 1)[1], *MODULES)
        finally:
            build.kill()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert record.read_text().splitlines() == [EARLY]
    rest = _collected("--part", "rest", "--early-record", str(record))
    assert EARLY not in rest
    assert sorted([*rest, EARLY]) == sorted(_collected())


def test_a_build_that_ended_but_was_not_waited_for_has_ended() -> None:
    """`make test`'s shell waits for the build only after the early part: until then the ended build is a zombie,
    which a signal 0 still reaches."""
    with subprocess.Popen(["sleep", "300"]) as running:
        assert process_running(running.pid)
        running.kill()
        deadline = time.monotonic() + 10
        while process_running(running.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not process_running(running.pid)
        os.kill(running.pid, 0)  # not yet waited for: the process is still there, as a zombie
