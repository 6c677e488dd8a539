"""A trial's MLflow run as the job opens it: its name, its tags and its params, spelled once for the job
(`kubesweep.jobs.runner`) and whatever stands in for it, so that the runs view (`kubesweep.tracking.view`) finds the
same columns under every run.

- The **name** is the trial's name without the sweep's name in front: the run sits under the sweep's parent run,
  in an experiment of that sweep, and a name that starts with the sweep's repeats it on every row, where the runs
  view has room for the first dozen characters only (`smoke-i…`). What is left leads with what sets trials apart:
  `inf-cpu-bs8-fp32-r1-3f2a9c1e` (task, device, batch size, precision, compile, repeat, then the id's head, which
  keeps two trials that differ only in another setting apart).
- The **params** are every job setting as it is, plus the trial's identity, except `compile`, written as the CLI
  and the tables write it (`off`, `default`, `max-autotune`; never Python's `False`): the runs view shows the
  param as it is.
"""

from __future__ import annotations

import json
from typing import Any

from kubesweep.wire import tags
from kubesweep.wire.config import TrialConfig

OFF = "off"


def compile_text(value: Any) -> str:
    """A `compile` setting as the CLI writes it: `off`, or the mode (`default`, `reduce-overhead`, ...)."""
    if value in (False, None, "false", "False", "off", ""):
        return OFF
    return "default" if value is True else str(value)


def run_name(trial: TrialConfig) -> str:
    """The trial's name without the sweep's name (or the part of it the planner kept) in front, and with its GPU
    type after the other axes: the runs view's Name column shows a dozen characters, and every run of a GPU's
    cells would start alike (`h100-80gb-b…`) where the GPU has a column of its own."""
    name, sweep = trial.name, trial.sweep.lower()
    for end in range(len(sweep), 0, -1):
        prefix = sweep[:end].rstrip("-")
        if prefix and name.startswith(prefix + "-") and len(name) > len(prefix) + 1:
            name = name[len(prefix) + 1:]
            break
    gpu = f"{trial.device}-"
    if trial.device != "cpu" and name.startswith(gpu):
        axes, _, short_id = name[len(gpu):].rpartition("-")
        if axes:
            return f"{axes}-{trial.device}-{short_id}"
    return name


def run_tags(trial: TrialConfig) -> dict[str, str]:
    """The tags a trial's run starts with: who it is and its cell (the outcome and flags come when it ends)."""
    job = trial.job
    return {
        tags.SWEEP: trial.sweep,
        tags.TRIAL: trial.name,
        tags.GPU: trial.device,
        tags.PRECISION: job.precision,
        tags.COMPILE: compile_text(job.compile),
        tags.BATCH_SIZE: str(job.batch_size),
        tags.REPEAT: str(trial.repeat),
        tags.ENGINE: job.engine,
        tags.TASK: job.task,
    }


def run_params(trial: TrialConfig) -> dict[str, Any]:
    """Every job setting (a dict or list as JSON), `compile` in the CLI's words, and the trial's identity; `gpu`
    as the tag `kubesweep.gpu` has it (the GPU type, `cpu` or `any GPU`)."""
    params: dict[str, Any] = {}
    for key, value in trial.job.model_dump(mode="json").items():
        params[key] = json.dumps(value) if isinstance(value, dict | list) else value
    params["compile"] = compile_text(trial.job.compile)
    params.update({"sweep": trial.sweep, "trial_id": trial.trial_id, "repeat": trial.repeat, "gpu": trial.device,
                   "gpus_per_trial": trial.gpus_per_trial})
    return params
