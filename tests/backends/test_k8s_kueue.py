"""Kueue's Workloads read into plain words (kubesweep.backends.k8s_kueue), on Workloads shaped as Kueue v0.17 writes
them (the cluster tests in tests/operator/test_kueue_cluster.py run the real Kueue)."""

from __future__ import annotations

from typing import Any

from kubesweep.backends import k8s_kueue

JOB_UID = "8f1c"
PENDING = ("couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor "
           "h100-80gb, 1 more needed")
PREEMPTED = ("Preempted to accommodate a workload (UID: 0b6d-41, JobUID: 69da-45) due to prioritization in the "
             "ClusterQueue; preemptor path: /team-a; preemptee path: /team-a;")


def workload(*conditions: dict[str, Any], requeued: bool = False, evictions: int = 0, **spec: Any
             ) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": list(conditions)}
    if requeued:
        status["requeueState"] = {"count": 1}
    if evictions:  # Kueue's count per reason and cause (Workload status.schedulingStats)
        status["schedulingStats"] = {"evictions": [
            {"reason": "Preempted", "underlyingCause": "InClusterQueue", "count": evictions - 1},
            {"reason": "Preempted", "underlyingCause": "InCohortReclamation", "count": 1}][2 - min(evictions, 2):]}
    return {"metadata": {"name": "job-t1-abcde", "ownerReferences": [{"kind": "Job", "name": "t1", "uid": JOB_UID}]},
            "spec": spec, "status": status}


def cond(kind: str, status: str, reason: str = "", message: str = "", at: str = "2026-11-26T10:00:00Z"
         ) -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": at}


CLUSTER_QUEUE = {
    "metadata": {"name": "team-a"},
    "spec": {"resourceGroups": [{"coveredResources": ["cpu", "nvidia.com/gpu"], "flavors": [
        {"name": "h100-80gb", "resources": [{"name": "cpu", "nominalQuota": 64},
                                            {"name": "nvidia.com/gpu", "nominalQuota": 8}]},
        {"name": "a100-40gb", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "4"}]}]}]},
    "status": {"flavorsReservation": [{"name": "h100-80gb", "resources": [{"name": "nvidia.com/gpu", "total": "8"}]}],
               "flavorsUsage": [{"name": "h100-80gb", "resources": [{"name": "nvidia.com/gpu", "total": "6"}]}]},
}


def test_a_job_without_a_workload_yet_names_its_queue_and_what_to_check() -> None:
    got = k8s_kueue.admission(None, "team-a")
    assert not got.admitted and "LocalQueue team-a" in got.reason and "is Kueue running" in got.reason


def test_waiting_for_quota_gives_kueues_words_and_the_cluster_queues_usage() -> None:
    got = k8s_kueue.admission(workload(cond("QuotaReserved", "False", "Pending", PENDING)), "team-a", CLUSTER_QUEUE)
    assert got.reason == (f"waiting for quota in LocalQueue team-a: {PENDING} [ClusterQueue team-a: nvidia.com/gpu "
                          "8 of 8 in use (flavor h100-80gb), 0 of 4 in use (flavor a100-40gb)]")
    assert not got.admitted and not got.preempted


def test_without_a_readable_cluster_queue_the_reason_is_kueues_alone() -> None:
    got = k8s_kueue.admission(workload(cond("QuotaReserved", "False", "Pending", PENDING)), "team-a")
    assert got.reason == f"waiting for quota in LocalQueue team-a: {PENDING}"


def test_a_preempted_workload_is_named_preempted_without_uids_or_cohort_paths() -> None:
    evicted = cond("Evicted", "True", "Preempted", PREEMPTED)
    # Kueue suspends the Job before it frees the quota: the Workload still says Admitted then
    still_admitted = k8s_kueue.admission(workload(evicted, cond("Admitted", "True")), "team-a")
    assert still_admitted.preempted and still_admitted.reason.startswith("preempted by Kueue")
    got = k8s_kueue.admission(workload(evicted, cond("QuotaReserved", "False")), "team-a")
    assert got.preempted and not got.admitted
    assert got.reason == ("preempted by Kueue, requeued in LocalQueue team-a: Preempted to accommodate a workload "
                          "due to prioritization in the ClusterQueue")


def test_requeued_after_a_preemption_it_waits_for_quota_and_says_it_was_preempted() -> None:
    got = k8s_kueue.admission(workload(cond("QuotaReserved", "False", "Pending", PENDING), requeued=True), "q")
    assert got.preempted and got.reason.startswith("preempted by Kueue earlier, requeued; waiting for quota in "
                                                   "LocalQueue q: ")


def test_kueues_eviction_count_is_read_and_noted_on_the_job_for_the_runs_tags() -> None:
    evicted = cond("Evicted", "True", "Preempted", PREEMPTED)
    got = k8s_kueue.admission(workload(evicted, cond("QuotaReserved", "False"), evictions=3), "team-a")
    assert got.evictions == 3  # summed over Kueue's reasons and causes
    # the count Kueue has not written yet: an eviction seen is at least one
    assert k8s_kueue.admission(workload(evicted), "team-a").evictions == 1
    readmitted = k8s_kueue.admission(workload(cond("Admitted", "True"), evictions=2), "team-a")
    assert readmitted.admitted and readmitted.preempted and readmitted.evictions == 2
    waiting = k8s_kueue.admission(workload(cond("QuotaReserved", "False", "Pending", PENDING), evictions=1), "q")
    assert waiting.preempted and waiting.reason.startswith("preempted by Kueue earlier")
    assert k8s_kueue.eviction_tags(got) == {"kueue.evictions": "3", "kueue.last_eviction": got.reason}
    job: dict[str, Any] = {"metadata": {"name": "t1"}}
    assert k8s_kueue.evictions_noted(job) == 0
    job["metadata"]["annotations"] = {k8s_kueue.EVICTIONS_NOTED: "2"}
    assert k8s_kueue.evictions_noted(job) == 2
    job["metadata"]["annotations"] = {k8s_kueue.EVICTIONS_NOTED: "-1; drop"}  # not ours: as if none was noted
    assert k8s_kueue.evictions_noted(job) == 0


def test_admitted_and_reserved_states() -> None:
    admitted = k8s_kueue.admission(workload(cond("QuotaReserved", "True"), cond("Admitted", "True")), "q")
    assert admitted.admitted and admitted.reason == "admitted by Kueue: starting"  # its Job not unsuspended yet
    assert admitted.admitted_at == 1795687200.0  # 2026-11-26T10:00:00Z
    checks = k8s_kueue.admission(workload(cond("QuotaReserved", "True"), cond("Admitted", "False")), "q")
    assert not checks.admitted and "admission checks" in checks.reason


def test_a_deactivated_workload_says_so() -> None:
    got = k8s_kueue.admission(workload(cond("Deactivated", "True", "", "stopped by an admin"), active=False), "q")
    assert got.reason == "deactivated in Kueue: stopped by an admin"


def test_workloads_are_found_by_their_jobs_uid() -> None:
    other = {"metadata": {"ownerReferences": [{"kind": "JobSet", "uid": "x"}]}}
    mine = workload()
    assert k8s_kueue.by_job([other, mine]) == {JOB_UID: mine}


def test_usage_is_empty_for_a_cluster_queue_without_the_resource() -> None:
    assert k8s_kueue.usage({"metadata": {"name": "cpu-only"}, "spec": {"resourceGroups": []}}) == ""


class FakeCustomApi:
    """Stands in for the API server's CustomObjectsApi (the real one runs in tests/operator/test_kueue_cluster.py):
    answers Workload lists by the job-uid selector and records each request."""

    def __init__(self, workloads: list[dict[str, Any]]):
        self.workloads = workloads
        self.requests: list[str] = []

    def list_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str,
                                      label_selector: str) -> dict[str, Any]:
        self.requests.append(label_selector)
        wanted = set(label_selector.split(" in (", 1)[1].rstrip(")").split(","))
        return {"items": [w for w in self.workloads
                          if w["metadata"]["ownerReferences"][0]["uid"] in wanted]}

    def get_namespaced_custom_object(self, *args: Any) -> dict[str, Any]:
        self.requests.append("localqueue")
        return {"spec": {"clusterQueue": "team-a"}}

    def get_cluster_custom_object(self, *args: Any) -> dict[str, Any]:
        self.requests.append("clusterqueue")
        return CLUSTER_QUEUE


def suspended_job(uid: str, *, finished: bool = False) -> dict[str, Any]:
    conditions = [{"type": "Complete", "status": "True"}] if finished else []
    return {"metadata": {"uid": uid}, "spec": {"suspend": True}, "status": {"conditions": conditions}}


def test_the_reader_asks_only_for_the_waiting_jobs_workloads_in_bounded_selectors_and_in_bounded_time() -> None:
    pending = cond("QuotaReserved", "False", "Pending", PENDING)
    workloads = []
    for i in range(120):
        wl = workload(pending)
        wl["metadata"]["ownerReferences"] = [{"kind": "Job", "uid": f"uid-{i:03d}"}]
        workloads.append(wl)
    api = FakeCustomApi(workloads)
    reader = k8s_kueue.QueueReader(api, "ns", lambda fn, *a, **kw: fn(*a, **kw), (RuntimeError,))
    jobs: dict[str | None, dict[str, Any]] = {f"t{i}": suspended_job(f"uid-{i:03d}") for i in range(120)}
    jobs["running"] = {"metadata": {"uid": "r"}, "spec": {"suspend": False}, "status": {}}
    jobs["done"] = suspended_job("d", finished=True)
    found = reader.waiting("s", "team-a", jobs)
    assert set(found) == {f"t{i}" for i in range(120)}  # neither the admitted nor the finished Job
    assert all(a.reason.startswith("waiting for quota in LocalQueue team-a") for a in found.values())
    selectors = [r for r in api.requests if r.startswith("kueue.x-k8s.io/job-uid in (")]
    assert [len(r.split(",")) for r in selectors] == [50, 50, 20]
    assert api.requests[-2:] == ["localqueue", "clusterqueue"]  # its usage read with them

    def passing(seconds: float) -> None:  # move the reader's clocks back, as if `seconds` had passed
        read_at, partial_at, *rest = reader._seen["s"]
        reader._seen["s"] = (read_at - seconds, partial_at - seconds, *rest)

    asked = len(api.requests)
    del jobs["t0"]  # admitted: no longer waiting
    jobs["t120"] = suspended_job("uid-120")
    again = reader.waiting("s", "team-a", jobs)
    assert len(api.requests) == asked and again["t120"].reason == "waiting in LocalQueue team-a"  # within 1 s
    passing(1.0)  # then a Job that started waiting is read, alone
    again = reader.waiting("s", "team-a", jobs)
    assert api.requests[asked:] == ["kueue.x-k8s.io/job-uid in (uid-120)", "localqueue", "clusterqueue"]
    assert "t0" not in again and again["t120"].reason.startswith("waiting for Kueue to take it")  # no Workload yet
    api.workloads.append(workload(cond("Admitted", "True")))
    api.workloads[-1]["metadata"]["ownerReferences"] = [{"kind": "Job", "uid": "uid-120"}]
    passing(1.0)
    assert reader.waiting("s", "team-a", jobs)["t120"].admitted  # read again: it had none
    api.workloads[-1]["status"]["conditions"] = [cond("Evicted", "True", "Preempted", PREEMPTED)]
    passing(1.0)
    asked = len(api.requests)
    assert reader.waiting("s", "team-a", jobs)["t120"].preempted  # read as admitted: read again, now preempted
    assert api.requests[asked:] == ["kueue.x-k8s.io/job-uid in (uid-120)", "localqueue", "clusterqueue"]
    passing(1.0)
    asked = len(api.requests)
    assert reader.waiting("s", "team-a", jobs)["t1"].reason and len(api.requests) == asked  # nothing in passing
    passing(5.0)  # REFRESH_S: every waiting Job's Workload again
    reader.waiting("s", "team-a", jobs)
    assert len(api.requests) == asked + 3 + 2
    assert reader.waiting("s", None, jobs) == {}  # no queue: nothing is read


def test_a_trimmed_workload_reads_the_same() -> None:
    evicted = workload(cond("Evicted", "True", "Preempted", PREEMPTED), cond("QuotaReserved", "False"), requeued=True,
                       evictions=2)
    evicted["spec"]["podSets"] = [{"name": "main", "template": {"spec": {"containers": [{"name": "c" * 1000}]}}}]
    trimmed = k8s_kueue.trim_workload(evicted)
    assert "podSets" not in trimmed["spec"] and len(str(trimmed)) < 1000
    assert k8s_kueue.admission(trimmed, "q") == k8s_kueue.admission(evicted, "q")
    assert k8s_kueue.by_job([trimmed]) == {JOB_UID: trimmed}
