"""Kubernetes objects → trial phase and outcome. Pure functions over the API's JSON, testable without a cluster.

The mapping:
  Job Complete                                  -> Succeeded / succeeded
  Job Failed, container exit 3 or OOMKilled     -> Failed / oom
  Job Failed, container exit 4                  -> Failed / gpu_mismatch
  Job Failed, DeadlineExceeded                  -> Failed / failed ("deadline exceeded after N s")
  Job Failed, otherwise                         -> Failed / failed (reason, exit code, termination message)
  pod PodScheduled=False, Unschedulable         -> Unschedulable, with the scheduler's message; when the message
                                                   says no node can ever take it (`no_node_can_take`) and it has
                                                   said so for the spec's `resources.unschedulable_seconds`:
                                                   Failed / unschedulable
  pod running                                   -> Running
  otherwise                                     -> Pending
A JSON termination message written by the job (`{"outcome": ...}`) overrides the exit-code mapping.
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from kubesweep.backends.base import Phase
from kubesweep.wire.outcomes import ExitCode, Outcome
from kubesweep.wire.results import ErrorInfo

# Why the scheduler leaves a node out that no wait changes: the node's labels or taints (a GPU type the cluster has
# no node of, a label no node carries). Every other reason (GPUs or memory in use, too many pods, a node cordoned,
# another pod's anti-affinity) can pass as other pods end.
STATIC_REASONS = ("didn't match Pod's node affinity/selector", "didn't match Pod's node affinity",
                  "had untolerated taint", "had taint")
_AVAILABLE = re.compile(r"^0/\d+ nodes are available: (?P<why>.*)$")
_PART = re.compile(r"^\d+ ")


@dataclass(frozen=True)
class Observed:
    phase: Phase
    outcome: Outcome | None = None
    reason: str = ""
    started_at: float | None = None
    finished_at: float | None = None
    summary: dict[str, Any] | None = None  # the job's termination message, when JSON


@functools.lru_cache(maxsize=65536)  # a step reads the same few timestamps of every Job and pod
def _ts(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in obj.get("status", {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return cond  # type: ignore[no-any-return]
    return None


def job_finished(job: Mapping[str, Any]) -> bool:
    """Whether a Job is Complete or Failed."""
    return _condition(job, "Complete") is not None or _condition(job, "Failed") is not None


def _terminated(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for status in pod.get("status", {}).get("containerStatuses") or []:
        state = status.get("state", {}).get("terminated") or status.get("lastState", {}).get("terminated")
        if state:
            return state  # type: ignore[no-any-return]
    return None


def _summary(term: Mapping[str, Any] | None) -> dict[str, Any] | None:
    message = ((term or {}).get("message") or "").strip()
    if not message.startswith("{"):  # most are not JSON: no parse attempt (a step looks at every trial)
        return None
    try:
        data = json.loads(message)
    except (ValueError, RecursionError):  # the trial writes it: 4 KiB of `[` nest deeper than Python's parser goes
        return None
    return data if isinstance(data, dict) else None


def _text(value: object) -> str:
    """A termination message's field as text: a string as it is; the results file's error (`{"type", "message"}`,
    `ErrorInfo`) as `type: message`, as the local backend words it; anything else, none (never a repr)."""
    if isinstance(value, str):
        return value
    try:
        error = ErrorInfo.model_validate(value)
    except ValidationError:
        return ""
    return f"{error.type}: {error.message}"


def _newest(pods: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    ordered = sorted(pods, key=lambda p: p.get("metadata", {}).get("creationTimestamp") or "")
    return ordered[-1] if ordered else None


def pod_failure(pod: Mapping[str, Any]) -> tuple[Outcome, str]:
    """Outcome and reason of a failed pod."""
    status = pod.get("status", {})
    term = _terminated(pod)
    summary = _summary(term)
    if summary and summary.get("outcome") in {o.value for o in Outcome}:
        return Outcome(summary["outcome"]), _text(summary.get("error")) or _text(summary.get("reason"))
    if status.get("reason") == "Evicted" or _condition(pod, "DisruptionTarget"):
        return Outcome.FAILED, f"evicted: {status.get('message') or 'disrupted'}"
    if term:
        code = term.get("exitCode")
        reason = term.get("reason") or "Error"
        if reason == "OOMKilled":
            return Outcome.OOM, f"OOMKilled (exit code {code})"
        if code == ExitCode.OOM:
            return Outcome.OOM, "CUDA out of memory"
        if code == ExitCode.GPU_MISMATCH:
            return Outcome.GPU_MISMATCH, (term.get("message") or "the GPU is not the type asked for").strip()
        tail = (term.get("message") or "").strip().splitlines()[-1:] or [""]
        return Outcome.FAILED, f"{reason}: exit code {code}" + (f": {tail[0][:300]}" if tail[0] else "")
    return Outcome.FAILED, status.get("reason") or "failed"


def no_node_can_take(message: str) -> bool:
    """The scheduler's message says every node is ruled out by its labels or taints (`STATIC_REASONS`), as for a
    pod of a GPU type the cluster has no node of: `0/12 nodes are available: 4 node(s) had untolerated taint
    {node-role.kubernetes.io/control-plane: }, 8 node(s) didn't match Pod's node affinity/selector. preemption:
    ...`. A message that names any other reason, or that is not of that form, is not."""
    match = _AVAILABLE.match(message.strip())
    if match is None:
        return False
    why = match["why"].split(". ", 1)[0].strip().rstrip(".")  # the first sentence: the nodes' reasons
    parts = why.split(", ")
    return all(_PART.match(part) and any(reason in part for reason in STATIC_REASONS) for part in parts)


def unschedulable(pod: Mapping[str, Any], timeout: float | None, now: float | None) -> Observed | None:
    """The pod's scheduling state when the scheduler cannot place it: Unschedulable with its message, or, when no
    node can ever take it (`no_node_can_take`) and that has held for `timeout` seconds, Failed / unschedulable."""
    for cond in pod.get("status", {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and (
                cond.get("reason") == "Unschedulable"):
            message = str(cond.get("message") or "unschedulable")
            since = _ts(cond.get("lastTransitionTime"))
            if timeout is not None and since is not None and no_node_can_take(message):
                now = time.time() if now is None else now
                if now - since >= timeout:
                    return Observed(Phase.FAILED, Outcome.UNSCHEDULABLE,
                                    f"no node can take it (unschedulable for {now - since:.0f} s, the spec's "
                                    f"resources.unschedulable_seconds is {timeout:g}): {message}", None, now)
            return Observed(Phase.UNSCHEDULABLE, reason=message)
    return None


def observe(job: Mapping[str, Any] | None, pods: Iterable[Mapping[str, Any]], *,
            unschedulable_seconds: float | None = None, now: float | None = None) -> Observed:
    """What a trial's Job and pods say of it. `unschedulable_seconds`: how long a pod no node can take stays
    Unschedulable before the trial ends `unschedulable` (None: for ever); `now`: the time to measure it at."""
    if job is None:
        return Observed(Phase.PENDING)
    pods = list(pods)
    status = job.get("status", {})
    started = _ts(status.get("startTime"))
    newest = _newest(pods)
    if _condition(job, "Complete"):
        term = _terminated(newest) if newest else None
        summary = _summary(term)
        outcome = Outcome(summary["outcome"]) if summary and summary.get("outcome") == "succeeded" else (
            Outcome.SUCCEEDED)
        return Observed(Phase.SUCCEEDED, outcome, "", started, _ts(status.get("completionTime")), summary)
    failed = _condition(job, "Failed")
    if failed:
        finished = _ts(failed.get("lastTransitionTime"))
        failed_pods = [p for p in pods if p.get("status", {}).get("phase") == "Failed"]
        last = _newest(failed_pods)
        if failed.get("reason") == "DeadlineExceeded":
            deadline = job.get("spec", {}).get("activeDeadlineSeconds")
            return Observed(Phase.FAILED, Outcome.FAILED, f"deadline exceeded after {deadline} s", started, finished)
        if last is not None:
            outcome, reason = pod_failure(last)
            return Observed(Phase.FAILED, outcome, reason, started, finished, _summary(_terminated(last)))
        return Observed(Phase.FAILED, Outcome.FAILED, f"{failed.get('reason')}: {failed.get('message', '')}".strip(),
                        started, finished)
    if newest is not None:
        pod_status = newest.get("status", {})
        if pod_status.get("phase") in ("Running", "Succeeded"):  # Succeeded: the Job controller is catching up
            return Observed(Phase.RUNNING, started_at=started)
        if pod_status.get("phase") == "Failed":  # the Job will start another pod
            _, why = pod_failure(newest)
            return Observed(Phase.PENDING, reason=f"retrying after: {why}", started_at=started)
        waiting = unschedulable(newest, unschedulable_seconds, now)
        if waiting is not None:
            return replace(waiting, started_at=started) if waiting.phase.terminal else waiting
    if status.get("active"):
        return Observed(Phase.PENDING, started_at=started)
    return Observed(Phase.PENDING)
