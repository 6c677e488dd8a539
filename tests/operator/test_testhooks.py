"""The operator's test hooks (`kubesweep.operator.testhooks`): annotation rules matched by axes, and fault points
that kill or stop the process at the n-th passage."""

from __future__ import annotations

import pytest

from kubesweep.operator import testhooks
from tests.support.operator_sweeps import two_trial_plan


def test_hook_rules_match_by_axes_and_only_copy_test_annotations() -> None:
    _, p = two_trial_plan()
    rules = testhooks.parse_rules('[{"match": {"batch_size": 8}, "annotations": {"kubesweep.io/test-outcome": "oom"}},'
                                  ' {"annotations": {"kubesweep.io/test-duration": "1s"}}]')
    by_batch = {t.axes["batch_size"]: testhooks.annotations_for(t, rules) for t in p.trials}
    assert by_batch == {8: {"kubesweep.io/test-outcome": "oom"}, 16: {"kubesweep.io/test-duration": "1s"}}
    assert testhooks.parse_rules(None) == []
    with pytest.raises(testhooks.TestHookError, match=r"only kubesweep\.io/test-"):
        testhooks.parse_rules('{"sidecar.istio.io/inject": "true"}')
    with pytest.raises(testhooks.TestHookError, match="not JSON"):
        testhooks.parse_rules("{")


def test_fault_points_are_parsed_and_bad_ones_refused() -> None:
    faults = testhooks.FaultPoints.from_env({testhooks.KILL_ENV: "job-apply:3, outcome-recorded:1",
                                             testhooks.STOP_ENV: "write:6"})
    assert faults.kill_at == {"job-apply": 3, "outcome-recorded": 1} and faults.stop_at == {"write": 6}
    assert not testhooks.FaultPoints.from_env({})
    testhooks.FaultPoints().reached("job-apply")  # no points: nothing happens
    with pytest.raises(testhooks.TestHookError, match="unknown point 'job-aply'"):
        testhooks.FaultPoints.from_env({testhooks.KILL_ENV: "job-aply:3"})
    with pytest.raises(testhooks.TestHookError, match="POINT:N"):
        testhooks.FaultPoints.from_env({testhooks.KILL_ENV: "cancel-delete:0"})
    with pytest.raises(testhooks.TestHookError, match="unknown point"):
        testhooks.FaultPoints.from_env({testhooks.STOP_ENV: "job-apply:1"})  # only `write` stops


def test_a_kill_point_kills_the_process_at_its_nth_passage() -> None:
    import signal
    import subprocess
    import sys

    code = ("from kubesweep.operator import testhooks\n"
            "f = testhooks.FaultPoints(kill_at={'job-apply': 2})\n"
            "f.reached('outcome-recorded'); f.reached('job-apply'); print('first', flush=True)\n"
            "f.reached('job-apply'); print('second', flush=True)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert proc.stdout == "first\n" and "SIGKILL at job-apply #2" in proc.stderr
