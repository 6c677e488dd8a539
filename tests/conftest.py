"""Fixtures shared across test directories (session-scoped: one MLflow server and one tracked sweep per run)."""

import pytest

from tests.support.cluster_fixtures import k8s_cluster, k8s_namespace
from tests.support.image_fixtures import buildah, built_images, image_tools, registry, standin_bases
from tests.support.mlflow_fixtures import mlflow_server, tracked_sweep

__all__ = ["buildah", "built_images", "image_tools", "k8s_cluster", "k8s_namespace", "mlflow_server", "registry",
           "standin_bases", "tracked_sweep"]


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: object, items: list[object]) -> None:
    """Under pytest-xdist (`-n N --dist loadgroup`), tests that share a session-scoped real component run on
    one worker, so each component starts once: the Kubernetes control plane, the image registry, the MLflow
    server with its tracked sweep."""
    groups = {"cluster": "k8s", "images": "images", "tracking": "mlflow", "browser": "mlflow", "tune": "mlflow"}
    for item in items:
        folder = item.path.parent.name  # type: ignore[attr-defined]
        if folder in groups:
            item.add_marker(pytest.mark.xdist_group(groups[folder]))  # type: ignore[attr-defined]
