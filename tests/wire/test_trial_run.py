"""A trial's MLflow run as the job opens it (kubesweep/wire/trial_run.py): names that set trials apart within the
runs view's name column, and `compile` in the CLI's words."""

from __future__ import annotations

from kubesweep.plan import plan
from kubesweep.sweep_spec import parse_sweep_text
from kubesweep.wire import tags
from kubesweep.wire.config import JobConfig, TrialConfig
from kubesweep.wire.trial_run import compile_text, run_name, run_params, run_tags

SPEC = """\
apiVersion: kubesweep.io/v1alpha1
kind: Sweep
metadata: {name: smoke}
spec:
  matrix:
    gpu: [h100-80gb]
    batch_size: [16, 64]
    compile: [false, true]
  include:
    - {task: inference, gpus_per_trial: 0, precision: fp32, batch_size: 8}
    - {task: inference, gpus_per_trial: 0, precision: fp32, batch_size: 8, max_seq_len: 64}
  repeats: 2
"""


def test_run_names_drop_the_sweep_and_stay_distinct() -> None:
    trials = plan(parse_sweep_text(SPEC)).trials
    names = [run_name(t.config) for t in trials]
    assert len(set(names)) == len(names) == len(trials)  # two inference cells differ only in max_seq_len
    assert not [n for n in names if n.startswith("smoke")], names
    # the trial's name's parts, the sweep's dropped and a GPU's moved after the other axes (its own column shows
    # it): the view's Name column shows a dozen characters, which must not be the same for every run of a GPU
    assert all(sorted(n.split("-")) == sorted(t.config.name.split("-")[1:]) for t, n in zip(trials, names,
                                                                                                 strict=True))
    assert "inf-bs8-fp32-r0-" in " ".join(names) and "bs64-fp32-c-r1-h100-80gb-" in " ".join(names), names
    gpu_names = [n for n in names if "h100-80gb" in n]
    assert gpu_names and not [n for n in gpu_names if n.startswith("h100")], gpu_names
    assert len({n[:12] for n in gpu_names}) >= len(gpu_names) // 2  # a repeat's pair may share its first 12


def test_a_long_sweep_name_cut_by_the_planner_is_dropped_too() -> None:
    sweep = "a-very-long-sweep-name-that-the-planner-has-to-cut-short-x"
    trial = TrialConfig(sweep=sweep, trial_id="0123456789abcdef", gpu="h100-80gb",
                        name=f"{sweep[:30]}-h100-80gb-bs16-bf16-01234567")
    assert run_name(trial) == "bs16-bf16-h100-80gb-01234567"
    assert run_name(TrialConfig(sweep="x", trial_id="1", name="other")) == "other"


def test_compile_is_written_as_the_cli_writes_it() -> None:
    assert [compile_text(v) for v in (False, None, "off", True, "default", "max-autotune")] == [
        "off", "off", "off", "default", "default", "max-autotune"]
    trial = TrialConfig(sweep="s", trial_id="1", name="s-cpu-bs8-fp32-1", gpus_per_trial=0,
                        job=JobConfig(task="inference", batch_size=8, precision="fp32"))
    params = run_params(trial)
    assert params["compile"] == "off" and params["task"] == "inference" and params["gpu"] == "cpu"
    assert run_tags(trial)[tags.COMPILE] == "off" and run_tags(trial)[tags.TASK] == "inference"
