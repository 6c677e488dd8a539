"""`--set PATH=VALUE` on `sweep validate`, `plan`, `render` and `submit`: the spec file's values overridden from the
command line, seen by the plan, the trial ids, the rendered Jobs and the spec the backend keeps; a bad value named by
the option; a malformed option refused at once; the commands printed to type again carry the options along."""

from __future__ import annotations

import json
import os
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from kubesweep.backends.local import LocalBackend
from kubesweep.cli.commands import app, submit_command
from tests.cli.test_commands import ROOT, STAND_IN, refused, spec, timed

DIGEST = "reg.example/job@sha256:" + "a" * 64


def invoke(*args: str, code: int = 0) -> Any:
    """The CLI in a home of its own: never the user's, where `make demo` leaves a sweep named `smoke` that a
    validate of an overridden smoke.yaml is rightly refused against."""
    with tempfile.TemporaryDirectory(prefix="kubesweep-home-") as home:
        result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200", "KUBESWEEP_LOCAL_GPUS": "[]",
                                                          "KUBESWEEP_HOME": home})
    assert result.exit_code == code, result.output
    return result


def planned(file: Path, *sets: str) -> list[dict[str, Any]]:
    trials: list[dict[str, Any]] = json.loads(invoke("plan", str(file), "-o", "json", *sets).stdout)["trials"]
    return trials


def test_an_override_changes_the_plan(tmp_path: Path) -> None:
    file = spec(tmp_path)  # batch_size [8, 16, 256], max_steps 2
    assert len(planned(file)) == 3
    trials = planned(file, "--set", "matrix.batch_size=[16, 32, 64, 128]", "--set", "job.max_steps=7",
                     "--set", "spec.job.random_init=true")
    assert [t["axes"]["batch_size"] for t in trials] == [16, 32, 64, 128]
    assert {(t["job"]["max_steps"], t["job"]["random_init"]) for t in trials} == {(7, True)}


def test_ids_change_with_an_overridden_job_setting_and_stay_with_the_same_override(tmp_path: Path) -> None:
    file = spec(tmp_path)
    plain = [t["id"] for t in planned(file)]
    five = [t["id"] for t in planned(file, "--set", "job.max_steps=5")]
    assert not set(plain) & set(five)
    assert [t["id"] for t in planned(file, "--set", "job.max_steps=5")] == five
    # the same as the file saying so
    edited = spec(tmp_path, "cli", steps=5)
    assert [t["id"] for t in planned(edited)] == five


def test_render_shows_the_overridden_spec() -> None:
    """The README's use case: the shipped GPU matrix with what a cluster needs, the file unchanged."""
    sets = [f"image={DIGEST}", "matrix.gpu=[h100-80gb]", "matrix.batch_size=[32]", "matrix.precision=[bf16]",
            "matrix.compile=[true]", "warm_pods=false", "job.max_steps=200", "job.dataset=/cache/sst2",
            "storage.cache_claim=cache"]
    out = invoke("render", "sweeps/gpu_matrix.yaml", *(w for s in sets for w in ("--set", s))).stdout
    [job] = [o for o in yaml.safe_load_all(out) if o and o["kind"] == "Job"]
    config = json.loads(job["spec"]["template"]["metadata"]["annotations"]["kubesweep.io/trial-config"])
    assert (config["job"]["max_steps"], config["job"]["dataset"], config["job"]["batch_size"]) == (200, "/cache/sst2",
                                                                                                    32)
    claims = [v["persistentVolumeClaim"]["claimName"] for v in job["spec"]["template"]["spec"]["volumes"]
              if "persistentVolumeClaim" in v]
    assert claims == ["cache"]


def test_validate_shows_the_effective_values_of_the_overridden_paths() -> None:
    out = invoke("validate", "sweeps/smoke.yaml", "--set", "job.max_steps=200", "--set", "job.compile=true",
                 "--set", "repeat_until={target: 3%, max: 10}", "--set", "job.max_seq_len=null").stdout.splitlines()
    assert out[1:] == ["  spec.job.max_steps: 200  (--set job.max_steps=200)",
                       "  spec.job.compile: default  (--set job.compile=true)",
                       "  spec.repeat_until: {target: 3.0, max: 10, metric: samples_per_s}  "
                       "(--set repeat_until={target: 3%, max: 10})",
                       "  spec.job.max_seq_len: 128  (--set job.max_seq_len=null)"], out


def test_a_bad_value_is_named_by_its_option(tmp_path: Path) -> None:
    for command in ("validate", "plan", "render", "submit"):
        result = invoke(command, str(spec(tmp_path)), "--set", "job.max_steps=0", code=2)
        assert result.stderr == "--set job.max_steps=0: spec.job.max_steps: must be >= 1, got 0\n", command
    # a local path given on the command line, refused as the file's would be
    result = invoke("validate", "sweeps/smoke.yaml", "--set", "job.dataset=./nope", code=2)
    assert result.stderr.startswith("--set job.dataset=./nope: spec.job.dataset: ")


MALFORMED = [("job.max_steps", "--set job.max_steps: no '=' in it: expected PATH=VALUE"),
             ("=5", "--set =5: the path before '=' is empty"),
             ("kind=Job", "--set kind=Job: kind is not set from the command line"),
             ("jobs.max_steps=5", "--set jobs.max_steps=5: 'jobs' is not a field of a sweep's spec")]
COMMANDS = ["validate", "plan", "render", "submit"]


def test_a_malformed_option_is_refused_at_once_before_the_file_is_read(tmp_path: Path) -> None:
    env = {**os.environ, "KUBESWEEP_HOME": str(tmp_path / "home"), "KUBESWEEP_LOCAL_GPUS": "[]"}
    missing = str(tmp_path / "no-such.yaml")  # read first, this would be "file not found"
    for command, (option, start) in zip(COMMANDS, MALFORMED, strict=True):  # as a person runs it: one line, exit 2
        assert refused([command, missing, "--set", option], env).startswith(start)
    for command in COMMANDS:
        for option, start in MALFORMED:
            assert invoke(command, missing, "--set", option, code=2).stderr.startswith(start)
        # into a value that is not a mapping: once the file is read
        result = invoke(command, str(spec(tmp_path)), "--set", "job.max_steps.x=1", code=2)
        assert result.stderr.startswith("--set job.max_steps.x=1: spec.job.max_steps is 2, not a mapping")


def test_a_list_value_for_a_matrix_axis(tmp_path: Path) -> None:
    trials = planned(spec(tmp_path), "--set", "matrix.precision=[fp32, bf16]", "--set", "matrix.batch_size=[8]")
    assert [(t["axes"]["batch_size"], t["axes"]["precision"]) for t in trials] == [(8, "fp32"), (8, "bf16")]
    result = invoke("plan", str(spec(tmp_path)), "--set", "matrix.precision=[fp32, bf61]", code=2)
    assert result.stderr.startswith("--set matrix.precision=[fp32, bf61]: spec.matrix.precision[1]: 'bf61' is not "
                                    "one of fp32, tf32, fp16, bf16")


def test_submit_says_what_it_overrode_and_the_backend_keeps_the_overridden_spec(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "KUBESWEEP_HOME": str(home), "KUBESWEEP_LOCAL_GPUS": "[]", "KUBESWEEP_NO_TRACKING": "1",
           "KUBESWEEP_JOB_COMMAND": json.dumps([sys.executable, str(STAND_IN)]), "COLUMNS": "200"}
    file = spec(tmp_path)
    sets = ["--set", "job.max_steps=3", "--set", "matrix.batch_size=[4, 8]"]
    proc, _ = timed(["submit", str(file), *sets], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "with --set job.max_steps=3, --set 'matrix.batch_size=[4, 8]'" in proc.stdout.splitlines()
    kept = LocalBackend(home).sweep_of("cli")
    assert kept is not None and kept.spec.job.max_steps == 3
    assert kept.to_document()["spec"]["matrix"]["batch_size"] == [4, 8]
    # the file without the overrides is another spec under the same name; with them, the same sweep again
    proc, _ = timed(["submit", str(file)], env)
    assert proc.returncode == 2 and "already exists with a different spec" in proc.stderr
    proc, _ = timed(["submit", str(file), *sets], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_commands_printed_to_type_again_carry_the_set_options(tmp_path: Path) -> None:
    """`submit_command` (the cluster's GPU report: `--gpu TYPE` and `--yes` are added to it) and the local
    backend's way forward to a cluster reproduce the same sweep: with its --set options, in order, quoted."""
    words = submit_command(Path("sweeps/gpu_matrix.yaml"), ("--backend", "kubernetes"), ("--namespace", "ml-team"),
                           ("--set", ["job.max_steps=200", "job.dataset=/cache/sst2", "matrix.batch_size=[16, 32]"]))
    assert shlex.join(words) == ("sweep submit sweeps/gpu_matrix.yaml --backend kubernetes --namespace ml-team "
                                 "--set job.max_steps=200 --set job.dataset=/cache/sst2 "
                                 "--set 'matrix.batch_size=[16, 32]'")
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    line = refused(["submit", "sweeps/gpu_matrix.yaml", "--set", "job.max_steps=200", "--set",
                    "matrix.batch_size=[16, 32]"], {**env, "KUBESWEEP_LOCAL_GPUS": "[]",
                                                    "KUBESWEEP_HOME": str(tmp_path / "home")}, cwd=ROOT)
    assert ("`sweep submit sweeps/gpu_matrix.yaml --set job.max_steps=200 --set 'matrix.batch_size=[16, 32]' "
            "--backend kubernetes`") in line
