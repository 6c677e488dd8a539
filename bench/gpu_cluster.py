"""The cluster as its users run it, on a GPU machine: the chart installed with helm, Kueue rationing the node's GPUs,
and the shipped `sweeps/gpu_matrix.yaml` submitted, watched and read as the README gives it.

On the GPU machine, after `bench/gpu_node.py node` (the node up, the assembled image imported):

    python3 bench/gpu_cluster.py chart  --out DIR   # Kueue, then `helm install` of charts/kubesweep; ml-team's queue
    python3 bench/gpu_cluster.py matrix --out DIR   # sweeps/gpu_matrix.yaml through the in-cluster operator, with the
                                                    # operator pod deleted and the MLflow pod restarted mid-sweep
    python3 bench/gpu_cluster.py local  --out DIR   # the same command on the local backend, same machine

What the machine cannot reach is swapped as a user of an air-gapped cluster would, on the command line, the spec
file untouched: `--set job.random_init=true` (no hub, so no pretrained weights: bert-base shapes from random init,
accuracy labelled as such), SST-2's TSVs and bert-base-uncased's vocabulary on the namespace's cache claim
(`--set storage.cache_claim=cache --set job.dataset=/cache/sst2 --set job.tokenizer=/cache/tokenizer`), and
`--set job.max_steps=N` for the device time this machine is lent. The node's GPU type comes from the cluster itself:
`sweep submit` names it (`--gpu TYPE`).

The chart's images are the node's assembled image (`tests/cluster/gpu_node.py`: the machine's own PyTorch-CUDA
userland with kubesweep and its `job`, `tracking` and `k8s` extras), referenced by digest for the operator, MLflow
and the trials alike. Each step writes `<step>.json` (timings, commands, figures) and the commands' output to DIR.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _bench_module() -> Any:
    """bench/gpu_node.py (the node's steps and helpers), under a name of its own: tests/cluster/gpu_node.py, which
    it imports, has the same file name."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_node_bench", ROOT / "bench" / "gpu_node.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


node_bench = _bench_module()
gpu_node = node_bench.gpu_node  # tests/cluster/gpu_node.py (bench/gpu_node.py put its folder on sys.path)

RELEASE = "kubesweep"
RELEASE_NS = "kubesweep"
TEAM_NS = "ml-team"
QUEUE = "gpus"
SWEEP = "bert-gpu-matrix"  # sweeps/gpu_matrix.yaml's metadata.name
SPEC = "sweeps/gpu_matrix.yaml"
MLFLOW_SERVICE = f"{RELEASE}-mlflow"
STORAGE_CLASS = "node"
log = node_bench.log


def layout() -> Any:
    return gpu_node.Layout(gpu_node.ROOT)


def run_logged(out: Path, argv: list[str], *, env: dict[str, str], timeout: float = 900,
               name: str = "commands.log") -> subprocess.CompletedProcess[str]:
    """A command as a user types it, its output appended to DIR/commands.log with its exit and seconds."""
    t0 = time.monotonic()
    proc = subprocess.run(argv, env=env, text=True, capture_output=True, timeout=timeout, check=False, cwd=ROOT)
    shown = " ".join(argv).replace(sys.executable + " -m kubesweep", "sweep")
    with (out / name).open("a") as f:
        f.write(f"$ {shown}   (exit {proc.returncode}, {time.monotonic() - t0:.1f}s)\n{proc.stdout}{proc.stderr}\n")
    return proc


def sweep_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "kubesweep", *args]


# --------------------------------------------------------------------------------------------- chart
def host_volume(name: str, path: Path, claim: str, namespace: str, *, uid: int, size: str = "50Gi") -> list[Any]:
    """A PersistentVolume on the node's disk bound ahead to `claim` (a cluster's storage provisioner would make it)."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, uid, uid)
    return [{"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
             "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce", "ReadWriteMany"],
                      "storageClassName": STORAGE_CLASS, "persistentVolumeReclaimPolicy": "Retain",
                      "hostPath": {"path": str(path), "type": "Directory"},
                      "claimRef": {"namespace": namespace, "name": claim}}}]


def team_claim(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {
        "name": name, "namespace": TEAM_NS, "labels": {"kubesweep.io/sweeps": "allowed"}},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": STORAGE_CLASS,
                 "volumeName": f"{TEAM_NS}-{name}", "resources": {"requests": {"storage": "50Gi"}}}}


def kueue_objects(product: str, gpu: str, gpus: int) -> list[dict[str, Any]]:
    """A ResourceFlavor for the node's GPU type, a ClusterQueue of its GPUs, and ml-team's LocalQueue."""
    v = "kueue.x-k8s.io/v1beta2"
    return [
        {"apiVersion": v, "kind": "ResourceFlavor", "metadata": {"name": gpu},
         "spec": {"nodeLabels": {gpu_node.PRODUCT_LABEL: product}}},
        {"apiVersion": v, "kind": "ClusterQueue", "metadata": {"name": QUEUE}, "spec": {
            "namespaceSelector": {}, "queueingStrategy": "BestEffortFIFO",
            "resourceGroups": [{"coveredResources": ["cpu", "memory", gpu_node.GPU_RESOURCE], "flavors": [{
                "name": gpu, "resources": [{"name": "cpu", "nominalQuota": "16"},
                                           {"name": "memory", "nominalQuota": "120Gi"},
                                           {"name": gpu_node.GPU_RESOURCE, "nominalQuota": str(gpus)}]}]}]}},
        {"apiVersion": v, "kind": "LocalQueue", "metadata": {"name": QUEUE, "namespace": TEAM_NS},
         "spec": {"clusterQueue": QUEUE}},
    ]


def start_kueue(api: Any) -> float:
    """Kueue's manager as a node process with the release's CRDs and webhooks (`tests/cluster/kueue.py`)."""
    import kueue

    t0 = time.monotonic()
    lay = layout()
    version = (lay.bin / "kueue.version").read_text().strip() if (lay.bin / "kueue.version").exists() else "v0.17.0"

    def kubectl(*args: str, input: str = "", check: bool = True, timeout: float = 60) -> Any:
        import yaml

        dry = "--dry-run=server" in args
        try:
            for doc in yaml.safe_load_all(input):
                if doc:
                    api.apply(doc, dry_run=dry)
        except urllib.error.HTTPError as exc:
            if check:
                raise RuntimeError(f"apply: {exc.code} {exc.read()[:2000]!r}") from None
            return subprocess.CompletedProcess(args, 1, "", str(exc))
        return subprocess.CompletedProcess(args, 0, "", "")

    def wait_established(*_selector: str, timeout: float = 90) -> None:
        def established() -> bool:
            crds = api.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions")["items"]
            mine = [c for c in crds if c["spec"]["group"] == "kueue.x-k8s.io"]
            return bool(mine) and all(any(c["type"] == "Established" and c["status"] == "True"
                                          for c in (crd.get("status") or {}).get("conditions") or [])
                                      for crd in mine)
        node_bench.wait_for(established, timeout, "Kueue's CRDs established")

    manager = kueue.Kueue(workdir=gpu_node.ROOT / "kueue-run", bins=lay.bin, kubeconfig=lay.admin_kubeconfig,
                          version=version, kubectl=kubectl, wait_established=wait_established,
                          components=gpu_node.ROOT / "kueue" / "components")
    manager.start(timeout=180)
    return time.monotonic() - t0


def mlflow_reachable(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=3) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def mlflow_uri(api: Any) -> tuple[str, str]:
    """MLflow's address for this host's CLI: the Service's address (kube-proxy's output rules), else its pod's (as
    `kubectl port-forward svc/kubesweep-mlflow` would reach it); and which one it is."""
    ip = api.get(f"/api/v1/namespaces/{RELEASE_NS}/services/{MLFLOW_SERVICE}")["spec"]["clusterIP"]
    uri = f"http://{ip}:5000"
    if mlflow_reachable(uri):
        return uri, "service"
    pods = api.get(f"/api/v1/namespaces/{RELEASE_NS}/pods?labelSelector=app.kubernetes.io/component%3Dmlflow")
    for pod in pods["items"]:
        pod_ip = pod["status"].get("podIP")
        if pod_ip and mlflow_reachable(f"http://{pod_ip}:5000"):
            return f"http://{pod_ip}:5000", "pod"
    return uri, "unreachable"


def credentials(api: Any) -> dict[str, tuple[str, str]]:
    data = api.get(f"/api/v1/namespaces/{RELEASE_NS}/secrets/{MLFLOW_SERVICE}-auth")["data"]
    plain = {k: base64.b64decode(v).decode() for k, v in data.items()}
    return {"admin": (plain["admin-username"], plain["admin-password"]),
            "team": (f"kubesweep-ns-{TEAM_NS}", plain[f"ns-{TEAM_NS}-password"])}


def diagnostics(api: Any, namespace: str) -> dict[str, Any]:
    """Each pod's containers' states and log tails, and the namespace's last events."""
    out: dict[str, Any] = {"pods": {}, "events": []}
    for pod in api.get(f"/api/v1/namespaces/{namespace}/pods")["items"]:
        name, st = pod["metadata"]["name"], pod["status"]
        containers = (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or [])
        logs = {}
        for c in containers:
            try:
                logs[c["name"]] = api.text(f"/api/v1/namespaces/{namespace}/pods/{name}/log?container={c['name']}"
                                           "&tailLines=30")[-3000:]
            except (urllib.error.URLError, OSError) as exc:
                logs[c["name"]] = str(exc)
        out["pods"][name] = {"phase": st.get("phase"), "states": [c.get("state") for c in containers], "logs": logs}
    out["events"] = [f"{e['involvedObject']['name']}: {e['reason']}: {e['message']}"
                     for e in api.get(f"/api/v1/namespaces/{namespace}/events")["items"][-30:]]
    return out


def reinstall(lay: Any, env: dict[str, str], out: Path) -> None:
    """A release left by an earlier attempt goes first (with its MLflow store), so the install is a first one."""
    helm = str(lay.bin / "helm")
    kube = ["--kubeconfig", str(lay.admin_kubeconfig)]
    if subprocess.run([helm, "status", RELEASE, "-n", RELEASE_NS, *kube], capture_output=True).returncode != 0:
        return
    run_logged(out, [helm, "uninstall", RELEASE, "-n", RELEASE_NS, "--wait", "--timeout", "120s", *kube], env=env,
               timeout=150)
    api = node_bench.node_api()
    with contextlib.suppress(urllib.error.HTTPError):  # the chart keeps MLflow's claim (resource policy `keep`)
        api.call("DELETE", f"/api/v1/namespaces/{RELEASE_NS}/persistentvolumeclaims/{MLFLOW_SERVICE}")
    with contextlib.suppress(urllib.error.HTTPError):
        api.call("DELETE", f"/api/v1/persistentvolumes/{RELEASE_NS}-mlflow")
    node_bench.wait_for(lambda: not any(pv["metadata"]["name"] == f"{RELEASE_NS}-mlflow" for pv in
                                        api.get("/api/v1/persistentvolumes")["items"]), 60, "the old MLflow volume")
    shutil.rmtree(gpu_node.ROOT / "volumes" / "chart-mlflow", ignore_errors=True)


def chart(args: argparse.Namespace) -> None:
    env = node_bench.site_env()
    api = node_bench.node_api()
    lay = layout()
    image = json.loads((gpu_node.ROOT / "job-image.json").read_text())["image"]
    repo, digest = image.split("@")
    result: dict[str, Any] = {"image": image}
    t0 = time.monotonic()
    result["kueue_s"] = round(start_kueue(api), 1)
    node = api.node() or {}
    product = node["metadata"]["labels"][gpu_node.PRODUCT_LABEL]
    gpu = node_bench.gpu_key(api)
    gpus = gpu_node.gpus_allocatable(node)
    # the team's namespace: restricted pods, Kueue manages its Jobs; its claims for the cache and checkpoints
    api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TEAM_NS, "labels": {
        "pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest",
        "kubesweep.io/kueue": "enabled"}}})
    reinstall(lay, env, args.out)
    volumes = gpu_node.ROOT / "volumes"
    objs = host_volume(f"{RELEASE_NS}-mlflow", volumes / "chart-mlflow", MLFLOW_SERVICE, RELEASE_NS, uid=1001)
    for claim in ("cache", "checkpoints"):
        objs += host_volume(f"{TEAM_NS}-{claim}", volumes / f"{TEAM_NS}-{claim}", claim, TEAM_NS, uid=1000)
        objs.append(team_claim(claim))
    for obj in objs:
        api.apply(obj)
    cache = volumes / f"{TEAM_NS}-cache"
    for src, dest in ((ROOT / "data" / "sst2", cache / "sst2"), (node_bench.WHEELS / "tokenizer", cache / "tokenizer")):
        if not dest.exists():
            shutil.copytree(src, dest)
    subprocess.run(["chown", "-R", "1000:1000", str(cache)], check=True)
    for obj in kueue_objects(product, gpu, gpus):
        api.apply(obj)
    # the README's command, with this node's image and its storage class
    helm = [str(lay.bin / "helm"), "install", RELEASE, "charts/kubesweep", "-n", RELEASE_NS, "--create-namespace",
            "--set", f"operator.image.repository={repo}", "--set", f"operator.image.digest={digest}",
            "--set", f"mlflow.image.repository={repo}", "--set", f"mlflow.image.digest={digest}",
            "--set", f"watch.namespaces={{{TEAM_NS}}}",
            "--set", f"mlflow.persistence.storageClassName={STORAGE_CLASS}",
            "--set", f"kueue.defaultQueue={QUEUE}",
            "--wait", "--timeout", "240s", "--kubeconfig", str(lay.admin_kubeconfig)]
    t1 = time.monotonic()
    proc = run_logged(args.out, helm, env=env, timeout=300)
    result["helm_install"] = {"exit": proc.returncode, "wall_s": round(time.monotonic() - t1, 1)}
    result["pods"] = {p["metadata"]["name"]: {"phase": p["status"].get("phase"), **node_bench.pod_timing(p)}
                      for p in api.get(f"/api/v1/namespaces/{RELEASE_NS}/pods")["items"]}
    if proc.returncode != 0:
        result["diagnostics"] = diagnostics(api, RELEASE_NS)
        node_bench.write_json(args.out, "chart.json", result)
        raise SystemExit(f"helm install exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    uri, via = mlflow_uri(api)
    result["mlflow"] = {"uri": uri, "reached_at": via}
    result["chart_ready_s"] = round(time.monotonic() - t0, 1)
    result["gpu"] = {"type": gpu, "product": product, "allocatable": gpus}
    # what `sweep submit` says of this cluster before it applies anything
    result["validate"] = run_logged(args.out, sweep_argv("validate", SPEC, "--backend", "kubernetes", "-n", TEAM_NS),
                                    env=env, timeout=120).stdout
    node_bench.write_json(args.out, "chart.json", result)


# --------------------------------------------------------------------------------------------- matrix
def overrides(args: argparse.Namespace, *, local: bool) -> list[str]:
    data = Path(args.local_data) if local else Path("/cache")
    sets = {"job.random_init": "true", "job.dataset": f"{data}/sst2", "job.tokenizer": f"{data}/tokenizer",
            "job.max_steps": str(args.max_steps)}
    if not local:
        sets["storage.cache_claim"] = "cache"
        # the image lock's key names an image this machine cannot pull: the node's own, pinned by digest
        image = json.loads((gpu_node.ROOT / "job-image.json").read_text())["image"]
        sets["images.torch-2\\.8-cu128"] = image
    return [arg for key, value in sets.items() for arg in ("--set", f"{key}={value}")] + [
        arg for extra in args.extra_set for arg in ("--set", extra)]


def sweep_phase(api: Any) -> dict[str, Any]:
    try:
        sweep = api.get(f"/apis/kubesweep.io/v1alpha1/namespaces/{TEAM_NS}/sweeps/{SWEEP}") or {}
    except (urllib.error.URLError, OSError):
        return {}
    return dict(sweep.get("status") or {})


def done_count(status: dict[str, Any]) -> int:
    """Trials in a terminal phase (the Sweep's `.status.counts.done`, which the operator keeps)."""
    return int((status.get("counts") or {}).get("done") or 0)


class Sampler(threading.Thread):
    """The chart's pods' CPU and memory every few seconds, from the kubelet's summary (through the API server)."""

    def __init__(self, api: Any, every: float = 5.0) -> None:
        super().__init__(daemon=True)
        self.api, self.every, self.samples, self.stop = api, every, [], threading.Event()

    def run(self) -> None:
        path = f"/api/v1/nodes/{gpu_node.NODE_NAME}/proxy/stats/summary"
        while not self.stop.is_set():
            try:
                summary = self.api.get(path)
                t = time.time()
                for pod in summary.get("pods", []):
                    ref = pod["podRef"]
                    if ref["namespace"] != RELEASE_NS:
                        continue
                    self.samples.append({"t": t, "pod": ref["name"],
                                         "cpu_m": (pod.get("cpu") or {}).get("usageNanoCores", 0) / 1e6,
                                         "mem_mib": (pod.get("memory") or {}).get("workingSetBytes", 0) / 2**20})
            except Exception as exc:  # a sample missed is a gap, not an end
                self.samples.append({"t": time.time(), "error": str(exc)[:200]})
            self.stop.wait(self.every)

    def summary(self) -> dict[str, Any]:
        by_role: dict[str, list[dict[str, Any]]] = {}
        for s in self.samples:
            if "pod" in s:
                role = "operator" if "-operator-" in s["pod"] else "mlflow" if "-mlflow-" in s["pod"] else s["pod"]
                by_role.setdefault(role, []).append(s)
        out: dict[str, Any] = {}
        for role, samples in by_role.items():
            per_t: dict[float, dict[str, float]] = {}
            for s in samples:  # the role's pods together at each sample
                acc = per_t.setdefault(round(s["t"]), {"cpu_m": 0.0, "mem_mib": 0.0})
                acc["cpu_m"] += s["cpu_m"]
                acc["mem_mib"] += s["mem_mib"]
            cpu = sorted(v["cpu_m"] for v in per_t.values())
            mem = sorted(v["mem_mib"] for v in per_t.values())
            out[role] = {"samples": len(per_t), "cpu_millicores_mean": round(sum(cpu) / len(cpu), 1),
                         "cpu_millicores_max": round(cpu[-1], 1), "memory_mib_mean": round(sum(mem) / len(mem), 1),
                         "memory_mib_max": round(mem[-1], 1)}
        return out


def pods_of(api: Any, component: str) -> list[dict[str, Any]]:
    sel = f"app.kubernetes.io/component%3D{component}"
    return list(api.get(f"/api/v1/namespaces/{RELEASE_NS}/pods?labelSelector={sel}")["items"])


def leader(api: Any) -> str | None:
    """The operator pod holding the Lease (its holderIdentity names the pod)."""
    try:
        leases = api.get(f"/apis/coordination.k8s.io/v1/namespaces/{RELEASE_NS}/leases")["items"]
    except (urllib.error.URLError, OSError):
        return None
    names = {p["metadata"]["name"] for p in pods_of(api, "operator")}
    for lease in leases:
        holder = (lease.get("spec") or {}).get("holderIdentity") or ""
        for name in names:
            if name in holder:
                return name
    return None


def runs_per_trial(uri: str, user: tuple[str, str]) -> dict[str, Any]:
    """Every MLflow run of the sweep's experiment by trial id: a trial logged twice would show two."""
    import mlflow
    from mlflow.tracking import MlflowClient

    os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"] = user
    mlflow.set_tracking_uri(uri)
    client = MlflowClient()
    exp = client.get_experiment_by_name(f"{TEAM_NS}/{SWEEP}")
    if exp is None:
        return {"error": "no experiment"}
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    trials: dict[str, list[str]] = {}
    for r in runs:
        tid = r.data.tags.get("kubesweep.trial_id")
        if tid:
            trials.setdefault(tid, []).append(r.info.status)
    return {"runs": len(runs), "trials": len(trials), "twice": {k: v for k, v in trials.items() if len(v) > 1},
            "statuses": sorted({s for v in trials.values() for s in v})}


def matrix(args: argparse.Namespace) -> None:
    env = node_bench.site_env()
    api = node_bench.node_api()
    chart_info = json.loads((args.out / "chart.json").read_text()) if (args.out / "chart.json").exists() else {}
    uri, via = mlflow_uri(api)
    users = credentials(api)
    env = {**env, "MLFLOW_TRACKING_USERNAME": users["team"][0], "MLFLOW_TRACKING_PASSWORD": users["team"][1]}
    gpu = node_bench.gpu_key(api)
    result: dict[str, Any] = {"mlflow": {"uri": uri, "reached_at": via}, "gpu": gpu, "max_steps": args.max_steps}
    k8s = ["--backend", "kubernetes", "-n", TEAM_NS]
    submit = sweep_argv("submit", SPEC, *k8s, "--tracking-uri", uri, "--gpu", gpu, *overrides(args, local=False))
    sampler = Sampler(api)
    sampler.start()
    t0 = time.monotonic()
    with (args.out / "submit.log").open("w") as f:
        f.write(f"$ {' '.join(submit).replace(sys.executable + ' -m kubesweep', 'sweep')}\n")
        f.flush()
        proc = subprocess.Popen(submit, env={**env, "COLUMNS": "120"}, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    # `status --watch` as a user types it after `submit` has applied the Sweep (before that there is none to watch)
    while not sweep_phase(api) and proc.poll() is None and time.monotonic() - t0 < 120:
        time.sleep(1)
    with (args.out / "status-watch.log").open("w") as f:
        watch = subprocess.Popen(sweep_argv("status", SWEEP, *k8s, "--watch"), env={**env, "COLUMNS": "120"},
                                 stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    faults: dict[str, Any] = {}
    first_done: float | None = None
    while proc.poll() is None and time.monotonic() - t0 < args.timeout:
        status = sweep_phase(api)
        done = done_count(status)
        if done and first_done is None:
            first_done = time.monotonic() - t0
        if "operator" not in faults and done >= args.fault_operator_after:
            victim = leader(api)
            if victim:
                api.call("DELETE", f"/api/v1/namespaces/{RELEASE_NS}/pods/{victim}")
                faults["operator"] = {"deleted": victim, "at_s": round(time.monotonic() - t0, 1), "done": done}
                log(f"deleted the operator's leader pod {victim} ({done} trials done)")
        if "mlflow" not in faults and done >= args.fault_mlflow_after:
            (pod,) = pods_of(api, "mlflow")[:1] or [None]
            if pod:
                api.call("DELETE", f"/api/v1/namespaces/{RELEASE_NS}/pods/{pod['metadata']['name']}")
                faults["mlflow"] = {"deleted": pod["metadata"]["name"], "at_s": round(time.monotonic() - t0, 1),
                                    "done": done}
                log(f"deleted the MLflow pod {pod['metadata']['name']} ({done} trials done)")
        time.sleep(2)
    if proc.poll() is None:
        proc.terminate()
    result["submit"] = {"exit": proc.wait(timeout=60), "wall_s": round(time.monotonic() - t0, 1),
                        "first_trial_done_s": first_done}
    try:
        watch.wait(timeout=60)
    except subprocess.TimeoutExpired:
        watch.terminate()
    sampler.stop.set()
    result["faults"] = faults
    result["resources"] = sampler.summary()
    result["sweep_status"] = sweep_phase(api)
    uri, via = mlflow_uri(api)  # the MLflow pod may have a new address
    # after the MLflow pod's restart the user's reads wait, as a user does, until the server answers again
    t_back = time.monotonic()
    while not mlflow_reachable(uri) and time.monotonic() - t_back < 300:
        time.sleep(2)
        uri, via = mlflow_uri(api)
    result["mlflow_answered_after_sweep_s"] = round(time.monotonic() - t_back, 1)
    for fmt in ("table", "json", "markdown"):
        out = run_logged(args.out, sweep_argv("results", SWEEP, *k8s, "--tracking-uri", uri, "-o", fmt),
                         env={**env, "COLUMNS": "160"})
        (args.out / f"results.{ 'md' if fmt == 'markdown' else fmt}").write_text(out.stdout)
    run_logged(args.out, sweep_argv("report", SWEEP, *k8s, "--tracking-uri", uri, "-o", str(args.out / "report")),
               env=env)
    t1 = time.monotonic()
    ui = subprocess.Popen(sweep_argv("ui", SWEEP, *k8s, "--tracking-uri", uri), env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        ui_out, _ = ui.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        ui.terminate()
        ui_out = (ui.communicate()[0] or "") + "\n(left running after 30 s: stopped)"
    result["ui"] = {"output": ui_out, "wall_s": round(time.monotonic() - t1, 1)}
    result["runs"] = runs_per_trial(uri, users["admin"])
    os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"] = users["admin"]
    files = node_bench.results_files(uri, f"{TEAM_NS}/{SWEEP}")
    result["busy"] = node_bench.busy(files)
    (args.out / "results-files.json").write_text(json.dumps(files, indent=1, default=str))
    result["timeline"] = {"chart": chart_info.get("chart_ready_s"), "first_trial_done_s": first_done,
                          "sweep_s": result["submit"]["wall_s"]}
    # the MLflow store, for the UI's screenshot where a browser is (this machine has none)
    store = gpu_node.ROOT / "volumes" / "chart-mlflow"
    subprocess.run(["tar", "-C", str(store), "-czf", str(args.out / "mlflow-store.tgz"), "."], check=False)
    log(f"GPU busy {result['busy'].get('fraction')}; faults {faults}; runs {result['runs']}")
    node_bench.write_json(args.out, "matrix.json", result)


def local(args: argparse.Namespace) -> None:
    """The same command on the local backend, same machine: the GPU busy to compare."""
    env = node_bench.site_env()
    api = node_bench.node_api()
    gpu = node_bench.gpu_key(api)
    home = gpu_node.ROOT / "local-home"
    env = {**env, "KUBESWEEP_HOME": str(home), "COLUMNS": "160"}
    data = Path(args.local_data)
    if not (data / "sst2").exists():
        shutil.copytree(ROOT / "data" / "sst2", data / "sst2")
        shutil.copytree(node_bench.WHEELS / "tokenizer", data / "tokenizer")
    t0 = time.monotonic()
    proc = run_logged(args.out, sweep_argv("submit", SPEC, "--gpu", gpu, *overrides(args, local=True)), env=env,
                      timeout=args.timeout, name="local.log")
    result: dict[str, Any] = {"submit": {"exit": proc.returncode, "wall_s": round(time.monotonic() - t0, 1)}}
    out = run_logged(args.out, sweep_argv("results", SWEEP, "-o", "json"), env=env, name="local.log")
    (args.out / "local-results.json").write_text(out.stdout)
    uri = f"sqlite:///{home}/mlflow.db"
    files = node_bench.results_files(uri, SWEEP)
    result["busy"] = node_bench.busy(files)
    node_bench.write_json(args.out, "local.json", result)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, fn, text in (("chart", chart, "Kueue and the chart on the node; ml-team's queue and claims"),
                           ("matrix", matrix, "sweeps/gpu_matrix.yaml through the in-cluster operator, with faults"),
                           ("local", local, "the same command on the local backend")):
        sp = sub.add_parser(name, help=text)
        sp.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-cluster-out")))
        sp.add_argument("--max-steps", type=int, default=100, help="--set job.max_steps: steps per trial")
        sp.add_argument("--timeout", type=float, default=560)
        sp.add_argument("--fault-operator-after", type=int, default=3, help="trials done before the operator's "
                                                                           "leader pod is deleted")
        sp.add_argument("--fault-mlflow-after", type=int, default=7, help="trials done before the MLflow pod is "
                                                                         "deleted")
        sp.add_argument("--local-data", default=str(gpu_node.ROOT / "local-data"))
        sp.add_argument("--extra-set", action="append", default=[], help="another --set for the sweep")
        sp.set_defaults(fn=fn)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    args.fn(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
