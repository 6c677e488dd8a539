"""The job's command line: flags and files resolved into a trial, usage errors, `python -m kubesweep.jobs`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kubesweep.jobs import cli
from kubesweep.wire.config import JobConfig
from kubesweep.wire.outcomes import ExitCode
from tests.support.job_fixtures import REPO, run_job


def test_flags_override_the_trial_file(tmp_path: Path) -> None:
    trial_file = tmp_path / "trial.json"
    trial_file.write_text(
        '{"sweep": "s", "trial_id": "t-1", "name": "n", "gpu": "l40s", "gpu_product": "NVIDIA-L40S",'
        ' "job": {"batch_size": 16, "precision": "fp16", "epochs": 1}}'
    )
    args = cli.build_parser().parse_args(
        [
            "--config",
            str(trial_file),
            "--batch-size",
            "64",
            "--compile",
            "max-autotune",
            "--no-pin-memory",
            "--export",
            "onnx,torchscript",
            "--model-overrides",
            "num_hidden_layers=2,hidden_act=gelu",
            "--random-init",
            "--max-steps",
            "none",
            "--repeat",
            "2",
        ]
    )
    trial = cli.resolve_trial(args)
    job = trial.job
    assert (trial.sweep, trial.trial_id, trial.repeat, trial.gpu_product) == ("s", "t-1", 2, "NVIDIA-L40S")
    assert job.batch_size == 64 and job.precision == "fp16" and job.epochs == 1
    assert job.compile == "max-autotune" and job.pin_memory is False
    assert job.export == ["onnx", "torchscript"]
    assert job.model_overrides == {"num_hidden_layers": 2, "hidden_act": "gelu"}
    assert job.max_steps is None


def test_bare_job_file_gets_an_adhoc_identity(tmp_path: Path) -> None:
    job_file = tmp_path / "job.yaml"
    job_file.write_text("batch_size: 8\ntask: inference\n")
    trial = cli.resolve_trial(cli.build_parser().parse_args(["--config", str(job_file)]))
    assert trial.sweep == "adhoc" and trial.trial_id.startswith("adhoc-") and trial.job.batch_size == 8


def test_every_job_field_has_a_flag() -> None:
    flags = {a.dest for a in cli.build_parser()._actions}
    assert {f"job__{name}" for name in JobConfig.model_fields} <= flags


def test_bad_model_path_is_a_one_line_usage_error(sst2: Path, tmp_path: Path) -> None:
    run = run_job(["--model", "./no/such/model", "--dataset", str(sst2)], tmp_path)
    assert run.returncode == ExitCode.USAGE
    assert run.stdout.strip() == "error: model path './no/such/model' does not exist or is not a directory"
    assert not (tmp_path / "results.json").exists()  # rejected before the trial started


def test_invalid_setting_is_a_usage_error(tmp_path: Path) -> None:
    run = run_job(["--precision", "fp8"], tmp_path)
    assert run.returncode == ExitCode.USAGE
    assert "precision" in run.stdout


def test_module_help_lists_the_flags() -> None:
    """`python -m kubesweep.jobs --help` (the entry point `__main__` runs) exits 0 and names every flag kind."""
    proc = subprocess.run(
        [sys.executable, "-m", "kubesweep.jobs", "--help"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: python -m kubesweep.jobs")
    for flag in ("--config", "--output-dir", "--trial-id", "--batch-size", "--random-init", "--no-random-init",
                 "--model-overrides", "--export"):
        assert flag in proc.stdout, flag


def test_yaml_trial_file_flags_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A YAML trial file, identity flags over it, `none` clearing an optional field, JSON overrides, and the
    checkpoint claim's directory from the environment unless the settings name one."""
    trial_file = tmp_path / "trial.yaml"
    trial_file.write_text("sweep: s\ntrial_id: t-9\nname: n\njob:\n  max_steps: 5\n  batch_size: 4\n")
    monkeypatch.setenv(cli.CHECKPOINT_DIR_ENV, str(tmp_path / "claim"))
    args = cli.build_parser().parse_args([
        "--config", str(trial_file), "--trial-id", "t-10", "--repeat", "3", "--max-steps", "null",
        "--random-init", "--model-overrides", '{"num_hidden_layers": 1}', "--export", " weights , onnx,",
    ])  # fmt: skip
    trial = cli.resolve_trial(args)
    assert (trial.sweep, trial.trial_id, trial.repeat) == ("s", "t-10", 3)
    assert trial.job.max_steps is None and trial.job.batch_size == 4
    assert trial.job.model_overrides == {"num_hidden_layers": 1} and trial.job.export == ["weights", "onnx"]
    assert trial.job.checkpoint_dir == str(tmp_path / "claim")
    named = cli.resolve_trial(cli.build_parser().parse_args(["--checkpoint-dir", str(tmp_path / "own")]))
    assert named.job.checkpoint_dir == str(tmp_path / "own")


def test_malformed_settings_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="KEY=VALUE"):
        cli.resolve_trial(cli.build_parser().parse_args(["--random-init", "--model-overrides", "num_hidden_layers"]))
    listed = tmp_path / "list.yaml"
    listed.write_text("- batch_size: 8\n")
    with pytest.raises(ValueError, match="expected a mapping"):
        cli.resolve_trial(cli.build_parser().parse_args(["--config", str(listed)]))


def test_main_reports_invalid_settings_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps({"batch_size": 0}))
    assert cli.main(["--config", str(job_file), "--output-dir", str(tmp_path / "out")]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.startswith("error: invalid settings: batch_size:") and err.count("\n") == 1
    assert cli.main(["--dataset", str(tmp_path / "nowhere")]) == ExitCode.USAGE
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
