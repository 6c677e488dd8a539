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


def workload(*conditions: dict[str, Any], requeued: bool = False, **spec: Any) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": list(conditions)}
    if requeued:
        status["requeueState"] = {"count": 1}
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
    "status": {"flavorsUsage": [{"name": "h100-80gb", "resources": [{"name": "nvidia.com/gpu", "total": "8"}]}]},
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
    got = k8s_kueue.admission(workload(evicted, cond("QuotaReserved", "False")), "team-a")
    assert got.preempted and not got.admitted
    assert got.reason == ("preempted by Kueue, requeued in LocalQueue team-a: Preempted to accommodate a workload "
                          "due to prioritization in the ClusterQueue")


def test_requeued_after_a_preemption_it_waits_for_quota_and_says_it_was_preempted() -> None:
    got = k8s_kueue.admission(workload(cond("QuotaReserved", "False", "Pending", PENDING), requeued=True), "q")
    assert got.preempted and got.reason.startswith("preempted by Kueue earlier, requeued; waiting for quota in "
                                                   "LocalQueue q: ")


def test_admitted_and_reserved_states() -> None:
    admitted = k8s_kueue.admission(workload(cond("QuotaReserved", "True"), cond("Admitted", "True")), "q")
    assert admitted.admitted and admitted.reason == ""
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
