"""Fixtures shared by every test module, and the xdist groups.

A test says which environment it needs by its markers (`cluster`, `realnode`, `images`, `browser`, `gpu`, `slow`;
declared in pyproject.toml), never by where it lives: tests/ mirrors the package, so `-m` selects by environment.
The session-scoped fixtures (one test control plane, one image registry, one MLflow server and one tracked sweep
per run) come from tests/support and are imported here so that every module finds them.
"""

import pytest

from tests.support.cluster_fixtures import k8s_cluster, k8s_namespace, kueue
from tests.support.image_fixtures import buildah, built_images, image_tools, registry, standin_bases
from tests.support.job_fixtures import sst2, token_cache
from tests.support.mlflow_auth import mlflow_auth_server
from tests.support.mlflow_fixtures import marked_sweep, mlflow_server, tracked_sweep

__all__ = ["buildah", "built_images", "image_tools", "k8s_cluster", "k8s_namespace", "kueue", "marked_sweep",
           "mlflow_auth_server", "mlflow_server", "registry", "sst2", "standin_bases", "token_cache", "tracked_sweep"]

IMAGE_FIXTURES = {"buildah", "built_images", "image_tools", "registry", "standin_bases"}
MLFLOW_FIXTURES = {"marked_sweep", "mlflow_server", "tracked_sweep"}


def xdist_group(item: pytest.Item) -> str | None:
    """The shared component a test uses: the control plane (marker `cluster`), else the image registry (marker
    `images`), else the MLflow server and its tracked sweep (marker `browser`, or the fixtures)."""
    markers = {mark.name for mark in item.iter_markers()}
    fixtures = set(getattr(item, "fixturenames", ()))
    if "cluster" in markers or "k8s_cluster" in fixtures:
        return "k8s"
    if "images" in markers or fixtures & IMAGE_FIXTURES:
        return "images"
    if "browser" in markers or fixtures & MLFLOW_FIXTURES:
        return "mlflow"
    if "mlflow_auth_server" in fixtures:
        return "mlflow-auth"
    return None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`-n N --dist loadgroup`), tests that share a session-scoped real component run on
    one worker, so each component starts once: the Kubernetes control plane, the image registry, the MLflow
    server with its tracked sweep. A test that needs the cluster and another component goes with the cluster."""
    for item in items:
        group = xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
