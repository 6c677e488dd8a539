"""The GPUs a cluster's nodes offer (`k8s_gpus`): Node objects as the API server sends them; read from the test
control plane's kwok GPU nodes (a plan split by them; `sweep submit` saying so before it applies anything), refused
to a user without the right to list nodes, and trials of a GPU type no node has ending `unschedulable`."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubesweep.backends.base import Phase
from kubesweep.backends.k8s_client import Api
from kubesweep.backends.k8s_gpus import (
    ClusterGpus,
    NodesHidden,
    QueueFlavors,
    flavor_products,
    gpus_of,
    read_cluster_gpus,
)
from kubesweep.backends.kubernetes import KubernetesBackend
from kubesweep.preflight import gpu_fit
from kubesweep.session import Options, Session
from kubesweep.wire.outcomes import Outcome
from tests.backends.contract import make_plan


def node(product: str | None, gpus: Any = "8", **spec: Any) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.product": product} if product else {}
    return {"metadata": {"name": "n", "labels": labels}, "spec": spec,
            "status": {"allocatable": {"nvidia.com/gpu": gpus} if gpus is not None else {}}}


def test_each_product_label_with_its_nodes_allocatable_gpus() -> None:
    cluster = gpus_of([node("NVIDIA-L4"), node("NVIDIA-L4", "4"), node("NVIDIA-L40S", None), node(None),
                       node("NVIDIA-H100-80GB-HBM3", "8", unschedulable=True), node("Tesla-T4", "1.5")])
    assert cluster.products == {"NVIDIA-L4": [8, 4], "NVIDIA-L40S": [0], "Tesla-T4": [0]}  # a cordoned node: none


def test_fits_counts_nodes_with_enough_gpus() -> None:
    cluster = ClusterGpus({"NVIDIA-L4": [8, 4]})
    assert cluster.fits("NVIDIA-L4", 4, 2) and cluster.fits("NVIDIA-L4", 8)
    assert not cluster.fits("NVIDIA-L4", 8, 2) and not cluster.fits("NVIDIA-L4", 16)
    assert not cluster.fits("NVIDIA-L40S", 1)  # exact: an L40S is no L4, and an L4 no L40S


# -- against the test control plane: kwok nodes of h100-80gb, a100-40gb, l40s and l4 (tests/cluster) ---------

DIGEST = "registry.example/kubesweep-job@sha256:" + "0" * 64
FOUR = {"gpu": ["h100-80gb", "v100-32gb", "l4", "t4"], "batch_size": [8, 16]}  # two of them on the cluster


def restricted_kubeconfig(cluster: Any, namespace: str, path: Path) -> Path:
    """A kubeconfig of a ServiceAccount whose Role may do anything in `namespace` and nothing else: no node."""
    rbac = "rbac.authorization.k8s.io"
    cluster.apply([
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "author"}},
        {"apiVersion": f"{rbac}/v1", "kind": "Role", "metadata": {"name": "author"},
         "rules": [{"apiGroups": ["", "batch"], "resources": ["*"], "verbs": ["*"]}]},
        {"apiVersion": f"{rbac}/v1", "kind": "RoleBinding", "metadata": {"name": "author"},
         "roleRef": {"apiGroup": rbac, "kind": "Role", "name": "author"},
         "subjects": [{"kind": "ServiceAccount", "name": "author", "namespace": namespace}]}], namespace=namespace)
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    server = next(c for c in admin["clusters"] if c["name"] == context["cluster"])["cluster"]
    token = cluster.kubectl("create", "token", "author", "--duration=1h", namespace=namespace).stdout.strip()
    entry = {k: v for k, v in server.items() if k.startswith(("server", "certificate-authority"))}
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "author",
        "clusters": [{"name": "test", "cluster": entry}],
        "users": [{"name": "author", "user": {"token": token}}],
        "contexts": [{"name": "author", "context": {"cluster": "test", "user": "author", "namespace": namespace}}]}))
    return path


@pytest.mark.cluster
def test_the_clusters_gpu_types_are_read_and_a_plan_of_four_split_by_them(k8s_cluster: Any, k8s_namespace: str,
                                                                          tmp_path: Path) -> None:
    cluster = read_cluster_gpus(Api(k8s_cluster.api_client(), k8s_namespace))
    assert cluster.products["NVIDIA-H100-80GB-HBM3"] == [8, 8] and cluster.products["NVIDIA-L4"] == [8, 8]
    assert "Tesla-V100-SXM2-32GB" not in cluster.products and "Tesla-T4" not in cluster.products
    fits = gpu_fit(make_plan("four", FOUR, image=DIGEST, resources={"gpus_per_trial": 1}), cluster)
    assert [(f.gpu, f.runnable, f.stuck) for f in fits] == [("h100-80gb", 2, 0), ("v100-32gb", 0, 2), ("l4", 2, 0),
                                                            ("t4", 0, 2)]
    # `sweep submit` says so before it applies anything, and without --yes (not at a terminal) applies nothing
    spec = tmp_path / "four.yaml"
    spec.write_text(yaml.safe_dump({"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep",
                                    "metadata": {"name": "four"},
                                    "spec": {"image": DIGEST, "matrix": FOUR, "warm_pods": False}}))
    sets = ["--set", "job.max_steps=5", "--set", "concurrency={max_parallel: 2}"]  # carried into the commands
    args = ["submit", str(spec), "--backend", "kubernetes", "--direct", "--no-tracking", "-n", k8s_namespace,
            "--kubeconfig", str(k8s_cluster.kubeconfig), *sets]
    proc = subprocess.run([sys.executable, "-m", "kubesweep", *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "80"})  # commands stay whole
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("4 of this sweep's 8 GPU trials cannot run on this cluster")
    assert "  v100-32gb (Tesla-V100-SXM2-32GB): no node: none of its 2 trials can run (no node of it)" in lines
    command = shlex.join(["sweep", *args[:2], "--backend", "kubernetes", "--namespace", k8s_namespace,
                          "--kubeconfig", str(k8s_cluster.kubeconfig), "--direct", "--no-tracking", *sets])
    assert command.endswith(" --set job.max_steps=5 --set 'concurrency={max_parallel: 2}'")
    assert f"  {command} --gpu h100-80gb --gpu l4" in lines and f"  {command} --yes" in lines, lines
    assert lines[-1] == "nothing submitted: choose one of the commands above" and proc.stdout == ""
    assert not k8s_cluster.get_json("jobs", namespace=k8s_namespace)["items"]
    assert not [c for c in k8s_cluster.get_json("configmaps", namespace=k8s_namespace)["items"]
                if "four" in c["metadata"]["name"]]


@pytest.mark.cluster
@pytest.mark.parametrize("warm", [False, True], ids=["own-jobs", "warm-pods"])
def test_a_trial_no_node_can_take_ends_unschedulable_with_the_schedulers_reason(k8s_cluster: Any, k8s_namespace: str,
                                                                                warm: bool) -> None:
    backend = KubernetesBackend(namespace=k8s_namespace, api_client=k8s_cluster.api_client())
    p = make_plan("no-v100", {"gpu": ["v100-32gb"], "batch_size": [8, 16]}, image=DIGEST, warm_pods=warm,
                  resources={"gpus_per_trial": 1, "unschedulable_seconds": 3})
    began = time.monotonic()
    backend.submit(p)
    status = backend.wait(p.sweep.name, timeout=90)  # ends: no trial waits for ever
    assert time.monotonic() - began >= 2  # the bound, counted from a condition time in whole seconds
    assert {(t.phase, t.outcome) for t in status.trials} == {(Phase.FAILED, Outcome.UNSCHEDULABLE)}
    assert all("didn't match Pod's node affinity/selector" in t.reason for t in status.trials), status.trials
    assert status.has_failures and not any(t.settled for t in status.trials)  # resume runs them again
    deadline = time.monotonic() + 30
    while k8s_cluster.get_json("jobs", "-l", "kubesweep.io/sweep=no-v100", namespace=k8s_namespace)["items"]:
        assert time.monotonic() < deadline, "the Jobs of trials no node can take were not deleted"
        time.sleep(0.5)
    backend.close()


@pytest.mark.cluster
def test_a_user_who_may_not_list_nodes_is_told_in_one_line_and_submission_goes_on(
        k8s_cluster: Any, k8s_namespace: str, tmp_path: Path) -> None:
    kubeconfig = restricted_kubeconfig(k8s_cluster, k8s_namespace, tmp_path / "author.yaml")
    with pytest.raises(NodesHidden, match="cannot list resource \"nodes\""):
        read_cluster_gpus(Api.connect(k8s_namespace, kubeconfig))
    notes: list[tuple[str, bool]] = []
    s = Session(Options(backend="kubernetes", direct=True, namespace=k8s_namespace, kubeconfig=kubeconfig,
                        no_tracking=True), notify=lambda message, warning: notes.append((message, warning)))
    p = make_plan("hidden", {"gpu": ["l4"]}, image=DIGEST, resources={"gpus_per_trial": 1})
    assert s.cluster_fit(p) is None
    [(note, warning)] = notes
    assert warning and "\n" not in note and note.startswith("note: the cluster's GPU types are not checked: this "
                                                            "user may not list its nodes (nodes is forbidden: ")
    status = s.submit(p.sweep, p)
    assert status is not None and len(status.trials) == 1
    assert k8s_cluster.get_json("jobs", "-l", "kubesweep.io/sweep=hidden", namespace=k8s_namespace)["items"]
    assert isinstance(s.backend, KubernetesBackend)
    s.backend.close()


def test_a_queue_admits_the_gpu_types_its_flavors_name() -> None:
    def flavor(name: str, product: str | None) -> dict[str, Any]:
        return {"metadata": {"name": name}, "spec": {"nodeLabels": {"nvidia.com/gpu.product": product}} if product
                else {}}

    flavors = [flavor("h100", "NVIDIA-H100-80GB-HBM3"), flavor("cpu", None), flavor("l4", "NVIDIA-L4")]
    cq = {"spec": {"resourceGroups": [
        {"flavors": [{"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 4}]}]},
        {"flavors": [{"name": "cpu", "resources": [{"name": "cpu", "nominalQuota": 100}]},
                     {"name": "l4", "resources": [{"name": "cpu", "nominalQuota": 100}]}]}]}}  # l4: no GPU quota
    products = flavor_products(cq, flavors)
    assert products == {"NVIDIA-H100-80GB-HBM3"}
    cluster = ClusterGpus({"NVIDIA-H100-80GB-HBM3": [8], "NVIDIA-L4": [8]}, QueueFlavors("team-a", "cq-a", products))
    assert cluster.fits("NVIDIA-H100-80GB-HBM3", 8) and not cluster.fits("NVIDIA-L4", 1)  # nodes, but no flavor
