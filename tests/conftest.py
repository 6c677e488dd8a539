"""Fixtures shared by every test module, and the xdist groups.

A test says which environment it needs by its markers (`cluster`, `realnode`, `images`, `browser`, `gpu`, `slow`;
declared in pyproject.toml), never by where it lives: tests/ mirrors the package, so `-m` selects by environment.
The session-scoped fixtures (one test control plane, one image registry, one MLflow server and one tracked sweep
per run) come from tests/support and are imported here so that every module finds them.
"""

import os

import pytest

from tests.support.cluster_fixtures import k8s_cluster, k8s_namespace, kueue, stop_shared_cluster
from tests.support.image_fixtures import buildah, built_images, image_tools, registry, standin_bases
from tests.support.job_fixtures import sst2, token_cache
from tests.support.mlflow_auth import mlflow_auth_server
from tests.support.mlflow_fixtures import marked_sweep, mlflow_server, tracked_sweep

__all__ = ["buildah", "built_images", "image_tools", "k8s_cluster", "k8s_namespace", "kueue", "marked_sweep",
           "mlflow_auth_server", "mlflow_server", "registry", "sst2", "standin_bases", "token_cache", "tracked_sweep"]

IMAGE_FIXTURES = {"buildah", "built_images", "image_tools", "registry", "standin_bases"}
MLFLOW_FIXTURES = {"marked_sweep", "mlflow_server", "tracked_sweep"}


def xdist_group(item: pytest.Item) -> str | None:
    """The worker a test must share with others, by what it uses that one process must own:

    - the images (marker `images`, or the image fixtures): one registry and one build store, so every image test,
      the real node's chart tests among them, runs on one worker;
    - the operator's chart release (`installed` of tests/operator/test_controller_cluster.py, which the other
      operator modules import) and Kueue (the `kueue` fixture): one release name, its ClusterRoles and its CPU
      node are cluster-wide, so the modules that install it run one after another;
    - the MLflow server and its tracked sweep (marker `browser`, or the fixtures), or the basic-auth server;
    - a test module against the cluster: its module-scoped fixtures (an installed chart, a running operator).

    A group is read from the fixtures a test names, directly or through the fixtures it names: a fixture fetched
    inside another (`request.getfixturevalue`) is not seen, so the fixtures above are always named as parameters.
    Tests against the cluster in different groups run at the same time on the one cluster the workers share
    (tests/support/cluster_fixtures.py), each in namespaces of its own."""
    markers = {mark.name for mark in item.iter_markers()}
    fixtures = set(getattr(item, "fixturenames", ()))
    if "images" in markers or fixtures & IMAGE_FIXTURES:
        return "images"
    if fixtures & {"installed", "kueue"}:
        return "operator"
    if "browser" in markers or fixtures & MLFLOW_FIXTURES:
        return "mlflow"
    if "mlflow_auth_server" in fixtures:
        return "mlflow-auth"
    if "cluster" in markers or "k8s_cluster" in fixtures:
        return f"k8s:{item.nodeid.split('::', 1)[0]}"
    return None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`-n N --dist loadgroup`), tests that share a component one process must own run on
    one worker (`xdist_group`), so each such component starts once."""
    for item in items:
        group = xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The xdist controller, once every worker is done, deletes the cluster the workers shared."""
    if os.environ.get("PYTEST_XDIST_WORKER") or not hasattr(session.config, "_tmp_path_factory"):
        return
    if session.config.pluginmanager.has_plugin("xdist") and session.config.getoption("numprocesses", None):
        stop_shared_cluster(session.config._tmp_path_factory.getbasetemp())
