"""Tracking into a real `mlflow server` (sqlite store, local artifacts) on 127.0.0.1, including an outage."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubesweep.jobs.mlflow_logger import MlflowTrialLogger
from kubesweep.wire.outcomes import ExitCode
from tests.support.job_fixtures import REPO, tiny_args

mlflow = pytest.importorskip("mlflow")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class MlflowServer:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command = [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--backend-store-uri",
            f"sqlite:///{self.root / 'mlflow.db'}",
            "--artifacts-destination",
            str(self.root / "artifacts"),
            "--workers",
            "1",
        ]
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        log = (self.root / "server.log").open("ab")
        self.proc = subprocess.Popen(command, env=env, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.root / "server.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        raise TimeoutError("mlflow server did not become healthy")

    def stop(self) -> None:
        if self.proc is None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)  # its own session: the server and its workers
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    srv = MlflowServer(tmp_path_factory.mktemp("mlflow"))
    srv.start()
    yield srv
    srv.stop()


def client(server: MlflowServer) -> Any:
    return mlflow.tracking.MlflowClient(tracking_uri=server.uri)


def parent_run(server: MlflowServer, experiment: str) -> str:
    c = client(server)
    found = c.get_experiment_by_name(experiment)
    exp_id = found.experiment_id if found else c.create_experiment(experiment)
    run_id: str = c.create_run(exp_id, run_name="sweep").info.run_id
    return run_id


def test_one_child_run_per_trial_batched_and_reused(server: MlflowServer) -> None:
    parent = parent_run(server, "reuse")
    loggers = []
    for attempt in range(2):  # the same trial run twice (a retried Job): one MLflow run
        logger = MlflowTrialLogger(
            uri=server.uri,
            trial_id="trial-reuse",
            run_name="t",
            experiment="reuse",
            parent_run_id=parent,
            tags={"kubesweep.gpu": "l40s"},
        )
        logger.start()
        logger.log_params({"batch_size": 16, "precision": "bf16"})
        for step in range(attempt * 1250, (attempt + 1) * 1250):
            logger.log_metrics({"train/loss": 1.0 / (step + 1)}, step)
        stats = logger.close()
        assert stats.pending == 0 and stats.dropped == 0
        assert stats.sent_requests <= 8, "metrics must go in batches, not one request per step"
        loggers.append(logger)
    assert loggers[0].run_id == loggers[1].run_id
    c = client(server)
    runs = c.search_runs(
        [c.get_experiment_by_name("reuse").experiment_id],
        filter_string="tags.`kubesweep.trial_id` = 'trial-reuse'",
    )
    assert len(runs) == 1
    run = runs[0]
    assert run.data.tags["mlflow.parentRunId"] == parent
    assert run.data.tags["kubesweep.gpu"] == "l40s"
    assert run.data.params == {"batch_size": "16", "precision": "bf16"}
    history = c.get_metric_history(run.info.run_id, "train/loss")
    assert sorted(m.step for m in history) == list(range(2500))


@pytest.mark.slow
def test_job_logs_everything_through_a_server_outage(
    server: MlflowServer, sst2: Path, token_cache: Path, tmp_path: Path
) -> None:
    """Stop the server once the trial's run exists, restart it after training: no metric is lost."""
    steps = 24
    parent = parent_run(server, "outage")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "KUBESWEEP_TEST_"))}
    env.update(
        {
            "MLFLOW_TRACKING_URI": server.uri,
            "KUBESWEEP_EXPERIMENT": "outage",
            "KUBESWEEP_PARENT_RUN_ID": parent,
            "KUBESWEEP_TRIAL_ID": "trial-outage",
        }
    )
    command = [
        sys.executable,
        "-m",
        "kubesweep.jobs",
        "--output-dir",
        str(tmp_path),
        "--trial-id",
        "ignored",
        "--name",
        "outage-trial",
        "--sweep",
        "sw",
        *tiny_args(sst2, token_cache, "--max-steps", str(steps), "--export", "weights"),
    ]
    log_path = tmp_path.parent / "job.log"
    with log_path.open("w") as log:
        job = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        c = client(server)
        exp = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and job.poll() is None:
            exp = exp or c.get_experiment_by_name("outage")
            if exp and c.search_runs(
                [exp.experiment_id], filter_string="tags.`kubesweep.trial_id` = 'trial-outage'"
            ):
                break
            time.sleep(0.2)
        else:
            pytest.fail("the trial's run never appeared:\n" + log_path.read_text()[-3000:])
        server.stop()
        while not (tmp_path / "results.json").exists() and job.poll() is None:
            time.sleep(0.2)  # training runs on, with the server down
        assert job.poll() is None, (
            "the job must wait for the tracking server, not exit: " + log_path.read_text()
        )
        server.start()
        code = job.wait(timeout=300)
    output = log_path.read_text()
    assert code == ExitCode.OK, output[-3000:]
    summary = next(
        line for line in output.splitlines() if line.startswith("tracking: ") and "retries" in line
    )
    assert " 0 retries" not in summary and " 0 pending" in summary, summary

    c = client(server)
    (run,) = c.search_runs([exp.experiment_id], filter_string="tags.`kubesweep.trial_id` = 'trial-outage'")
    run_id = run.info.run_id
    history = c.get_metric_history(run_id, "train/loss")
    assert sorted(m.step for m in history) == list(range(1, steps + 1))
    assert c.get_metric_history(run_id, "eval/accuracy")
    assert c.get_metric_history(run_id, "result/samples_per_s")
    assert run.info.status == "FINISHED"
    tags = run.data.tags
    assert tags["mlflow.parentRunId"] == parent
    assert tags["kubesweep.sweep"] == "sw" and tags["kubesweep.trial"] == "outage-trial"
    for key in (
        "kubesweep.gpu",
        "kubesweep.precision",
        "kubesweep.compile",
        "kubesweep.batch_size",
        "kubesweep.repeat",
    ):
        assert key in tags
    assert run.data.params["batch_size"] == "16" and run.data.params["max_steps"] == str(steps)
    artifacts = {a.path for a in c.list_artifacts(run_id)}
    assert {"results.json", "environment.json", "trial.json", "loss_curve.png", "export"} <= artifacts


def test_a_spool_left_by_an_outage_is_sent_by_the_next_attempt(server: MlflowServer, tmp_path: Path) -> None:
    """An attempt that ends while MLflow is away spools its requests; the trial's next attempt in the same
    output directory sends them into the same run first, then its own, and removes the spool."""
    spool = tmp_path / "mlflow-spool.jsonl"
    common = {"trial_id": "trial-spooled", "run_name": "spooled", "experiment": "spool", "spool_path": spool}
    away = MlflowTrialLogger(uri=f"http://127.0.0.1:{free_port()}", flush_timeout_s=1.0, **common)
    away.start()
    away.log_params({"batch_size": 16})
    for step in range(1, 6):
        away.log_metrics({"train/loss": 1.0 / step}, step)
    stats = away.close("FAILED")
    assert stats.pending == 7 and stats.spool == str(spool)  # params, 5 metric points, the end of the run

    again = MlflowTrialLogger(uri=server.uri, **common)
    again.start()
    again.log_metrics({"train/loss": 0.1}, 6)
    stats = again.close("FINISHED")
    assert stats.pending == 0 and stats.dropped == 0
    assert not spool.exists() and not list(tmp_path.glob("*.replaying"))

    c = client(server)
    exp = c.get_experiment_by_name("spool")
    (run,) = c.search_runs([exp.experiment_id], filter_string="tags.`kubesweep.trial_id` = 'trial-spooled'")
    assert sorted(m.step for m in c.get_metric_history(run.info.run_id, "train/loss")) == [1, 2, 3, 4, 5, 6]
    assert run.data.params["batch_size"] == "16"
    assert run.info.status == "FINISHED"  # the spooled FAILED was the earlier attempt's, not this one's


def test_a_resumed_attempt_logs_each_step_once(server: MlflowServer, tmp_path: Path) -> None:
    """The step record beside the spool: an attempt that resumes from a checkpoint at step 4 trains steps 5-10
    again; MLflow keeps the first attempt's values for them and gets each step once."""
    common = {"uri": server.uri, "trial_id": "trial-once", "run_name": "once", "experiment": "once",
              "spool_path": tmp_path / "mlflow-spool.jsonl"}
    first = MlflowTrialLogger(**common)  # type: ignore[arg-type]
    first.start()
    for step in range(1, 11):
        first.log_metrics({"train/loss": 1.0, "system/gpu0/utilization_pct": 50.0}, step)
    assert first.close("FAILED").pending == 0
    assert json.loads((tmp_path / "mlflow-steps.json").read_text())["steps"]["train/loss"] == 10

    second = MlflowTrialLogger(**common)  # type: ignore[arg-type]
    second.start()
    assert second.prior_step("system/") == 10  # where the GPU samples of this attempt continue
    for step in range(5, 16):
        second.log_metrics({"train/loss": 2.0}, step)
    assert second.close().pending == 0
    assert second.run_id == first.run_id

    history = client(server).get_metric_history(first.run_id, "train/loss")
    assert sorted(m.step for m in history) == list(range(1, 16))
    assert {m.step: m.value for m in history} == {**{s: 1.0 for s in range(1, 11)}, **{s: 2.0 for s in range(11, 16)}}


@pytest.mark.slow
def test_a_trial_stopped_by_sigterm_resumes_from_its_checkpoint(
    server: MlflowServer, sst2: Path, token_cache: Path, tmp_path: Path
) -> None:
    """What the trial of an evicted pod does: SIGTERM after a checkpoint ends the attempt as cancelled, with its
    checkpoints, MLflow spool and step record in KUBESWEEP_CHECKPOINT_DIR (the Job's checkpoint claim); the next
    attempt, in a fresh output directory as a replacement pod has, resumes there and MLflow gets every step once."""
    steps = 200
    state = tmp_path / "claim" / "sw" / "trial-term"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "KUBESWEEP_"))}
    env.update({"MLFLOW_TRACKING_URI": server.uri, "KUBESWEEP_EXPERIMENT": "sigterm",
                "KUBESWEEP_TRIAL_ID": "trial-term", "KUBESWEEP_CHECKPOINT_DIR": str(state)})

    def command(output: Path) -> list[str]:
        return [sys.executable, "-m", "kubesweep.jobs", "--output-dir", str(output), "--name", "term", "--sweep",
                "sw", *tiny_args(sst2, token_cache, "--max-steps", str(steps), "--checkpoint-every", "8",
                                 "--log-every", "1")]

    log_path = tmp_path / "first.log"
    with log_path.open("w") as log:
        job = subprocess.Popen(command(tmp_path / "out-1"), cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while not list(state.glob("step-*")) and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        job.send_signal(signal.SIGTERM)
        code = job.wait(timeout=120)
    output = log_path.read_text()
    assert code == ExitCode.FAILED, output[-3000:]
    first = json.loads((tmp_path / "out-1" / "results.json").read_text())
    assert first["outcome"] == "cancelled" and first["error"]["type"] == "Terminated", first["error"]
    assert (state / "mlflow-steps.json").exists() and list(state.glob("step-*"))

    second = subprocess.run(command(tmp_path / "out-2"), cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=600)
    assert second.returncode == ExitCode.OK, (second.stdout + second.stderr)[-3000:]
    results = json.loads((tmp_path / "out-2" / "results.json").read_text())
    assert results["train"]["resumed_from_step"] >= 8, results["train"]

    c = client(server)
    (run,) = c.search_runs([c.get_experiment_by_name("sigterm").experiment_id],
                           filter_string="tags.`kubesweep.trial_id` = 'trial-term'")
    history = [m.step for m in c.get_metric_history(run.info.run_id, "train/loss")]
    assert sorted(history) == list(range(1, steps + 1)), history
    assert run.info.status == "FINISHED"


def test_an_experiment_another_trial_made_at_once_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two trials with no parent run start at once on a fresh store: both read no experiment, one makes it, the
    other's create is refused. The second logs into the one made rather than turning tracking off. The race made
    certain on a real sqlite store: the first read says none while the experiment exists."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    made = MlflowClient(tracking_uri=uri).create_experiment("raced")
    real_read = MlflowClient.get_experiment_by_name
    reads: list[str] = []

    def first_read_misses(self: Any, name: str) -> Any:
        reads.append(name)
        return None if len(reads) == 1 else real_read(self, name)

    monkeypatch.setattr(MlflowClient, "get_experiment_by_name", first_read_misses)
    logger = MlflowTrialLogger(uri=uri, trial_id="trial-raced", run_name="t", experiment="raced")
    logger.start()
    logger.log_metrics({"train/loss": 0.5}, 1)
    stats = logger.close()
    assert reads and stats.dropped == 0 and stats.pending == 0 and logger.run_id is not None
    assert MlflowClient(tracking_uri=uri).get_run(logger.run_id).info.experiment_id == made
