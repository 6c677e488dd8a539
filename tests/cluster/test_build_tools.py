"""build-tools.sh shares its cache safely: one run at a time (a lock on the cache), each run in a work directory of
its own. Run against a cache of its own (KUBESWEEP_TEST_CACHE) laid out as a finished build leaves it; fast."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

BUILD_TOOLS = Path(__file__).with_name("build-tools.sh")
# What a finished build leaves in the bin directory (the script's ALL list, and kube-router and kueue with their
# version stamps).
BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "etcd", "kwok",
            "kwokctl", "helm", "containerd", "containerd-shim-runc-v2", "ctr", "coredns", "pause", "kube-router",
            "kueue")
STAMPED = ("kube-router", "kueue")
WAITING = "waiting for "


@dataclass
class Run:
    proc: subprocess.Popen[str]
    stderr: Path

    def log(self) -> str:
        return self.stderr.read_text()

    def finish(self, timeout: float = 30) -> tuple[int, str, str]:
        out, _ = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, self.log()


def _env(cache: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "KUBESWEEP_TEST_CACHE": str(cache), **extra}


def _start(env: dict[str, str], stderr: Path) -> Run:
    with stderr.open("w") as err:
        proc = subprocess.Popen(["bash", str(BUILD_TOOLS)], env=env, stdout=subprocess.PIPE, stderr=err, text=True,
                                stdin=subprocess.DEVNULL)
    return Run(proc, stderr)


def _wait_for(run: Run, text: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while text not in run.log():
        if run.proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"build-tools.sh never logged {text!r} (exit {run.proc.poll()}):\n{run.log()}")
        time.sleep(0.02)


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[Path]:
    """A cache root whose bin directory holds every binary of the pinned versions; yields the bin directory."""
    root = tmp_path / "cache"
    bin_dir = Path(subprocess.run(["bash", str(BUILD_TOOLS), "--print-bin-dir"], env=_env(root), check=True,
                                  capture_output=True, text=True).stdout.strip())
    assert bin_dir.is_relative_to(root)
    bin_dir.mkdir(parents=True)
    for name in BINARIES:
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    for name in STAMPED:
        variable = name.upper().replace("-", "_") + "_VERSION"
        pinned = re.search(rf"^{variable}=(\S+)$", BUILD_TOOLS.read_text(), flags=re.M)
        assert pinned, f"build-tools.sh pins no {variable}"
        (bin_dir / f"{name}.version").write_text(pinned.group(1) + "\n")
    yield bin_dir


def test_two_runs_at_once_with_the_binaries_present_both_succeed(cache: Path, tmp_path: Path) -> None:
    env = _env(tmp_path / "cache")
    runs = [_start(env, tmp_path / f"run{i}.log") for i in (1, 2)]
    for run in runs:
        rc, out, log = run.finish()
        assert rc == 0, log
        assert out.strip() == str(cache)
        assert "all binaries present" in log


def test_a_second_run_waits_for_the_lock_then_finds_the_binaries(cache: Path, tmp_path: Path) -> None:
    """While the cache's lock is held (as by a run that is building), runs wait, saying so, and do not look at the
    cache; once it is released each takes it in turn and finds every binary present."""
    env = _env(tmp_path / "cache")
    with (cache.parent / "build.lock").open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        first = _start(env, tmp_path / "first.log")
        _wait_for(first, WAITING)
        second = _start(env, tmp_path / "second.log")
        _wait_for(second, WAITING)
        time.sleep(0.5)
        assert first.proc.poll() is None and second.proc.poll() is None, "a run went on while the lock was held"
        assert "all binaries present" not in first.log() + second.log()
    for run in (first, second):
        rc, out, log = run.finish()
        assert rc == 0, log
        assert out.strip() == str(cache)
        assert log.index(WAITING) < log.index("all binaries present"), log


@pytest.mark.skipif(shutil.which("go") is None, reason="go is not on PATH: build-tools.sh stops before building")
def test_a_run_builds_in_a_work_directory_of_its_own(cache: Path, tmp_path: Path) -> None:
    """A run that has to build makes its own work directory and removes it, whether it succeeds or fails; it leaves
    alone a directory another run may use (an older script's shared work/) and removes one a killed run left. The
    build is made to fail at once: kubelet is missing and Go may not download modules."""
    (cache / "kubelet").unlink()
    shared = cache.parent / "work" / "kubernetes" / "in-use"
    shared.parent.mkdir(parents=True)
    shared.touch()
    stale = cache.parent / "work.Ab12Cd"
    (stale / "out").mkdir(parents=True)
    env = _env(tmp_path / "cache", GOPROXY="off", GOMODCACHE=str(tmp_path / "gomod"), GOFLAGS="")
    rc, _, log = _start(env, tmp_path / "run.log").finish(timeout=120)
    assert rc != 0, log
    assert shared.is_file(), f"a run removed another's work directory:\n{log}"
    assert not list(cache.parent.glob("work.*")), f"a work directory was left behind:\n{log}"
    assert f"removing {stale}" in log
    assert "GOPROXY=off" in log, log  # it got as far as resolving k8s.io/kubernetes in its work directory
    assert "building Kubernetes failed" in log, log  # the stream that failed, named; the other had nothing to do


def test_check_says_whether_a_build_is_needed_without_building_or_waiting(cache: Path, tmp_path: Path) -> None:
    """`make test` asks --check before it starts a build in the background: 0 with every binary present, 1 with one
    missing or stamped with another version; it neither builds nor waits for a lock another run holds."""
    env = _env(tmp_path / "cache")

    def check() -> int:
        return subprocess.run(["bash", str(BUILD_TOOLS), "--check"], env=env, capture_output=True, text=True,
                              timeout=10).returncode

    with (cache.parent / "build.lock").open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert check() == 0
        pinned = (cache / "kueue.version").read_text()
        (cache / "kueue.version").write_text("v0.0.1\n")
        assert check() == 1
        (cache / "kueue.version").write_text(pinned)
        assert check() == 0
        (cache / "coredns").unlink()
        assert check() == 1
    assert not list(cache.parent.glob("work.*")) and not (cache / "coredns").exists()
    usage = subprocess.run(["bash", str(BUILD_TOOLS), "--chekc"], env=env, capture_output=True, text=True)
    assert usage.returncode == 2 and "usage:" in usage.stderr
