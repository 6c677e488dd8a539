"""The `sweep` CLI end to end on the local backend, in subprocesses as a person runs it. The workload is the
stand-in job (tests/support/stand_in_job.py) so these tests exercise the CLI, not training."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parents[2]
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
    base = {**os.environ, "KUBESWEEP_HOME": str(tmp_path / "home"), "KUBESWEEP_LOCAL_GPUS": "[]",
           "KUBESWEEP_JOB_COMMAND": json.dumps([sys.executable, str(STAND_IN)]), "COLUMNS": "200",
           "KUBESWEEP_NO_TRACKING": "1"}  # tracking is tested in tests/tracking

    def run(*args: str, check: int | None = 0, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, "-m", "kubesweep", *args], capture_output=True, text=True,
                              env={**base, **(env or {})}, cwd=tmp_path, timeout=120)
        if check is not None:
            assert proc.returncode == check, proc.stdout + proc.stderr
        return proc

    return run


def test_help_and_version(sweep) -> None:  # type: ignore[no-untyped-def]
    assert "submit" in sweep("--help").stdout
    assert "kubesweep 0.1.0" in sweep("--version").stdout
    assert sweep("-h").stdout == sweep("--help").stdout and "Usage: sweep results" in sweep("results", "-h").stdout
    assert "--install-completion" in sweep("--help").stdout  # shell completion
    assert "--confirm-over" not in sweep("plan", "-h").stdout  # plan submits nothing
    commands = re.findall(r"^  ([a-z]\w*) ", sweep("-h").stdout.split("Commands:")[1], re.M)
    assert {"submit", "results", "status", "images"} <= set(commands), commands
    for command in [*commands, "images list", "images lock", "images build"]:
        text = sweep(*command.split(), "-h").stdout
        placeholders = re.findall(r"^ +(?:-\w, )?(?:--[\w-]+|[A-Z]+) <[^>]*>", text, re.M)
        assert placeholders == [], command  # no <int range>, <list[str]>, <str>, not of options nor arguments
    bad = sweep("status", "x", "--backend", "nope", check=2).stderr
    assert "'nope' is not one of 'local', 'kubernetes'" in bad and "Value error" not in bad
    assert "Value error" not in sweep("results", "x", "-f", "xml", check=2).stderr


def test_cli_works_without_the_extras(tmp_path: Path) -> None:
    """validate/plan/--help import none of torch, transformers, mlflow, kubernetes, ray."""
    blocked = ["torch", "transformers", "datasets", "mlflow", "kubernetes", "kopf", "ray", "optuna"]
    code = (f"import sys\nfor m in {blocked!r}: sys.modules[m] = None\n"
            "from kubesweep.cli import main\nmain()")
    env = {**os.environ, "KUBESWEEP_LOCAL_GPUS": '["NVIDIA A100-SXM4-40GB"]'}  # one of the spec's GPU types
    for args in (["--help"], ["validate", str(ROOT / "sweeps/gpu_matrix.yaml")],
                 ["plan", str(ROOT / "sweeps/gpu_matrix.yaml"), "-o", "json"]):
        proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60,
                              env=env)
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


def test_validate_shows_a_bidi_override_as_its_escape(sweep, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A key with U+202E (right-to-left override: what follows reads backwards) in a spec: `validate` names it with
    the character as its escape, never the character itself."""
    path = tmp_path / "rtl.yaml"
    path.write_text("apiVersion: kubesweep.io/v1alpha1\nkind: Sweep\nmetadata: {name: rtl}\nspec:\n"
                    "  job: {max_steps: 1}\n  matrix: {batch_size: [8], \"lr\u202e\u2066\": [1]}\n",
                    encoding="utf-8")
    proc = sweep("validate", str(path), check=2)
    assert proc.stderr.startswith(f"{path}:6: spec.matrix.lr\\u202e\\u2066: unknown field"), proc.stderr
    assert "\u202e" not in proc.stderr and "\u2066" not in proc.stderr


def test_plan_json(sweep, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = json.loads(sweep("plan", str(spec(tmp_path)), "-o", "json").stdout)
    assert [t["axes"]["batch_size"] for t in out["trials"]] == [8, 16, 256]


def test_long_tables_are_summarised_and_large_sweeps_confirmed(sweep, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = spec(tmp_path, "wide", str(list(range(1, 121))))
    planned = sweep("plan", str(path))
    table = planned.stdout
    assert "confirmation" not in planned.stderr  # plan submits nothing: nothing to confirm
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
    for columns in ("80", "100"):
        table = sweep("results", "cli", env={"COLUMNS": columns}).stdout
        assert max(map(len, table.splitlines())) <= int(columns) and "…" not in table
        assert "OOM" in table and "1,600" in table
    piped = sweep("results", "cli", env={"COLUMNS": ""}).stdout  # not a terminal, no COLUMNS: 100
    assert max(map(len, piped.splitlines())) <= 100
    assert "$/epoch" in sweep("results", "cli", "--wide", env={"COLUMNS": "80"}).stdout
    listing = sweep("status").stdout
    assert "cli" in listing and "Succeeded" in listing
    named = sweep("results").stdout  # no name: the sweeps there are, and how to name one
    assert "cli" in named and "`sweep results cli`" in named and "3/3 done, 2 succeeded, 1 oom" in listing
    # a prefix of several trials is bad input that lists them; cancelling an ended sweep changes nothing
    ambiguous = sweep("logs", "cli", "cli", check=2).stderr
    assert "'cli' matches 3 trials of sweep 'cli'" in ambiguous
    assert all(t["name"] in ambiguous for t in status["trials"])
    assert "already ended (Succeeded): nothing to cancel" in sweep("cancel", "cli").stdout
    assert json.loads(sweep("status", "cli", "-o", "json").stdout)["phase"] == "Succeeded"


def test_the_spec_sets_the_accuracy_time_to_accuracy_is_measured_to(sweep, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`target_accuracy` in the spec is what the sweep's own summary, `sweep results` and its JSON measure time
    to accuracy to (a model that reaches 0.88 in its epochs never reaches the default 0.9); the flag overrides it,
    and a sweep whose spec names none keeps 0.9."""
    path = spec(tmp_path, batches="[8]")
    path.write_text(path.read_text() + "  target_accuracy: 0.62\n")
    submitted = sweep("submit", str(path)).stdout
    assert "TTA = training time to dev accuracy >= 0.62" in submitted, submitted
    assert "dev accuracy >= 0.62" in sweep("results", "cli").stdout
    assert json.loads(sweep("results", "cli", "-f", "json").stdout)["target_accuracy"] == 0.62
    overridden = json.loads(sweep("results", "cli", "-o", "json", "--target-accuracy", "0.7").stdout)  # as plan
    assert overridden["target_accuracy"] == 0.7
    sweep("submit", str(spec(tmp_path, name="plain", batches="[8]")))
    assert json.loads(sweep("results", "plain", "-f", "json").stdout)["target_accuracy"] == 0.9
    path.with_name("bad.yaml").write_text(path.read_text().replace("0.62", "62"))
    bad = sweep("validate", str(path.with_name("bad.yaml")), check=2).stderr
    assert bad.strip() == f"{path.with_name('bad.yaml')}:9: spec.target_accuracy: must be <= 1.0, got 62", bad


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


def test_logs_without_a_trial_lists_the_trials(sweep, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    sweep("submit", str(spec(tmp_path)))
    status = json.loads(sweep("status", "cli", "-o", "json").stdout)
    out = sweep("logs", "cli").stdout
    rows = [[cell.strip() for cell in line.split("│")[1:4]] for line in out.splitlines() if line.startswith("│")]
    assert rows == [[t["name"], t["phase"], t["outcome"]] for t in status["trials"]]
    assert "a trial's log: `sweep logs cli TRIAL [--follow]`" in out
    assert "Traceback" not in out


def test_cancel_counts_a_trial_that_had_succeeded_as_succeeded(sweep, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Cancelled while the first trial has written its results and is still sending them (the stand-in lingers,
    as the real job does for MLflow): that trial is succeeded, the queued ones cancelled; cancel says so in the
    words status uses."""
    path = spec(tmp_path, "slow", "[1, 2, 3]", steps=2)
    path.write_text(path.read_text() + "  concurrency: {max_parallel: 1}\n")
    # Long enough that the cancel below lands while the first trial lingers, however loaded the machine (each
    # CLI call here takes seconds then); cancel ends the lingering trial, so the test does not wait it out.
    sweep("submit", str(path), "--detach", env={"KUBESWEEP_TEST_STAND_IN_LINGER_S": "30"})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = json.loads(sweep("status", "slow", "-o", "json").stdout)
        first = status["trials"][0]
        if first["phase"] == "Running" and first["results"]:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the first trial did not write its results")
    out = sweep("cancel", "slow").stdout
    status = json.loads(sweep("status", "slow", "-o", "json").stdout)
    assert [t["phase"] for t in status["trials"]] == ["Succeeded", "Cancelled", "Cancelled"]
    assert out.strip() == "sweep 'slow' cancelled: 3/3 done, 1 succeeded, 2 cancelled"
    assert "3/3 done, 1 succeeded, 2 cancelled" in sweep("status", "slow").stdout


def test_not_found_is_exit_3(sweep) -> None:  # type: ignore[no-untyped-def]
    assert "no local sweep named 'nope'" in sweep("status", "nope", check=3).stderr
    sweep("logs", "nope", "x", check=3)


def test_a_read_only_command_on_a_name_nobody_knows_writes_nothing_and_names_the_nearest(  # type: ignore[no-untyped-def]
        sweep, tmp_path: Path) -> None:
    """With tracking on (the local MLflow store), a name neither the backend nor the store knows is answered from
    what is on disk: no MLflow store opened (it would be created), no backend store made; a near name suggested."""
    tracked = {"KUBESWEEP_NO_TRACKING": ""}
    home = tmp_path / "home"
    home.mkdir()
    for command in (["results", "nosuch"], ["report", "nosuch"], ["status", "nosuch"], ["logs", "nosuch", "x"],
                    ["results", "nosuch", "--from", "mlflow"]):
        out = sweep(*command, check=3, env=tracked).stderr
        assert "no local sweep named 'nosuch'" in out, (command, out)
    assert list(home.iterdir()) == []  # an empty home stays empty: no state.db, no mlflow.db
    sweep("submit", str(spec(tmp_path, "smoke", "[8]")))  # untracked: the store knows no experiment 'smoke'
    out = sweep("results", "smok", check=3, env=tracked).stderr
    assert "did you mean 'smoke'?" in out, out
    assert not (home / "mlflow.db").exists()


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


# -- what submit checks before anything runs, and `validate --backend` with it ---------------------------------

# Generous: a command that is refused returns at once (about 1 s of CPU; 3.5 s for one that asks the cluster, most
# of it the Kubernetes client's imports), and this bound only tells one from a hang (the subprocess timeout below
# is 60 s). A machine busy with other builds stretched a `submit --backend kubernetes` to 12 s.
QUICK_S = 25.0


def timed(args: list[str], env: dict[str, str], cwd: Path = ROOT) -> tuple[subprocess.CompletedProcess[str], float]:
    began = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "kubesweep", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=60)
    return proc, time.monotonic() - began


def refused(args: list[str], env: dict[str, str], code: int = 2, cwd: Path = ROOT) -> str:
    """The one line `sweep ARGS` is refused with: exit `code`, quickly, nothing on stdout, no traceback."""
    proc, took = timed(args, env, cwd)
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert took < QUICK_S, f"{args} took {took:.1f} s"
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert proc.stderr.endswith("\n") and proc.stderr.count("\n") == 1, proc.stderr
    return proc.stderr.rstrip("\n")


@pytest.fixture
def gpuless(tmp_path: Path) -> dict[str, str]:
    """This machine as a new user has it: no GPU (nvidia-smi's answer where there is one is replaced by none),
    no tracking server, a fresh home nobody has made yet."""
    env = {k: v for k, v in os.environ.items() if k not in ("KUBESWEEP_LOCAL_GPUS", "KUBECONFIG")}
    if shutil.which("nvidia-smi"):
        env["KUBESWEEP_LOCAL_GPUS"] = "[]"
    return {**env, "KUBESWEEP_HOME": str(tmp_path / "unused-home"), "MLFLOW_TRACKING_URI": "", "COLUMNS": "200"}


def test_the_headline_command_on_a_machine_without_its_gpus(gpuless: dict[str, str], tmp_path: Path) -> None:
    """`sweep submit sweeps/gpu_matrix.yaml` (the README's, local backend by default) with none of its GPU types
    here: one paragraph saying what it needs, what is here and the ways forward; exit 2; no trial queued."""
    home = tmp_path / "fresh-home"
    line = refused(["submit", "sweeps/gpu_matrix.yaml", "--home", str(home)], gpuless)
    assert line.startswith("sweeps/gpu_matrix.yaml:20: spec.matrix.gpu: none of this sweep's 84 trials can run on "
                           "the local backend here: each needs a GPU of type a100-40gb (NVIDIA-A100-SXM4-40GB), "
                           "v100-32gb (Tesla-V100-SXM2-32GB), rtx-3090 (NVIDIA-GeForce-RTX-3090), l40s (NVIDIA-L40S) "
                           "or h100-80gb (NVIDIA-H100-80GB-HBM3), and this machine has no NVIDIA GPU. ")
    for way in ("`sweep submit sweeps/gpu_matrix.yaml --backend kubernetes`", "`--any-gpu`", "a `gpu` axis",
                "`sweep submit sweeps/smoke.yaml`"):
        assert way in line
    assert not home.exists() and not (tmp_path / "unused-home").exists()  # no sweep state, no tracking store
    # validate runs the same check; --any-gpu on a machine without any GPU is refused too
    assert refused(["validate", "sweeps/gpu_matrix.yaml"], gpuless) == line
    assert "--any-gpu runs each GPU trial on whatever GPU this machine has, and this machine has no NVIDIA GPU" in \
        refused(["submit", "sweeps/gpu_matrix.yaml", "--any-gpu", "--home", str(home)], gpuless)
    assert not home.exists()


def test_an_image_key_not_built_yet_is_refused_alike_on_kubernetes(gpuless: dict[str, str], tmp_path: Path) -> None:
    """sweeps/gpu_matrix.yaml names its image by lock key: render, validate and submit for Kubernetes say how to
    build it (one check, so one message), before any cluster is asked; the local backend needs no image."""
    kubeconfig = closed_port_kubeconfig(tmp_path)  # never reached: the image is checked first
    expected = ("sweeps/gpu_matrix.yaml:10: spec.image: image key 'torch-2.8-cu128' is not built yet (the shipped "
                "image lock has it unconfirmed: not published yet). Build, push and lock it with `make images "
                "REGISTRY=<your registry>` (this key alone: `sweep images build --registry <your registry> --key "
                "torch-2.8-cu128`), or give spec.images.torch-2.8-cu128 a digest-pinned reference")
    for args in (["render", "sweeps/gpu_matrix.yaml"],
                 ["validate", "sweeps/gpu_matrix.yaml", "--backend", "kubernetes"],
                 ["submit", "sweeps/gpu_matrix.yaml", "--backend", "kubernetes", "--kubeconfig", str(kubeconfig)],
                 ["submit", "sweeps/gpu_matrix.yaml", "--backend", "kubernetes", "--direct", "--kubeconfig",
                  str(kubeconfig)]):
        assert refused(args, gpuless) == expected
    local = {**gpuless, "KUBESWEEP_LOCAL_GPUS": '["NVIDIA A100-SXM4-40GB"]'}
    proc, _ = timed(["validate", "sweeps/gpu_matrix.yaml"], local)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("sweeps/gpu_matrix.yaml: valid for the local backend — sweep 'bert-gpu-matrix', "
                                  "84 trials")


def test_gpu_keeps_only_the_named_types_of_the_spec(gpuless: dict[str, str]) -> None:
    """`--gpu TYPE` narrows the spec to those of its GPU types (what `submit --backend kubernetes` offers where the
    cluster lacks some); a type the spec does not name is refused in one line."""
    assert refused(["validate", "sweeps/gpu_matrix.yaml", "--gpu", "h100-80gb", "--gpu", "t4"], gpuless) == (
        "sweeps/gpu_matrix.yaml: --gpu t4: not a GPU type of sweep 'bert-gpu-matrix' (its GPU types are a100-40gb, "
        "v100-32gb, rtx-3090, l40s, h100-80gb)")
    proc, _ = timed(["validate", "sweeps/gpu_matrix.yaml", "--gpu", "h100-80gb", "--gpu", "l40s"],
                    {**gpuless, "KUBESWEEP_LOCAL_GPUS": '["NVIDIA H100 80GB HBM3"]'})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("sweeps/gpu_matrix.yaml: valid for the local backend — sweep 'bert-gpu-matrix', "
                                  "36 trials")


def test_validate_refuses_what_submit_would(sweep, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """An exclude that removes every trial and a local dataset path that is not there: `validate` and `submit`
    refuse both alike (exit 2), before anything runs; `glue/sst2` is a dataset name, not a path."""
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env.update(KUBESWEEP_HOME=str(tmp_path / "home"), KUBESWEEP_LOCAL_GPUS="[]", KUBESWEEP_NO_TRACKING="1")
    excluded = spec(tmp_path, "excl")
    excluded.write_text(excluded.read_text() + "  exclude:\n    - {batch_size: 8}\n    - {batch_size: 16}\n"
                                               "    - {batch_size: 256}\n")
    message = (f"{excluded}:9: spec.exclude: the 3 exclude rules remove every cell of the matrix (all 3): the sweep "
               "has no trial to run; narrow or remove a rule")
    missing = spec(tmp_path, "data")
    missing.write_text(missing.read_text().replace("job: {max_steps: 2}", "job: {max_steps: 2, dataset: ../sst2}"))
    absent = tmp_path.parent / "sst2"
    assert not absent.exists()
    data_message = (f"{missing}:5: spec.job.dataset: {absent} does not exist: '../sst2' names a local path (relative "
                    f"to the spec file's directory, {tmp_path}), which should be a directory of GLUE TSVs (train.tsv, "
                    "dev.tsv)")
    no_image = f"{missing}:4: spec.image: required to run trials on Kubernetes"
    for path, expected in ((excluded, message), (missing, data_message)):
        for command in ("validate", "submit"):
            assert refused([command, str(path)], env, cwd=tmp_path) == expected
            if path is missing and command == "submit":  # no cluster here: said before what the spec lacks for one
                assert refused([command, str(path), "--backend", "kubernetes"], env, cwd=tmp_path, code=4)\
                    .startswith("error: no Kubernetes cluster configured")
                continue
            assert refused([command, str(path), "--backend", "kubernetes"], env, cwd=tmp_path).startswith(
                expected if path is excluded else no_image)
    assert not (tmp_path / "home").exists()
    (tmp_path / "sst2").mkdir()  # relative to the spec file, not to where the command runs
    (tmp_path / "sst2" / "train.tsv").write_text("sentence\tlabel\n")
    missing.write_text(missing.read_text().replace("../sst2", "./sst2"))
    assert "valid for the local backend" in sweep("validate", str(missing)).stdout
    missing.write_text(missing.read_text().replace("./sst2", "glue/sst2"))
    assert "valid for the local backend" in sweep("validate", str(missing)).stdout


def closed_port_kubeconfig(tmp_path: Path, port: int | None = None) -> Path:
    """A kubeconfig whose API server is https://127.0.0.1:PORT, a local port nothing listens on (by default)."""
    if port is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: down\n"
        f"clusters: [{{name: down, cluster: {{server: 'https://127.0.0.1:{port}'}}}}]\n"
        "contexts: [{name: down, context: {cluster: down, user: me, namespace: team}}]\n"
        "users: [{name: me, user: {token: not-a-secret}}]\n")
    return path


def pinned_spec(tmp_path: Path) -> Path:
    path = spec(tmp_path, "k8s")
    path.write_text(path.read_text() + f"  image: registry.example/kubesweep-job@sha256:{'0' * 64}\n")
    return path


def test_an_api_server_that_is_down_is_one_line_naming_it(gpuless: dict[str, str], tmp_path: Path) -> None:
    """Every command that asks the cluster (through the operator's Sweep resource or --direct) says which server
    it could not reach and why, in one line: exit 4 (backend error), at once."""
    kubeconfig = closed_port_kubeconfig(tmp_path)
    server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    k8s = ["--backend", "kubernetes", "--kubeconfig", str(kubeconfig)]
    path = pinned_spec(tmp_path)
    for args in (["submit", str(path), "--no-tracking", *k8s], ["submit", str(path), "--no-tracking", "--direct", *k8s],
                 ["status", *k8s], ["status", "k8s", "--direct", *k8s], ["cancel", "k8s", *k8s],
                 ["results", "k8s", "--direct", "--no-tracking", "--per-trial", *k8s]):
        line = refused(args, gpuless, code=4)
        assert line == f"error: cannot reach the Kubernetes API at {server}: connection refused", args


def test_no_cluster_configured_is_one_line_saying_what_to_do(gpuless: dict[str, str], tmp_path: Path) -> None:
    """No kubeconfig anywhere and not in a pod: said plainly, not as the client's `Service host/port is not set`,
    and first: a spec with no image for Kubernetes (the first run's) hears of the cluster before of building
    images. `validate` checks the spec for a cluster it need not reach: the image, not the cluster."""
    env = {**gpuless, "HOME": str(tmp_path / "new-user")}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    env.pop("KUBECONFIG", None)
    no_cluster = ("error: no Kubernetes cluster configured: no kubeconfig (--kubeconfig, $KUBECONFIG or "
                  "~/.kube/config) and not in a pod; point --kubeconfig at a cluster, or run the sweep on this "
                  "machine with --backend local")
    for spec in (pinned_spec(tmp_path), ROOT / "sweeps" / "smoke.yaml"):
        line = refused(["submit", str(spec), "--no-tracking", "--backend", "kubernetes"], env, code=4)
        assert line == no_cluster, spec
    line = refused(["validate", str(ROOT / "sweeps" / "smoke.yaml"), "--backend", "kubernetes"], env, code=2)
    assert "spec.image: required to run trials on Kubernetes" in line


@pytest.mark.slow
def test_an_api_server_that_hangs_is_an_error_within_seconds(gpuless: dict[str, str], tmp_path: Path) -> None:
    """A server that takes connections and never answers (a hung process) is given `CONNECT_TIMEOUT_S` per
    connection, tried twice: an error in seconds, not a hang."""
    from kubesweep.backends.k8s_client import CONNECT_RETRIES, CONNECT_TIMEOUT_S

    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)  # connections wait in the backlog: never accepted, never answered
        kubeconfig = closed_port_kubeconfig(tmp_path, hung.getsockname()[1])
        port = hung.getsockname()[1]
        proc, took = timed(["status", "--direct", "--backend", "kubernetes", "--kubeconfig", str(kubeconfig)], gpuless)
    assert proc.returncode == 4, proc.stderr
    assert proc.stderr == (f"error: cannot reach the Kubernetes API at https://127.0.0.1:{port}: it "
                           f"took the connection but gave no TLS handshake within {CONNECT_TIMEOUT_S:g} s (is it "
                           "hung?)\n")
    assert took < (CONNECT_RETRIES + 1) * CONNECT_TIMEOUT_S + QUICK_S


def _copied_sweep(directory: Path, product: str, speed: float) -> None:
    """Results files as a local sweep on another machine leaves them: one GPU type (NVML's), 3 repeats a cell."""
    from kubesweep.plan import plan
    from kubesweep.sweep_spec import parse_sweep_text
    from tests.support.tracked_job import build

    text = ("apiVersion: kubesweep.io/v1alpha1\nkind: Sweep\nmetadata: {name: showcase}\nspec:\n  job: {epochs: 1}\n"
            "  matrix: {batch_size: [16, 32]}\n  repeats: 3\n  resources: {gpus_per_trial: 1}\n")
    for trial in plan(parse_sweep_text(text)).trials:
        results, _ = build(trial.config.model_copy(update={"gpu": "h100-80gb"}), "2026-11-26T00:00:00+00:00")
        results["trial"]["gpu"] = None  # the sweep asked for any GPU
        results["environment"] = {"gpus": [{"product": product}]}
        results["train"]["samples_per_s"] *= speed
        where = directory / "trials" / trial.name
        where.mkdir(parents=True)
        (where / "results.json").write_text(json.dumps(results))


def test_report_merges_sweeps_run_on_two_machines(sweep, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _copied_sweep(tmp_path / "h100", "NVIDIA-H100-80GB-HBM3", 1.0)
    _copied_sweep(tmp_path / "h200", "NVIDIA-H200", 1.3)
    out = sweep("report", str(tmp_path / "h100"), str(tmp_path / "h200"), "-o", str(tmp_path / "merged"),
                "--no-upload").stdout
    assert "report.html" in out
    summary = json.loads((tmp_path / "merged" / "summary.json").read_text())
    assert {c["gpu"] for c in summary["cells"]} == {"h100-80gb", "h200"}
    assert all(c["n"] == 3 and c["metrics"]["samples_per_s"]["ci95"] is not None for c in summary["cells"])
    line = next(a for a in summary["answer"] if a.startswith("GPU types, fine-tuning, highest throughput"))
    assert "h200 is 1.30x h100-80gb" in line, line
    assert summary["gpu_busy"] is None  # two machines at other times: no one wall time to be busy in
    table = sweep("results", str(tmp_path / "h100"), str(tmp_path / "h200"), "-f", "csv").stdout
    assert table.count("\n") == 5  # a header and 2 GPU types x 2 batch sizes


def test_a_directory_with_damaged_results_files_skips_each_in_one_line(sweep, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Each damaged or hostile results file is one line naming it, its field and what was expected; the report and
    the table come whole from the rest. A GPU name with mathtext in it is drawn as text."""
    _copied_sweep(tmp_path / "h100", r"$\frac{x$ GPU", 1.0)
    files = sorted((tmp_path / "h100" / "trials").glob("*/results.json"))
    good = json.loads(files[1].read_text())
    files[0].write_text('{"outcome": ')
    files[1].write_text(json.dumps({**good, "config": {**good["config"], "batch_size": "abc"}}))
    files[2].write_text(json.dumps({**good, "train": {**good["train"], "samples_per_s": 1e308}}))
    files[3].write_text("[" * 10_000 + "]" * 10_000)
    files[4].write_text("[]")
    out = tmp_path / "report"
    out.mkdir()
    (out / "report.html").write_text("the last report")
    proc = sweep("report", str(tmp_path / "h100"), "--no-upload", "-o", str(out))
    assert proc.stderr.splitlines() == [
        f"warning: skipped {files[0]}: not JSON: EOF while parsing a value at line 1 column 12",
        f"warning: skipped {files[1]}: config.batch_size: expected an integer, got 'abc' (kubesweep.io/results/v1, "
        "docs/results-schema.md)",
        f"warning: skipped {files[2]}: train.samples_per_s: expected a number within ±1e+15, got 1e+308",
        f"warning: skipped {files[3]}: not JSON: recursion limit exceeded at line 1 column 202",
        f"warning: skipped {files[4]}: expected a JSON object (a results file), got list"]
    assert "report.html" in proc.stdout and r"$\frac{x$ GPU" in (out / "report.html").read_text()
    table = sweep("results", str(tmp_path / "h100"), "-f", "json")
    assert [c["n"] for c in json.loads(table.stdout)["cells"]] == [1]  # the one file left
    files[5].write_text("{}")
    proc = sweep("report", str(tmp_path / "h100"), "--no-upload", "-o", str(out), check=2)
    assert proc.stderr.splitlines()[-1] == f"{tmp_path / 'h100'}: none of its 6 results files is valid (each " \
        "skipped above)" and "Traceback" not in proc.stderr
    proc = sweep("results", "./no-such-dir", str(tmp_path / "h100"), check=2)
    assert "no-such-dir: no such directory" in proc.stderr


def test_text_a_trial_wrote_is_printed_as_text(sweep, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A trial's error with a CUDA assert's `[/path/file.cu:12]` (a closing tag to Rich markup) and escape sequences
    (colour, window title), in its results file: every command prints them as literal text, without the escape
    bytes, and none crashes."""
    path = tmp_path / "hostile.yaml"
    path.write_text("apiVersion: kubesweep.io/v1alpha1\nkind: Sweep\nmetadata: {name: hostile}\nspec:\n"
                    "  job: {max_steps: 1}\n  matrix: {batch_size: [8], learning_rate: [0.456]}\n"
                    "  resources: {gpus_per_trial: 0, retries: 0}\n")
    outputs = [sweep("submit", str(path), check=1)]
    outputs += [sweep(*args) for args in (["status"], ["status", "hostile"], ["results", "hostile"],
                                          ["results", "hostile", "--per-trial"],
                                          ["results", "hostile", "-f", "csv"], ["results", "hostile", "-f", "markdown"],
                                          ["results", "hostile", "--per-trial", "-f", "csv"],
                                          ["results", "hostile", "--per-trial", "-f", "markdown"])]
    for proc in outputs:
        printed = proc.stdout + proc.stderr
        assert "Traceback" not in printed and "\x1b" not in printed and "\x07" not in printed, printed
    assert "[/pytorch/aten/src/ATen/native/cuda/Loss.cu:12]" in outputs[0].stdout  # the progress line's reason
    assert "[/pytorch/aten/src/ATen/native/cuda/Loss.cu:12]" in outputs[2].stdout  # the status table's
    # the results file's error, per trial (a free-text field; a setting the schema types cannot hold such text)
    assert all("[/pytorch/aten/src/ATen/native/cuda/Loss.cu:12]" in p.stdout for p in outputs[7:9])
    assert json.loads(sweep("status", "hostile", "-o", "json").stdout)["trials"][0]["outcome"] == "failed"


def test_a_hostile_results_file_fails_its_trial_and_nothing_else(sweep, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """One trial writes 200,000 nested brackets as its results file, another a whole file whose outcome is "bogus":
    the driver lives on, those two trials fail with one line saying why, the third succeeds, and every command on
    the sweep ends with an exit code, not a traceback."""
    path = tmp_path / "bomb.yaml"
    path.write_text("apiVersion: kubesweep.io/v1alpha1\nkind: Sweep\nmetadata: {name: bomb}\nspec:\n"
                    "  job: {max_steps: 1}\n  matrix: {batch_size: [8], learning_rate: [0.111, 0.222, 3.0e-5]}\n"
                    "  resources: {gpus_per_trial: 0, retries: 0}\n")
    procs = [sweep("submit", str(path), check=1)]
    trials = json.loads(sweep("status", "bomb", "-o", "json").stdout)["trials"]
    by_lr = {t["label"].rsplit("=", 1)[1]: t for t in trials}
    assert [by_lr[lr]["outcome"] for lr in ("0.111", "0.222", "3e-05")] == ["failed", "failed", "succeeded"], trials
    assert by_lr["0.111"]["reason"] == "results.json: not JSON: recursion limit exceeded at line 1 column 202"
    assert by_lr["0.222"]["reason"] == ("results.json: outcome: not one of the outcomes, got 'bogus' "
                                        "(kubesweep.io/results/v1, docs/results-schema.md)")
    procs += [sweep("status"), sweep("status", "bomb"), sweep("results", "bomb", "--per-trial", "-f", "json"),
              sweep("logs", "bomb", by_lr["0.111"]["name"]), sweep("report", "bomb", "--no-upload"),
              sweep("resume", "bomb", check=1), sweep("delete", "bomb")]
    for proc in procs:
        assert "Traceback" not in proc.stdout + proc.stderr, proc.args
    rows = json.loads(procs[3].stdout)
    assert sorted(r["outcome"] for r in rows) == ["failed", "failed", "succeeded"], rows
    assert "rerunning 2 of 3 trials (2 failed)" in procs[6].stdout
    assert "bomb" not in sweep("status").stdout


def test_logs_print_a_trials_text_as_text_and_raw_as_written(sweep, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A trial that prints an OSC 52 clipboard write, an OSC 8 link, BEL, a C1 CSI, a right-to-left override and a
    zero-width space: `sweep logs` shows none of them raw (the format characters as escapes); `--raw` gives the log
    as written."""
    from tests.support.stand_in_job import HOSTILE_LOG

    path = tmp_path / "loud.yaml"
    path.write_text("apiVersion: kubesweep.io/v1alpha1\nkind: Sweep\nmetadata: {name: loud}\nspec:\n"
                    "  job: {max_steps: 1}\n  matrix: {batch_size: [8], learning_rate: [0.333]}\n"
                    "  resources: {gpus_per_trial: 0, retries: 0}\n")
    sweep("submit", str(path))
    trial = json.loads(sweep("status", "loud", "-o", "json").stdout)["trials"][0]["name"]
    shown = sweep("logs", "loud", trial).stdout
    for raw in ("\x1b", "\x07", "\x9b", "\u202e", "\u202c", "\u200b"):
        assert raw not in shown, (raw, shown)
    assert " click bell  \\u202etxt.exe\\u202c zero\\u200bwidth" in shown and "done: succeeded" in shown
    assert HOSTILE_LOG in sweep("logs", "loud", trial, "--raw").stdout


def test_report_output_that_is_a_file_or_cannot_be_written_is_one_line_exit_2(sweep, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _copied_sweep(tmp_path / "h100", "NVIDIA-H100-80GB-HBM3", 1.0)
    taken = tmp_path / "report.html"
    taken.write_text("mine")
    proc = sweep("report", str(tmp_path / "h100"), "-o", str(taken), "--no-upload", check=2)
    assert proc.stderr == f"{taken}: exists and is not a directory (--output names the report's directory)\n"
    assert taken.read_text() == "mine"
    proc = sweep("report", str(tmp_path / "h100"), "-o", str(taken / "sub"), "--no-upload", check=2)
    assert proc.stderr == f"{taken / 'sub'}: cannot write the report there: Not a directory\n"
    # a directory that exists: the report's files are replaced, other files left alone, nothing staged is left
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("kept")
    (out / "gpu_timeline.png").write_text("an old figure this report does not draw")
    for _ in range(2):
        sweep("report", str(tmp_path / "h100"), "-o", str(out), "--no-upload")
    assert (out / "notes.txt").read_text() == "kept" and not (out / "gpu_timeline.png").exists()
    assert (out / "report.html").stat().st_size > 0 and not [p for p in out.iterdir() if p.name.startswith(".")]


def test_a_damaged_mlflow_store_is_one_line_exit_2_and_nothing_runs(sweep, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    home = tmp_path / "home"
    home.mkdir()
    (home / "mlflow.db").write_bytes(os.urandom(5000))
    started = time.monotonic()
    proc = sweep("submit", str(spec(tmp_path, batches="[8]")), check=2, env={"KUBESWEEP_NO_TRACKING": ""})
    assert time.monotonic() - started < 30
    assert proc.stderr.splitlines() == [
        f"the MLflow store {home / 'mlflow.db'} cannot be read (file is not a database): move it aside to start an "
        "empty one (runs recorded in it are lost to kubesweep), or pass --tracking-uri or --no-tracking"]
    assert not (home / "sweeps").exists()


def test_a_name_taken_by_another_spec_is_bad_input_said_by_validate_and_submit(  # type: ignore[no-untyped-def]
        sweep, tmp_path: Path) -> None:
    """The name is the user's input (exit 2), said before anything is opened for the second spec: `validate`
    says it too, and `submit` opens no tracking and records nothing for it."""
    sweep("submit", str(spec(tmp_path, "taken", "[8]")))
    other = spec(tmp_path / "other" if (tmp_path / "other").mkdir() is None else tmp_path, "taken", "[8, 16]")
    for command in ("validate", "submit"):
        out = sweep(command, str(other), check=2, env={"KUBESWEEP_NO_TRACKING": ""}).stderr
        assert "a sweep named 'taken' already exists with a different spec" in out, (command, out)
        assert "sweep delete taken" in out
    assert not (tmp_path / "home" / "mlflow.db").exists()  # submit opened no parent run for the refused spec
    status = json.loads(sweep("status", "taken", "-o", "json").stdout)
    assert len(status["trials"]) == 1


def test_ctrl_c_on_submit_says_which_trials_run_on_and_how_to_stop_them(  # type: ignore[no-untyped-def]
        sweep, tmp_path: Path) -> None:
    """Ctrl-C ends the command (130), not the trial it started: the trial runs to its end without it. The message
    says so, naming the trial, and how to stop it."""
    import signal

    env = {**os.environ, "KUBESWEEP_HOME": str(tmp_path / "home"), "KUBESWEEP_LOCAL_GPUS": "[]",
           "KUBESWEEP_JOB_COMMAND": json.dumps([sys.executable, str(STAND_IN)]), "KUBESWEEP_NO_TRACKING": "1"}
    # as a terminal's Ctrl-C reaches it: a shell that started this test in the background may have SIGINT ignored,
    # which the child would inherit (Python then never raises KeyboardInterrupt)
    proc = subprocess.Popen([sys.executable, "-m", "kubesweep", "submit", str(spec(tmp_path, "long", "[1, 2]", 600))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status = json.loads(sweep("status", "long", "-o", "json", check=None).stdout or "{}")
            if any(t["phase"] == "Running" for t in status.get("trials", [])):
                break
            time.sleep(0.2)
        else:
            pytest.fail("no trial started")
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 130, stderr
        stderr = " ".join(stderr.split())  # as wrapped to the terminal's width
        running = next(t["name"] for t in status["trials"] if t["phase"] == "Running")
        assert f"Still running without this process, to their end: 1 trial ({running})" in stderr, stderr
        assert "`sweep cancel long` stops it" in stderr
    finally:
        proc.kill()
        sweep("cancel", "long", check=None)


def test_delete_of_a_running_sweep_asks_then_stops_it_and_ends_its_runs_as_killed(  # type: ignore[no-untyped-def]
        sweep, tmp_path: Path) -> None:
    """Without a terminal to ask at, deleting a running sweep needs --yes (exit 2, nothing touched); with it the
    trials stop, the sweep is forgotten and its MLflow parent run, RUNNING until then, ends as KILLED."""
    tracked = {"KUBESWEEP_NO_TRACKING": ""}
    sweep("submit", str(spec(tmp_path, "long", "[1, 2]", 600)), "--detach", env=tracked)
    deadline = time.monotonic() + 60
    while not any(t["phase"] == "Running" for t in json.loads(sweep("status", "long", "-o", "json").stdout)["trials"]):
        assert time.monotonic() < deadline, "no trial started"
        time.sleep(0.2)
    refused = sweep("delete", "long", check=2, env=tracked).stderr
    assert "sweep 'long' is still running: 1 trial running, 1 to start" in " ".join(refused.split()), refused
    assert "`sweep delete long --yes` stops and deletes it" in " ".join(refused.split())
    sweep("status", "long")  # still there
    out = sweep("delete", "long", "--yes", env=tracked).stdout
    assert "sweep 'long' deleted" in out and "ended as KILLED" in out, out
    sweep("status", "long", check=3)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'home' / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments() if e.name == "long"]
    runs = client.search_runs([experiment.experiment_id])
    assert runs and {r.info.status for r in runs} == {"KILLED"}, [(r.info.run_name, r.info.status) for r in runs]


def test_a_resumed_trial_log_counts_its_attempts_truly(sweep, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Cancelled while running, then resumed: the trial's log holds `# attempt 1`, then `# attempt 2` (resume
    counts retries anew, not the attempts the log holds)."""
    sweep("submit", str(spec(tmp_path, "again", "[1]", 600)), "--detach")
    deadline = time.monotonic() + 60
    while not any(t["phase"] == "Running" for t in json.loads(sweep("status", "again", "-o", "json").stdout)["trials"]):
        assert time.monotonic() < deadline, "no trial started"
        time.sleep(0.2)
    sweep("cancel", "again")
    sweep("resume", "again", "--detach")
    try:
        (log,) = (tmp_path / "home" / "sweeps" / "again" / "trials").glob("*/log.txt")
        while log.read_text().count("# attempt ") < 2:
            assert time.monotonic() < deadline + 60, log.read_text()
            time.sleep(0.2)
        headers = [line.split(":")[0] for line in log.read_text().splitlines() if line.startswith("# attempt ")]
        assert headers == ["# attempt 1", "# attempt 2"]
    finally:
        sweep("cancel", "again", check=None)
