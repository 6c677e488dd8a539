"""Kueue's view of a sweep's trial Jobs, in plain words: pure readings of the Workloads Kueue keeps per Job (and,
where readable, of the ClusterQueue behind the sweep's LocalQueue), testable without a cluster, and the
`QueueReader` that fetches them for a backend.

A Job with `kueue.x-k8s.io/queue-name` is created suspended; Kueue makes a Workload owned by it, reserves quota
(condition QuotaReserved), admits it (Admitted) and unsuspends the Job. A preempted Workload gets Evicted (reason
Preempted) and its Job is suspended again; it is requeued and, when admitted again, its Job starts a new pod.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubesweep.backends.k8s_status import job_finished
from kubesweep.wire import tags

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
GPU = "nvidia.com/gpu"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"  # on each Workload: the UID of the Job it was made for
REFRESH_S = 5.0  # seconds between reads of every waiting trial's Workload (QueueReader)
PASSING_S = 1.0  # seconds between reads of those that started waiting or were read in passing
SELECT = 50  # Job UIDs per label selector when reading their Workloads
EVICTIONS_NOTED = "kubesweep.io/kueue-evictions"  # on a trial Job: the evictions its MLflow run is tagged with
_UIDS = re.compile(r"\s*\((?:UID|JobUID): [^)]*\)")


@dataclass(frozen=True)
class Admission:
    """What Kueue says of one trial's Job."""

    reason: str = ""  # why it waits or was preempted, in plain words ("" once admitted)
    admitted: bool = False
    preempted: bool = False  # evicted by Kueue (a higher priority, a reclaim) and requeued
    admitted_at: float | None = None  # epoch seconds of the last admission
    evictions: int = 0  # how often Kueue has evicted it so far (preemptions included; its Workload's count)


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


def trim_workload(workload: Mapping[str, Any]) -> dict[str, Any]:
    """What `admission` and `by_job` read of a Workload (its pod sets, a copy of the Job's template, are dropped:
    a reader keeps one per waiting Job)."""
    meta, spec, status = (workload.get(k) or {} for k in ("metadata", "spec", "status"))
    return {"metadata": {"ownerReferences": meta.get("ownerReferences") or []},
            "spec": {k: spec[k] for k in ("active",) if k in spec},
            "status": {k: status[k] for k in ("conditions", "requeueState", "schedulingStats") if k in status}}


def evictions(workload: Mapping[str, Any] | None) -> int:
    """How often Kueue has evicted the Workload (preemptions, reclaims, ...): its `schedulingStats` count."""
    stats = ((workload or {}).get("status") or {}).get("schedulingStats") or {}
    return sum(int(e.get("count") or 0) for e in stats.get("evictions") or [])


def evictions_noted(job: Mapping[str, Any]) -> int:
    """The evictions already noted on a trial Job (its `EVICTIONS_NOTED` annotation; 0 when absent or garbled)."""
    value = ((job.get("metadata") or {}).get("annotations") or {}).get(EVICTIONS_NOTED, "0")
    return int(value) if str(value).isdigit() else 0


def not_noted(admissions: Mapping[str, Admission], jobs: Mapping[str | None, Mapping[str, Any]]
              ) -> dict[str, tuple[Mapping[str, Any], Admission]]:
    """trial id → (its Job, Kueue's word) for the trials Kueue evicted more often than their Jobs have noted."""
    return {tid: (jobs[tid], adm) for tid, adm in admissions.items() if adm.evictions > evictions_noted(jobs[tid])}


def eviction_tags(admission: Admission) -> dict[str, str]:
    """The MLflow tags that carry Kueue's word on an evicted trial to its run."""
    return {tags.KUEUE_EVICTIONS: str(admission.evictions), tags.KUEUE_LAST_EVICTION: admission.reason[:5000]}


def _transitional(workload: Mapping[str, Any] | None) -> bool:
    return workload is None or _conditions(workload).get("Admitted", {}).get("status") == "True"


def usage(cluster_queue: Mapping[str, Any], resource: str = GPU) -> str:
    """`ClusterQueue team-a: nvidia.com/gpu 4 of 4 in use (flavor h100-80gb)`, over the flavors that have
    `resource` ("" when it has none); in use: the quota reserved by admitted and admitting Workloads."""
    quota: dict[str, str] = {}
    for group in (cluster_queue.get("spec") or {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for res in flavor.get("resources") or []:
                if res.get("name") == resource:
                    quota[flavor.get("name", "?")] = str(res.get("nominalQuota", "?"))
    used: dict[str, str] = {}
    status = cluster_queue.get("status") or {}
    # reserved (admitted or being admitted) is what Kueue weighs a new Workload against; usage lags it
    for flavor in status.get("flavorsReservation") or status.get("flavorsUsage") or []:
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
    evicted = conds.get("Evicted", {})
    preempted = conds.get("Preempted", {}).get("status") == "True" or (
        evicted.get("status") == "True" and evicted.get("reason") == "Preempted")
    count = evictions(workload)
    if preempted or evicted.get("status") == "True":  # checked first: Admitted stays True until the quota is freed
        why = _plain((conds.get("Preempted") or evicted).get("message") or evicted.get("reason") or "evicted")
        words = "preempted by Kueue" if preempted else "evicted by Kueue"
        return Admission(f"{words}, requeued in LocalQueue {queue}: {why}", preempted=True, evictions=max(1, count))
    # evicted before (the Evicted condition cleared on requeue): Kueue's count, or a requeue state
    before = bool(count or (workload.get("status") or {}).get("requeueState"))
    admitted = conds.get("Admitted", {})
    if admitted.get("status") == "True":
        return Admission("admitted by Kueue: starting", admitted=True, preempted=before, evictions=count,
                         admitted_at=_ts(admitted.get("lastTransitionTime")))
    reserved = conds.get("QuotaReserved", {})
    if reserved.get("status") == "True":
        return Admission("quota reserved, waiting for Kueue's admission checks", preempted=before, evictions=count)
    if (workload.get("spec") or {}).get("active") is False:
        return Admission(f"deactivated in Kueue: {conds.get('Deactivated', {}).get('message', '')}".rstrip(": "),
                         preempted=before, evictions=count)
    message = _plain(reserved.get("message") or "waiting for quota")
    where = usage(cluster_queue) if cluster_queue else ""
    reason = f"waiting for quota in LocalQueue {queue}: {message}" + (f" [{where}]" if where else "")
    if before:
        reason = f"preempted by Kueue earlier, requeued; {reason}"
    return Admission(reason, preempted=before, evictions=count)


class QueueReader:
    """Kueue's word on a sweep's suspended trial Jobs, read through a backend's `call` (which maps API errors to
    `errors`): the Workloads of those Jobs only (selected by Kueue's job-uid label, `SELECT` UIDs a request) and
    the ClusterQueue behind the LocalQueue. A step comes with every change of a Job or pod, so reads are bounded in
    time, not per step: every waiting Job's Workload every `REFRESH_S` seconds, and in between, at most every
    `PASSING_S`, those of Jobs that started waiting or were read in passing (none yet, or admitted: a Job
    suspended while its Workload still says admitted is being preempted)."""

    def __init__(self, custom: Any, namespace: str, call: Callable[..., Any],
                 errors: tuple[type[BaseException], ...]):
        self.custom = custom
        self.namespace = namespace
        self.call = call
        self.errors = errors
        # sweep -> (when all were read, when some were, the ClusterQueue then, Job UID -> its Workload or None)
        self._seen: dict[str, tuple[float, float, Mapping[str, Any] | None,
                                    dict[str, Mapping[str, Any] | None]]] = {}

    def waiting(self, sweep: str, queue: str | None, jobs_by_trial: Mapping[str | None, Mapping[str, Any]]
                ) -> dict[str, Admission]:
        """trial id → Kueue's word on its suspended, unfinished Job (none without a queue or a waiting Job)."""
        if not queue:  # a sweep without Kueue: nothing to look at
            return {}
        waiting = {tid: str(job["metadata"].get("uid", "")) for tid, job in jobs_by_trial.items()
                   if tid and (job.get("spec") or {}).get("suspend") and not job_finished(job)}
        if not waiting:
            self._seen.pop(sweep, None)
            return {}
        now = time.monotonic()
        read_at, partial_at, cluster_queue, workloads = self._seen.get(sweep) or (0.0, 0.0, None, {})
        if now - read_at >= REFRESH_S:
            wanted, read_at = sorted(set(waiting.values())), now
        elif now - partial_at >= PASSING_S:
            wanted = sorted(uid for uid in set(waiting.values())
                            if uid not in workloads or _transitional(workloads[uid]))
        else:
            wanted = []
        try:
            fresh = self._workloads(wanted)
            if wanted:  # its usage read with them: the words "4 of 4 in use" go with the Workloads' "no quota"
                cluster_queue, partial_at = self.cluster_queue(queue), now
        except self.errors as exc:  # Kueue's CRDs absent, or not readable with this token
            reason = f"waiting in LocalQueue {queue}; Kueue's Workloads cannot be read: {exc}"
            return {tid: Admission(reason) for tid in waiting}
        known = {uid: workloads[uid] for uid in waiting.values() if uid in workloads}  # the others are dropped
        known.update({uid: fresh.get(uid) for uid in wanted})
        self._seen[sweep] = (read_at, partial_at, cluster_queue, known)
        return {tid: admission(known[uid], queue, cluster_queue) if uid in known
                else Admission(f"waiting in LocalQueue {queue}") for tid, uid in waiting.items()}

    def _workloads(self, uids: list[str]) -> dict[str, Mapping[str, Any]]:
        found: dict[str, Mapping[str, Any]] = {}
        for i in range(0, len(uids), SELECT):
            selector = f"{JOB_UID_LABEL} in ({','.join(uids[i:i + SELECT])})"
            resp = self.call(self.custom.list_namespaced_custom_object, GROUP, VERSION, self.namespace,
                             "workloads", label_selector=selector)
            found.update(by_job(trim_workload(wl) for wl in resp.get("items") or []))
        return found

    def cluster_queue(self, queue: str) -> Mapping[str, Any] | None:
        """The ClusterQueue behind LocalQueue `queue` (its quota and usage), or None where it cannot be read."""
        try:
            local = self.call(self.custom.get_namespaced_custom_object, GROUP, VERSION, self.namespace,
                              "localqueues", queue)
            name = (local.get("spec") or {}).get("clusterQueue")
            if not name:
                return None
            found: Mapping[str, Any] = self.call(self.custom.get_cluster_custom_object, GROUP, VERSION,
                                                 "clusterqueues", name)
            return found
        except self.errors:
            return None

    def forget(self, sweep: str) -> None:
        self._seen.pop(sweep, None)
