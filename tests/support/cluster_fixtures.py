"""pytest fixtures for tests against the real test control plane (see docs/testing.md); the root conftest
makes them available to every test module, so the cluster starts once per session whoever asks first.

- ``k8s_cluster`` (session): a :class:`kwok_cluster.K8sCluster`. With ``KUBESWEEP_TEST_KUBECONFIG`` set,
  the cluster of that kubeconfig is used as it is; otherwise the kwok cluster ``KUBESWEEP_TEST_CLUSTER``
  (default ``kubesweep-pytest-<hash of the checkout path>``) is created through the same code as
  ``tests/cluster/up --real-node`` (kwok GPU nodes plus one real node, see ``real_node.py``) and deleted at the
  end of the session (``KUBESWEEP_TEST_KEEP_CLUSTER=1`` keeps it; ``KUBESWEEP_TEST_REAL_NODE=0`` leaves the real
  node out, and the tests marked ``realnode`` then fail saying so).
  If it cannot start, every test using it fails with the reason; nothing is skipped.
  Under pytest-xdist the workers share one cluster: the first worker that asks starts it (under a lock in the
  run's shared temporary directory, where it leaves the cluster's address), the others attach to it as to an
  external one, and the controller process deletes it when every worker is done (``stop_shared_cluster``, called
  from the root conftest's ``pytest_sessionfinish``). A failed start is recorded there too, so every worker fails
  its cluster tests with the same reason at once instead of trying again.
- ``k8s_namespace`` (function): a fresh namespace (name returned), deleted after the test.
- ``kueue`` (session): Kueue beside that cluster (``tests/cluster/kueue.py``), started by the first test that asks
  and ended with the cluster; it manages the Jobs of namespaces labelled ``kubesweep.io/kueue=enabled`` only.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Loaded by path so it works whatever pytest's import mode, and stays runnable as a script (tests/cluster/up).
_spec = importlib.util.spec_from_file_location(
    "kubesweep_kwok_cluster", Path(__file__).parents[1] / "cluster" / "kwok_cluster.py"
)
assert _spec and _spec.loader
kwok_cluster = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = kwok_cluster
_spec.loader.exec_module(kwok_cluster)


SHARED_CLUSTER = "k8s-cluster.json"  # in the xdist run's shared temporary directory: the cluster the workers share


def _start() -> kwok_cluster.K8sCluster:
    name = os.environ.get("KUBESWEEP_TEST_CLUSTER") or kwok_cluster.pytest_cluster_name()
    real_node = os.environ.get("KUBESWEEP_TEST_REAL_NODE", "1") != "0"
    return kwok_cluster.start_cluster(name, recreate=True, with_real_node=real_node)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory every xdist worker of this run shares (the controller's base temporary directory)."""
    return tmp_path_factory.getbasetemp().parent


def _shared_cluster(shared: Path) -> kwok_cluster.K8sCluster:
    """The run's one cluster: started by the first worker that asks, attached to by the others."""
    record = shared / SHARED_CLUSTER
    with _locked(shared / "k8s-cluster.lock"):
        if record.exists():
            known = json.loads(record.read_text())
            if known.get("error"):
                raise kwok_cluster.ClusterError(f"(another worker's start) {known['error']}")
            return kwok_cluster.external_cluster(known["kubeconfig"])
        try:
            cluster = _start()
        except (kwok_cluster.ClusterError, OSError) as exc:
            record.write_text(json.dumps({"error": str(exc)}))
            raise
        record.write_text(json.dumps({"kubeconfig": str(cluster.kubeconfig), "name": cluster.name,
                                      "bin_dir": str(cluster.bin_dir) if cluster.bin_dir else None}))
        return cluster


def stop_shared_cluster(shared: Path) -> None:
    """Delete the cluster the workers of this run shared, if one was started (the controller, at the end)."""
    record = shared / SHARED_CLUSTER
    if not record.exists() or os.environ.get("KUBESWEEP_TEST_KEEP_CLUSTER"):
        return
    known = json.loads(record.read_text())
    if known.get("name"):
        kwok_cluster.stop_cluster(known["name"], Path(known["bin_dir"]) if known.get("bin_dir") else None)


@pytest.fixture(scope="session")
def k8s_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kwok_cluster.K8sCluster]:
    external = os.environ.get("KUBESWEEP_TEST_KUBECONFIG")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    try:
        if external:
            cluster = kwok_cluster.external_cluster(external)
        elif worker:
            cluster = _shared_cluster(shared_dir(tmp_path_factory))
        else:
            cluster = _start()
    except (kwok_cluster.ClusterError, OSError) as exc:
        pytest.fail(f"the test Kubernetes cluster could not start:\n{exc}", pytrace=False)
    try:
        yield cluster
    finally:
        if cluster.started_here and not worker and not os.environ.get("KUBESWEEP_TEST_KEEP_CLUSTER"):
            kwok_cluster.stop_cluster(cluster.name, cluster.bin_dir)


@pytest.fixture(scope="session")
def kueue(k8s_cluster: kwok_cluster.K8sCluster, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Kueue beside the cluster, started once however many workers ask (a running one is kept)."""
    lock = shared_dir(tmp_path_factory) / "kueue.lock" if os.environ.get("PYTEST_XDIST_WORKER") else None
    try:
        with _locked(lock) if lock else contextlib.nullcontext():
            return kwok_cluster.start_kueue(k8s_cluster)
    except kwok_cluster.ClusterError as exc:
        pytest.fail(f"Kueue could not start beside the test cluster:\n{exc}", pytrace=False)


@pytest.fixture
def k8s_namespace(k8s_cluster: kwok_cluster.K8sCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    base = "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:40].strip("-")
    name = f"t-{base}-{uuid.uuid4().hex[:6]}"
    k8s_cluster.kubectl("create", "namespace", name)
    k8s_cluster.kubectl("label", "namespace", name, "kubesweep.io/test=true")
    # Pods are admitted only once the namespace's default ServiceAccount exists.
    kwok_cluster.wait_until(
        f"ServiceAccount default in {name}",
        lambda: (
            k8s_cluster.kubectl("get", "serviceaccount", "default", namespace=name, check=False).returncode
            == 0
        ),
        30,
        0.2,
    )
    try:
        yield name
    finally:
        k8s_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
