"""A trial's flags: what a reader must know beside its numbers (`OOM`, `GPU mismatch`, `failed`, `chance accuracy
(0.51)`, `random init: accuracy not meaningful`, `host-bound (99% issuing)`). One set of names and rules for the
job's MLflow run (its flags tag and description), `sweep results`, the report and the MLflow runs view."""

from __future__ import annotations

import math

from kubesweep.wire import tags
from kubesweep.wire.config import JobConfig
from kubesweep.wire.results import Results

# an outcome or a phase as the tables write it
OUTCOME_TEXT = {"oom": "OOM", "gpu_mismatch": "GPU mismatch", "failed": "failed", "skipped": "skipped",
                "cancelled": "cancelled", "stopped": "stopped", "pending": "pending", "running": "running",
                "unschedulable": "unschedulable"}
FLAGGED = ("oom", "gpu_mismatch", "failed")  # the outcomes that are a flag of their own
CHANCE_ACCURACY = 0.5  # SST-2: two balanced classes
CHANCE_MARGIN = 0.05
RANDOM_INIT = "random init: accuracy not meaningful"
# An inference batch on a GPU whose issuing took at least this share of its latency measured the host's kernel
# launches, not the GPU (kubesweep/jobs/inference.py; eager bert-base at batch 8 on an H100: 0.77-0.99).
HOST_BOUND_SHARE = 0.5
HOST_BOUND_ADVICE = "replay it as a CUDA graph (step_graph: true)"


def finite(value: float | None) -> float | None:
    """`value` where it is a finite number (a diverged run writes NaN), else None."""
    return float(value) if value is not None and math.isfinite(value) else None


def final_accuracy(results: Results | None) -> float | None:
    return finite(results.final_accuracy) if results is not None else None


def at_chance(results: Results | None) -> bool:
    """Its final accuracy is at chance: the training did not learn."""
    accuracy = final_accuracy(results)
    return accuracy is not None and accuracy <= CHANCE_ACCURACY + CHANCE_MARGIN


def random_init(job: JobConfig | None) -> bool:
    """A model built from its config, untrained: a speed run, whose accuracy says nothing about the recipe."""
    return job is not None and job.random_init


def chance_flag(accuracy: float) -> str:
    return f"chance accuracy ({accuracy:.2f})"


def host_share(results: Results | None) -> float | None:
    """The share of its inference batches' latency the host spent issuing them (GPU runs only), where it is at
    least HOST_BOUND_SHARE: the figure is the host's."""
    inference = results.inference if results is not None else None
    share = finite(inference.host_share) if inference is not None else None
    return share if share is not None and share >= HOST_BOUND_SHARE else None


def host_bound_flag(share: float) -> str:
    return f"host-bound ({share:.0%} issuing)"


def trial_flags(outcome: str, results: Results | None) -> list[str]:
    """One trial's flags: `OOM`, `GPU mismatch` or `failed` by its outcome; `random init: accuracy not
    meaningful` for a random-init model; else `chance accuracy (0.51)` when it succeeded at chance; an inference
    run whose GPU waited for the host, `host-bound (99% issuing)`."""
    if outcome in FLAGGED:
        return [OUTCOME_TEXT[outcome]]
    config = results.config if results is not None else None
    if config is not None and random_init(config) and config.task != "inference":
        return [RANDOM_INIT]
    if outcome == "succeeded" and at_chance(results):
        return [chance_flag(final_accuracy(results) or 0.0)]
    share = host_share(results) if outcome == "succeeded" else None
    if share is not None:
        return [host_bound_flag(share)]
    return []


def comparison_tags(results: Results) -> dict[str, str]:
    """One trial's flags joined by `; ` as the tag `kubesweep.flags` and as its run's description, empty when it
    has none (a retried trial that now learned clears what an earlier attempt set)."""
    flags = "; ".join(trial_flags(results.outcome.value, results))
    return {tags.FLAGS: flags, tags.NOTE: flags}
