"""Trial outcomes and the job's exit codes (`kubesweep.wire.outcomes`): the contract between the job, the backends
and the reports."""

from __future__ import annotations

import pytest

from kubesweep.wire.outcomes import EXIT_TO_OUTCOME, ExitCode, Outcome, outcome_for_exit


@pytest.mark.parametrize(("code", "outcome"), [
    (0, Outcome.SUCCEEDED), (3, Outcome.OOM), (4, Outcome.GPU_MISMATCH),
    (1, Outcome.FAILED), (2, Outcome.FAILED), (5, Outcome.FAILED), (137, Outcome.FAILED), (-9, Outcome.FAILED),
])
def test_an_exit_code_maps_to_its_outcome_and_any_other_code_is_a_failure(code: int, outcome: Outcome) -> None:
    assert outcome_for_exit(code) is outcome


def test_the_exit_codes_and_outcome_names_are_the_documented_ones() -> None:
    assert {c.name: int(c) for c in ExitCode} == {"OK": 0, "FAILED": 1, "USAGE": 2, "OOM": 3, "GPU_MISMATCH": 4}
    assert [o.value for o in Outcome] == ["succeeded", "oom", "gpu_mismatch", "failed", "skipped", "cancelled",
                                          "stopped", "unschedulable"]
    assert Outcome("oom") is Outcome.OOM and f"{Outcome.GPU_MISMATCH}" == "gpu_mismatch"
    # only the codes the job gives a result for are mapped; a usage error is a failure of the trial
    assert set(EXIT_TO_OUTCOME) == {ExitCode.OK, ExitCode.OOM, ExitCode.GPU_MISMATCH}
    assert outcome_for_exit(ExitCode.USAGE) is Outcome.FAILED
