"""Kueue's view of a sweep's trial Jobs, in plain words: pure readings of the Workloads Kueue keeps per Job (and,
where readable, of the ClusterQueue behind the sweep's LocalQueue). Testable without a cluster.

A Job with `kueue.x-k8s.io/queue-name` is created suspended; Kueue makes a Workload owned by it, reserves quota
(condition QuotaReserved), admits it (Admitted) and unsuspends the Job. A preempted Workload gets Evicted (reason
Preempted) and its Job is suspended again; it is requeued and, when admitted again, its Job starts a new pod.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
GPU = "nvidia.com/gpu"
_UIDS = re.compile(r"\s*\((?:UID|JobUID): [^)]*\)")


@dataclass(frozen=True)
class Admission:
    """What Kueue says of one trial's Job."""

    reason: str = ""  # why it waits or was preempted, in plain words ("" once admitted)
    admitted: bool = False
    preempted: bool = False  # evicted by Kueue (a higher priority, a reclaim) and requeued
    admitted_at: float | None = None  # epoch seconds of the last admission


def _ts(value: str | None) -> float | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else None


def _plain(message: str) -> str:
    """Kueue's message without object UIDs and the cohort paths it appends (`; preemptor path: ...`)."""
    return _UIDS.sub("", message.split("; preemptor path")[0]).strip().rstrip(";")


def _conditions(workload: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {c.get("type", ""): c for c in (workload.get("status") or {}).get("conditions") or []}


def by_job(workloads: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Job UID → its Workload (Kueue makes one per Job, owned by it)."""
    out: dict[str, Mapping[str, Any]] = {}
    for wl in workloads:
        for ref in (wl.get("metadata") or {}).get("ownerReferences") or []:
            if ref.get("kind") == "Job" and ref.get("uid"):
                out[ref["uid"]] = wl
    return out


def usage(cluster_queue: Mapping[str, Any], resource: str = GPU) -> str:
    """`ClusterQueue team-a: nvidia.com/gpu 4 of 4 in use (flavor h100-80gb)`, over the flavors that have
    `resource` ("" when it has none)."""
    quota: dict[str, str] = {}
    for group in (cluster_queue.get("spec") or {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for res in flavor.get("resources") or []:
                if res.get("name") == resource:
                    quota[flavor.get("name", "?")] = str(res.get("nominalQuota", "?"))
    used: dict[str, str] = {}
    for flavor in (cluster_queue.get("status") or {}).get("flavorsUsage") or []:
        for res in flavor.get("resources") or []:
            if res.get("name") == resource:
                used[flavor.get("name", "?")] = str(res.get("total", "0"))
    if not quota:
        return ""
    parts = [f"{used.get(name, '0')} of {total} in use (flavor {name})" for name, total in quota.items()]
    return f"ClusterQueue {cluster_queue['metadata']['name']}: {resource} " + ", ".join(parts)


def admission(workload: Mapping[str, Any] | None, queue: str, cluster_queue: Mapping[str, Any] | None = None
              ) -> Admission:
    """A trial Job's standing with Kueue, from its Workload (None: Kueue has made none yet)."""
    if workload is None:
        return Admission(f"waiting for Kueue to take it into LocalQueue {queue} (no Workload yet: is Kueue running, "
                         "and does the LocalQueue exist?)")
    conds = _conditions(workload)
    admitted = conds.get("Admitted", {})
    if admitted.get("status") == "True":
        return Admission(admitted=True, admitted_at=_ts(admitted.get("lastTransitionTime")),
                         preempted=bool((workload.get("status") or {}).get("requeueState")))
    evicted = conds.get("Evicted", {})
    preempted = conds.get("Preempted", {}).get("status") == "True" or (
        evicted.get("status") == "True" and evicted.get("reason") == "Preempted")
    requeue = (workload.get("status") or {}).get("requeueState") or {}
    if preempted or evicted.get("status") == "True":
        why = _plain((conds.get("Preempted") or evicted).get("message") or evicted.get("reason") or "evicted")
        words = "preempted by Kueue" if preempted else "evicted by Kueue"
        return Admission(f"{words}, requeued in LocalQueue {queue}: {why}", preempted=True)
    if requeue:  # evicted before and waiting again (the Evicted condition cleared on requeue)
        preempted = True
    reserved = conds.get("QuotaReserved", {})
    if reserved.get("status") == "True":
        return Admission("quota reserved, waiting for Kueue's admission checks", preempted=preempted)
    inactive = (workload.get("spec") or {}).get("active") is False
    if inactive:
        return Admission(f"deactivated in Kueue: {conds.get('Deactivated', {}).get('message', '')}".rstrip(": "),
                         preempted=preempted)
    message = _plain(reserved.get("message") or "waiting for quota")
    where = usage(cluster_queue) if cluster_queue else ""
    reason = f"waiting for quota in LocalQueue {queue}: {message}" + (f" [{where}]" if where else "")
    if preempted:
        reason = f"preempted by Kueue earlier, requeued; {reason}"
    return Admission(reason, preempted=preempted)
