"""pytest fixtures for tests against the real test control plane (see docs/testing.md); the root conftest
makes them available to every test module, so the cluster starts once per session whoever asks first.

- ``k8s_cluster`` (session): a :class:`kwok_cluster.K8sCluster`. With ``KUBESWEEP_TEST_KUBECONFIG`` set,
  the cluster of that kubeconfig is used as it is; otherwise the kwok cluster ``KUBESWEEP_TEST_CLUSTER``
  (default ``kubesweep-pytest-<hash of the checkout path>``) is created through the same code as
  ``tests/cluster/up --real-node`` (kwok GPU nodes plus one real node, see ``real_node.py``) and deleted at the
  end of the session (``KUBESWEEP_TEST_KEEP_CLUSTER=1`` keeps it; ``KUBESWEEP_TEST_REAL_NODE=0`` leaves the real
  node out, and the tests marked ``realnode`` then fail saying so).
  If it cannot start, every test using it fails with the reason; nothing is skipped.
- ``k8s_namespace`` (function): a fresh namespace (name returned), deleted after the test.
- ``kueue`` (session): Kueue beside that cluster (``tests/cluster/kueue.py``), started by the first test that asks
  and ended with the cluster; it manages the Jobs of namespaces labelled ``kubesweep.io/kueue=enabled`` only.
"""

from __future__ import annotations

import importlib.util
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


@pytest.fixture(scope="session")
def k8s_cluster() -> Iterator[kwok_cluster.K8sCluster]:
    external = os.environ.get("KUBESWEEP_TEST_KUBECONFIG")
    try:
        if external:
            cluster = kwok_cluster.external_cluster(external)
        else:
            name = os.environ.get("KUBESWEEP_TEST_CLUSTER") or kwok_cluster.pytest_cluster_name()
            real_node = os.environ.get("KUBESWEEP_TEST_REAL_NODE", "1") != "0"
            cluster = kwok_cluster.start_cluster(name, recreate=True, with_real_node=real_node)
    except (kwok_cluster.ClusterError, OSError) as exc:
        pytest.fail(f"the test Kubernetes cluster could not start:\n{exc}", pytrace=False)
    try:
        yield cluster
    finally:
        if cluster.started_here and not os.environ.get("KUBESWEEP_TEST_KEEP_CLUSTER"):
            kwok_cluster.stop_cluster(cluster.name, cluster.bin_dir)


@pytest.fixture(scope="session")
def kueue(k8s_cluster: kwok_cluster.K8sCluster) -> Any:
    try:
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
