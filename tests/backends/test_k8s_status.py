"""Job/pod JSON → trial phase and outcome, for every outcome the cluster can report; each case runs on the objects
as the API server sends them and as the watch caches keep them (`trim_job`, `trim_pod`)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import pytest

from kubesweep.backends import k8s_status
from kubesweep.backends.base import Phase
from kubesweep.backends.k8s_status import Observed, observe
from kubesweep.backends.k8s_watch import trim_job, trim_pod
from kubesweep.wire.outcomes import Outcome

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:01:40Z"


def job(condition: str | None = None, reason: str = "", **status: Any) -> dict[str, Any]:
    conds = [{"type": condition, "status": "True", "reason": reason, "lastTransitionTime": T1}] if condition else []
    return {"spec": {"activeDeadlineSeconds": 60},
            "status": {"startTime": T0, "conditions": conds, "completionTime": T1, **status}}


def pod(phase: str, *, exit_code: int | None = None, reason: str = "", message: str = "",
        created: str = T0, **status: Any) -> dict[str, Any]:
    terminated = {"exitCode": exit_code, "reason": reason, "message": message} if exit_code is not None else None
    container = {"state": {"terminated": terminated}} if terminated else {"state": {"running": {}}}
    return {"metadata": {"creationTimestamp": created},
            "status": {"phase": phase, "containerStatuses": [container], **status}}


@pytest.fixture(autouse=True, params=["whole", "trimmed"])
def _objects(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.param == "trimmed":
        def trimmed(job: Mapping[str, Any] | None, pods: Iterable[Mapping[str, Any]]) -> Observed:
            return k8s_status.observe(trim_job(job) if job is not None else None, [trim_pod(p) for p in pods])

        monkeypatch.setattr(sys.modules[__name__], "observe", trimmed)


def test_not_created_is_pending() -> None:
    assert observe(None, []).phase == Phase.PENDING


def test_complete_is_succeeded_with_times() -> None:
    o = observe(job("Complete"), [pod("Succeeded", exit_code=0)])
    assert (o.phase, o.outcome) == (Phase.SUCCEEDED, Outcome.SUCCEEDED)
    assert o.finished_at is not None and o.started_at is not None and o.finished_at - o.started_at == 100


def test_cuda_oom_exit_code() -> None:
    o = observe(job("Failed", "PodFailurePolicy"), [pod("Failed", exit_code=3, reason="Error")])
    assert (o.phase, o.outcome) == (Phase.FAILED, Outcome.OOM)


def test_oomkilled() -> None:
    o = observe(job("Failed", "BackoffLimitExceeded"), [pod("Failed", exit_code=137, reason="OOMKilled")])
    assert o.outcome == Outcome.OOM and "OOMKilled" in o.reason


def test_gpu_mismatch() -> None:
    o = observe(job("Failed", "PodFailurePolicy"), [pod("Failed", exit_code=4, message="got NVIDIA-L4")])
    assert o.outcome == Outcome.GPU_MISMATCH and "NVIDIA-L4" in o.reason


def test_crash_reports_exit_code_and_message_tail() -> None:
    o = observe(job("Failed", "BackoffLimitExceeded"),
                [pod("Failed", exit_code=1, reason="Error", message="Traceback\nValueError: bad")])
    assert o.outcome == Outcome.FAILED and o.reason == "Error: exit code 1: ValueError: bad"


def test_a_termination_message_nested_past_the_parser_is_no_summary() -> None:
    """The job's termination message is the trial's to write: 4,000 nested brackets (within the 4 KiB the kubelet
    keeps) are no summary, not a RecursionError of the reconciler reading every trial."""
    bomb = '{"outcome": ' + "[" * 4000
    o = observe(job("Failed", "BackoffLimitExceeded"), [pod("Failed", exit_code=1, reason="Error", message=bomb)])
    assert (o.phase, o.outcome, o.summary) == (Phase.FAILED, Outcome.FAILED, None)
    o = observe(job("Complete"), [pod("Succeeded", exit_code=0, message=bomb)])
    assert (o.phase, o.outcome, o.summary) == (Phase.SUCCEEDED, Outcome.SUCCEEDED, None)


def test_deadline() -> None:
    o = observe(job("Failed", "DeadlineExceeded"), [pod("Failed", exit_code=137)])
    assert o.outcome == Outcome.FAILED and o.reason == "deadline exceeded after 60 s"


def test_evicted() -> None:
    evicted = pod("Failed")
    evicted["status"].update({"reason": "Evicted", "message": "node drained"})
    o = observe(job("Failed", "BackoffLimitExceeded"), [evicted])
    assert o.outcome == Outcome.FAILED and o.reason.startswith("evicted")


def test_termination_message_json_wins() -> None:
    summary = json.dumps({"outcome": "gpu_mismatch", "error": "asked NVIDIA-H100-80GB-HBM3, got NVIDIA-H200"})
    o = observe(job("Failed", "BackoffLimitExceeded"), [pod("Failed", exit_code=1, message=summary)])
    assert o.outcome == Outcome.GPU_MISMATCH and "NVIDIA-H200" in o.reason


def test_a_termination_messages_error_is_its_text_not_a_dicts_repr() -> None:
    """A termination message in the results file's words (`error`: `{"type", "message"}`, `wire.results.ErrorInfo`)
    gives the reason as the local backend words it, `type: message`; an error that is neither text nor such a pair
    leaves the reason to the message's `reason`."""
    error = {"type": "RuntimeError", "message": "CUDA error: device-side assert triggered"}
    summary = json.dumps({"outcome": "failed", "error": error})
    o = observe(job("Failed", "BackoffLimitExceeded"), [pod("Failed", exit_code=1, message=summary)])
    assert (o.outcome, o.reason) == (Outcome.FAILED, "RuntimeError: CUDA error: device-side assert triggered")
    odd = json.dumps({"outcome": "failed", "error": [1, {"x": 2}], "reason": "the worker ended"})
    o = observe(job("Failed", "BackoffLimitExceeded"), [pod("Failed", exit_code=1, message=odd)])
    assert (o.outcome, o.reason) == (Outcome.FAILED, "the worker ended")


def test_unschedulable_carries_the_schedulers_message() -> None:
    p = pod("Pending", conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                    "message": "0/8 nodes are available: 8 Insufficient nvidia.com/gpu."}])
    p["status"]["containerStatuses"] = []
    o = observe(job(active=1), [p])
    assert o.phase == Phase.UNSCHEDULABLE and "Insufficient nvidia.com/gpu" in o.reason


def test_running_and_retrying() -> None:
    assert observe(job(active=1), [pod("Running")]).phase == Phase.RUNNING
    assert observe(job(active=0), [pod("Succeeded", exit_code=0)]).phase == Phase.RUNNING
    o = observe(job(active=0), [pod("Failed", exit_code=1, reason="Error")])
    assert o.phase == Phase.PENDING and o.reason.startswith("retrying after: Error: exit code 1")


def test_newest_pod_decides() -> None:
    old = pod("Failed", exit_code=1, reason="Error", created=T0)
    new = pod("Failed", exit_code=3, reason="Error", created=T1)
    assert observe(job("Failed", "PodFailurePolicy"), [new, old]).outcome == Outcome.OOM


NO_NODE = ("0/12 nodes are available: 4 node(s) had untolerated taint {node-role.kubernetes.io/control-plane: }, "
           "8 node(s) didn't match Pod's node affinity/selector. preemption: 0/12 nodes are available: 12 "
           "Preemption is not helpful for scheduling.")
BUSY = ("0/12 nodes are available: 2 Insufficient nvidia.com/gpu, 10 node(s) didn't match Pod's node "
        "affinity/selector. preemption: 0/12 nodes are available: 2 No preemption victims found for incoming pod, "
        "10 Preemption is not helpful for scheduling.")


def unscheduled(message: str, since: str = T0) -> dict[str, Any]:
    p = pod("Pending", conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                    "message": message, "lastTransitionTime": since}])
    p["status"]["containerStatuses"] = []
    return p


@pytest.mark.parametrize(("message", "never"), [
    (NO_NODE, True),
    ("0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector.", True),
    (BUSY, False),  # GPUs in use pass
    ("0/3 nodes are available: 3 Too many pods.", False),
    ("0/3 nodes are available: 1 node(s) were unschedulable, 2 node(s) didn't match Pod's node affinity/selector.",
     False),  # a cordoned node comes back
    ("0/3 nodes are available: 3 node(s) didn't match pod anti-affinity rules.", False),  # another trial's node
    ("0/7 nodes are available: 1 node(s) had untolerated taint(s), 6 node(s) didn't match Pod's node "
     "affinity/selector. no new claims to deallocate, preemption: 0/7 nodes are available: 7 Preemption is not "
     "helpful for scheduling.", True),
    ("no nodes available to schedule pods", False),  # not of the form: wait
    ("", False),
])
def test_no_node_can_take_reads_only_labels_and_taints_as_for_ever(message: str, never: bool) -> None:
    assert k8s_status.no_node_can_take(message) is never


def test_a_pod_no_node_can_take_ends_unschedulable_after_the_bound() -> None:
    start = k8s_status._ts(T0) or 0.0
    before = k8s_status.observe(job(active=1), [unscheduled(NO_NODE)], unschedulable_seconds=600, now=start + 599)
    assert before.phase == Phase.UNSCHEDULABLE and before.outcome is None
    after = k8s_status.observe(job(active=1), [unscheduled(NO_NODE)], unschedulable_seconds=600, now=start + 600)
    assert (after.phase, after.outcome) == (Phase.FAILED, Outcome.UNSCHEDULABLE)
    assert after.phase.terminal and after.finished_at == start + 600
    assert "unschedulable for 600 s" in after.reason and "didn't match Pod's node affinity/selector" in after.reason
    trimmed = k8s_status.observe(trim_job(job(active=1)), [trim_pod(unscheduled(NO_NODE))], unschedulable_seconds=600,
                                 now=start + 600)  # as the watch caches keep it
    assert trimmed.outcome == Outcome.UNSCHEDULABLE


def test_a_pod_waiting_for_gpus_in_use_waits_on() -> None:
    start = k8s_status._ts(T0) or 0.0
    seen = k8s_status.observe(job(active=1), [unscheduled(BUSY)], unschedulable_seconds=60, now=start + 86400)
    assert seen.phase == Phase.UNSCHEDULABLE and seen.outcome is None
    unbounded = k8s_status.observe(job(active=1), [unscheduled(NO_NODE)], now=start + 86400)
    assert unbounded.phase == Phase.UNSCHEDULABLE  # no bound given: the phase alone
