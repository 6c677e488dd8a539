"""The `sweep` CLI end to end on the local backend, in subprocesses as a person runs it. The workload is the
stand-in job (tests/support/stand_in_job.py) so these tests exercise the CLI, not training."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
STAND_IN = ROOT / "tests" / "support" / "stand_in_job.py"


def spec(tmp_path: Path, name: str = "cli", batches: str = "[8, 16, 256]", steps: int = 2) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"apiVersion: kubesweep.io/v1alpha1\nkind: Sweep\nmetadata: {{name: {name}}}\nspec:\n"
        f"  job: {{max_steps: {steps}}}\n  matrix:\n    batch_size: {batches}\n"
        f"  resources: {{gpus_per_trial: 0, retries: 0}}\n"
    )
    return path


@pytest.fixture
def sweep(tmp_path: Path):  # type: ignore[no-untyped-def]
    env = {**os.environ, "KUBESWEEP_HOME": str(tmp_path / "home"), "KUBESWEEP_LOCAL_GPUS": "[]",
           "KUBESWEEP_JOB_COMMAND": json.dumps([sys.executable, str(STAND_IN)]), "COLUMNS": "200",
           "KUBESWEEP_NO_TRACKING": "1"}  # tracking is tested in tests/tracking

    def run(*args: str, check: int | None = 0) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, "-m", "kubesweep", *args], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=120)
        if check is not None:
            assert proc.returncode == check, proc.stdout + proc.stderr
        return proc

    return run


def test_help_and_version(sweep) -> None:  # type: ignore[no-untyped-def]
    assert "submit" in sweep("--help").stdout
    assert "kubesweep 0.1.0" in sweep("--version").stdout


def test_cli_works_without_the_extras(tmp_path: Path) -> None:
    """validate/plan/--help import none of torch, transformers, mlflow, kubernetes, ray."""
    blocked = ["torch", "transformers", "datasets", "mlflow", "kubernetes", "kopf", "ray", "optuna"]
    code = (f"import sys\nfor m in {blocked!r}: sys.modules[m] = None\n"
            "from kubesweep.cli import main\nmain()")
    for args in (["--help"], ["validate", str(ROOT / "sweeps/gpu_matrix.yaml")],
                 ["plan", str(ROOT / "sweeps/gpu_matrix.yaml"), "-o", "json"]):
        proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr


def test_validate_exit_codes(sweep, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert "valid" in sweep("validate", str(spec(tmp_path))).stdout
    bad = ROOT / "tests/data/bad_specs/39-unknown-precision.yaml"
    proc = sweep("validate", str(bad), check=2)
    assert proc.stderr.startswith(f"{bad}:7: spec.matrix.precision[2]: 'bf61' is not one of")
    assert "Traceback" not in proc.stderr


def test_validate_refuses_a_binary_file_and_a_duplicate_key(sweep, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    binary = tmp_path / "model.bin"
    binary.write_bytes(bytes(range(256)))
    proc = sweep("validate", str(binary), check=2)
    assert proc.stderr.startswith(f"{binary}:1: not a text file: it holds NUL bytes")
    assert "Traceback" not in proc.stderr
    duplicate = ROOT / "tests/data/bad_specs/46-duplicate-key.yaml"
    assert "spec.matrix: given twice (lines 6 and 9)" in sweep("validate", str(duplicate), check=2).stderr


def test_plan_json(sweep, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = json.loads(sweep("plan", str(spec(tmp_path)), "-o", "json").stdout)
    assert [t["axes"]["batch_size"] for t in out["trials"]] == [8, 16, 256]


def test_long_tables_are_summarised_and_large_sweeps_confirmed(sweep, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = spec(tmp_path, "wide", str(list(range(1, 121))))
    table = sweep("plan", str(path), "--confirm-over", "100").stdout
    assert "... 70 more trials not shown (--all prints every row)" in table
    assert "wide-bs50-" in table and "wide-bs51-" not in table
    assert "wide-bs120-" in sweep("plan", str(path), "--all").stdout
    warned = sweep("validate", str(path), "--confirm-over", "100").stderr
    assert "120 trials, over the confirmation threshold of 100" in warned
    # no terminal to ask at: refused, nothing submitted, and --yes submits
    refused = sweep("submit", str(path), "--confirm-over", "100", "--detach", check=2).stderr
    assert "sweep 'wide' makes 120 trials (over 100): nothing submitted. Pass --yes" in refused
    sweep("status", "wide", check=3)
    sweep("submit", str(path), "--confirm-over", "100", "--detach", "--yes")
    sweep("cancel", "wide")


def test_submit_status_logs_results(sweep, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc = sweep("submit", str(spec(tmp_path)))
    assert "3/3" in proc.stdout and "results" in proc.stdout
    status = json.loads(sweep("status", "cli", "-o", "json").stdout)
    assert status["phase"] == "Succeeded"
    assert sorted(t["outcome"] for t in status["trials"]) == ["oom", "succeeded", "succeeded"]
    trial = status["trials"][0]["name"]
    assert trial in sweep("logs", "cli", trial).stdout
    rows = json.loads(sweep("results", "cli", "--format", "json", "--per-trial").stdout)
    assert [r["samples_per_s"] for r in rows] == [800.0, 1600.0, None]
    assert sweep("results", "cli", "--format", "csv", "--per-trial").stdout.startswith("trial,gpu,batch_size")
    assert "| trial |" in sweep("results", "cli", "--format", "markdown", "--per-trial").stdout
    cells = json.loads(sweep("results", "cli", "--format", "json").stdout)["cells"]
    assert [(c["batch_size"], c["status"], c["metrics"]["samples_per_s"]["mean"]) for c in cells] == [
        (8, "ok", 800.0), (16, "ok", 1600.0), (256, "OOM", None)]
    listing = sweep("status").stdout
    assert "cli" in listing and "Succeeded" in listing and "3/3 done, 1 oom" in listing
    # a prefix of several trials is bad input that lists them; cancelling an ended sweep changes nothing
    ambiguous = sweep("logs", "cli", "cli", check=2).stderr
    assert "'cli' matches 3 trials of sweep 'cli'" in ambiguous
    assert all(t["name"] in ambiguous for t in status["trials"])
    assert "already ended (Succeeded): nothing to cancel" in sweep("cancel", "cli").stdout
    assert json.loads(sweep("status", "cli", "-o", "json").stdout)["phase"] == "Succeeded"


def test_failed_trial_gives_exit_1_and_resume_reruns_it(sweep, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = spec(tmp_path)
    path.write_text(path.read_text().replace("max_steps: 2}", "max_steps: 2, learning_rate: 0.123}"))
    sweep("submit", str(path), check=1)
    assert "sweep 'cli': rerunning 3 of 3 trials (3 failed)" in sweep("resume", "cli", check=1).stdout
    starts = (tmp_path / "home/sweeps/cli/starts.log").read_text().splitlines()
    assert len(starts) == 6


def test_resume_of_a_settled_sweep_says_there_is_nothing_to_rerun(sweep, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Every trial has an answer (succeeded or OOM): resume starts nothing, replays nothing and exits 0; once
    a trial's results file is gone, resume reruns that one and says so."""
    sweep("submit", str(spec(tmp_path)))
    starts = tmp_path / "home/sweeps/cli/starts.log"
    before = starts.read_text()
    out = sweep("resume", "cli").stdout
    assert out.strip() == "sweep 'cli': nothing to rerun: every trial has ended with an answer (2 succeeded, 1 oom)"
    assert starts.read_text() == before
    next((tmp_path / "home/sweeps/cli/trials").glob("cli-bs8-*/results.json")).unlink()
    out = sweep("resume", "cli").stdout
    assert "sweep 'cli': rerunning 1 of 3 trials (1 results missing)" in out
    assert len(starts.read_text().splitlines()) == 4


def test_not_found_is_exit_3(sweep) -> None:  # type: ignore[no-untyped-def]
    assert "no local sweep named 'nope'" in sweep("status", "nope", check=3).stderr
    sweep("logs", "nope", "x", check=3)


def test_detach_then_cancel(sweep, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    sweep("submit", str(spec(tmp_path, "slow", "[1, 2, 3]", steps=600)), "--detach")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status = json.loads(sweep("status", "slow", "-o", "json").stdout)
        if any(t["phase"] == "Running" for t in status["trials"]):
            break
        time.sleep(0.2)
    else:
        pytest.fail("no trial started")
    assert "cancelled" in sweep("cancel", "slow").stdout
    status = json.loads(sweep("status", "slow", "-o", "json").stdout)
    assert {t["phase"] for t in status["trials"]} == {"Cancelled"}
    sweep("delete", "slow")
    sweep("status", "slow", check=3)
