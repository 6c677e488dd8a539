"""The argv a trial is launched with: the job module alone, or under torchrun for several GPUs or nodes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kubesweep.jobs.command import JOB_MODULE, job_argv
from kubesweep.wire.outcomes import ExitCode
from tests.support.job_fixtures import REPO

ARGS = ["--config", "/t/trial.json", "--output-dir", "/out"]


def test_one_gpu_runs_the_module() -> None:
    assert job_argv("/t/trial.json", "/out") == ["python", "-m", JOB_MODULE, *ARGS]
    assert job_argv("/t/trial.json", "/out", python="/venv/bin/python", gpus=0)[0] == "/venv/bin/python"


def test_several_gpus_run_under_standalone_torchrun() -> None:
    assert job_argv("/t/trial.json", "/out", gpus=4) == [
        "python", "-m", "torch.distributed.run", "--nproc_per_node=4", "--standalone", "-m", JOB_MODULE, *ARGS,
    ]  # fmt: skip


def test_several_nodes_meet_at_the_rendezvous() -> None:
    argv = job_argv("/t/trial.json", "/out", gpus=2, num_nodes=3, rdzv_endpoint="trial-0.svc:29500")
    assert argv == [
        "python", "-m", "kubesweep.jobs.rendezvous", "--nproc_per_node=2", "--nnodes=3", "--rdzv_backend=c10d",
        "--rdzv_endpoint=trial-0.svc:29500", "-m", JOB_MODULE, *ARGS,
    ]  # fmt: skip
    assert "--nproc_per_node=1" in job_argv("/t/trial.json", "/out", gpus=0, num_nodes=2, rdzv_endpoint="h:1")
    with pytest.raises(ValueError, match="rendezvous endpoint"):
        job_argv("/t/trial.json", "/out", gpus=1, num_nodes=2)


def test_the_argv_launches_the_job(tmp_path: Path) -> None:
    """The command as built runs the job: a settings file it refuses gives the usage exit code, not a crash."""
    job_file = tmp_path / "job.yaml"
    job_file.write_text("precision: fp8\n")
    argv = job_argv(str(job_file), str(tmp_path / "out"), python=sys.executable)
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert "error: invalid settings: precision" in proc.stderr


def test_pod_0_of_a_multi_node_trial_hosts_the_rendezvous_by_its_index_not_by_dns() -> None:
    from kubesweep.jobs.rendezvous import torchrun_argv

    args = ["--nnodes=2", "--rdzv_endpoint=t-0.t:29500", "-m", JOB_MODULE]
    assert torchrun_argv(args, "0", python="py") == [
        "py", "-m", "torch.distributed.run", "--rdzv_conf=is_host=1", *args]
    assert torchrun_argv(args, "1", python="py")[3] == "--rdzv_conf=is_host=0"
    assert torchrun_argv(args, None, python="py") == ["py", "-m", "torch.distributed.run", *args]
