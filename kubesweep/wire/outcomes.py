"""Trial outcomes and the job's exit codes: the contract between the job, the backends and the reports."""

from __future__ import annotations

from enum import IntEnum, StrEnum


class Outcome(StrEnum):
    """How a trial ended, as written in its results file and shown by `sweep status`/`results`."""

    SUCCEEDED = "succeeded"
    OOM = "oom"
    GPU_MISMATCH = "gpu_mismatch"
    FAILED = "failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"
    STOPPED = "stopped"  # ended early by a search scheduler (ASHA, median)
    # no node of the cluster could take it for the spec's `resources.unschedulable_seconds` (its GPU type, labels
    # or taints match none): it never ran, so it is not a result; `sweep resume` runs it again
    UNSCHEDULABLE = "unschedulable"


class ExitCode(IntEnum):
    """Exit status of `python -m kubesweep.jobs`. Backends map a status without a results file through this."""

    OK = 0
    FAILED = 1
    USAGE = 2
    OOM = 3
    GPU_MISMATCH = 4


EXIT_TO_OUTCOME: dict[int, Outcome] = {
    ExitCode.OK: Outcome.SUCCEEDED,
    ExitCode.OOM: Outcome.OOM,
    ExitCode.GPU_MISMATCH: Outcome.GPU_MISMATCH,
}


def outcome_for_exit(code: int) -> Outcome:
    return EXIT_TO_OUTCOME.get(code, Outcome.FAILED)
