"""Fixtures shared by every test module, and the xdist groups.

A test says which environment it needs by its markers (`cluster`, `realnode`, `images`, `browser`, `gpu`, `slow`;
declared in pyproject.toml), never by where it lives: tests/ mirrors the package, so `-m` selects by environment.
The session-scoped fixtures (one test control plane, one image registry, one MLflow server and one tracked sweep
per run) come from tests/support and are imported here so that every module finds them.

The suite has two parts (`--part early`, `--part rest`), which `make test` runs one after the other on a fresh
machine: the early one beside the end of the cluster's build (docs/testing.md).
"""

import os
from collections.abc import Callable

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


CLUSTER_FIXTURES = {"k8s_cluster", "k8s_namespace", "kueue", "installed"}
EARLY_GROUPS = {"mlflow", "mlflow-auth"}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kubesweep", "the suite's parts (make test on a fresh machine)")
    group.addoption(
        "--part", choices=("early", "rest"), default=None,
        help="run part of the suite: 'early', the tests that share an MLflow server and need neither the test "
             "cluster nor the images (what `make test` runs on a fresh machine while the cluster's binaries "
             "build), or 'rest', every other test. The two parts together are the whole suite.")
    group.addoption(
        "--early-while", type=int, default=None, metavar="PID",
        help="with --part early: start no further test once process PID has ended (the build); the tests it did "
             "not start are left to --part rest")
    group.addoption(
        "--early-record", default=None, metavar="FILE",
        help="with --part early: write the node id of each test it ran to FILE; with --part rest: also run the "
             "early tests that FILE does not list")


def needs_cluster(item: pytest.Item) -> bool:
    """Whether a test uses the test control plane: marked `cluster` or `realnode`, or asking (through any fixture
    it uses) for the cluster, a namespace on it, Kueue or the operator's chart release."""
    markers = {mark.name for mark in item.iter_markers()}
    fixtures = set(getattr(item, "fixturenames", ()))
    return bool(markers & {"cluster", "realnode"} or fixtures & CLUSTER_FIXTURES)


def in_early_part(item: pytest.Item) -> bool:
    """The early part: the MLflow servers' tests that need no cluster. They make up one xdist group, so taking
    them out of the rest leaves its many small tests to balance the two workers."""
    return xdist_group(item) in EARLY_GROUPS and not needs_cluster(item)


def _early_not_run(config: pytest.Config) -> Callable[[pytest.Item], bool]:
    """For the rest part: whether an early test is the rest's to run. Without `--early-record`, none is; with it,
    those the record does not list (all of them if there is no record: the early part never ran)."""
    record = config.getoption("early_record", None)
    if record is None:
        return lambda item: False
    ran: set[str] = set()
    if os.path.exists(record):
        with open(record, encoding="utf-8") as f:
            ran = {line.rstrip("\n") for line in f if line.strip()}
    return lambda item: item.nodeid not in ran


def _select_part(config: pytest.Config, items: list[pytest.Item], part: str) -> None:
    if part == "early":
        keep = [item for item in items if in_early_part(item)]
    else:
        left_to_rest = _early_not_run(config)
        keep = [item for item in items if not in_early_part(item) or left_to_rest(item)]
    if len(keep) < len(items):
        kept = set(map(id, keep))
        config.hook.pytest_deselected(items=[item for item in items if id(item) not in kept])
        items[:] = keep


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`--part` keeps one part of the suite (the others are reported as deselected). Under pytest-xdist (`-n N
    --dist loadgroup`), tests that share a component one process must own run on one worker (`xdist_group`), so
    each such component starts once."""
    part = config.getoption("part", None)
    if part is not None:
        _select_part(config, items, part)
    for item in items:
        group = xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def process_running(pid: int) -> bool:
    """Whether process PID still runs. One that has ended but is not yet waited for (a zombie: the build is a child
    of the shell that runs this pytest, and is waited for only after it) has ended."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: a zombie reads as running
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return state not in ("Z", "X")


_LEFT = pytest.StashKey[int]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    """The early part's loop: pytest's own, but it records each test it ran (`--early-record`) and starts none
    once the build it runs beside has ended (`--early-while`), so the rest part can start at once and run them."""
    config = session.config
    if config.getoption("part", None) != "early" or config.option.collectonly:
        return None
    if session.testsfailed and not config.option.continue_on_collection_errors:
        raise session.Interrupted(f"{session.testsfailed} error(s) during collection")
    pid, record = config.getoption("early_while", None), config.getoption("early_record", None)
    out = open(record, "w", encoding="utf-8") if record else None  # noqa: SIM115 - written test by test
    try:
        for i, item in enumerate(session.items):
            if pid is not None and not process_running(pid):
                config.stash[_LEFT] = len(session.items) - i
                break
            nextitem = session.items[i + 1] if i + 1 < len(session.items) else None
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
            if out is not None:
                out.write(item.nodeid + "\n")
                out.flush()
            if session.shouldfail:
                raise session.Failed(session.shouldfail)
            if session.shouldstop:
                raise session.Interrupted(session.shouldstop)
    finally:
        if out is not None:
            out.close()
    return True


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    left = config.stash.get(_LEFT, 0)
    if left:
        terminalreporter.write_line(
            f"the build this early part ran beside has ended: {left} of its tests were not started here and are "
            f"left to --part rest")


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The xdist controller, once every worker is done, deletes the cluster the workers shared."""
    if os.environ.get("PYTEST_XDIST_WORKER") or not hasattr(session.config, "_tmp_path_factory"):
        return
    if session.config.pluginmanager.has_plugin("xdist") and session.config.getoption("numprocesses", None):
        stop_shared_cluster(session.config._tmp_path_factory.getbasetemp())
