"""The chart and the operator on the real test control plane.

The chart is linted, rendered, validated (kubernetes-validate, strict, the cluster's version) and installed with
`helm install --wait` into a namespace that enforces the `restricted` Pod Security profile. kwok runs no
containers, so the operator runs here as a local process with the chart's ServiceAccount identity (a token from
`kubectl create token`), and `--test-hooks` lets a Sweep's `kubesweep.io/test-pod-annotations` tell the kwok
Stages how each trial's pod ends (docs/testing.md).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubesweep.backends.k8s_state import TrialEntry
from kubesweep.plan import plan
from kubesweep.sweep_spec import parse_sweep
from kubesweep.wire.outcomes import Outcome

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kubesweep"
RELEASE = "ks"
OPERATOR = f"{RELEASE}-kubesweep-operator"  # ServiceAccount, Lease and Deployment name
K8S_SCHEMA_VERSION = "1.36"
# Stand-in digests: the schema wants the shape of a digest; kwok never pulls images.
OPERATOR_DIGEST = "sha256:" + "1" * 64
MLFLOW_DIGEST = "sha256:" + "2" * 64
KILLS = 4
FAULTS_KILL = "KUBESWEEP_TEST_KILL_AT"  # kubesweep.operator.testhooks: where the operator kills itself
FAULTS_STOP = "KUBESWEEP_TEST_STOP_AT"
FINALIZER = "kubesweep.io/outcome"
CPU_NODE = "kubesweep-test-cpu-0"
JOB_IMAGE = "registry.example/kubesweep-job@sha256:" + "0" * 64
TUNER_IMAGE = "registry.example/kubesweep-operator@" + OPERATOR_DIGEST
DIGEST_SETS = ["--set", f"operator.image.digest={OPERATOR_DIGEST}", "--set", f"mlflow.image.digest={MLFLOW_DIGEST}"]
SERVE = ["--set", "watch.namespaces={kubesweep}"]  # the release namespace, served because it is listed


def _kwok() -> Any:
    return sys.modules["kubesweep_kwok_cluster"]


def helm_bin() -> str:
    path = _kwok().bin_dir() / "helm"
    assert path.exists(), f"helm is not built: run tests/cluster/build-tools.sh ({path})"
    return str(path)


def helm(*args: str, kubeconfig: Path | None = None, check: bool = True, timeout: float = 180
         ) -> subprocess.CompletedProcess[str]:
    cmd = [helm_bin(), *args]
    if kubeconfig:
        cmd += ["--kubeconfig", str(kubeconfig)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


# ------------------------------------------------------------------------------------------------------------
# Offline chart checks


def test_chart_lints_strictly_and_refuses_placeholder_digests() -> None:
    assert "0 chart(s) failed" in helm("lint", "--strict", str(CHART), *DIGEST_SETS, *SERVE).stdout
    refused = helm("lint", "--strict", str(CHART), *SERVE, check=False)
    assert refused.returncode != 0
    assert "/operator/image/digest" in refused.stdout + refused.stderr
    assert "/mlflow/image/digest" in refused.stdout + refused.stderr
    tag = helm("template", RELEASE, str(CHART), *DIGEST_SETS, *SERVE, "--set", "operator.image.digest=latest",
               check=False)
    assert tag.returncode != 0 and "does not match pattern" in tag.stderr
    # no namespace named: nothing is served by default, the release namespace (MLflow's store) least of all
    unnamed = helm("template", RELEASE, str(CHART), "-n", "kubesweep", *DIGEST_SETS, check=False)
    assert unnamed.returncode != 0 and "watch.namespaces: name the namespaces whose Sweeps the operator serves" \
        in unnamed.stderr, unnamed.stderr


@pytest.mark.parametrize("scope", [SERVE, ["--set", "watch.allNamespaces=true"],
                                   ["--set", "watch.namespaces={team-a,team-b}", "--set", "mlflow.enabled=false",
                                    "--set", "tracking.uri=http://mlflow.example:5000"],
                                   [*SERVE, "--set", "mlflow.backendStore.uriSecret.name=mlflow-db",
                                    "--set", "mlflow.artifacts.s3.bucket=runs",
                                    "--set", "mlflow.artifacts.s3.credentialsSecret=mlflow-s3",
                                    "--set", "mlflow.artifacts.s3.endpointUrl=https://minio.example:9000"]],
                         ids=["default", "all-namespaces", "namespaces-external-tracking", "postgres-s3"])
def test_rendered_chart_validates_strictly(scope: list[str], tmp_path: Path) -> None:
    text = helm("template", RELEASE, str(CHART), "-n", "kubesweep", "--include-crds", *DIGEST_SETS, *scope).stdout
    out = tmp_path / "rendered.yaml"
    out.write_text(text)
    validate = Path(sys.executable).with_name("kubernetes-validate")
    proc = subprocess.run([str(validate), "--strict", "-k", K8S_SCHEMA_VERSION, "--quiet", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    docs = [d for d in yaml.safe_load_all(text) if d]
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("CustomResourceDefinition", "sweeps.kubesweep.io") in kinds
    for d in docs:
        if d["kind"] == "Deployment":
            for c in d["spec"]["template"]["spec"]["containers"]:
                assert "@sha256:" in c["image"], c["image"]
                assert c["securityContext"]["allowPrivilegeEscalation"] is False
                assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    rules = [r for d in docs if d["kind"] in ("Role", "ClusterRole") for r in d["rules"]]
    assert not [r for r in rules if "secrets" in r["resources"] or "*" in r["verbs"] or "*" in r["resources"]]
    if "watch.allNamespaces=true" in scope:
        assert any(d["kind"] == "ClusterRole" for d in docs)
    if "watch.namespaces={team-a,team-b}" in scope:
        assert {d["metadata"]["namespace"] for d in docs if d["kind"] == "RoleBinding"} >= {"team-a", "team-b"}
    from kubesweep.manifests import RUN_AS

    for d in docs:  # MLflow never runs as the trials' uid: a trial that reached its files could not write them
        if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-mlflow"):
            pod_security = d["spec"]["template"]["spec"]["securityContext"]
            assert RUN_AS not in (pod_security["runAsUser"], pod_security["runAsGroup"], pod_security["fsGroup"])
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    # no rule admits "any namespace" (an empty namespaceSelector): a pod label alone is anyone's to set
    peers = [peer for d in policies for rule in d["spec"].get("ingress") or [] for peer in rule.get("from") or []]
    assert not [peer for peer in peers if peer.get("namespaceSelector") == {}], peers
    # a tuner admits nothing, in each namespace served
    tuners = {d["metadata"]["namespace"]: d["spec"] for d in policies if d["metadata"]["name"] ==
              "kubesweep-tuner-no-ingress"}
    served = {"team-a", "team-b"} if "watch.namespaces={team-a,team-b}" in scope else {"kubesweep"}
    assert set(tuners) == served and all(t["policyTypes"] == ["Ingress"] and not t.get("ingress")
                                         for t in tuners.values()), tuners


def test_chart_gpu_catalog_equals_the_shipped_one() -> None:
    from kubesweep.gpus import load_catalog

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    shipped = yaml.safe_load((ROOT / "kubesweep" / "data" / "gpus.yaml").read_text())["gpus"]
    assert values["gpuCatalog"] == shipped
    assert load_catalog().names  # the shipped file parses


# ------------------------------------------------------------------------------------------------------------
# The installed chart


class Installed:
    def __init__(self, cluster: Any, namespace: str, sa_kubeconfig: Path, catalog: Path):
        self.cluster = cluster
        self.namespace = namespace
        self.sa_kubeconfig = sa_kubeconfig
        self.catalog = catalog


def _sa_kubeconfig(cluster: Any, namespace: str, path: Path) -> Path:
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    server = next(c for c in admin["clusters"] if c["name"] == context["cluster"])["cluster"]
    token = cluster.kubectl("create", "token", OPERATOR, "--duration=2h", namespace=namespace).stdout.strip()
    cluster_entry = {"server": server["server"]}
    if "certificate-authority" in server:
        cluster_entry["certificate-authority"] = server["certificate-authority"]
    elif "certificate-authority-data" in server:
        cluster_entry["certificate-authority-data"] = server["certificate-authority-data"]
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "operator",
              "clusters": [{"name": "test", "cluster": cluster_entry}],
              "users": [{"name": OPERATOR, "user": {"token": token}}],
              "contexts": [{"name": "operator", "context": {"cluster": "test", "user": OPERATOR,
                                                           "namespace": namespace}}]}
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def installed(k8s_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    cluster = k8s_cluster
    ns = f"ksw-op-{uuid.uuid4().hex[:6]}"
    tmp = tmp_path_factory.mktemp("operator")
    cluster.kubectl("create", "namespace", ns)
    cluster.kubectl("label", "namespace", ns, "kubesweep.io/test=true",
                    "pod-security.kubernetes.io/enforce=restricted",
                    "pod-security.kubernetes.io/enforce-version=latest")
    # A plain (untainted) node for the operator and MLflow pods, and a volume for MLflow's claim; both are
    # removed again at the end, so other modules see the cluster as the fixture made it.
    cluster.apply(_kwok().cpu_node_manifest(CPU_NODE))
    storage_class = f"manual-{ns}"
    cluster.apply({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"mlflow-{ns}"},
                   "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                            "storageClassName": storage_class, "hostPath": {"path": f"/tmp/{ns}"}}})
    try:
        helm("install", RELEASE, str(CHART), "-n", ns, "--wait", "--timeout", "150s", *DIGEST_SETS,
             "--set", f"watch.namespaces={{{ns}}}",  # sweeps run beside the chart here: served when listed
             "--set", f"mlflow.persistence.storageClassName={storage_class}",
             "--set", "mlflow.persistence.size=1Gi", kubeconfig=cluster.kubeconfig, timeout=200)
        catalog = tmp / "gpus.yaml"
        cm = cluster.get_json("configmap", f"{RELEASE}-kubesweep-gpu-catalog", namespace=ns)
        catalog.write_text(cm["data"]["gpus.yaml"])
        yield Installed(cluster, ns, _sa_kubeconfig(cluster, ns, tmp / "sa-kubeconfig.yaml"), catalog)
    finally:
        helm("uninstall", RELEASE, "-n", ns, "--wait", kubeconfig=cluster.kubeconfig, check=False)
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        cluster.kubectl("delete", "pv", f"mlflow-{ns}", "--wait=false", check=False)
        cluster.kubectl("delete", "node", CPU_NODE, "--wait=false", check=False)


class OperatorProcess:
    """`python -m kubesweep.operator` as the chart's ServiceAccount; `env` adds variables (fault points)."""

    def __init__(self, inst: Installed, log: Path, identity: str = "op-test", lease_duration: float = 6,
                 env: dict[str, str] | None = None):
        self.inst = inst
        self.log = log
        self.identity = identity
        self.lease_duration = lease_duration
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> OperatorProcess:
        env = {**os.environ, "KUBECONFIG": str(self.inst.sa_kubeconfig),
               "KUBESWEEP_GPU_CATALOG": str(self.inst.catalog), **self.env}
        env.pop("MLFLOW_TRACKING_URI", None)
        if not self.env:
            env.pop(FAULTS_KILL, None)
            env.pop(FAULTS_STOP, None)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kubesweep.operator", "--namespace", self.inst.namespace,
                 "--lease-name", OPERATOR, "--lease-namespace", self.inst.namespace, "--identity", self.identity,
                 "--lease-duration", str(self.lease_duration), "--resync", "2", "--test-hooks",
                 "--tuner-image", TUNER_IMAGE],
                env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        return self

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            if sig == signal.SIGTERM:
                self.proc.send_signal(signal.SIGCONT)  # a stopped process handles SIGTERM once continued
            self.proc.wait(timeout=30)

    def wait_killed_by_hook(self, point: str, timeout: float = 90) -> None:
        """Wait until the process SIGKILLed itself at fault point `point`."""
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the operator did not reach {point} in {timeout}s:\n{self.text()[-3000:]}") from None
        assert code == -signal.SIGKILL, f"exit {code}:\n{self.text()[-3000:]}"
        assert f"test hook: SIGKILL at {point}" in self.text()

    def state(self) -> str:
        """The process state letter from /proc (R, S, T for stopped, ...)."""
        assert self.proc is not None
        return Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@pytest.fixture
def operator(installed: Installed, tmp_path: Path) -> Iterator[OperatorProcess]:
    op = OperatorProcess(installed, tmp_path / "operator.log").start()
    yield op
    op.kill(signal.SIGTERM)


def sweep_file(tmp_path: Path, name: str, matrix: dict[str, Any], *, hooks: Any,
               concurrency: dict[str, Any] | None = None, base: Path | None = None) -> Path:
    doc = yaml.safe_load(base.read_text()) if base else {"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep",
                                                         "spec": {}}
    doc["metadata"] = {"name": name, "annotations": {"kubesweep.io/test-pod-annotations": json.dumps(hooks)}}
    doc["spec"]["image"] = JOB_IMAGE
    doc["spec"]["matrix"] = matrix
    doc["spec"]["warm_pods"] = False  # kwok runs no containers: no warm pod's worker could run here
    if concurrency:
        doc["spec"]["concurrency"] = concurrency
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def cli(inst: Installed, *args: str, check: int | None = 0, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    cmd = [str(Path(sys.executable).with_name("sweep")), *args, "--backend", "kubernetes", "-n", inst.namespace,
           "--kubeconfig", str(inst.cluster.kubeconfig)]
    env = {**os.environ, "KUBESWEEP_GPU_CATALOG": str(inst.catalog), "COLUMNS": "200"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    if check is not None:
        assert proc.returncode == check, f"{' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def kubectl_apply(inst: Installed, path: Path) -> None:
    """A sweep file is a Sweep resource: `kubectl apply -f` submits it as well as the CLI does."""
    inst.cluster.kubectl("apply", "--server-side", "-f", str(path), namespace=inst.namespace)


def sweep_status(inst: Installed, name: str) -> dict[str, Any]:
    return inst.cluster.get_json("sweep", name, namespace=inst.namespace).get("status") or {}


def trial_slices(inst: Installed, name: str) -> dict[str, TrialEntry]:
    """Every trial's entry in the sweep's TrialSlices (trial id → entry), as the operator wrote them."""
    items = inst.cluster.get_json("trialslices", "-l", f"kubesweep.io/sweep={name}", namespace=inst.namespace)["items"]
    return {tid: TrialEntry.decode(text) for item in items for tid, text in (item.get("trials") or {}).items()}


def trials_by_cell(inst: Installed, name: str, path: Path) -> dict[str, TrialEntry]:
    """The entries keyed by matrix cell (`l4 batch_size=16`), planned from the sweep file."""
    doc = yaml.safe_load(path.read_text())
    doc.setdefault("metadata", {})["name"] = name
    cells = {t.id: t.label() for t in plan(parse_sweep(doc, allow_unpinned=True)).trials}
    return {cells[tid]: entry for tid, entry in trial_slices(inst, name).items()}


def wait_phase(inst: Installed, name: str, phases: set[str], timeout: float = 120, op: Any = None) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        status = sweep_status(inst, name)
        return status if status.get("phase") in phases else None

    try:
        return _kwok().wait_until(f"sweep {name} in {phases}", reached, timeout, interval=1.0)  # type: ignore[no-any-return]
    except Exception as exc:
        log = op.text()[-4000:] if op else ""
        raise AssertionError(f"{exc}\nstatus: {json.dumps(sweep_status(inst, name))[:3000]}\n"
                             f"operator log:\n{log}") from None


# ------------------------------------------------------------------------------------------------------------


def test_helm_install_restricted_and_least_privilege(installed: Installed) -> None:
    cluster, ns = installed.cluster, installed.namespace
    pods = cluster.get_json("pods", "-l", "app.kubernetes.io/instance=" + RELEASE, namespace=ns)["items"]
    assert {p["metadata"]["labels"]["app.kubernetes.io/component"] for p in pods} == {"operator", "mlflow"}
    assert all(p["status"]["phase"] == "Running" for p in pods)
    assert cluster.get_json("pvc", f"{RELEASE}-kubesweep-mlflow", namespace=ns)["status"]["phase"] == "Bound"
    notes = helm("get", "notes", RELEASE, "-n", ns, kubeconfig=cluster.kubeconfig).stdout
    assert f"port-forward svc/{RELEASE}-kubesweep-mlflow 5000:5000" in notes

    who = f"system:serviceaccount:{ns}:{OPERATOR}"

    def can(verb: str, resource: str, namespace: str | None = ns, *extra: str, who: str = who) -> bool:
        args = ["auth", "can-i", verb, resource, "--as", who, *extra]
        args += ["-n", namespace] if namespace else []
        return cluster.kubectl(*args, check=False).stdout.strip() == "yes"

    allowed = [("watch", "sweeps.kubesweep.io"), ("patch", "sweeps.kubesweep.io", ns, "--subresource=status"),
               ("update", "sweeps.kubesweep.io", ns, "--subresource=finalizers"),
               ("create", "jobs.batch"), ("patch", "jobs.batch"), ("delete", "jobs.batch"), ("watch", "pods"),
               ("get", "pods", ns, "--subresource=log"), ("create", "services"), ("create", "events"),
               ("list", "events"), ("create", "leases.coordination.k8s.io"),
               ("update", f"leases.coordination.k8s.io/{OPERATOR}"), ("get", "serviceaccounts"),
               ("get", "persistentvolumeclaims")]
    denied = [("get", "secrets"), ("list", "secrets"), ("delete", "namespaces", None), ("list", "configmaps"),
              ("update", "sweeps.kubesweep.io"), ("delete", "sweeps.kubesweep.io"), ("create", "pods"),
              ("update", "jobs.batch"),  # the outcome finalizer is removed by a patch
              ("list", "nodes", None), ("update", "leases.coordination.k8s.io/someone-elses-lease"),
              ("create", "jobs.batch", "default"), ("list", "customresourcedefinitions.apiextensions.k8s.io", None),
              ("create", "clusterrolebindings.rbac.authorization.k8s.io", None), ("create", "serviceaccounts"),
              ("create", "serviceaccounts", ns, "--subresource=token")]
    assert [a for a in allowed if not can(*a)] == []
    assert [d for d in denied if can(*d)] == []

    # the identity of search sweeps' tuner Jobs: drives trial Jobs and its state ConfigMap, nothing more
    tuner = f"system:serviceaccount:{ns}:kubesweep-tuner"
    allowed = [("create", "jobs.batch"), ("delete", "jobs.batch"), ("watch", "pods"), ("create", "services"),
               ("patch", "configmaps"), ("delete", "configmaps"), ("list", "events")]
    denied = [("get", "secrets"), ("list", "sweeps.kubesweep.io"), ("create", "pods"), ("list", "nodes", None),
              ("create", "jobs.batch", "default")]
    assert [a for a in allowed if not can(*a, who=tuner)] == []
    assert [d for d in denied if can(*d, who=tuner)] == []


def test_gpu_matrix_through_the_cli_reaches_succeeded(installed: Installed, operator: OperatorProcess,
                                                      tmp_path: Path) -> None:
    """A reduced sweeps/gpu_matrix.yaml: 3 GPU types x 2 batch sizes x 2 precisions, concurrency 4 and 2 per type."""
    matrix = {"gpu": ["a100-40gb", "l40s", "h100-80gb"], "batch_size": [16, 32], "precision": ["fp16", "bf16"]}
    path = sweep_file(tmp_path, "gpu-matrix", matrix, hooks={"kubesweep.io/test-duration": "500ms"},
                      concurrency={"max_parallel": 4, "per_gpu_type": 2}, base=ROOT / "sweeps" / "gpu_matrix.yaml")
    out = cli(installed, "submit", str(path), "--detach")
    assert "12 trials on the kubernetes backend" in out.stdout
    status = wait_phase(installed, "gpu-matrix", {"Succeeded", "Failed"}, timeout=150, op=operator)
    assert status["phase"] == "Succeeded", status
    assert status["counts"]["total"] == 12 and status["counts"]["succeeded"] == 12 and status["counts"]["failed"] == 0
    assert status["progress"] == "12/12"
    entries = trial_slices(installed, "gpu-matrix")
    assert len(entries) == 12 and all(e.final and e.outcome == Outcome.SUCCEEDED for e in entries.values())

    shown = json.loads(cli(installed, "status", "gpu-matrix", "-o", "json").stdout)
    assert len(shown["trials"]) == 12 and {t["phase"] for t in shown["trials"]} == {"Succeeded"}
    table = installed.cluster.kubectl("get", "ksw", "gpu-matrix", namespace=installed.namespace).stdout
    assert "Succeeded" in table and "12/12" in table

    # The limits held: never more than 4 trials at once, nor more than 2 on one GPU type.
    jobs = installed.cluster.get_json("jobs", "-l", "kubesweep.io/sweep=gpu-matrix",
                                      namespace=installed.namespace)["items"]
    assert len(jobs) == 12
    spans = [(j["metadata"]["labels"]["kubesweep.io/gpu"], j["metadata"]["creationTimestamp"],
              j["status"]["completionTime"]) for j in jobs]
    for gpu, start, _ in spans:
        overlapping = [s for s in spans if s[1] <= start < s[2]]
        assert len(overlapping) <= 4
        assert len([s for s in overlapping if s[0] == gpu]) <= 2
    for job in jobs:
        assert job["metadata"]["ownerReferences"][0]["kind"] == "Sweep"


def test_oom_trials_show_outcome_oom(installed: Installed, operator: OperatorProcess, tmp_path: Path) -> None:
    hooks = [{"match": {"batch_size": 16}, "annotations": {"kubesweep.io/test-outcome": "crash",
                                                           "kubesweep.io/test-exit-code": "3",
                                                           "kubesweep.io/test-duration": "1s"}},
             {"match": {"batch_size": 32}, "annotations": {"kubesweep.io/test-outcome": "oom",
                                                           "kubesweep.io/test-duration": "1s"}},
             {"annotations": {"kubesweep.io/test-outcome": "crash", "kubesweep.io/test-exit-code": "1",
                              "kubesweep.io/test-duration": "1s"}}]
    path = sweep_file(tmp_path, "oom", {"gpu": ["l4"], "batch_size": [16, 32, 8]}, hooks=hooks)
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["resources"] = {"retries": 0}
    path.write_text(yaml.safe_dump(doc))
    kubectl_apply(installed, path)
    status = wait_phase(installed, "oom", {"Succeeded", "Failed"}, timeout=90, op=operator)
    by_cell = trials_by_cell(installed, "oom", path)
    assert by_cell["l4 batch_size=16"].outcome == Outcome.OOM, by_cell
    assert "CUDA out of memory" in by_cell["l4 batch_size=16"].reason
    assert by_cell["l4 batch_size=32"].outcome == Outcome.OOM
    assert "OOMKilled" in by_cell["l4 batch_size=32"].reason
    assert by_cell["l4 batch_size=8"].outcome == Outcome.FAILED
    assert status["phase"] == "Failed" and status["counts"]["oom"] == 2 and status["counts"]["failed"] == 1
    # the status names the trials to look at (bounded), with their reasons
    assert {n["outcome"] for n in status["attention"]} == {"oom", "failed"} and len(status["attention"]) == 3


def test_deleting_the_sweep_deletes_its_jobs(installed: Installed, operator: OperatorProcess,
                                             tmp_path: Path) -> None:
    path = sweep_file(tmp_path, "to-delete", {"gpu": ["a100-40gb"], "batch_size": [16, 32]},
                      hooks={"kubesweep.io/test-outcome": "hang"})
    kubectl_apply(installed, path)
    cluster, ns = installed.cluster, installed.namespace

    def jobs() -> list[dict[str, Any]]:
        return cluster.get_json("jobs", "-l", "kubesweep.io/sweep=to-delete", namespace=ns)["items"]  # type: ignore[no-any-return]

    _kwok().wait_until("two running Jobs", lambda: len(jobs()) == 2 or None, 60)
    cluster.kubectl("delete", "sweep", "to-delete", "--wait=false", namespace=ns)
    _kwok().wait_until("Jobs garbage-collected", lambda: not jobs() or None, 90, interval=1.0)


def test_suspend_stops_new_trials_and_the_matrix_is_immutable(
        installed: Installed, operator: OperatorProcess, tmp_path: Path) -> None:
    path = sweep_file(tmp_path, "suspended", {"gpu": ["l40s"], "batch_size": [8, 16, 32]},
                      hooks={"kubesweep.io/test-duration": "1s"})
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["suspend"] = True
    path.write_text(yaml.safe_dump(doc))
    kubectl_apply(installed, path)
    status = wait_phase(installed, "suspended", {"Suspended"}, timeout=60, op=operator)
    assert status["counts"]["pending"] == 3
    time.sleep(2)
    assert not installed.cluster.get_json("jobs", "-l", "kubesweep.io/sweep=suspended",
                                          namespace=installed.namespace)["items"]
    installed.cluster.kubectl("patch", "sweep", "suspended", "--type=merge", "-p", '{"spec":{"suspend":false}}',
                              namespace=installed.namespace)
    wait_phase(installed, "suspended", {"Succeeded"}, timeout=90, op=operator)
    # The matrix is immutable once the sweep exists.
    bad = installed.cluster.kubectl("patch", "sweep", "suspended", "--type=merge", "-p",
                                    '{"spec":{"matrix":{"batch_size":[64]}}}', namespace=installed.namespace,
                                    check=False)
    assert bad.returncode != 0 and "spec.matrix is immutable" in bad.stderr


def test_killing_the_operator_repeatedly_loses_and_duplicates_nothing(installed: Installed,
                                                                      tmp_path: Path) -> None:
    """SIGKILL the operator at random moments while an 8-trial sweep runs; every Job is created exactly once."""
    from kubernetes import client, watch

    cluster, ns = installed.cluster, installed.namespace
    created: dict[str, list[str]] = {}
    stop = threading.Event()
    api = client.BatchV1Api(cluster.api_client())

    def record() -> None:
        while not stop.is_set():
            w = watch.Watch()
            for event in w.stream(api.list_namespaced_job, ns, label_selector="kubesweep.io/sweep=killed",
                                  timeout_seconds=5):
                if event["type"] == "ADDED":
                    job = event["object"]
                    uids = created.setdefault(job.metadata.name, [])
                    if job.metadata.uid not in uids:
                        uids.append(job.metadata.uid)
                if stop.is_set():
                    w.stop()

    recorder = threading.Thread(target=record, daemon=True)
    recorder.start()
    matrix = {"gpu": ["a100-40gb", "l40s"], "batch_size": [8, 16, 32, 64]}
    path = sweep_file(tmp_path, "killed", matrix, hooks={"kubesweep.io/test-duration": "1s"},
                      concurrency={"max_parallel": 3})
    kubectl_apply(installed, path)
    log = tmp_path / "operator.log"
    rng = random.Random(7)
    kills = 0
    op = OperatorProcess(installed, log)
    try:
        for _ in range(KILLS):
            op.start()
            time.sleep(rng.uniform(1.0, 3.0))
            op.kill(signal.SIGKILL)
            kills += 1
        op.start()
        status = wait_phase(installed, "killed", {"Succeeded", "Failed"}, timeout=150, op=op)
    finally:
        op.kill(signal.SIGTERM)
        stop.set()
        recorder.join(timeout=10)
    assert kills == KILLS
    assert status["phase"] == "Succeeded", status
    assert status["counts"]["succeeded"] == 8
    jobs = cluster.get_json("jobs", "-l", "kubesweep.io/sweep=killed", namespace=ns)["items"]
    assert len(jobs) == 8
    assert len(created) == 8 and all(len(uids) == 1 for uids in created.values()), created
    assert {j["metadata"]["uid"] for j in jobs} == {u for uids in created.values() for u in uids}
    pods = cluster.get_json("pods", "-l", "kubesweep.io/sweep=killed", namespace=ns)["items"]
    assert len(pods) == 8  # one pod per trial: nothing ran twice


def test_two_replicas_one_leader_and_takeover(installed: Installed, tmp_path: Path) -> None:
    a = OperatorProcess(installed, tmp_path / "a.log", identity="replica-a", lease_duration=6).start()
    _kwok().wait_until("replica-a leads", lambda: "leading" in a.text() or None, 120)
    b = OperatorProcess(installed, tmp_path / "b.log", identity="replica-b", lease_duration=6).start()
    try:
        path = sweep_file(tmp_path, "ha", {"gpu": ["l4"], "batch_size": [8, 16, 32]},
                          hooks={"kubesweep.io/test-duration": "1s"}, concurrency={"max_parallel": 1})
        kubectl_apply(installed, path)
        _kwok().wait_until("a first trial done", lambda: sweep_status(installed, "ha").get("counts", {})
                           .get("done", 0) >= 1 or None, 60)
        assert "leading" not in b.text()
        a.kill(signal.SIGKILL)
        status = wait_phase(installed, "ha", {"Succeeded"}, timeout=90, op=b)
        assert status["counts"]["succeeded"] == 3
        assert "took the Lease" in b.text() and "from replica-a" in b.text()
        lease = installed.cluster.get_json("lease", OPERATOR, namespace=installed.namespace)
        assert lease["spec"]["holderIdentity"] == "replica-b"
    finally:
        a.kill(signal.SIGTERM)
        b.kill(signal.SIGTERM)


# ------------------------------------------------------------------------------------------------------------
# Nothing runs twice: fault points, Jobs deleted early, a paused leader


def sweep_jobs(inst: Installed, name: str) -> list[dict[str, Any]]:
    return inst.cluster.get_json("jobs", "-l", f"kubesweep.io/sweep={name}",  # type: ignore[no-any-return]
                                 namespace=inst.namespace)["items"]


def job_finished(job: dict[str, Any]) -> bool:
    return any(c["type"] in ("Complete", "Failed") and c["status"] == "True"
               for c in job.get("status", {}).get("conditions") or [])


class Recorder:
    """Every Job and pod of one sweep that ever existed, from watches started before the sweep is applied (a
    list, then watches resumed from its resourceVersion, so an object that lived a moment is seen too): the Job
    UIDs per Job name (a trial's Job is named after the trial) and the pod UIDs per Job UID. A trial started
    twice shows as a second Job UID; a Job that ran twice, as a second pod."""

    def __init__(self, inst: Installed, sweep: str | None = None):
        from kubernetes import client

        api = inst.cluster.api_client()
        self.namespace = inst.namespace
        self.selector = f"kubesweep.io/sweep={sweep}" if sweep else "kubesweep.io/trial"  # None: every sweep's
        self.jobs: dict[str, list[str]] = {}
        self.trials: dict[tuple[str, str], list[str]] = {}  # (sweep, trial id) -> its Jobs' UIDs
        self.pods: dict[str, set[str]] = {}
        self._stop = threading.Event()
        self._synced = [threading.Event(), threading.Event()]
        self._threads = [
            threading.Thread(target=self._run, args=(client.BatchV1Api(api).list_namespaced_job, self._job, 0),
                             daemon=True),
            threading.Thread(target=self._run, args=(client.CoreV1Api(api).list_namespaced_pod, self._pod, 1),
                             daemon=True)]

    def __enter__(self) -> Recorder:
        for thread in self._threads:
            thread.start()
        assert all(synced.wait(30) for synced in self._synced), "the recorder's watches did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)

    def _job(self, job: Any) -> None:
        labels = job.metadata.labels or {}
        for uids in (self.jobs.setdefault(job.metadata.name, []),
                     self.trials.setdefault((labels.get("kubesweep.io/sweep"), labels.get("kubesweep.io/trial")), [])):
            if job.metadata.uid not in uids:
                uids.append(job.metadata.uid)

    def _pod(self, pod: Any) -> None:
        for ref in pod.metadata.owner_references or []:
            if ref.kind == "Job":
                self.pods.setdefault(ref.uid, set()).add(pod.metadata.uid)

    def _run(self, list_fn: Any, record: Any, index: int) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        version = ""
        while not self._stop.is_set():
            try:
                if not version:
                    listed = list_fn(self.namespace, label_selector=self.selector)
                    for item in listed.items:
                        record(item)
                    version = listed.metadata.resource_version
                    self._synced[index].set()
                w = watch.Watch()
                for event in w.stream(list_fn, self.namespace, label_selector=self.selector,
                                      resource_version=version, timeout_seconds=5):
                    record(event["object"])
                    version = event["object"].metadata.resource_version or version
                    if self._stop.is_set():
                        w.stop()
            except ApiException as exc:
                if exc.status == 410:  # too old: list again (nothing is lost, only re-read)
                    version = ""
                else:
                    time.sleep(0.5)

    def assert_each_trial_ran(self, trials: int, times: int = 1) -> None:
        """`trials` Jobs names, each with `times` Job UIDs, and one pod for every Job UID."""
        assert len(self.jobs) == trials, self.jobs
        assert all(len(uids) == times for uids in self.jobs.values()), self.jobs
        uids = {uid for uids in self.jobs.values() for uid in uids}
        assert {uid: len(self.pods.get(uid, ())) for uid in uids} == {uid: 1 for uid in uids}, self.pods


@pytest.mark.parametrize("point", ["job-apply:3", "outcome-recorded:2"])
def test_killed_at_a_fault_point_the_next_operator_runs_nothing_twice(installed: Installed, tmp_path: Path,
                                                                       point: str) -> None:
    """The operator SIGKILLs itself right after its 3rd Job apply (the rest of that batch and the status write
    not made), or right after it recorded outcomes for the 2nd time (status not yet published, the finalizers
    of those Jobs not yet removed); a restarted operator finishes the sweep with one Job and one pod per
    trial, and every finalizer removed."""
    where = point.split(":")[0]
    name = f"fault-{where}"
    path = sweep_file(tmp_path, name, {"gpu": ["a100-40gb", "l40s"], "batch_size": [8, 16, 32]},
                      hooks={"kubesweep.io/test-duration": "1s"}, concurrency={"max_parallel": 3})
    log = tmp_path / "operator.log"
    with Recorder(installed, name) as rec:
        op = OperatorProcess(installed, log, env={FAULTS_KILL: point}).start()
        try:
            kubectl_apply(installed, path)
            op.wait_killed_by_hook(where)
            op = OperatorProcess(installed, log).start()
            status = wait_phase(installed, name, {"Succeeded", "Failed"}, timeout=150, op=op)
        finally:
            op.kill(signal.SIGTERM)
    assert status["phase"] == "Succeeded" and status["counts"]["succeeded"] == 6, status
    rec.assert_each_trial_ran(6)
    assert [j["metadata"]["name"] for j in sweep_jobs(installed, name)
            if FINALIZER in (j["metadata"].get("finalizers") or [])] == []


def test_killed_inside_a_cancel_the_next_operator_completes_it(installed: Installed, tmp_path: Path) -> None:
    """The operator SIGKILLs itself inside a cancel, between deleting the first Job and removing that Job's
    finalizer (the Job is left Terminating); the restarted operator deletes the rest, releases every Job, and
    starts none."""
    name = "fault-cancel"
    path = sweep_file(tmp_path, name, {"gpu": ["l4"], "batch_size": [8, 16, 32]},
                      hooks={"kubesweep.io/test-outcome": "hang"}, concurrency={"max_parallel": 3})
    log = tmp_path / "operator.log"
    with Recorder(installed, name) as rec:
        op = OperatorProcess(installed, log, env={FAULTS_KILL: "cancel-delete:1"}).start()
        try:
            kubectl_apply(installed, path)
            _kwok().wait_until("three running trials", lambda: sweep_status(installed, name).get("counts", {})
                               .get("running") == 3 or None, 60)
            installed.cluster.kubectl("annotate", "sweep", name, "kubesweep.io/cancel=true",
                                      namespace=installed.namespace)  # what `sweep cancel` does
            op.wait_killed_by_hook("cancel-delete")
            held = [j for j in sweep_jobs(installed, name) if j["metadata"].get("deletionTimestamp")]
            assert len(held) == 1 and FINALIZER in held[0]["metadata"]["finalizers"], held
            op = OperatorProcess(installed, log).start()
            status = wait_phase(installed, name, {"Cancelled"}, timeout=60, op=op)
            _kwok().wait_until("every Job deleted", lambda: not sweep_jobs(installed, name) or None, 60)
            time.sleep(3)  # resyncs every 2 s: nothing is started again
        finally:
            op.kill(signal.SIGTERM)
    assert status["cancelled"] is True and status["counts"]["cancelled"] == 3, status
    rec.assert_each_trial_ran(3)
    assert not sweep_jobs(installed, name)


def test_killed_inside_a_resume_the_next_operator_completes_it(installed: Installed, tmp_path: Path) -> None:
    """Three trials fail; `resume` (its annotation) makes the operator delete their Jobs and run them again.
    The operator SIGKILLs itself after deleting the first Job, before the resume is recorded; the restarted
    operator carries the resume out once: each trial ran exactly twice (the failed run and the rerun), one pod
    each."""
    name = "fault-resume"
    cluster, ns = installed.cluster, installed.namespace
    crash = {"kubesweep.io/test-outcome": "crash", "kubesweep.io/test-exit-code": "1",
             "kubesweep.io/test-duration": "1s"}
    path = sweep_file(tmp_path, name, {"gpu": ["l40s"], "batch_size": [8, 16, 32]}, hooks=crash,
                      concurrency={"max_parallel": 3})
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["resources"] = {"retries": 0}
    path.write_text(yaml.safe_dump(doc))
    log = tmp_path / "operator.log"
    with Recorder(installed, name) as rec:
        op = OperatorProcess(installed, log, env={FAULTS_KILL: "resume-delete:1"}).start()
        try:
            kubectl_apply(installed, path)
            failed = wait_phase(installed, name, {"Failed"}, timeout=90, op=op)
            assert failed["counts"]["failed"] == 3, failed
            cluster.kubectl("annotate", "--overwrite", "sweep", name,
                            "kubesweep.io/test-pod-annotations=" + json.dumps({"kubesweep.io/test-duration": "1s"}),
                            namespace=ns)
            cluster.kubectl("annotate", "sweep", name, "kubesweep.io/resume=request-1", namespace=ns)
            op.wait_killed_by_hook("resume-delete")
            assert sweep_status(installed, name).get("resumeHandled") is None
            op = OperatorProcess(installed, log).start()
            status = wait_phase(installed, name, {"Succeeded"}, timeout=90, op=op)
            time.sleep(3)  # resyncs every 2 s: the resume is not carried out again
            status = sweep_status(installed, name)
        finally:
            op.kill(signal.SIGTERM)
    assert status["resumeHandled"] == "request-1" and status["counts"]["succeeded"] == 3, status
    rec.assert_each_trial_ran(3, times=2)


def test_jobs_deleted_while_the_operator_is_stopped_are_not_run_again(installed: Installed,
                                                                      tmp_path: Path) -> None:
    """With no operator running, two trials finish and all three Jobs are deleted (as a TTL, or a person,
    would): the finalizer holds them, Terminating. The next operator records the two outcomes, records the
    trial whose Job was deleted while it ran as cancelled, lets the Jobs go, and starts nothing again."""
    name = "deleted-early"
    hooks = [{"match": {"batch_size": 32}, "annotations": {"kubesweep.io/test-outcome": "hang"}},
             {"annotations": {"kubesweep.io/test-duration": "3s"}}]
    path = sweep_file(tmp_path, name, {"gpu": ["l40s"], "batch_size": [8, 16, 32]}, hooks=hooks,
                      concurrency={"max_parallel": 3})
    log = tmp_path / "operator.log"
    cluster, ns = installed.cluster, installed.namespace
    with Recorder(installed, name) as rec:
        op = OperatorProcess(installed, log).start()
        try:
            kubectl_apply(installed, path)
            _kwok().wait_until("three Jobs", lambda: len(sweep_jobs(installed, name)) == 3 or None, 60)
            op.kill(signal.SIGKILL)  # no operator from here on
            _kwok().wait_until("two finished Jobs", lambda: len([j for j in sweep_jobs(installed, name)
                                                                 if job_finished(j)]) == 2 or None, 60)
            cluster.kubectl("delete", "jobs", "-l", f"kubesweep.io/sweep={name}", "--wait=false", namespace=ns)
            time.sleep(2)
            held = sweep_jobs(installed, name)
            assert len(held) == 3, held
            assert all(j["metadata"].get("deletionTimestamp") and FINALIZER in j["metadata"]["finalizers"]
                       for j in held)
            assert not [e for e in trial_slices(installed, name).values() if e.final]
            op = OperatorProcess(installed, log).start()
            wait_phase(installed, name, {"Cancelled", "Succeeded", "Failed"}, timeout=60, op=op)
            _kwok().wait_until("the deleted Jobs gone", lambda: not sweep_jobs(installed, name) or None, 60)
            time.sleep(3)  # resyncs every 2 s: nothing is started again
            status = sweep_status(installed, name)
        finally:
            op.kill(signal.SIGTERM)
    by_cell = trials_by_cell(installed, name, path)
    assert status["phase"] == "Cancelled", status
    assert status["counts"]["succeeded"] == 2 and status["counts"]["cancelled"] == 1, status
    assert by_cell["l40s batch_size=32"].outcome == Outcome.CANCELLED, by_cell
    assert by_cell["l40s batch_size=32"].reason == "its Job was deleted before the trial finished"
    assert all(e.final for e in by_cell.values())
    rec.assert_each_trial_ran(3)
    assert not sweep_jobs(installed, name)


def test_ttl_zero_runs_every_trial_once(installed: Installed, operator: OperatorProcess, tmp_path: Path) -> None:
    """`ttl_seconds_after_finished: 0`: the TTL controller deletes each Job the moment it finishes; the
    finalizer keeps it until its outcome is recorded, so no trial reads as never started and runs again."""
    name = "ttl-zero"
    path = sweep_file(tmp_path, name, {"gpu": ["a100-40gb", "h100-80gb"], "batch_size": [8, 16, 32]},
                      hooks={"kubesweep.io/test-duration": "1s"}, concurrency={"max_parallel": 3})
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["resources"] = {"ttl_seconds_after_finished": 0}
    path.write_text(yaml.safe_dump(doc))
    with Recorder(installed, name) as rec:
        kubectl_apply(installed, path)
        status = wait_phase(installed, name, {"Succeeded", "Failed"}, timeout=120, op=operator)
        _kwok().wait_until("every Job deleted by its TTL", lambda: not sweep_jobs(installed, name) or None, 60)
        time.sleep(3)  # resyncs every 2 s: nothing is started again
    assert status["phase"] == "Succeeded" and status["counts"]["succeeded"] == 6, status
    assert all(e.final for e in trial_slices(installed, name).values())
    rec.assert_each_trial_ran(6)


def test_a_finished_tuner_is_recorded_and_never_run_again(installed: Installed, operator: OperatorProcess,
                                                          tmp_path: Path) -> None:
    """A search sweep's tuner Job runs the operator's tuner image (not the Sweep's), is kept at least
    UNGUARDED_TTL_FLOOR seconds whatever the spec's TTL, and once it finished the Sweep records it
    (`status.searchFinished`): the Job deleted afterwards (as its TTL would) is not created again. kwok plays the
    tuner's pod, which succeeds after 2 s."""
    from kubesweep.manifests import UNGUARDED_TTL_FLOOR

    name = "search-once"
    doc = {"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": name},
           "spec": {"image": JOB_IMAGE, "resources": {"ttl_seconds_after_finished": 0}, "warm_pods": False,
                    "search": {"strategy": "tune", "num_samples": 2,
                               "space": {"batch_size": {"type": "choice", "values": [8, 16]}}}}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    kubectl_apply(installed, path)
    cluster, ns = installed.cluster, installed.namespace
    job = _kwok().wait_until("the tuner Job", lambda: cluster.get_json("job", f"{name}-tuner", namespace=ns), 60)
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == TUNER_IMAGE
    assert job["spec"]["ttlSecondsAfterFinished"] == UNGUARDED_TTL_FLOOR
    _kwok().wait_until("searchFinished recorded", lambda: sweep_status(installed, name).get("searchFinished"), 90)
    cluster.kubectl("delete", "job", f"{name}-tuner", "--wait=true", namespace=ns)
    time.sleep(6)  # three resyncs of 2 s
    left = cluster.kubectl("get", "job", f"{name}-tuner", namespace=ns, check=False)
    assert left.returncode != 0 and "NotFound" in left.stderr, left.stdout
    assert "search: finished" in sweep_status(installed, name).get("message", "")


def _audit_events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(errors="replace").splitlines() if line.strip()]


def _received(event: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(event["requestReceivedTimestamp"])


def test_a_paused_leader_makes_no_write_after_a_standby_took_over(installed: Installed, tmp_path: Path) -> None:
    """Replica A stops itself (SIGSTOP, fault point `write:4`) right after the leadership check of its 4th write,
    before sending it; replica B takes the Lease over and drives the sweep; then A is continued (SIGCONT).

    Writes are counted in the API server's audit log (tests/cluster/audit-policy.yaml logs every write of a
    ServiceAccount), by user agent: each replica's requests carry `kubesweep-operator/<identity>`. The takeover
    is B's first Lease update. After it the log holds no write of A (a Lease update of A, which would be
    refused for its stale resourceVersion, is allowed): the write A had checked for was not sent (it reads the
    Lease's remaining validity again just before sending), and A made none later.
    """
    cluster = installed.cluster
    if not cluster.workdir:
        pytest.skip("counts writes in the audit log of a test cluster started by kwokctl")
    audit = cluster.workdir / "logs" / "audit.log"
    assert audit.exists(), f"no audit log at {audit} (kwok_cluster.kwokctl_config sets kubeAuditPolicy)"
    name = "paused-leader"
    path = sweep_file(tmp_path, name, {"gpu": ["l4"], "batch_size": [8, 16, 32, 64]},
                      hooks={"kubesweep.io/test-duration": "1s"}, concurrency={"max_parallel": 1})
    a = OperatorProcess(installed, tmp_path / "a.log", identity="paused-a", env={FAULTS_STOP: "write:4"}).start()
    b = OperatorProcess(installed, tmp_path / "b.log", identity="paused-b")
    with Recorder(installed, name) as rec:
        try:
            _kwok().wait_until("replica-a leads", lambda: "leading" in a.text() or None, 120)
            b.start()
            kubectl_apply(installed, path)
            _kwok().wait_until("A stopped itself", lambda: a.state() == "T" or None, 60)
            assert "test hook: SIGSTOP at write #4" in a.text()
            _kwok().wait_until("B took the Lease over", lambda: "took the Lease" in b.text() or None, 60)
            _kwok().wait_until("B drives the sweep", lambda: sweep_status(installed, name).get("counts", {})
                               .get("done", 0) >= 2 or None, 60)
            assert a.proc is not None
            a.proc.send_signal(signal.SIGCONT)
            _kwok().wait_until("A continued", lambda: "continued after SIGSTOP" in a.text() or None, 60)
            status = wait_phase(installed, name, {"Succeeded", "Failed"}, timeout=120, op=b)
            time.sleep(5)  # A's Lease rounds (every 2 s) and resyncs after it was continued
        finally:
            a.kill(signal.SIGTERM)
            b.kill(signal.SIGTERM)
    assert status["phase"] == "Succeeded" and status["counts"]["succeeded"] == 4, status
    rec.assert_each_trial_ran(4)

    events = _audit_events(audit)
    takeover = min(_received(e) for e in events if e.get("userAgent", "").startswith("kubesweep-operator/paused-b")
                   and e["objectRef"].get("resource") == "leases" and e["verb"] == "update"
                   and e.get("responseStatus", {}).get("code") == 200)
    by_a = [e for e in events if e.get("userAgent", "").startswith("kubesweep-operator/paused-a")]
    before = [e for e in by_a if _received(e) < takeover and e["objectRef"].get("resource") != "leases"]
    after = [e for e in by_a if _received(e) >= takeover and not (
        e["objectRef"].get("resource") == "leases" and e.get("responseStatus", {}).get("code", 0) >= 400)]
    assert before, "no write of A before the takeover: the user agent does not tell the replicas apart"
    assert after == [], [(e["verb"], e["objectRef"], e["requestReceivedTimestamp"]) for e in after]
    assert "a write is not sent" in a.text(), a.text()[-3000:]  # the checked write, after SIGCONT


def test_a_sweep_of_10_to_the_8_trials_is_invalid_at_once_and_the_operator_unharmed(
        installed: Installed, operator: OperatorProcess, tmp_path: Path) -> None:
    """The trial count is computed from the axes before anything is expanded: a Sweep of 10^8 trials (applied
    with kubectl, so no CLI check ran) is Invalid within a second of the operator seeing it, naming the count and
    the limit, and the operator goes on driving other sweeps."""
    # a first sweep runs to its end: the operator's watch of Sweeps is up (not what is timed below)
    before = sweep_file(tmp_path, "before-huge", {"gpu": ["l4"], "batch_size": [8]},
                        hooks={"kubesweep.io/test-duration": "500ms"})
    kubectl_apply(installed, before)
    assert wait_phase(installed, "before-huge", {"Succeeded", "Failed"}, timeout=60, op=operator)["phase"] == (
        "Succeeded")
    axes = {"batch_size": list(range(1, 11)), "learning_rate": [i * 1e-5 for i in range(1, 11)],
            "seed": list(range(10)), "max_steps": list(range(1, 11)), "grad_accum": list(range(1, 11)),
            "num_workers": list(range(10)), "warmup_batches": list(range(10)), "log_every": list(range(1, 11))}
    path = sweep_file(tmp_path, "huge", axes, hooks={})
    kubectl_apply(installed, path)
    status = _kwok().wait_until("huge Invalid", lambda: (sweep_status(installed, "huge") or {}).get("phase")
                                == "Invalid" or None, 30, interval=0.2)
    assert status
    message = sweep_status(installed, "huge")["message"]
    assert "100,000,000 trials" in message and "limit of 10,000" in message, message
    # timed by the API server (audit log, tests/cluster/audit-policy.yaml): the apply, then the Invalid status
    cluster = installed.cluster
    if cluster.workdir:
        events = [e for e in _audit_events(cluster.workdir / "logs" / "audit.log")
                  if e["objectRef"].get("name") == "huge" and e["objectRef"].get("namespace") == installed.namespace
                  and e["objectRef"].get("resource") == "sweeps"]
        applied = min(datetime.fromisoformat(e["stageTimestamp"]) for e in events if not e["objectRef"].get(
            "subresource"))
        judged = min(_received(e) for e in events if e["objectRef"].get("subresource") == "status")
        took = (judged - applied).total_seconds()
        assert took < 1.0, f"Invalid {took:.2f} s after the Sweep was applied"
    small = sweep_file(tmp_path, "after-huge", {"gpu": ["l4"], "batch_size": [8]},
                       hooks={"kubesweep.io/test-duration": "500ms"})
    kubectl_apply(installed, small)
    assert wait_phase(installed, "after-huge", {"Succeeded", "Failed"}, timeout=60, op=operator)["phase"] == "Succeeded"
    assert operator.proc is not None and operator.proc.poll() is None


def test_a_sweep_naming_an_image_key_not_built_yet_is_invalid_saying_how_to_build_it(
        installed: Installed, operator: OperatorProcess, tmp_path: Path) -> None:
    """Applied with kubectl (no CLI check ran), a Sweep whose image is a key of the image lock with no confirmed
    digest is Invalid with the message `sweep render` gives for it, and none of its Jobs is made."""
    path = sweep_file(tmp_path, "unbuilt", {"gpu": ["l4"], "batch_size": [8]}, hooks={})
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["image"] = "torch-2.8-cu128"  # unconfirmed in the shipped lock, which the operator reads
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    kubectl_apply(installed, path)
    message = wait_phase(installed, "unbuilt", {"Invalid"}, timeout=90, op=operator)["message"]
    assert "spec.image: image key 'torch-2.8-cu128' is not built yet" in message, message
    assert "`make images REGISTRY=<your registry>`" in message, message
    jobs = installed.cluster.get_json("jobs", "-l", "kubesweep.io/sweep=unbuilt", namespace=installed.namespace)
    assert jobs["items"] == []


SCALE_TRIALS = 600  # a full TrialSlice and a second; the scale itself (1,000 to 10,000) is bench/operator_scale.py's
SLICE_TRIALS = 500
OBJECT_BOUND = 256 * 1024
# The Sweep with its status: about 4 KiB at any size (bench/results/operator_scale-kwok.json: 4,409 bytes at 1,000
# trials); a status naming each of 600 trials, at 20 bytes or more an entry, would pass this.
SWEEP_BOUND = 16 * 1024


def test_a_two_slice_sweep_succeeds_with_bounded_objects_across_a_restart(installed: Installed,
                                                                          tmp_path: Path) -> None:
    """600 CPU trials (two TrialSlices), all allowed at once, on a kwok node with room for them: the operator is
    SIGKILLed once about half of the Jobs exist and a new one finishes the sweep. Every trial's Job is created
    exactly once (the audit log's server-side applies that answered 201 Created, per Job name) and ran one pod; the
    Sweep with its status stays within 16 KiB whatever the number of trials, each TrialSlice (a full one: 500
    trials) within 256 KiB, and every outcome is recorded. The Lease is the production default (15 s): writes carry
    its remaining validity as their timeout. The same path at 1,000 to 10,000 trials is a benchmark, with its
    figures committed: bench/operator_scale.py (docs/benchmarks.md)."""
    cluster, ns = installed.cluster, installed.namespace
    if not cluster.workdir:
        pytest.skip("counts Job creations in the audit log of a test cluster started by kwokctl")
    audit = cluster.workdir / "logs" / "audit.log"
    node = f"kubesweep-scale-{uuid.uuid4().hex[:6]}"
    manifest = _kwok().cpu_node_manifest(node)
    room = {"cpu": "1000", "memory": "4Ti", "pods": str(SCALE_TRIALS + 100)}
    manifest["status"] = {"allocatable": room, "capacity": dict(room)}
    cluster.apply(manifest)
    name = "scale"
    doc = {"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep",
           "metadata": {"name": name, "annotations": {
               "kubesweep.io/test-pod-annotations": json.dumps({"kubesweep.io/test-duration": "1s"})}},
           "spec": {"image": JOB_IMAGE, "job": {"max_steps": 2}, "warm_pods": False,
                    "matrix": {"seed": list(range(SCALE_TRIALS // 50)),
                               "learning_rate": [round(1e-5 * (i + 1), 6) for i in range(50)]},
                    "resources": {"gpus_per_trial": 0, "cpu": "10m", "memory": "16Mi", "retries": 0},
                    "concurrency": {"max_parallel": SCALE_TRIALS}}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    log = tmp_path / "operator.log"
    op = OperatorProcess(installed, log, identity="scale-1", lease_duration=15).start()
    try:
        kubectl_apply(installed, path)

        def jobs_now() -> int:
            out = cluster.kubectl("get", "jobs", "-l", f"kubesweep.io/sweep={name}", "-o", "name", namespace=ns)
            return len(out.stdout.split())

        _kwok().wait_until("half of the Jobs", lambda: jobs_now() >= SCALE_TRIALS // 2 or None, 900, interval=2)
        op.kill(signal.SIGKILL)
        op = OperatorProcess(installed, log, identity="scale-2", lease_duration=15).start()
        status = wait_phase(installed, name, {"Succeeded", "Failed"}, timeout=1200, op=op)
    finally:
        op.kill(signal.SIGTERM)
    assert status["phase"] == "Succeeded" and status["progress"] == f"{SCALE_TRIALS}/{SCALE_TRIALS}", status
    assert "scale-1" in log.read_text() and "test hook" not in log.read_text()

    sweep = cluster.get_json("sweep", name, namespace=ns)
    slices = cluster.get_json("trialslices", "-l", f"kubesweep.io/sweep={name}", namespace=ns)["items"]
    sizes = {f"sweep/{name}": len(json.dumps(sweep))} | {f"trialslice/{s['metadata']['name']}": len(json.dumps(s))
                                                           for s in slices}
    assert sizes[f"sweep/{name}"] <= SWEEP_BOUND and max(sizes.values()) <= OBJECT_BOUND, sizes
    assert len(slices) == -(-SCALE_TRIALS // SLICE_TRIALS) == status["trialSlices"] == 2
    entries = trial_slices(installed, name)
    assert len(entries) == SCALE_TRIALS and all(e.final and e.outcome == Outcome.SUCCEEDED for e in entries.values())

    created: dict[str, int] = {}
    for event in _audit_events(audit):
        ref = event.get("objectRef", {})
        if (ref.get("resource") == "jobs" and ref.get("namespace") == ns and not ref.get("subresource")
                and event.get("verb") in ("create", "patch") and event.get("responseStatus", {}).get("code") == 201
                and ref.get("name", "").startswith(f"{name}-")):
            created[ref["name"]] = created.get(ref["name"], 0) + 1
    # a Job created twice (deleted and applied again: its trial would run twice) answers 201 twice; an apply whose
    # client timed out may have created its Job without a 201 in the log, so not every name need appear
    assert len(created) >= SCALE_TRIALS * 0.99 and set(created.values()) == {1}, sorted(
        (n, c) for n, c in created.items() if c != 1)[:10]
    pods = cluster.get_json("pods", "-l", f"kubesweep.io/sweep={name}", namespace=ns)["items"]
    per_job = {}
    for pod in pods:
        owner = next(r["name"] for r in pod["metadata"]["ownerReferences"] if r["kind"] == "Job")
        per_job[owner] = per_job.get(owner, 0) + 1
    assert len(per_job) == SCALE_TRIALS and set(per_job.values()) == {1}

    cluster.kubectl("delete", "sweep", name, "--wait=false", namespace=ns)
    _kwok().wait_until("the sweep's Jobs collected", lambda: jobs_now() == 0 or None, 600, interval=5)
    cluster.kubectl("delete", "node", node, "--wait=false", check=False)


def test_operator_entry_point_help() -> None:
    out = subprocess.run([sys.executable, "-m", "kubesweep.operator", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "--all-namespaces" in out.stdout and "--test-hooks" in out.stdout


def test_without_the_crd_the_cli_says_how_to_install_and_direct_mode_works(installed: Installed,
                                                                          tmp_path: Path) -> None:
    """On a control plane of its own (started for this test, about 5 s): the test cluster's CRD is shared by
    every worker's sweeps, and deleting it there deleted another module's running Sweep."""
    kwok = _kwok()
    bare = kwok.start_cluster(f"{kwok.pytest_cluster_name()}-nocrd-{uuid.uuid4().hex[:4]}", recreate=True)
    try:
        bare.kubectl("create", "namespace", installed.namespace)
        alone = Installed(bare, installed.namespace, installed.sa_kubeconfig, installed.catalog)
        path = sweep_file(tmp_path, "direct", {"gpu": ["l4"], "batch_size": [8]}, hooks={})
        refused = cli(alone, "submit", str(path), "--detach", check=4)
        assert "no Sweep CRD" in refused.stderr and "helm install kubesweep charts/kubesweep" in refused.stderr
        assert "--direct" in refused.stderr
        done = cli(alone, "submit", str(path), "--direct", check=0, timeout=180)
        assert ": Succeeded" in done.stdout  # the progress line of the one trial
        cm = bare.get_json("configmap", "kubesweep-sweep-direct", namespace=alone.namespace)
        assert "sweep.json" in cm["data"]
        # no operator removes finalizers here: the direct backend's Jobs carry none, and a TTL floor instead
        job = sweep_jobs(alone, "direct")[0]
        assert not job["metadata"].get("finalizers") and job["spec"]["ttlSecondsAfterFinished"] >= 600
    finally:
        kwok.stop_cluster(bare.name, bare.bin_dir)


def test_a_job_the_api_server_refuses_is_reported_and_odd_sweeps_stay_small(
        installed: Installed, operator: OperatorProcess, tmp_path: Path) -> None:
    """Applied with kubectl (no CLI check ran): a Sweep whose Jobs the API server refuses (a ResourceQuota of no
    Jobs: every create answers 403, again on every try) says so in its status, in the API server's words, and
    runs once the quota is lifted; a Sweep of 2,000 duplicate GPU names is Invalid with a status message of 20
    problems and a count, not megabytes; a Sweep asking for 100,000 nodes per trial is refused by the CRD."""
    cluster, ns = installed.cluster, installed.namespace
    cluster.apply([{"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-jobs", "namespace": ns},
                    "spec": {"hard": {"count/jobs.batch": "0"}}}])
    try:
        path = sweep_file(tmp_path, "quota", {"gpu": ["l4"], "batch_size": [8]},
                          hooks={"kubesweep.io/test-duration": "500ms"})
        kubectl_apply(installed, path)
        message = _kwok().wait_until("the refusal in the status", lambda: (
            m if "refused trial Job" in (m := (sweep_status(installed, "quota") or {}).get("message") or "")
            else None), 60, interval=0.2)
        assert "HTTP 403" in message and "exceeded quota: no-jobs" in message, message
    finally:
        cluster.kubectl("delete", "resourcequota", "no-jobs", namespace=ns, check=False)
    assert wait_phase(installed, "quota", {"Succeeded", "Failed"}, timeout=90, op=operator)["phase"] == "Succeeded"

    dupes = sweep_file(tmp_path, "dupes", {"gpu": ["l4"] * 2_000}, hooks={})
    kubectl_apply(installed, dupes)
    message = wait_phase(installed, "dupes", {"Invalid"}, timeout=90, op=operator)["message"]
    assert len(message) <= 4096 and "... and 1,979 more problems" in message, message[-300:]

    nodes = sweep_file(tmp_path, "nodes", {"gpu": ["l4"]}, hooks={})
    doc = yaml.safe_load(nodes.read_text())
    doc["spec"]["resources"] = {"num_nodes": 100_000}
    nodes.write_text(yaml.safe_dump(doc, sort_keys=False))
    refused = cluster.kubectl("apply", "--server-side", "-f", str(nodes), namespace=ns, check=False)
    assert refused.returncode != 0 and "spec.resources.num_nodes" in refused.stderr, refused.stderr
    assert "less than or equal to 512" in refused.stderr, refused.stderr
