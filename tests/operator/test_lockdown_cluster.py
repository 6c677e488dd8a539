"""Who may do what once the chart is installed (marker `cluster`), in both of its scopes: serving listed
namespaces, and serving every namespace.

`kubectl auth can-i` against the real API server's RBAC, for a user bound only to create and read Sweeps, for the
tuner's ServiceAccount and for the operator's: none of them reads a Secret, creates a pod directly, or writes
RBAC; only the operator and the tuner create Jobs, and each only where it serves. The real-node module
(test_controller_realnode.py) shows the same user's search sweep end to end.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.cluster

CHART = Path(__file__).resolve().parents[2] / "charts" / "kubesweep"
DIGESTS = ["--set", "operator.image.digest=sha256:" + "1" * 64, "--set", "mlflow.image.digest=sha256:" + "2" * 64]
USER = "sweep-author@example.com"
RBAC = "rbac.authorization.k8s.io"


def _kwok() -> Any:
    return sys.modules["kubesweep_kwok_cluster"]


class Scope:
    def __init__(self, cluster: Any, mode: str) -> None:
        self.cluster, self.mode = cluster, mode
        suffix = uuid.uuid4().hex[:6]
        self.release_ns, self.team_ns, self.other_ns = (f"ksw-lock-{suffix}", f"ksw-team-{suffix}",
                                                        f"ksw-other-{suffix}")
        self.release = f"lk{suffix}"
        self.operator = f"system:serviceaccount:{self.release_ns}:{self.release}-kubesweep-operator"
        # the chart makes the tuner's ServiceAccount in each namespace it serves (the release's under allNamespaces)
        tuner_ns = self.release_ns if mode == "all-namespaces" else self.team_ns
        self.tuner = f"system:serviceaccount:{tuner_ns}:kubesweep-tuner"
        self.tuner_ns = tuner_ns

    def can(self, who: str, verb: str, resource: str, namespace: str | None) -> bool:
        """`kubectl auth can-i`; `resource` may name a subresource as `RESOURCE/SUB`."""
        where = ["-n", namespace] if namespace else ["--all-namespaces"]
        resource, _, sub = resource.partition("/")
        extra = [f"--subresource={sub}"] if sub else []
        out = self.cluster.kubectl("auth", "can-i", verb, resource, *extra, *where, f"--as={who}", check=False)
        return bool(out.stdout.strip() == "yes")


@pytest.fixture(params=["namespaces", "all-namespaces"])
def scope(request: pytest.FixtureRequest, k8s_cluster: Any) -> Iterator[Scope]:
    s = Scope(k8s_cluster, request.param)
    cluster = k8s_cluster
    for ns in (s.release_ns, s.team_ns, s.other_ns):
        cluster.kubectl("create", "namespace", ns)
        cluster.kubectl("label", "namespace", ns, "kubesweep.io/test=true")
    watch = (["--set", "watch.allNamespaces=true"] if s.mode == "all-namespaces"
             else ["--set", f"watch.namespaces={{{s.team_ns}}}"])
    # RBAC objects are what is looked at: no --wait (kwok would only pretend the pods run)
    helm = str(_kwok().bin_dir() / "helm")
    proc = subprocess.run([helm, "install", s.release, str(CHART), "-n", s.release_ns, *DIGESTS, *watch,
                           "--set", "mlflow.persistence.enabled=false", "--kubeconfig", str(cluster.kubeconfig)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the user: create and read Sweeps, nothing else (in the team namespace, or everywhere)
    rule = {"apiGroups": ["kubesweep.io"], "resources": ["sweeps"], "verbs": ["create", "get", "list", "watch"]}
    subject = [{"apiGroup": RBAC, "kind": "User", "name": USER}]
    if s.mode == "all-namespaces":
        objs = [{"apiVersion": f"{RBAC}/v1", "kind": "ClusterRole", "metadata": {"name": s.release}, "rules": [rule]},
                {"apiVersion": f"{RBAC}/v1", "kind": "ClusterRoleBinding", "metadata": {"name": s.release},
                 "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": s.release}, "subjects": subject}]
    else:
        meta = {"name": "author", "namespace": s.team_ns}
        objs = [{"apiVersion": f"{RBAC}/v1", "kind": "Role", "metadata": meta, "rules": [rule]},
                {"apiVersion": f"{RBAC}/v1", "kind": "RoleBinding", "metadata": meta,
                 "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": "author"}, "subjects": subject}]
    cluster.apply(objs)
    try:
        yield s
    finally:
        subprocess.run([helm, "uninstall", s.release, "-n", s.release_ns, "--kubeconfig", str(cluster.kubeconfig)],
                       capture_output=True, timeout=120, check=False)
        if s.mode == "all-namespaces":
            cluster.kubectl("delete", "clusterrole,clusterrolebinding", s.release, check=False)
        for ns in (s.release_ns, s.team_ns, s.other_ns):
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


# (verb, resource) pairs nobody of the three may do anywhere
NEVER = [("get", "secrets"), ("list", "secrets"), ("create", "pods"), ("create", "pods/exec"),
         ("create", f"rolebindings.{RBAC}"), ("create", f"roles.{RBAC}"), ("impersonate", "serviceaccounts"),
         ("create", "serviceaccounts/token"), ("update", "sweeps.kubesweep.io"), ("delete", "namespaces")]


def test_who_may_do_what(scope: Scope) -> None:
    s = scope
    everywhere: list[str | None] = [s.release_ns, s.team_ns, s.other_ns, None]
    granted = [(who, verb, res, ns) for who in (USER, s.tuner, s.operator) for verb, res in NEVER
               for ns in everywhere if s.can(who, verb, res, ns)]
    assert granted == [], granted

    # the user: Sweeps in the team namespace (everywhere under a cluster-wide binding), no Jobs anywhere
    assert s.can(USER, "create", "sweeps.kubesweep.io", s.team_ns)
    assert s.can(USER, "create", "sweeps.kubesweep.io", None) == (s.mode == "all-namespaces")
    assert not any(s.can(USER, verb, "jobs.batch", ns) for verb in ("create", "delete") for ns in everywhere)
    assert not s.can(USER, "patch", "sweeps.kubesweep.io/status", s.team_ns)

    # the tuner: trial Jobs in its own namespace only; no Sweeps
    assert s.can(s.tuner, "create", "jobs.batch", s.tuner_ns)
    assert not s.can(s.tuner, "create", "jobs.batch", s.other_ns)
    assert not any(s.can(s.tuner, verb, "sweeps.kubesweep.io", s.tuner_ns) for verb in ("get", "create", "patch"))

    # the operator: Jobs where it serves (the team namespace, or every namespace), nowhere else
    served = [s.team_ns] if s.mode == "namespaces" else [s.team_ns, s.other_ns, None]
    assert all(s.can(s.operator, "create", "jobs.batch", ns) for ns in served)
    if s.mode == "namespaces":
        assert not s.can(s.operator, "create", "jobs.batch", s.other_ns)
        assert not s.can(s.operator, "create", "jobs.batch", None)
    assert s.can(s.operator, "patch", "sweeps.kubesweep.io/status", s.team_ns)
    assert not s.can(s.operator, "create", "sweeps.kubesweep.io", s.team_ns)
