"""The warm pod's worker (kubesweep/jobs/worker.py): a sweep's trials one after another, from one fork server.

The worker runs here as it runs in a pod: a process reading its hand-over file, with the real job on the CPU (the
tiny random-init BERT of tests/support/job_fixtures.py) forked from the real fork server. Only the GPU is missing:
the OOM is the job's test hook (`KUBESWEEP_TEST_OOM_ABOVE_BATCH`); tests/jobs/test_train_gpu.py runs a real CUDA
OOM followed by a good trial in one worker on a GPU.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from kubesweep.jobs import worker as worker_mod
from kubesweep.jobs.runtime import OOM_HOOK_ENV
from kubesweep.wire.handover import HandedTrial, Handover, WorkerEvent, log_lines, parse_events
from tests.support.job_fixtures import MINILM, REPO, TINY_OVERRIDES

pytestmark = pytest.mark.slow

SWEEP = "warm"


def job(sst2: Path, cache: Path, **overrides: Any) -> dict[str, Any]:
    """The job section of a tiny trial (what tiny_args says as flags)."""
    return {"model": MINILM, "random_init": True,
            "model_overrides": {k: int(v) for k, v in (kv.split("=") for kv in TINY_OVERRIDES.split(","))},
            "dataset": str(sst2), "train_samples": 256, "eval_samples": 64, "batch_size": 8, "max_seq_len": 64,
            "padding": "dynamic", "learning_rate": 1e-3, "num_workers": 0, "log_every": 4, "cache_dir": str(cache),
            "max_steps": 6, **overrides}


def trial(tid: str, sst2: Path, cache: Path, *, sweep: str = SWEEP, **overrides: Any) -> HandedTrial:
    config = {"sweep": sweep, "trial_id": tid, "name": tid, "gpus_per_trial": 0,
              "job": job(sst2, cache, **overrides)}
    return HandedTrial(id=tid, config=config)


class Pod:
    """A worker process as a pod runs it: its hand-over file, output directory and log (standard output)."""

    def __init__(self, tmp: Path, *args: str, env: dict[str, str] | None = None, python: str = sys.executable,
                 **popen: Any) -> None:
        self.dir = tmp
        self.handover = tmp / "etc" / "handover.json"
        self.handover.parent.mkdir(parents=True, exist_ok=True)
        self.output = tmp / "output"
        self.log = tmp / "pod.log"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "KUBESWEEP_"))}
        full_env.update({"KUBESWEEP_SWEEP": SWEEP, "KUBESWEEP_FORKSERVER_WARM": "0", **(env or {})})
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [python, "-m", "kubesweep.jobs.worker", "--handover", str(self.handover),
                 "--output-dir", str(self.output), *args],
                cwd=REPO, env=full_env, stdout=out, stderr=subprocess.STDOUT, **popen)

    def hand_over(self, *trials: HandedTrial, closed: bool = False) -> None:
        """Write the hand-over as the kubelet does: a new file swapped in whole."""
        partial = self.handover.with_name(".handover.tmp")
        partial.write_text(Handover(sweep=SWEEP, trials=list(trials), closed=closed).to_annotation())
        partial.replace(self.handover)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def events(self) -> list[WorkerEvent]:
        return parse_events(log_lines(self.text()))

    def wait_for(self, predicate: Any, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not predicate(self.events()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"not seen in time (worker exit {self.proc.poll()}):\n{self.text()[-4000:]}")
            time.sleep(0.1)

    def wait(self, timeout: float = 300) -> int:
        code = self.proc.wait(timeout=timeout)
        print(self.text()[-6000:])
        return code


def ends(events: list[WorkerEvent]) -> dict[str, WorkerEvent]:
    return {e.trial: e for e in events if e.event == "end" and e.trial}


def test_trials_run_one_after_another_from_one_warm_server_and_an_oom_does_not_poison_the_next(
    sst2: Path, token_cache: Path, tmp_path: Path
) -> None:
    """An OOM, then a good trial, forked from the one server the worker started; each with its own output and
    log; a trial of another sweep refused, never run; the worker ends once the closed hand-over has run."""
    pod = Pod(tmp_path, env={OOM_HOOK_ENV: "16"})
    pod.hand_over(trial("t-oom", sst2, token_cache, batch_size=32), trial("t-good", sst2, token_cache),
                  trial("t-other", sst2, token_cache, sweep="another"), closed=True)
    assert pod.wait() == 0
    events = pod.events()
    assert [(e.event, e.trial) for e in events] == [
        ("ready", None), ("start", "t-oom"), ("end", "t-oom"), ("start", "t-good"), ("end", "t-good"),
        ("start", "t-other"), ("end", "t-other"), ("exit", None)]
    got = ends(events)
    assert (got["t-oom"].exit_code, got["t-oom"].outcome) == (3, "oom")
    assert (got["t-good"].exit_code, got["t-good"].outcome) == (0, "succeeded")
    assert got["t-other"].exit_code == 2 and "sweep 'another'" in (got["t-other"].reason or "")
    assert not (pod.output / "t-other").exists()
    assert events[-1].reason and events[-1].reason.startswith("closed")
    results = json.loads((pod.output / "t-good" / "results.json").read_text())
    assert results["outcome"] == "succeeded" and results["trial"]["trial_id"] == "t-good"
    assert "step 6/6" in (pod.output / "t-good" / "log.txt").read_text()
    server_log = (pod.output / "forkserver.log").read_text()
    assert len(re.findall(r"forkserver: trial \d+:", server_log)) == 2  # both forked, from one server
    assert "running the job in this process" not in pod.text()


def test_a_trial_taken_out_of_the_handover_is_stopped_and_sigterm_ends_the_worker_after_its_trial(
    sst2: Path, token_cache: Path, tmp_path: Path
) -> None:
    """Taken out of the hand-over while it runs, a trial is stopped (SIGTERM: it records itself cancelled) and the
    next one runs; SIGTERM to the worker stops the running trial and ends the worker once it has ended, without
    starting the trial after it."""
    pod = Pod(tmp_path, "--grace", "60")
    long = trial("t-long", sst2, token_cache, max_steps=100000, train_samples=4096)
    pod.hand_over(long)
    pod.wait_for(lambda ev: any(e.event == "start" for e in ev))
    _wait_for_steps(pod.output / "t-long" / "log.txt")
    second = trial("t-second", sst2, token_cache, max_steps=100000, train_samples=4096)
    pod.hand_over(second, trial("t-third", sst2, token_cache))
    pod.wait_for(lambda ev: any(e.event == "start" and e.trial == "t-second" for e in ev))
    _wait_for_steps(pod.output / "t-second" / "log.txt")
    pod.proc.send_signal(signal.SIGTERM)
    assert pod.wait() == 128 + signal.SIGTERM
    events = pod.events()
    got = ends(events)
    assert got["t-long"].outcome == "cancelled" and got["t-long"].reason == "taken out of the hand-over"
    assert got["t-second"].outcome == "cancelled" and got["t-second"].reason == "the pod is terminating"
    assert "t-third" not in {e.trial for e in events}
    assert events[-1].event == "exit" and events[-1].reason == "terminated"


def test_a_worker_with_nothing_handed_over_gives_its_slot_back(tmp_path: Path) -> None:
    """No hand-over (a driver that is gone) ends the worker after its idle timeout; a closed, empty one at once.
    A hand-over that is not one is said once and read as nothing."""
    idle = Pod(tmp_path / "idle", "--idle-timeout", "1", "--no-forkserver")
    idle.handover.write_text("{not json")
    assert idle.wait(timeout=60) == 0
    assert idle.events()[-1].reason == "idle: nothing handed over for 1 s"
    assert idle.text().count("not a hand-over") == 1
    closed = Pod(tmp_path / "closed", "--no-forkserver")
    closed.hand_over(closed=True)
    assert closed.wait(timeout=60) == 0
    assert [e.event for e in closed.events()] == ["ready", "exit"]


def test_a_trial_cannot_write_an_event_line(capsys: pytest.CaptureFixture[str]) -> None:
    """A trial's line that reads like an event reaches the pod's log escaped, and the log file as printed."""
    forged = WorkerEvent("end", 1.0, trial="t-other", exit_code=0, outcome="succeeded").line()
    log = io.BytesIO()
    log.close = lambda: None  # type: ignore[method-assign]  # read after the relay is done
    worker_mod._relay(io.BytesIO(f"step 1/2\n{forged}\n".encode()), log)
    printed = capsys.readouterr().out.splitlines()
    assert parse_events(printed) == []
    assert printed == ["step 1/2", "| " + forged]
    assert log.getvalue().decode().splitlines() == ["step 1/2", forged]


@pytest.mark.skipif(os.getuid() != 0, reason="runs the worker and the attacker as another user: needs root here")
def test_a_trial_cannot_reach_the_workers_output_through_proc() -> None:
    """A trial runs as the worker's user. Through /proc/<worker>/fd/1 it could open the pod's log pipe and write
    an event there unescaped; the worker is non-dumpable, so that open is refused."""
    tmp_path = Path(tempfile.mkdtemp(prefix="kubesweep-worker-test-"))  # pytest's own is its owner's alone
    tmp_path.chmod(0o777)
    user = 65534  # nobody
    python = _python_for_others()
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "KUBESWEEP_SWEEP": SWEEP,
           "PYTHONPATH": str(_worker_code_for_others(tmp_path / "lib"))}
    # Its standard output a pipe owned by its user, as the container runtime makes a container's (so that the
    # container's processes can open /dev/stdout).
    read_end, write_end = os.pipe()
    os.fchown(write_end, user, user)
    proc = subprocess.Popen([python, "-m", "kubesweep.jobs.worker", "--no-forkserver", "--idle-timeout", "60",
                             "--handover", str(tmp_path / "handover.json"), "--output-dir", str(tmp_path / "out")],
                            cwd=tmp_path, env=env, stdout=write_end, stderr=subprocess.STDOUT, user=user, group=user)
    os.close(write_end)
    log = os.fdopen(read_end, "r")
    try:
        first = log.readline()
        if not first.startswith("kubesweep.worker "):  # it failed to start: all it said
            proc.wait(timeout=60)
            first += log.read()
        assert first.startswith("kubesweep.worker ") and '"ready"' in first, first
        attack = ("import sys\ntry:\n    open(f'/proc/{sys.argv[1]}/fd/1', 'w').write('kubesweep.worker {}\\n')\n"
                  "except PermissionError:\n    print('refused')\nelse:\n    print('written')\n")
        tried = subprocess.run([python, "-c", attack, str(proc.pid)], capture_output=True, text=True,
                               user=user, group=user, timeout=60, cwd=tmp_path)
        assert tried.stdout.strip() == "refused", tried.stdout + tried.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        log.close()
        shutil.rmtree(tmp_path, ignore_errors=True)


def _python_for_others() -> str:
    """This Python, or the system's of the same version, whichever another user may run (this one may live under
    a home directory only its owner enters)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (sys.executable, os.path.realpath(sys.executable), f"/usr/bin/{version}",
                      f"/usr/local/bin/{version}"):
        path = Path(os.path.realpath(candidate))
        if path.is_file() and all(p.stat().st_mode & 0o001 for p in (path, *path.parents)):
            return candidate
    pytest.fail(f"no {version} that another user may run")


def _worker_code_for_others(dest: Path) -> Path:
    """A copy, in `dest`, of every package the worker imports, from the checkout and this environment: another
    user may not enter either (a checkout in a directory only its owner enters, as a fresh clone in mktemp's)."""
    probe = ("import json, sys, kubesweep.jobs.worker\n"
             "print(json.dumps(sorted({m.__file__ for n, m in list(sys.modules.items())\n"
             "    if '.' not in n and getattr(m, '__file__', None)})))")
    files = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                                      cwd=REPO, timeout=120).stdout)
    dest.mkdir(parents=True, exist_ok=True)
    roots = [Path(p) for p in sys.path if p and Path(p).is_dir() and ("site-packages" in p or Path(p) == REPO)]
    for file in map(Path, files):
        root = max((r for r in roots if file.is_relative_to(r)), key=lambda r: len(r.parts), default=None)
        if root is None:  # the standard library: the other user's Python has its own
            continue
        top = root / file.relative_to(root).parts[0]
        target = dest / top.name
        if top.is_dir() and not target.exists():
            shutil.copytree(top, target, ignore=shutil.ignore_patterns("__pycache__"))
        elif top.is_file():
            shutil.copy(top, target)
    for path in (dest, *dest.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return dest


def _wait_for_steps(log: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and "step " in log.read_text(errors="replace"):
            return
        time.sleep(0.1)
    raise AssertionError(f"no step line in {log}")
