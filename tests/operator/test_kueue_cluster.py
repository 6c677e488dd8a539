"""Sweeps admitted by real Kueue (tests/cluster/kueue.py: the pinned release's manager, CRDs and webhooks) on the
test control plane, with the chart's operator as in test_controller_cluster.py (its ServiceAccount, its RBAC).

The Kueue objects are a platform team's: a ResourceFlavor per GPU type (its node labels), ClusterQueues with GPU
quotas, LocalQueues in the sweeps' namespace, WorkloadPriorityClasses. kwok runs the admitted trials' pods (the
Sweep's test annotations say how long each runs).
"""

from __future__ import annotations

import json
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubesweep.wire.outcomes import Outcome
from tests.operator.test_controller_cluster import (  # noqa: F401  (installed: the module's chart release)
    OPERATOR,
    Installed,
    OperatorProcess,
    Recorder,
    cli,
    installed,
    job_finished,
    kubectl_apply,
    sweep_file,
    sweep_jobs,
    trial_slices,
    wait_phase,
)

pytestmark = pytest.mark.cluster

KUEUE = "kueue.x-k8s.io/v1beta2"
H100 = "ks-h100-80gb"
A100 = "ks-a100-40gb"
RESOURCES = ("cpu", "memory", "nvidia.com/gpu")


def _kwok() -> Any:
    return sys.modules["kubesweep_kwok_cluster"]


def flavor(name: str, product: str) -> dict[str, Any]:
    return {"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": name},
            "spec": {"nodeLabels": {"nvidia.com/gpu.product": product}}}


def cluster_queue(name: str, gpus: int, *, cohort: str | None = None, borrowing: int | None = None,
                  preemption: dict[str, Any] | None = None, a100: int | None = None) -> dict[str, Any]:
    """A ClusterQueue with `gpus` H100s (and `a100` A100s: a flavor per GPU type, tried in that order)."""
    def quota(flavor_name: str, count: int) -> dict[str, Any]:
        gpu: dict[str, Any] = {"name": "nvidia.com/gpu", "nominalQuota": count}
        if borrowing is not None:
            gpu["borrowingLimit"] = borrowing
        return {"name": flavor_name, "resources": [{"name": "cpu", "nominalQuota": 1000},
                                                    {"name": "memory", "nominalQuota": "10Ti"}, gpu]}

    flavors = [quota(H100, gpus)] + ([quota(A100, a100)] if a100 is not None else [])
    spec: dict[str, Any] = {
        "namespaceSelector": {},
        "resourceGroups": [{"coveredResources": list(RESOURCES), "flavors": flavors}],
        "preemption": preemption or {"withinClusterQueue": "LowerPriority"},
    }
    if cohort:
        spec["cohortName"] = cohort
    return {"apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec}


def local_queue(name: str, namespace: str, cq: str) -> dict[str, Any]:
    return {"apiVersion": KUEUE, "kind": "LocalQueue", "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterQueue": cq}}


def priority(name: str, value: int) -> dict[str, Any]:
    return {"apiVersion": KUEUE, "kind": "WorkloadPriorityClass", "metadata": {"name": name}, "value": value}


@pytest.fixture(scope="module")
def queued(installed: Installed, kueue: Any) -> Iterator[Installed]:  # noqa: F811  (the imported fixture)
    """The chart's namespace managed by Kueue, with the platform's queues: `solo` (4 H100 GPUs, alone),
    `team-a` and `team-b` (4 H100s and 2 A100s each, a ResourceFlavor per GPU type; one cohort, borrowing up to 4
    more of each, reclaiming what they lent)."""
    cluster, ns = installed.cluster, installed.namespace
    cluster.kubectl("label", "namespace", ns, "kubesweep.io/kueue=enabled")
    reclaim = {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Any"}
    objects = [flavor(H100, "NVIDIA-H100-80GB-HBM3"), flavor(A100, "NVIDIA-A100-SXM4-40GB"),
               priority("ks-low", 100), priority("ks-high", 1000), cluster_queue("ks-solo", 4),
               cluster_queue("ks-team-a", 4, cohort="ks-research", borrowing=4, preemption=reclaim, a100=2),
               cluster_queue("ks-team-b", 4, cohort="ks-research", borrowing=4, preemption=reclaim, a100=2),
               local_queue("solo", ns, "ks-solo"), local_queue("team-a", ns, "ks-team-a"),
               local_queue("team-b", ns, "ks-team-b")]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))
    _kwok().wait_until("the ClusterQueues to be active", lambda: all(
        any(c["type"] == "Active" and c["status"] == "True"
            for c in (cluster.get_json("clusterqueue", cq).get("status") or {}).get("conditions") or [])
        for cq in ("ks-solo", "ks-team-a", "ks-team-b")), 60, 0.5)
    try:
        yield installed
    finally:
        cluster.kubectl("delete", "-f", "-", "--wait=false", "--ignore-not-found", check=False,
                        input=yaml.safe_dump_all(objects))


def queued_sweep(tmp_path: Path, name: str, batch_sizes: list[int], *, queue: str | None, duration: str,
                 repeats: int = 1, window: int = 8, priority_class: str | None = None) -> Path:
    path = sweep_file(tmp_path, name, {"gpu": ["h100-80gb"], "batch_size": batch_sizes},
                      hooks={"kubesweep.io/test-duration": duration}, concurrency={"max_parallel": window})
    doc = yaml.safe_load(path.read_text())
    if queue:
        doc["spec"]["queue"] = queue
    doc["spec"]["repeats"] = repeats
    if priority_class:
        doc["spec"]["priority_class"] = priority_class
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def admitted_now(inst: Installed, selector: str) -> int:
    """Jobs Kueue let run (not suspended) and not finished, as the API server lists them now."""
    jobs = inst.cluster.get_json("jobs", "-l", selector, namespace=inst.namespace)["items"]
    return sum(1 for j in jobs if not j["spec"].get("suspend") and not job_finished(j))


class Sampler:
    """Samples `admitted_now` per selector every 0.2 s in a thread; keeps the maxima and every sample."""

    def __init__(self, inst: Installed, **selectors: str):
        self.inst = inst
        self.selectors = selectors
        self.samples: list[dict[str, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append({k: admitted_now(self.inst, s) for k, s in self.selectors.items()})
            time.sleep(0.2)

    def most(self, key: str) -> int:
        return max((s[key] for s in self.samples), default=0)


def test_the_operator_reads_kueue_and_writes_nothing_of_it(queued: Installed) -> None:
    """The chart's RBAC for Kueue (checked where Kueue's CRDs exist: `kubectl auth can-i` resolves the kind
    first): Workloads and LocalQueues read in the served namespace, ClusterQueues read cluster-wide, nothing
    written."""
    ns = queued.namespace
    who = f"system:serviceaccount:{ns}:{OPERATOR}"

    def can(verb: str, resource: str, namespace: str | None = ns) -> bool:
        args = ["auth", "can-i", verb, resource, "--as", who, *(["-n", namespace] if namespace else [])]
        return queued.cluster.kubectl(*args, check=False).stdout.strip() == "yes"

    allowed = [("list", "workloads.kueue.x-k8s.io"), ("get", "localqueues.kueue.x-k8s.io"),
               ("get", "clusterqueues.kueue.x-k8s.io", None)]
    denied = [("create", "workloads.kueue.x-k8s.io"), ("patch", "workloads.kueue.x-k8s.io"),
              ("patch", "localqueues.kueue.x-k8s.io"), ("list", "clusterqueues.kueue.x-k8s.io", None),
              ("update", "clusterqueues.kueue.x-k8s.io", None),
              ("create", "workloadpriorityclasses.kueue.x-k8s.io", None)]
    assert [a for a in allowed if not can(*a)] == []
    assert [d for d in denied if can(*d)] == []


def test_kueue_is_the_pinned_release_with_its_webhooks(queued: Installed, kueue: Any) -> None:
    """The manager is the release build-tools.sh pins (its startup line), and its Job webhook is live in a managed
    namespace: a Job in a queue created running comes back suspended (Kueue starts it on admission)."""
    assert f'"gitVersion":"{kueue.version}"' in kueue.log_path.read_text()
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "webhook-probe", "labels": {"kueue.x-k8s.io/queue-name": "solo"}},
           "spec": {"suspend": False, "template": {"spec": {"restartPolicy": "Never", "containers": [
               {"name": "c", "image": "registry.example/probe@sha256:" + "0" * 64}]}}}}
    made = queued.cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(job),
                                  namespace=queued.namespace)
    assert json.loads(made.stdout)["spec"]["suspend"] is True


def test_a_20_trial_sweep_in_a_4_gpu_queue_never_runs_more_than_4_and_says_why_the_rest_wait(
        queued: Installed, tmp_path: Path) -> None:
    """20 one-GPU trials, a window of 8 Jobs: Kueue admits 4 at a time (its quota), the operator keeps Jobs
    waiting suspended in the queue, `sweep status` gives Kueue's reason for a waiting trial, and all succeed."""
    inst = queued
    # trials of 5 s keep some waiting for ~25 s, however loaded the machine (the operator may take 30 s to start and
    # each `sweep status` several: at 1.5 s a loaded run could end its waiting before a status call caught it)
    path = queued_sweep(tmp_path, "quota", [8, 16, 32, 64, 128], queue="solo", duration="5s", repeats=4)
    op = OperatorProcess(inst, tmp_path / "operator.log").start()
    reason = ""
    try:
        with Sampler(inst, quota="kubesweep.io/sweep=quota") as sampler, Recorder(inst, "quota") as recorder:
            kubectl_apply(inst, path)

            def waiting_reason() -> str | None:
                shown = json.loads(cli(inst, "status", "quota", "-o", "json").stdout)
                return next((t["reason"] for t in shown["trials"] if "waiting for quota" in t.get("reason", "")),
                            None)

            reason = _kwok().wait_until("a trial waiting for Kueue's quota", waiting_reason, 150, 0.5)
            status = wait_phase(inst, "quota", {"Succeeded", "Failed"}, timeout=240, op=op)
    finally:
        op.kill(signal.SIGTERM)
    assert status["phase"] == "Succeeded", status
    assert status["counts"]["succeeded"] == 20
    assert 1 <= sampler.most("quota") <= 4, sampler.samples
    recorder.assert_each_trial_ran(20)
    assert "LocalQueue solo" in reason and "nvidia.com/gpu" in reason, reason
    # Kueue's own words, as of when it last tried to admit that trial: a trial may have ended since (3 of 4)
    assert re.search(r"ClusterQueue ks-solo: nvidia.com/gpu [0-4] of 4 in use", reason), reason
    jobs = sweep_jobs(inst, "quota")
    assert {j["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] for j in jobs} == {"solo"}
    # every Job went through Kueue: created suspended, so its start came at admission, after its creation
    assert all(j["status"]["startTime"] >= j["metadata"]["creationTimestamp"] for j in jobs)


def test_a_preempted_trial_is_requeued_and_resumes_its_job_and_its_outcome_is_recorded_once(
        queued: Installed, tmp_path: Path) -> None:
    """4 low-priority trials fill `solo`; a high-priority sweep's 4-GPU trial preempts them: each shows
    `preempted` (Kueue's words), its Job is suspended, not replaced, and runs again once readmitted; both sweeps
    succeed with one outcome per trial."""
    inst = queued
    # the low trials run long enough to be still running when the high sweep's Job is made and admitted, however
    # loaded the machine (at 8 s, a loaded run's low trials could end first: nothing to preempt)
    low = queued_sweep(tmp_path, "low", [8, 16, 32, 64], queue="solo", duration="25s", priority_class="ks-low")
    # the high trial holds the queue long enough that the low trials stay preempted (suspended, requeued) for
    # several status reads, however loaded the machine: at 1 s a loaded run could readmit them between two reads
    high = queued_sweep(tmp_path, "high", [8], queue="solo", duration="10s", priority_class="ks-high")
    doc = yaml.safe_load(high.read_text())
    doc["spec"]["resources"] = {"gpus_per_trial": 4}
    high.write_text(yaml.safe_dump(doc, sort_keys=False))
    op = OperatorProcess(inst, tmp_path / "operator.log", env={"KUBESWEEP_PRIORITY_CLASSES": "ks-low,ks-high"}).start()
    try:
        with Recorder(inst, "low") as recorder:
            kubectl_apply(inst, low)
            _kwok().wait_until("the 4 low trials running", lambda: admitted_now(inst, "kubesweep.io/sweep=low") == 4,
                               60, 0.3)
            kubectl_apply(inst, high)

            def preempted() -> str | None:
                shown = json.loads(cli(inst, "status", "low", "-o", "json").stdout)
                return next((t["reason"] for t in shown["trials"] if "preempted" in t.get("reason", "")), None)

            reason = _kwok().wait_until("a low trial shown preempted", preempted, 60, 0.5)
            assert wait_phase(inst, "high", {"Succeeded", "Failed"}, timeout=90, op=op)["phase"] == "Succeeded"
            status = wait_phase(inst, "low", {"Succeeded", "Failed"}, timeout=120, op=op)
    finally:
        op.kill(signal.SIGTERM)
    assert status["phase"] == "Succeeded", status
    assert "preempted by Kueue" in reason and "LocalQueue solo" in reason, reason
    assert len(recorder.jobs) == 4 and all(len(uids) == 1 for uids in recorder.jobs.values()), recorder.jobs
    runs = sorted(len(recorder.pods.get(uids[0], ())) for uids in recorder.jobs.values())
    assert runs == [2, 2, 2, 2], runs  # each preempted trial's one Job ran a second pod once readmitted
    # the eviction the operator saw is noted on the Job (its MLflow run tagged, where the sweep tracks: no MLflow
    # here; tests/operator/test_controller_realnode.py reads the tags), once: Kueue counted one eviction each
    noted = [(j["metadata"].get("annotations") or {}).get("kubesweep.io/kueue-evictions")
             for j in sweep_jobs(inst, "low")]
    assert set(noted) <= {"1", None} and "1" in noted, noted
    entries = trial_slices(inst, "low")
    assert len(entries) == 4 and all(e.final and e.outcome == Outcome.SUCCEEDED for e in entries.values())


def test_two_teams_share_a_cohort_as_their_cluster_queues_say(queued: Installed, tmp_path: Path) -> None:
    """team-a's 8 trials borrow team-b's idle quota (8 admitted, nominal 4); team-b's sweep then reclaims what it
    lent (Kueue preempts team-a's borrowed trials): 4 and 4 admitted, never more than the cohort's 8 GPUs, and both
    sweeps finish with every trial succeeded once."""
    inst = queued
    # team-a's trials run long enough that team-b's Jobs exist while they still hold the borrowed quota, however
    # slowly a loaded machine creates them: otherwise team-a may finish first and there is nothing to reclaim.
    # team-b's run long enough that all four are admitted at once however slowly their Jobs come: with short ones,
    # the first may end before the fourth is admitted, and 4 and 4 is never seen.
    share_a = queued_sweep(tmp_path, "share-a", [8, 16, 32, 64], queue="team-a", duration="25s", repeats=2)
    share_b = queued_sweep(tmp_path, "share-b", [8, 16, 32, 64], queue="team-b", duration="20s")
    op = OperatorProcess(inst, tmp_path / "operator.log").start()
    try:
        with Sampler(inst, a="kubesweep.io/sweep=share-a", b="kubesweep.io/sweep=share-b") as sampler:
            kubectl_apply(inst, share_a)
            _kwok().wait_until("team-a borrowing: 8 trials admitted",
                               lambda: admitted_now(inst, "kubesweep.io/sweep=share-a") == 8, 60, 0.3)
            kubectl_apply(inst, share_b)
            _kwok().wait_until("team-b reclaiming its quota: 4 and 4 admitted", lambda: (
                admitted_now(inst, "kubesweep.io/sweep=share-a") == 4
                and admitted_now(inst, "kubesweep.io/sweep=share-b") == 4), 90, 0.3)
            statuses = [wait_phase(inst, name, {"Succeeded", "Failed"}, timeout=180, op=op)
                        for name in ("share-a", "share-b")]
    finally:
        op.kill(signal.SIGTERM)
    assert [s["phase"] for s in statuses] == ["Succeeded", "Succeeded"], statuses
    assert [s["counts"]["succeeded"] for s in statuses] == [8, 4]
    assert sampler.most("a") == 8 and sampler.most("b") == 4, sampler.samples
    assert all(s["a"] + s["b"] <= 8 for s in sampler.samples), sampler.samples  # the cohort's GPUs
    for name, trials in (("share-a", 8), ("share-b", 4)):
        entries = trial_slices(inst, name)
        assert len(entries) == trials and all(e.final and e.outcome == Outcome.SUCCEEDED for e in entries.values())


def test_the_operator_killed_while_kueue_holds_trials_loses_and_duplicates_nothing(queued: Installed,
                                                                                   tmp_path: Path) -> None:
    """SIGKILL the operator twice while a 12-trial sweep waits in and runs from a 4-GPU queue: each trial's Job
    is created once and runs one pod, and every outcome is recorded. The sweep names no queue: the operator's
    default queue (--default-queue, the chart's kueue.defaultQueue) is used."""
    inst = queued
    path = queued_sweep(tmp_path, "restarted", [8, 16, 32], queue=None, duration="1500ms", repeats=4)
    op = OperatorProcess(inst, tmp_path / "operator.log", env={"KUBESWEEP_DEFAULT_QUEUE": "solo"})
    try:
        with Recorder(inst, "restarted") as recorder:
            kubectl_apply(inst, path)
            op.start()  # killed once its first Jobs exist (waiting for admission)
            _kwok().wait_until("the first trial Jobs", lambda: sweep_jobs(inst, "restarted"), 60, 0.2)
            op.kill(signal.SIGKILL)
            op.start()  # and once 4 trials finished, with Kueue holding the next ones
            _kwok().wait_until("4 trials finished", lambda: sum(
                job_finished(j) for j in sweep_jobs(inst, "restarted")) >= 4, 90, 0.2)
            op.kill(signal.SIGKILL)
            op.start()
            status = wait_phase(inst, "restarted", {"Succeeded", "Failed"}, timeout=180, op=op)
    finally:
        op.kill(signal.SIGTERM)
    assert status["phase"] == "Succeeded" and status["counts"]["succeeded"] == 12, status
    recorder.assert_each_trial_ran(12)
    jobs = sweep_jobs(inst, "restarted")
    assert {j["metadata"]["labels"].get("kueue.x-k8s.io/queue-name") for j in jobs} == {"solo"}


def test_a_sweep_author_cannot_give_trials_a_priority_the_operator_was_not_allowed(queued: Installed,
                                                                                   tmp_path: Path) -> None:
    """The operator creates trial Jobs as itself: a policy keeping `ks-high` to some users would see the operator,
    not the Sweep's author. With only `ks-low` allowed, a Sweep naming `ks-high` is Invalid and no Job is made."""
    inst = queued
    path = queued_sweep(tmp_path, "greedy", [8], queue="solo", duration="1s", priority_class="ks-high")
    op = OperatorProcess(inst, tmp_path / "operator.log", env={"KUBESWEEP_PRIORITY_CLASSES": "ks-low"}).start()
    try:
        kubectl_apply(inst, path)
        status = wait_phase(inst, "greedy", {"Invalid", "Running", "Succeeded"}, timeout=60, op=op)
    finally:
        op.kill(signal.SIGTERM)
    assert status["phase"] == "Invalid", status
    assert "spec.priority_class: 'ks-high' is not a priority class this operator may give trials" in status["message"]
    assert "allowed: ks-low" in status["message"]
    assert sweep_jobs(inst, "greedy") == []


def test_a_multi_node_trial_is_admitted_as_one_workload_all_pods_or_none(queued: Installed,
                                                                         tmp_path: Path) -> None:
    """Two pods of two GPUs each (an Indexed Job) in the 4-GPU queue: Kueue admits the trial as one Workload of
    both pods, and never one pod alone; a trial of two pods of four GPUs (8 > the queue's 4) is admitted never,
    no pod of it is made, and its status says why."""
    inst = queued
    fits = queued_sweep(tmp_path, "mn-fits", [8], queue="solo", duration="1500ms")
    too_big = queued_sweep(tmp_path, "mn-too-big", [8], queue="solo", duration="1500ms")
    for path, gpus in ((fits, 2), (too_big, 4)):
        doc = yaml.safe_load(path.read_text())
        doc["spec"]["resources"] = {"gpus_per_trial": gpus, "num_nodes": 2, "retries": 0}
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
    op = OperatorProcess(inst, tmp_path / "operator.log").start()
    try:
        kubectl_apply(inst, fits)
        kubectl_apply(inst, too_big)
        status = wait_phase(inst, "mn-fits", {"Succeeded", "Failed"}, timeout=180, op=op)

        def unadmitted_reason() -> str | None:
            shown = json.loads(cli(inst, "status", "mn-too-big", "-o", "json").stdout)
            return next((t["reason"] for t in shown["trials"] if "nvidia.com/gpu" in t.get("reason", "")), None)

        reason = _kwok().wait_until("the oversized trial's reason", unadmitted_reason, 60, 0.5)
    finally:
        op.kill(signal.SIGTERM)
    assert status["phase"] == "Succeeded", status
    workloads = inst.cluster.get_json("workloads", namespace=inst.namespace)["items"]
    owned = {w["metadata"]["ownerReferences"][0]["name"]: w for w in workloads}
    [fits_job] = sweep_jobs(inst, "mn-fits")
    [big_job] = sweep_jobs(inst, "mn-too-big")
    admitted = owned[fits_job["metadata"]["name"]]
    assert [p["count"] for p in admitted["spec"]["podSets"]] == [2]  # one Workload holds both pods
    assert [a["count"] for a in admitted["status"]["admission"]["podSetAssignments"]] == [2]
    held = owned[big_job["metadata"]["name"]]
    assert "admission" not in held.get("status", {})
    assert big_job["spec"]["suspend"] is True
    pods = inst.cluster.get_json("pods", "-l", f"batch.kubernetes.io/job-name={big_job['metadata']['name']}",
                                 namespace=inst.namespace)["items"]
    assert pods == []  # not one of its pods was made: nothing holds a GPU for a trial that cannot run
    assert "nvidia.com/gpu" in reason, reason
    inst.cluster.kubectl("delete", "sweep", "mn-too-big", "-n", inst.namespace, "--wait=false", check=False)
