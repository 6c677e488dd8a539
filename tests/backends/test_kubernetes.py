"""The backend contract on the Kubernetes backend, against the real test control plane.

kwok runs no containers: pod annotations (`kwok_annotations`) ask the cluster's kwok Stages for the outcome the
job would have produced (docs/testing.md), so the real API server, Job controller and scheduler drive every path.
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kubesweep.backends.kubernetes import KubernetesBackend
from kubesweep.wire.outcomes import Outcome
from tests.backends.contract import BackendContract, Harness, kwok_annotations, make_plan

pytestmark = pytest.mark.cluster
DIGEST = "registry.example/kubesweep-job@sha256:" + "0" * 64


def counting_backend(monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> tuple[KubernetesBackend, dict[str, int]]:
    """A backend counting the Jobs it creates per trial: a trial's Job is applied only when it has none, so each is
    a start."""
    backend = KubernetesBackend(**kwargs)
    created: dict[str, int] = {}
    apply_all = backend.jobs.apply_all

    def counting(objects: list[dict[str, Any]]) -> None:
        for obj in objects:
            if obj["kind"] == "Job":
                trial = obj["metadata"]["labels"]["kubesweep.io/trial"]
                created[trial] = created.get(trial, 0) + 1
        apply_all(objects)

    monkeypatch.setattr(backend.jobs, "apply_all", counting)
    return backend, created


@pytest.fixture
def harness(k8s_cluster: Any, k8s_namespace: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    backend, created = counting_backend(monkeypatch, namespace=k8s_namespace, api_client=k8s_cluster.api_client(),
                                        pod_annotations=kwok_annotations)

    def starts(sweep: str, trial_id: str) -> int:
        return created.get(trial_id, 0)

    def gone(sweep: str, trial_id: str) -> bool:
        """The trial's Job is deleted (background propagation: its pods follow)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            jobs = backend.batch.list_namespaced_job(k8s_namespace, label_selector=f"kubesweep.io/trial={trial_id}")
            if not jobs.items:
                return True
            time.sleep(0.2)
        return False

    marker = sys.modules["kubesweep_kwok_cluster"].POD_LOG_MARKER  # kwok serves one log file for every pod
    yield Harness(backend=backend, starts=starts, timeout=90, log_marker=lambda trial: marker, gone=gone)
    backend.close()


@pytest.fixture(autouse=True)
def _pinned_image(monkeypatch: pytest.MonkeyPatch) -> None:
    """Contract plans carry no image and ask for no GPU; here trials need an image, and the cluster's nodes are
    all GPU nodes (tainted), so each trial asks for one GPU of any type."""
    import tests.backends.contract as contract

    real = contract.make_plan

    def with_image(name: str, matrix: dict[str, Any], **spec: Any) -> Any:
        spec.setdefault("resources", {"gpus_per_trial": 1, "retries": 0})
        return real(name, matrix, image=DIGEST, **spec)

    monkeypatch.setattr(contract, "make_plan", with_image)


class TestKubernetesBackend(BackendContract):
    pass


def test_unschedulable_trial_shows_the_schedulers_reason(k8s_cluster: Any, k8s_namespace: str) -> None:
    backend = KubernetesBackend(namespace=k8s_namespace, api_client=k8s_cluster.api_client())
    p = make_plan("too-big", {"gpu": ["h100-80gb"]}, image=DIGEST, resources={"gpus_per_trial": 16})
    backend.submit(p)
    seen: list[Any] = []

    def until_unschedulable(status: Any) -> None:
        if status.trials[0].phase.value == "Unschedulable":
            seen.append(status)
            raise StopIteration

    with pytest.raises(StopIteration):
        backend.wait(p.sweep.name, timeout=60, progress=until_unschedulable)
    assert "Insufficient nvidia.com/gpu" in seen[0].trials[0].reason
    backend.close()


def test_gpu_trials_land_on_their_exact_gpu_type(k8s_cluster: Any, k8s_namespace: str) -> None:
    backend = KubernetesBackend(namespace=k8s_namespace, api_client=k8s_cluster.api_client())
    p = make_plan("placement", {"gpu": ["l4", "l40s", "h100-80gb"]}, image=DIGEST, resources={"gpus_per_trial": 1})
    backend.submit(p)
    status = backend.wait(p.sweep.name, timeout=90)
    assert {t.outcome for t in status.trials} == {Outcome.SUCCEEDED}
    pods = k8s_cluster.get_json("pods", "-l", "kubesweep.io/sweep=placement", namespace=k8s_namespace)
    nodes = {p["metadata"]["labels"]["kubesweep.io/gpu"]: p["spec"]["nodeName"] for p in pods["items"]}
    products = k8s_cluster.gpu_nodes()
    for gpu, node in nodes.items():
        assert products[node] == {"l4": "NVIDIA-L4", "l40s": "NVIDIA-L40S", "h100-80gb": "NVIDIA-H100-80GB-HBM3"}[gpu]
    backend.close()


def test_rendered_manifests_pass_server_side_dry_run(k8s_cluster: Any, k8s_namespace: str) -> None:
    from kubesweep.manifests import render_plan, to_yaml

    for resources in ({"gpus_per_trial": 1}, {"gpus_per_trial": 8, "num_nodes": 2}, {"gpus_per_trial": 0}):
        p = make_plan("dry-run", {"batch_size": [8]}, image=DIGEST, resources=resources)
        text = to_yaml(render_plan(p, namespace=k8s_namespace))
        proc = k8s_cluster.kubectl("apply", "--dry-run=server", "-f", "-", namespace=k8s_namespace, input=text)
        assert "(server dry run)" in proc.stdout


def test_job_creates_reuse_the_clients_connections(k8s_cluster: Any, k8s_namespace: str) -> None:
    """Writes whose response body is not wanted hand their connection back to the pool: an unread response kept
    it, and every create opened a TLS connection of its own (the API server's CPU went to handshakes)."""
    from kubesweep.backends.k8s_reconcile import WRITE_THREADS

    backend = KubernetesBackend(namespace=k8s_namespace, kubeconfig=k8s_cluster.kubeconfig)
    p = make_plan("pooled", {"seed": list(range(40))}, image=DIGEST, resources={"gpus_per_trial": 1},
                  concurrency={"max_parallel": 40})
    backend.submit(p)
    jobs = backend.batch.list_namespaced_job(k8s_namespace, label_selector="kubesweep.io/sweep=pooled").items
    assert len(jobs) == 40
    manager = backend.client.rest_client.pool_manager
    # (the pool container refuses iteration; keys() is its way)
    opened = sum(manager.pools[key].num_connections for key in manager.pools.keys())  # noqa: SIM118
    assert 1 <= opened <= WRITE_THREADS + 4, opened  # the write threads, the watches, a read
    backend.delete("pooled")
    backend.close()


def test_a_namespace_that_does_not_exist_is_named_not_a_traceback(k8s_cluster: Any) -> None:
    """`sweep submit -n gpu-sweep` before the namespace exists: a BackendError (exit 4) that names it and says how
    to make it. It was an uncaught NotFoundException, a traceback and exit 1 ("trials failed")."""
    from kubesweep.backends.base import BackendError

    backend = KubernetesBackend(namespace="no-such-namespace-kw", api_client=k8s_cluster.api_client())
    with pytest.raises(BackendError, match=r"namespace 'no-such-namespace-kw' not found on the cluster: create it "
                                           r"\(`kubectl create namespace no-such-namespace-kw`\)"):
        backend.submit(make_plan("nowhere", {"batch_size": [8]}, image=DIGEST), wait=False)
    backend.close()


def test_trials_measured_alone_share_no_node(k8s_cluster: Any, k8s_namespace: str) -> None:
    """spec.placement.alone on the kwok GPU nodes (two of each type, 8 GPUs each): three h100 trials at once fit
    one node by GPUs, but the real scheduler places at most one per node and the third waits, named by its
    reason, until a node is free; every trial then runs."""
    backend = KubernetesBackend(namespace=k8s_namespace, api_client=k8s_cluster.api_client(),
                                pod_annotations=lambda trial: {"kubesweep.io/test-duration": "3s"})
    p = make_plan("alone", {"gpu": ["h100-80gb"], "batch_size": [8, 16, 32]}, image=DIGEST,
                  resources={"gpus_per_trial": 1}, placement={"alone": True}, concurrency={"max_parallel": 3})
    backend.submit(p)
    waiting: list[str] = []

    def note_waiting(status: Any) -> None:
        waiting.extend(t.reason for t in status.trials if t.phase.value == "Unschedulable")

    status = backend.wait(p.sweep.name, timeout=90, progress=note_waiting)
    assert {t.outcome for t in status.trials} == {Outcome.SUCCEEDED}
    assert any("anti-affinity" in reason for reason in waiting), waiting
    pods = k8s_cluster.get_json("pods", "-l", "kubesweep.io/sweep=alone", namespace=k8s_namespace)["items"]
    spans: dict[str, list[tuple[str, str]]] = {}
    for pod in pods:
        state = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        spans.setdefault(pod["spec"]["nodeName"], []).append((state["startedAt"], state["finishedAt"]))
    assert len(spans) == 2  # both h100 nodes used
    for runs in spans.values():
        runs.sort()
        assert all(end <= start for (_, end), (start, _) in itertools.pairwise(runs)), spans
    backend.close()
