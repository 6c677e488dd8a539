"""The fork server (kubesweep/jobs/forkserver*.py): trials forked from one interpreter that imported the job.

The real job runs, on the CPU (the tiny random-init BERT of tests/support/job_fixtures.py). What is compared is
what a trial computes and reports; how long it takes is measured in bench/trial_wall.py, not here.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kubesweep.jobs import forkserver_handle, forkserver_warm
from kubesweep.jobs.forkserver_handle import Handle
from kubesweep.jobs.runtime import CRASH_HOOK_ENV
from kubesweep.wire.outcomes import ExitCode
from tests.support.job_fixtures import REPO, JobRun, run_job, tiny_args

pytestmark = pytest.mark.slow


# A host "with a GPU": CI has none, so the device node the server looks for is pointed at a file that exists. The
# spares then prepare as on a GPU host (compile workers, the compiler's imports). `plain` turns that off.
PREPARING = {forkserver_warm.WARM_ENV: "1", forkserver_warm.GPU_NODE_ENV: "/dev/null"}
PLAIN = {forkserver_warm.WARM_ENV: "0"}


@pytest.fixture
def server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Handle]:
    env = {**os.environ, **(PREPARING if getattr(request, "param", "plain") == "preparing" else PLAIN)}
    handle = Handle(sys.executable, env, tmp_path / "forkserver.log")
    yield handle
    handle.stop()
    handle.proc.wait(timeout=60)


def forked_trials(tmp_path: Path) -> list[int]:
    """The pids the server says it forked, in order."""
    log = (tmp_path / "forkserver.log").read_text()
    return [int(pid) for pid in re.findall(r"forkserver: trial (\d+):", log)]


def forkserver_prepared(tmp_path: Path) -> dict[int, str]:
    """The spares that prepared for a trial: pid -> the CUDA environment they prepared for."""
    log = (tmp_path / "forkserver.log").read_text()
    return {int(pid): cuda for pid, cuda in re.findall(r"forkserver: spare (\d+) prepared for (.*?) in ", log)}


def client(server: Handle, args: list[str], output_dir: Path, env: dict[str, str] | None = None,
           **popen: object) -> subprocess.Popen[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "KUBESWEEP_TEST_"))}
    return subprocess.Popen(server.argv(["--output-dir", str(output_dir), *args]), cwd=REPO,
                            env={**full_env, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, **popen)  # type: ignore[call-overload]


def through(server: Handle, args: list[str], output_dir: Path,
            env: dict[str, str] | None = None) -> JobRun:
    proc = client(server, args, output_dir, env)
    out, _ = proc.communicate(timeout=600)
    print(out[-4000:])
    return JobRun(proc.returncode, out, output_dir)


@pytest.mark.parametrize("server", ["plain", "preparing"], indirect=True)
def test_a_trial_after_another_computes_what_a_fresh_process_computes(
    server: Handle, sst2: Path, token_cache: Path, tmp_path: Path
) -> None:
    """Trial B forked after trial A (other seed, batch, precision, attention kernels, learning rate) reports
    exactly what B reports in an interpreter of its own: every logged loss, the evaluation, the step count; also
    where each trial is taken by a spare that prepared for it (`preparing`)."""
    a = through(server, tiny_args(sst2, token_cache, "--seed", "7", "--batch-size", "8", "--precision", "bf16",
                                  "--sdpa-backend", "math", "--learning-rate", "3e-3", "--max-steps", "10"),
                tmp_path / "a")
    b_args = tiny_args(sst2, token_cache, "--max-steps", "12", "--eval-every-epoch")
    b = through(server, b_args, tmp_path / "b")
    fresh = run_job(b_args, tmp_path / "fresh")
    assert a.returncode == b.returncode == fresh.returncode == 0
    assert len(forked_trials(tmp_path)) == 2 and "running the job in this process" not in a.stdout + b.stdout
    got, want = b.results, fresh.results
    assert [p["loss"] for p in got["loss_curve"]] == [p["loss"] for p in want["loss_curve"]]
    assert got["final_accuracy"] == want["final_accuracy"] and got["train"]["steps"] == want["train"]["steps"]
    assert got["eval"] == want["eval"] and got["train"]["final_loss"] == want["train"]["final_loss"]
    assert got["outcome"] == "succeeded" and got["timings"]["startup_s"] >= 0
    if server.env.get(forkserver_warm.WARM_ENV) == "1":
        assert set(forkserver_prepared(tmp_path)) >= set(forked_trials(tmp_path))


def test_exit_codes_and_signals_pass_through_the_client(
    server: Handle, sst2: Path, token_cache: Path, tmp_path: Path
) -> None:
    """The client exits as its trial did; SIGTERM to the client reaches the trial, which records itself cancelled;
    a client killed outright takes its trial with it; the server serves the next trial after each."""
    crashed = through(server, tiny_args(sst2, token_cache, "--max-steps", "8"), tmp_path / "crash",
                      env={CRASH_HOOK_ENV: "2"})
    assert crashed.returncode == 137

    long_run = tiny_args(sst2, token_cache, "--max-steps", "100000", "--train-samples", "4096")
    termed = client(server, long_run, tmp_path / "term", start_new_session=True)
    _wait_for_steps(tmp_path / "term")
    termed.send_signal(signal.SIGTERM)
    out, _ = termed.communicate(timeout=120)
    assert termed.returncode == ExitCode.FAILED, out[-3000:]
    assert JobRun(termed.returncode, out, tmp_path / "term").results["outcome"] == "cancelled"

    killed = client(server, long_run, tmp_path / "kill")
    _wait_for_steps(tmp_path / "kill")
    trial_pid = forked_trials(tmp_path)[-1]
    killed.kill()
    killed.wait(timeout=30)
    deadline = time.monotonic() + 30
    while _exists(trial_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _exists(trial_pid), "the trial outlived its killed client"

    after = through(server, tiny_args(sst2, token_cache, "--max-steps", "4"), tmp_path / "after")
    assert after.returncode == 0 and len(forked_trials(tmp_path)) == 4


def test_without_a_server_or_with_another_import_environment_the_job_runs_in_the_client(
    server: Handle, tmp_path: Path
) -> None:
    """Nothing is lost when the server cannot take a trial: the client runs the job itself (here a usage error,
    which the job reports before importing torch) and says why."""
    elsewhere = Handle.__new__(Handle)
    elsewhere.python, elsewhere.socket = sys.executable, str(tmp_path / "absent" / "socket")
    for handle, env, why in ((elsewhere, None, "cannot reach"),
                             (server, {"PYTORCH_NO_SUCH_SETTING": "1"}, "PYTORCH_NO_SUCH_SETTING")):
        run = through(handle, ["--batch-size", "0"], tmp_path / "usage", env)
        assert run.returncode == ExitCode.USAGE
        assert why in run.stdout and "running the job in this process" in run.stdout
        assert "batch_size" in run.stdout
    assert forked_trials(tmp_path) == []


def test_each_trial_is_taken_by_a_spare_forked_before_it_and_a_lost_spare_is_replaced(
    server: Handle, tmp_path: Path
) -> None:
    """The server keeps one child waiting: a trial runs in the spare that was there before its request, the next
    spare is forked then, and a spare killed while it waits is reaped and replaced without losing a trial."""
    server.wait_ready()
    (spare,) = _children(server.proc.pid)
    run = through(server, ["--batch-size", "0"], tmp_path / "first")
    assert run.returncode == ExitCode.USAGE and forked_trials(tmp_path) == [spare]
    (next_spare,) = _wait_children(server.proc.pid, lambda pids: pids != [spare] and len(pids) == 1)
    os.kill(next_spare, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while f"spare {next_spare} ended without a trial" not in server.log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert f"spare {next_spare} ended without a trial" in server.log.read_text()
    again = through(server, ["--batch-size", "0"], tmp_path / "again")
    assert again.returncode == ExitCode.USAGE and "running the job in this process" not in again.stdout
    assert len(forked_trials(tmp_path)) == 2 and next_spare not in forked_trials(tmp_path)


def test_terminate_ends_the_server_with_its_spare_and_its_trial_at_once(
    sst2: Path, token_cache: Path, tmp_path: Path
) -> None:
    """Ending the server does not wait for its import or its trial, while it imports and while it serves:
    `Handle.terminate` in the process that started it, `end_recorded` from another (the handle's record file names
    it). The spare and the running trial go with it (the trial's client says the server went away), and its socket
    directory and record are removed.

    The bounds are the grace after SIGTERM (then SIGKILL) and 2 s more, not a speed. While the server imports, the
    handle's SIGKILL after a short grace is what bounds it: beside the other worker's tests, a server still inside
    `import torch` has taken over 5 s to run its SIGTERM handler. While it serves, the bound is the default grace,
    and a server left to finish its trial (100,000 steps) would not end at all."""
    record = tmp_path / "forkserver.json"
    env = {**os.environ, **PLAIN}
    importing = Handle(sys.executable, env, tmp_path / "importing.log", record=record)
    assert json.loads(record.read_text()) == {"pid": importing.proc.pid, "socket": importing.socket,
                                              "start": forkserver_handle._start_time(importing.proc.pid)}
    grace = 1.0
    start = time.monotonic()
    importing.terminate(grace=grace)
    assert time.monotonic() - start < grace + 2.0 and importing.proc.returncode is not None
    assert not os.path.exists(importing.dir) and not record.exists()

    serving = Handle(sys.executable, env, tmp_path / "forkserver.log", record=record)
    serving.wait_ready()
    long_run = tiny_args(sst2, token_cache, "--max-steps", "100000", "--train-samples", "4096")
    trial = client(serving, long_run, tmp_path / "run")
    _wait_for_steps(tmp_path / "run")
    (trial_pid,) = forked_trials(tmp_path)
    processes = [serving.proc.pid, *_children(serving.proc.pid)]  # the server, its trial and its spare
    assert trial_pid in processes and len(processes) == 3
    start = time.monotonic()
    assert forkserver_handle.end_recorded(record)
    assert time.monotonic() - start < forkserver_handle.TERMINATE_GRACE_S + 2.0
    assert [pid for pid in processes if forkserver_handle._running(pid)] == []
    out, _ = trial.communicate(timeout=30)
    assert trial.returncode == 1 and "the server went away" in out
    assert not os.path.exists(serving.dir) and not record.exists()
    assert not forkserver_handle.end_recorded(record)  # nothing left to end
    serving.proc.wait(timeout=10)


def test_a_preparing_spare_takes_only_a_trial_of_the_cuda_environment_it_prepared_for(tmp_path: Path) -> None:
    """A spare prepares for the CUDA environment of the trial before it (the server's at first): a trial with
    another is taken by a spare forked for it on the spot, which prepares nothing, and the next spare prepares
    for the new environment."""
    env = {**os.environ, **PREPARING, "CUDA_VISIBLE_DEVICES": "0"}
    server = Handle(sys.executable, env, tmp_path / "forkserver.log")
    try:
        server.wait_ready()
        first = through(server, ["--batch-size", "0"], tmp_path / "a", env={"CUDA_VISIBLE_DEVICES": "0"})
        other = through(server, ["--batch-size", "0"], tmp_path / "b", env={"CUDA_VISIBLE_DEVICES": "1"})
        again = through(server, ["--batch-size", "0"], tmp_path / "c", env={"CUDA_VISIBLE_DEVICES": "1"})
    finally:
        server.stop()
        server.proc.wait(timeout=60)
    assert first.returncode == other.returncode == again.returncode == ExitCode.USAGE
    a, b, c = forked_trials(tmp_path)
    prepared = forkserver_prepared(tmp_path)
    assert prepared[a] == "CUDA_VISIBLE_DEVICES=0" and prepared[c] == "CUDA_VISIBLE_DEVICES=1"
    assert b not in prepared
    log = server.log.read_text()
    assert re.search(r"spare \d+ prepared for CUDA_VISIBLE_DEVICES=0; the trial has CUDA_VISIBLE_DEVICES=1: "
                     r"a spare is forked for it", log), log
    assert f"{len(forkserver_warm.WARM_IMPORTS)} of {len(forkserver_warm.WARM_IMPORTS)} modules imported" in log


WARM_PROBE = r"""
import json, os, sys, time, torch
from kubesweep.jobs import forkserver_protocol, forkserver_warm
os.environ["CUDA_VISIBLE_DEVICES"] = "3"
forkserver_warm.prepare({"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
from torch._inductor.async_compile import AsyncCompile
sidecar = AsyncCompile.process_pool().process.pid
deadline = time.monotonic() + 60
while not AsyncCompile.use_process_pool() and time.monotonic() < deadline:
    time.sleep(0.05)
print(json.dumps({"ready": AsyncCompile.use_process_pool(), "sidecar_nice": os.getpriority(os.PRIO_PROCESS, sidecar),
                  "cuda_initialized": torch.cuda.is_initialized(),
                  "imported": all(name in sys.modules for name in forkserver_warm.WARM_IMPORTS),
                  "cuda_env": forkserver_protocol.cuda_env(dict(os.environ))}))
"""


def test_a_spare_prepares_behind_the_running_trial_in_the_cuda_environment_it_expects() -> None:
    """What a preparing spare does: with the CUDA environment it prepares for in place (and no other CUDA_*
    variable), Inductor's compile workers start and answer below the running trial's CPU priority, and the
    compiler's modules are imported. CI has no GPU; the workers and the imports are real."""
    pytest.importorskip("triton")
    env = dict(os.environ)
    out = subprocess.run([sys.executable, "-c", WARM_PROBE], capture_output=True, text=True, env=env, cwd=REPO,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"ready": True, "sidecar_nice": 10, "cuda_initialized": False, "imported": True,
                    "cuda_env": {"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}}, seen


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry.name))
    return sorted(found)


def _wait_children(pid: int, ok: Callable[[list[int]], bool]) -> list[int]:
    deadline = time.monotonic() + 30
    while not ok(pids := _children(pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pids


def _wait_for_steps(output_dir: Path) -> None:
    """Until the trial has written its trial file and trained a little."""
    deadline = time.monotonic() + 120
    while not (output_dir / "trial.json").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(3)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
