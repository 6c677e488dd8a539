"""The test cluster is a real control plane: GPU-label scheduling, API validation, Job outcomes (Stages)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid
from datetime import datetime
from typing import Any

import pytest
import yaml

kc = sys.modules["kubesweep_kwok_cluster"]  # loaded by conftest.py

pytestmark = pytest.mark.cluster

H100 = "NVIDIA-H100-80GB-HBM3"
L4 = "NVIDIA-L4"
L40S = "NVIDIA-L40S"


def gpu_job(
    name: str,
    *,
    product: str | None = None,
    gpus: int = 1,
    annotations: dict[str, str] | None = None,
    completions: int = 1,
    parallelism: int = 1,
    backoff_limit: int = 0,
    pod_failure_policy: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A trial-like Job: GPU request, GPU-taint toleration, optional product selector, test annotations."""
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [
            {
                "name": "trial",
                "image": "registry.invalid/kubesweep-test-job:0",
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
            }
        ],
    }
    if product:
        pod_spec["nodeSelector"] = {"nvidia.com/gpu.product": product}
    spec: dict[str, Any] = {
        "completions": completions,
        "parallelism": parallelism,
        "backoffLimit": backoff_limit,
        "template": {"metadata": {"annotations": annotations or {}}, "spec": pod_spec},
    }
    if pod_failure_policy:
        spec["podFailurePolicy"] = pod_failure_policy
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": spec}


def only_pod(cluster: Any, ns: str, job: str) -> dict[str, Any]:
    pods = cluster.job_pods(ns, job)
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return pods[0]


def terminated(pod: dict[str, Any]) -> dict[str, Any]:
    (status,) = pod["status"]["containerStatuses"]
    return status["state"]["terminated"]


def condition(obj: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    return next((c for c in obj.get("status", {}).get("conditions") or [] if c["type"] == ctype), None)


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


# ------------------------------------------------------------------------------------------- the components
def test_built_binaries_report_pinned_versions(k8s_cluster):
    bins = k8s_cluster.bin_dir or kc.bin_dir()
    if not (bins / "kube-apiserver").is_file():
        pytest.skip(f"external cluster and no binaries built in {bins} (run tests/cluster/build-tools.sh)")
    v = k8s_cluster.versions

    def run(*cmd: str) -> str:
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout

    assert run(str(bins / "kube-apiserver"), "--version").strip() == f"Kubernetes {v['k8s']}"
    assert run(str(bins / "kube-controller-manager"), "--version").strip() == f"Kubernetes {v['k8s']}"
    assert run(str(bins / "kube-scheduler"), "--version").strip() == f"Kubernetes {v['k8s']}"
    assert f"etcd Version: {v['etcd'].lstrip('v')}" in run(str(bins / "etcd"), "--version")
    assert v["kwok"] in run(str(bins / "kwok"), "--version")
    assert v["kwok"] in run(str(bins / "kwokctl"), "--version")
    helm = run(str(bins / "helm"), "version", "--template", "{{ .Version }}").strip()
    assert helm == v["helm"]


def test_server_is_the_pinned_kube_apiserver(k8s_cluster):
    info = yaml.safe_load(k8s_cluster.kubectl("get", "--raw", "/version").stdout)
    if k8s_cluster.name is None:
        pytest.skip(f"external cluster runs {info['gitVersion']}; the pin applies to the kwok cluster")
    assert info["gitVersion"] == k8s_cluster.versions["k8s"]
    assert info["major"] == "1"
    assert info["minor"] == k8s_cluster.versions["k8s"].split(".")[1]


def test_fake_gpu_nodes_carry_gpu_feature_discovery_labels(k8s_cluster):
    catalog = yaml.safe_load(kc.GPU_CATALOG.read_text())["gpus"]
    nodes = k8s_cluster.get_json("nodes", "-l", f"{kc.TEST_NODE_LABEL}=true")["items"]
    by_product: dict[str, list[str]] = {}
    for node in nodes:
        labels = node["metadata"]["labels"]
        by_product.setdefault(labels["nvidia.com/gpu.product"], []).append(node["metadata"]["name"])
        assert labels["nvidia.com/gpu.present"] == "true"
        assert labels["nvidia.com/gpu.count"] == "8"
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert node["status"]["capacity"]["nvidia.com/gpu"] == "8"
        assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in node["spec"]["taints"]
        assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
        assert condition(node, "Ready")["status"] == "True"
    for short in kc.GPU_NODE_TYPES:
        entry = catalog[short]
        names = by_product.get(entry["product"], [])
        assert len(names) >= 2, (short, by_product)
        node = next(n for n in nodes if n["metadata"]["name"] == names[0])
        assert node["metadata"]["labels"]["nvidia.com/gpu.memory"] == str(entry["memory_gib"] * 1024)


# ------------------------------------------------------------------------------------------- scheduling
def test_h100_selector_job_lands_on_h100_node_and_completes(k8s_cluster, k8s_namespace):
    ns = k8s_namespace
    k8s_cluster.apply(gpu_job("h100", product=H100, annotations={kc.ANNOTATION_DURATION: "1s"}), ns)
    result, job = k8s_cluster.wait_for_job(ns, "h100")
    assert result == "Complete", job["status"]
    assert job["status"]["succeeded"] == 1
    pod = only_pod(k8s_cluster, ns, "h100")
    assert k8s_cluster.gpu_nodes()[pod["spec"]["nodeName"]] == H100
    assert pod["status"]["phase"] == "Succeeded"
    assert terminated(pod)["exitCode"] == 0
    assert terminated(pod)["reason"] == "Completed"


def test_l4_selector_never_lands_on_l40s(k8s_cluster, k8s_namespace):
    # Three pods of 8 GPUs each against two L4 nodes of 8 GPUs: at most two fit; the rest stays Pending
    # although the L40S nodes could take it, and the scheduler says why: every non-L4 node fails the selector.
    # A prefix or substring match of the product label would put it on an L40S node.
    ns = k8s_namespace
    job = gpu_job(
        "l4",
        product=L4,
        gpus=8,
        completions=3,
        parallelism=3,
        annotations={kc.ANNOTATION_OUTCOME: "hang"},
    )
    k8s_cluster.apply(job, ns)
    nodes = k8s_cluster.gpu_nodes()
    n_other = sum(1 for p in nodes.values() if p != L4)
    assert sum(1 for p in nodes.values() if p == L40S) >= 2

    def settled():
        # every pod either runs on a node or has been found unschedulable, with its FailedScheduling event
        pods = k8s_cluster.job_pods(ns, "l4")
        if len(pods) != 3:
            return None
        running = [p for p in pods if p["status"].get("phase") == "Running"]
        pending = [p for p in pods if (condition(p, "PodScheduled") or {}).get("reason") == "Unschedulable"]
        if len(running) + len(pending) != 3 or not pending:
            return None
        events = [e for e in k8s_cluster.events(ns) if e["reason"] == "FailedScheduling"]
        return (running, pending, events) if events else None

    running, pending, events = kc.wait_until("the L4 pods to be placed or found unschedulable", settled, 60)
    assert all(nodes[p["spec"]["nodeName"]] == L4 for p in running)
    assert len({p["spec"]["nodeName"] for p in running}) == len(running)
    assert all(not p["spec"].get("nodeName") for p in pending)
    message = events[-1]["message"]
    # every GPU node of another type fails the selector (and any node another test added meanwhile: the cluster
    # may be shared by parallel workers, tests/support/cluster_fixtures.py)
    failed = re.search(r"(\d+) node\(s\) didn't match Pod's node affinity/selector", message)
    assert failed and int(failed.group(1)) >= n_other, message
    time.sleep(2)  # later scheduling attempts do not place it elsewhere either
    for pod in k8s_cluster.job_pods(ns, "l4"):
        if pod["spec"].get("nodeName"):
            assert nodes[pod["spec"]["nodeName"]] == L4


def test_job_asking_for_more_gpus_than_any_node_stays_pending(k8s_cluster, k8s_namespace):
    ns = k8s_namespace
    k8s_cluster.apply(gpu_job("too-big", gpus=kc.GPUS_PER_NODE + 1), ns)

    def failed_scheduling():
        pods = k8s_cluster.job_pods(ns, "too-big")
        if len(pods) != 1:
            return None
        events = k8s_cluster.events(ns, pods[0]["metadata"]["name"])
        hits = [e for e in events if e["reason"] == "FailedScheduling"]
        return (pods[0], hits[0]) if hits else None

    pod, event = kc.wait_until("a FailedScheduling event", failed_scheduling, 60)
    assert event["type"] == "Warning"
    assert "Insufficient nvidia.com/gpu" in event["message"], event["message"]
    time.sleep(3)
    pod = only_pod(k8s_cluster, ns, "too-big")
    assert pod["status"]["phase"] == "Pending"
    assert not pod["spec"].get("nodeName")
    assert condition(pod, "PodScheduled")["reason"] == "Unschedulable"
    job = k8s_cluster.get_json("job", "too-big", namespace=ns)
    assert not condition(job, "Complete") and not condition(job, "Failed")


# ------------------------------------------------------------------------------------------- API validation
def test_apiserver_rejects_invalid_job(k8s_cluster, k8s_namespace):
    job = gpu_job("bad-restart")
    job["spec"]["template"]["spec"]["restartPolicy"] = "Always"
    proc = k8s_cluster.create(job, k8s_namespace, check=False)
    assert proc.returncode != 0
    assert "is invalid" in proc.stderr
    assert "spec.template.spec.restartPolicy" in proc.stderr
    assert 'valid values: "OnFailure", "Never"' in proc.stderr, proc.stderr
    jobs = k8s_cluster.get_json("jobs", namespace=k8s_namespace)["items"]
    assert jobs == []


def test_apiserver_rejects_custom_resource_against_crd_schema(k8s_cluster, k8s_namespace):
    group = f"t{uuid.uuid4().hex[:8]}.test.kubesweep.io"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "required": ["gpu", "replicas"],
                                    "properties": {
                                        "gpu": {"type": "string", "enum": ["h100-80gb", "l4"]},
                                        "replicas": {"type": "integer", "minimum": 1},
                                    },
                                }
                            },
                        }
                    },
                }
            ],
        },
    }
    k8s_cluster.create(crd)
    try:
        k8s_cluster.wait_established(f"widgets.{group}", timeout=30)

        def widget(name: str, spec: dict[str, Any]) -> dict[str, Any]:
            return {"apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec}

        # the discovery cache of kubectl may lag a freshly established CRD: retry the valid create briefly
        kc.wait_until(
            "a valid Widget to be accepted",
            lambda: (
                k8s_cluster.create(widget("good", {"gpu": "l4", "replicas": 2}), k8s_namespace).returncode
                == 0
            ),
            30,
        )
        bad = k8s_cluster.create(widget("bad", {"gpu": "l40", "replicas": 0}), k8s_namespace, check=False)
        assert bad.returncode != 0
        assert "is invalid" in bad.stderr, bad.stderr
        assert "spec.gpu" in bad.stderr and 'Unsupported value: "l40"' in bad.stderr, bad.stderr
        assert "spec.replicas" in bad.stderr and "should be greater than or equal to 1" in bad.stderr, (
            bad.stderr
        )
        missing = k8s_cluster.create(widget("missing", {"gpu": "l4"}), k8s_namespace, check=False)
        assert missing.returncode != 0 and "spec.replicas: Required value" in missing.stderr, missing.stderr
        names = [
            w["metadata"]["name"]
            for w in k8s_cluster.get_json(f"widgets.{group}", namespace=k8s_namespace)["items"]
        ]
        assert names == ["good"]
    finally:
        k8s_cluster.kubectl("delete", "crd", f"widgets.{group}", "--wait=false", check=False)


# ------------------------------------------------------------------------------------------- Job outcomes
def test_default_duration_then_success(k8s_cluster, k8s_namespace):
    ns = k8s_namespace
    k8s_cluster.apply(gpu_job("default"), ns)
    result, _ = k8s_cluster.wait_for_job(ns, "default")
    assert result == "Complete"
    state = terminated(only_pod(k8s_cluster, ns, "default"))
    # timestamps have whole seconds: a 2 s default run shows 1..3 s (more only on a loaded machine)
    assert 1 <= (ts(state["finishedAt"]) - ts(state["startedAt"])).total_seconds() <= 8


def test_duration_annotation_sets_the_run_time(k8s_cluster, k8s_namespace):
    ns = k8s_namespace
    k8s_cluster.apply(gpu_job("slow", annotations={kc.ANNOTATION_DURATION: "6s"}), ns)
    pod = kc.wait_until("the pod to run", lambda: next(iter(k8s_cluster.job_pods(ns, "slow")), None), 30)
    kc.wait_until(
        "the pod to be Running",
        lambda: only_pod(k8s_cluster, ns, "slow")["status"].get("phase") == "Running",
        30,
        0.2,
    )
    time.sleep(3)
    assert only_pod(k8s_cluster, ns, "slow")["status"]["phase"] == "Running"
    result, _ = k8s_cluster.wait_for_job(ns, "slow")
    assert result == "Complete"
    state = terminated(only_pod(k8s_cluster, ns, "slow"))
    assert (ts(state["finishedAt"]) - ts(state["startedAt"])).total_seconds() >= 5, (
        pod["metadata"]["name"],
        state,
    )


@pytest.mark.parametrize(
    ("annotations", "exit_code", "reason"),
    [
        ({kc.ANNOTATION_OUTCOME: "crash"}, 1, "Error"),
        ({kc.ANNOTATION_OUTCOME: "crash", kc.ANNOTATION_EXIT_CODE: "3"}, 3, "Error"),
        ({kc.ANNOTATION_OUTCOME: "oom"}, 137, "OOMKilled"),
    ],
    ids=["crash-default-exit", "crash-exit-3", "oom"],
)
def test_failure_outcome_fails_the_job(k8s_cluster, k8s_namespace, annotations, exit_code, reason):
    ns = k8s_namespace
    annotations = {**annotations, kc.ANNOTATION_DURATION: "1s"}
    k8s_cluster.apply(gpu_job("fail", annotations=annotations), ns)
    result, job = k8s_cluster.wait_for_job(ns, "fail")
    assert result == "Failed"
    assert condition(job, "Failed")["reason"] == "BackoffLimitExceeded"
    assert job["status"]["failed"] == 1
    pod = only_pod(k8s_cluster, ns, "fail")
    assert pod["status"]["phase"] == "Failed"
    assert terminated(pod)["exitCode"] == exit_code
    assert terminated(pod)["reason"] == reason


def test_crash_exit_code_drives_pod_failure_policy(k8s_cluster, k8s_namespace):
    ns = k8s_namespace
    policy = {"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]}
    job = gpu_job(
        "exit42",
        annotations={
            kc.ANNOTATION_OUTCOME: "crash",
            kc.ANNOTATION_EXIT_CODE: "42",
            kc.ANNOTATION_DURATION: "1s",
        },
        backoff_limit=5,
        pod_failure_policy=policy,
    )
    k8s_cluster.apply(job, ns)
    result, job = k8s_cluster.wait_for_job(ns, "exit42")
    assert result == "Failed"
    assert condition(job, "Failed")["reason"] == "PodFailurePolicy"
    assert len(k8s_cluster.job_pods(ns, "exit42")) == 1  # failed at once, no retry despite backoffLimit 5


def test_evicted_pod_fails_job_without_policy(k8s_cluster, k8s_namespace):
    ns = k8s_namespace
    k8s_cluster.apply(
        gpu_job("evict", annotations={kc.ANNOTATION_OUTCOME: "evict", kc.ANNOTATION_DURATION: "1s"}), ns
    )
    result, _ = k8s_cluster.wait_for_job(ns, "evict")
    assert result == "Failed"
    pod = only_pod(k8s_cluster, ns, "evict")
    assert pod["status"]["phase"] == "Failed"
    assert pod["status"]["reason"] == "Evicted"
    disruption = condition(pod, "DisruptionTarget")
    assert disruption and disruption["status"] == "True"
    assert disruption["reason"] == "TerminationByKubelet"
    events = k8s_cluster.events(ns, pod["metadata"]["name"])
    assert any(e["reason"] == "Evicted" and e["type"] == "Warning" for e in events), events


def test_evicted_pod_is_ignored_by_pod_failure_policy(k8s_cluster, k8s_namespace):
    ns = k8s_namespace
    policy = {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}
    job = gpu_job(
        "evict-ignored",
        annotations={kc.ANNOTATION_OUTCOME: "evict", kc.ANNOTATION_DURATION: "1s"},
        pod_failure_policy=policy,
    )
    k8s_cluster.apply(job, ns)

    def replaced():
        pods = k8s_cluster.job_pods(ns, "evict-ignored")
        evicted = [p for p in pods if p["status"].get("reason") == "Evicted"]
        return pods if len(evicted) >= 2 else None

    kc.wait_until("the evicted pod to be replaced", replaced, 60)
    job = k8s_cluster.get_json("job", "evict-ignored", namespace=ns)
    assert not condition(job, "Failed"), job["status"]
    assert not job["status"].get("failed"), job["status"]  # ignored failures are not counted (backoffLimit 0)
    k8s_cluster.kubectl("delete", "job", "evict-ignored", "--wait=false", namespace=ns)


def test_hang_outcome_keeps_the_pod_running(k8s_cluster, k8s_namespace):
    ns = k8s_namespace
    k8s_cluster.apply(
        gpu_job("hang", annotations={kc.ANNOTATION_OUTCOME: "hang", kc.ANNOTATION_DURATION: "1s"}), ns
    )
    kc.wait_until(
        "the pod to be Running",
        lambda: [p["status"].get("phase") for p in k8s_cluster.job_pods(ns, "hang")] == ["Running"],
        30,
        0.2,
    )
    time.sleep(4)
    assert only_pod(k8s_cluster, ns, "hang")["status"]["phase"] == "Running"
    k8s_cluster.kubectl("delete", "job", "hang", "--cascade=foreground", "--timeout=30s", namespace=ns)
    assert k8s_cluster.job_pods(ns, "hang") == []


def test_unknown_outcome_fails_loudly(k8s_cluster, k8s_namespace):
    ns = k8s_namespace
    k8s_cluster.apply(gpu_job("typo", annotations={kc.ANNOTATION_OUTCOME: "crsh"}), ns)
    result, _ = k8s_cluster.wait_for_job(ns, "typo")
    assert result == "Failed"
    pod = only_pod(k8s_cluster, ns, "typo")
    assert pod["status"]["reason"] == "UnknownTestOutcome"
    assert '"crsh"' in pod["status"]["message"]


def test_pods_outside_jobs_keep_running(k8s_cluster, k8s_namespace):
    ns = k8s_namespace
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "server"},
        "spec": gpu_job("x")["spec"]["template"]["spec"] | {"restartPolicy": "Always"},
    }
    k8s_cluster.apply(pod, ns)
    kc.wait_until(
        "the pod to be Running",
        lambda: k8s_cluster.get_json("pod", "server", namespace=ns)["status"].get("phase") == "Running",
        30,
        0.2,
    )
    time.sleep(3)
    assert k8s_cluster.get_json("pod", "server", namespace=ns)["status"]["phase"] == "Running"
