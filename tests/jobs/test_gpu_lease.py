"""The GPU lease: an flock per device that a second holder waits for, and that dies with its process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kubesweep.jobs.gpu_lease import LEASE_ENV, GpuLease
from tests.support.job_fixtures import REPO

HOLD_S = 0.5


def test_without_a_lease_nothing_is_locked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LEASE_ENV, raising=False)
    lease = GpuLease.from_env()
    assert lease.path is None and lease.acquire("t") is None and not lease.held
    lease.release()
    assert lease.record() is None and lease.held_s is None


def test_each_local_rank_takes_its_own_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LEASE_ENV, os.pathsep.join([str(tmp_path / "gpu0.lock"), "", str(tmp_path / "gpu1.lock")]))
    assert GpuLease.from_env(0).path == tmp_path / "gpu0.lock"
    assert GpuLease.from_env(1).path == tmp_path / "gpu1.lock"
    assert GpuLease.from_env(2).path == tmp_path / "gpu0.lock"


def test_second_holder_waits_until_the_first_releases(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "locks" / "gpu0.lock"
    first, second = GpuLease(path), GpuLease(path)
    assert first.acquire("trial-a") is not None and first.held
    waited: list[float | None] = []
    thread = threading.Thread(target=lambda: waited.append(second.acquire("trial-b")))
    thread.start()
    time.sleep(HOLD_S)
    assert thread.is_alive() and not second.held  # still waiting
    first.release()
    thread.join(timeout=10)
    assert not thread.is_alive() and second.held
    assert waited[0] is not None and waited[0] >= HOLD_S * 0.9
    assert first.held_s is not None and first.held_s >= HOLD_S * 0.9 and not first.held
    assert f"held by {os.getpid()} trial-a" in capsys.readouterr().out
    assert path.read_text() == f"{os.getpid()} trial-b\n"  # the holder now
    record = first.record()
    assert record is not None and record["path"] == str(path)
    assert record["acquired_at"] <= record["released_at"] <= time.time()  # type: ignore[operator]
    assert second.record()["released_at"] is None  # type: ignore[index]
    second.release()
    second.release()  # idempotent
    assert second.held_s is not None and GpuLease(path).acquire() is not None


def test_a_killed_holder_frees_the_device(tmp_path: Path) -> None:
    path = tmp_path / "gpu0.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from pathlib import Path; from kubesweep.jobs.gpu_lease import GpuLease; "
         "lease = GpuLease(Path(sys.argv[1])); "
         "lease.acquire('victim'); print('held', flush=True); time.sleep(600)",
         str(path)],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        lease = GpuLease(path)
        thread = threading.Thread(target=lease.acquire, args=("next",))
        thread.start()
        time.sleep(HOLD_S)
        assert thread.is_alive()  # the other process holds it
        holder.send_signal(signal.SIGKILL)
        thread.join(timeout=10)
        assert not thread.is_alive() and lease.held
        lease.release()
    finally:
        holder.kill()
        holder.wait()
