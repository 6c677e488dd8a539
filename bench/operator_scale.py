"""The operator at scale: a Sweep of 1,000 and 10,000 trials driven by `python -m kubesweep.operator` on the kwok
test control plane, measured through the operator.

    .venv/bin/python bench/operator_scale.py                                  # N = 1,000 and 10,000
    .venv/bin/python bench/operator_scale.py --trials 1000 --label baseline-kwok
    .venv/bin/python bench/operator_scale.py --trials 5000 --timeout 900 --keep-cluster
    .venv/bin/python bench/operator_scale.py --trials 1000 --kueue --label kueue-kwok      # trials admitted by Kueue

It starts (or reuses) the kwok cluster `kubesweep-bench` (`$KUBESWEEP_TEST_CLUSTER`; no real node), installs the
Sweep CRD (`python -m kubesweep.crd`), the chart's ServiceAccount and RBAC (`helm template --show-only
templates/rbac.yaml`, release `kubesweep-bench` in namespace `kubesweep-bench`) and one kwok CPU node with room for
every trial at once. Per N, in a namespace of its own (`kubesweep-bench-n<N>`), it starts the operator as a local
process with a token of that ServiceAccount (`--test-hooks --resync 30`), submits a Sweep of N CPU trials
(`learning_rate` x `seed`, `max_parallel: N`, pods that succeed 1 s after they run) and measures:

  (a) seconds from the submit until all N Jobs exist (paged metadata-only LISTs; goal: 1,000 in <= 20 s, scaled
      to 20 s per 1,000 for other N), and until the first exists;
  (b) seconds until the Sweep's `.status.phase` is `Succeeded` (`--timeout`; otherwise the phase it reached, its
      progress and the operator's warnings, e.g. a status object past etcd's request limit), and, for
      comparison, when the Job controller had finished all N Jobs (kube-controller-manager's
      `job_controller_jobs_finished_total`; the report records the controller-manager's client rate limit,
      which bounds (b) where it is client-go's default of 20 requests/s);
  (c) the operator's API requests per trial, by verb, resource and user agent (`kubesweep-operator/...`, kopf's
      watches `kopf/...`), from the submit until Succeeded plus `--settle` seconds, counted in the API server's
      audit log (tests/cluster/audit-policy.yaml logs every request of this ServiceAccount); writes per trial
      (create + update + patch + delete; goal <= 3);
  (d) the operator's RSS once it leads (idle) and its peak RSS (VmHWM; goal <= 250 MiB at 10,000), and its CPU
      seconds over the sweep; the operator loads bytecode compiled once into ~/.cache/kubesweep-bench/pycache, as
      the image's Python does (compiling on every import leaves ~70 MiB of the compiler's garbage in the heap);
  (e) the largest object the operator wrote: the Sweep with its status, every ConfigMap and TrialSlice labelled
      `kubesweep.io/sweep=<name>`, a sample Job, as compact JSON (goal <= 256 KiB);
  (f) CPU seconds per reconcile of the finished sweep: the operator's utime+stime (/proc/<pid>/stat) over
      `--pokes` annotation patches on the Sweep, each at least `--poke-interval` s apart and waited out until the
      operator's CPU is flat again (so each is a step of its own), minus its idle CPU at the rate measured over
      the same number of intervals just before; the operator's requests in both windows.

With `--kueue`, Kueue runs beside the cluster (tests/cluster/kueue.py) and the Sweep names a LocalQueue (`spec.queue`)
whose ClusterQueue has room for every trial at once (a ResourceFlavor without node labels, cpu and memory quota):
its Jobs are created suspended and run when Kueue admits them, so (a) to (f) include Kueue's work, and

  (g) admission: per Job, its creation to its start (`status.startTime`, set when the Job is unsuspended; without
      Kueue, when the Job controller starts it): p50, p95, max, and trials started per second from the first
      creation to the last start; the same figures are reported without `--kueue` for comparison.

Writes bench/results/operator_scale-<label>.json (`--output`) and prints a table; the operators' logs stay in
$TMPDIR/operator_scale-<label>/. The namespace of each N is deleted (with its operator still running, so no Job is
left holding the operator's finalizer) before the next N; the operator is stopped; the cluster is deleted at the
end unless `--keep-cluster` (SIGTERM and Ctrl-C clean up the same way). Progress goes to stderr.

To measure a commit other than the checkout (e.g. a baseline while the tree is being edited), run a copy of it:

    git archive COMMIT | tar -x -C DIR && git rev-parse COMMIT > DIR/.bench-commit
    cp bench/operator_scale.py DIR/bench/
    cd DIR && /path/to/.venv/bin/python bench/operator_scale.py --trials 1000 --output /path/to/result.json

(the operator runs from DIR; the report names the commit from DIR/.bench-commit).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import platform
import signal
import ssl
import subprocess
import sys
import sysconfig
import tempfile
import time
import traceback
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubesweep.crd import GROUP, PLURAL, VERSION  # noqa: E402
from kubesweep.manifests import LABEL_SWEEP  # noqa: E402
from kubesweep.operator.store import resource_body  # noqa: E402
from kubesweep.plan import plan  # noqa: E402
from kubesweep.sweep_spec import parse_sweep  # noqa: E402

CHART = ROOT / "charts" / "kubesweep"
RESULTS = ROOT / "bench" / "results"
DEFAULT_CLUSTER = "kubesweep-bench"
# Release name and namespace of the chart's ServiceAccount; the audit policy's first rule names this user.
RELEASE = "kubesweep-bench"
HOME_NS = "kubesweep-bench"
OPERATOR_SA = f"{RELEASE}-operator"  # the chart's operatorName for a release whose name contains "kubesweep"
SA_USER = f"system:serviceaccount:{HOME_NS}:{OPERATOR_SA}"
IDENTITY = "bench-op"
NODE = "kubesweep-bench-cpu-0"
SWEEP = "op-scale"
JOB_IMAGE = "registry.example/kubesweep-job@sha256:" + "0" * 64
DIGEST_SETS = ["--set", "operator.image.digest=sha256:" + "1" * 64, "--set", "mlflow.image.digest=sha256:" + "2" * 64]
TEST_POD_ANNOTATIONS = "kubesweep.io/test-pod-annotations"
POKE_ANNOTATION = "bench.kubesweep.io/poke"
META_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
MERGE = "application/merge-patch+json"
WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection")
KUEUE = "kueue.x-k8s.io/v1beta2"
QUEUE = "bench"  # the LocalQueue (and ClusterQueue, ResourceFlavor) of --kueue
SEEDS = 10  # the matrix is learning_rate (N / SEEDS values) x seed (SEEDS values)
TRIAL_RESOURCES = {"gpus_per_trial": 0, "cpu": "100m", "memory": "128Mi", "shm_size": "64Mi"}
# Goals (the numbers): all Jobs of 1,000 trials in 20 s, <= 3 writes per trial, <= 250 MiB peak RSS at
# 10,000 trials, no object over 256 KiB.
GOAL_JOBS_S_PER_1000 = 20.0
GOAL_WRITES_PER_TRIAL = 3.0
GOAL_RSS_MIB = 250.0
GOAL_OBJECT_BYTES = 256 * 1024
# The operator image's Python loads compiled bytecode (pip compiles what it installs); a virtualenv installed without
# it compiles every module on import, and the compiler's garbage stays in the heap (peak RSS at 1,000 trials: 194 MiB
# compiling, 124 MiB from bytecode). So the operator here reads bytecode compiled once into this cache.
PYCACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kubesweep-bench" / "pycache"
T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[operator_scale {time.monotonic() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def now_utc() -> datetime:
    return datetime.now(UTC)


# --------------------------------------------------------------------------------------------- the cluster
def load_kwok() -> Any:
    """tests/cluster/kwok_cluster.py, loaded by path (it is a plain script, not a package module)."""
    name = "kubesweep_kwok_cluster"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "cluster" / "kwok_cluster.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def check_audit_rule(cluster: Any) -> Path:
    """The cluster's audit log; fails when the cluster was made with an audit policy that lacks the benchmark's rule
    (kwokctl copies the policy into the cluster's work directory when it creates the cluster)."""
    policy = cluster.workdir / "audit.yaml"
    text = policy.read_text() if policy.exists() else ""
    if SA_USER not in text:
        raise SystemExit(f"cluster {cluster.name!r} was created with an audit policy that does not log {SA_USER} "
                         f"({policy}); rerun with --recreate-cluster")
    return Path(cluster.workdir) / "logs" / "audit.log"


def component_args(cluster: Any, component: str) -> dict[str, str]:
    """The command-line flags kwokctl started a control-plane component with (the cluster's kwok.yaml)."""
    try:
        for doc in yaml.safe_load_all((cluster.workdir / "kwok.yaml").read_text()):
            for comp in (doc or {}).get("components") or []:
                if comp.get("name") == component:
                    return dict(a.removeprefix("--").split("=", 1) for a in comp.get("args") or [] if "=" in a)
    except (OSError, AttributeError, yaml.YAMLError):
        pass
    return {}


def kcm_metrics_url(cluster: Any) -> str | None:
    """kube-controller-manager's /metrics (kwokctl allows it without authorization)."""
    port = component_args(cluster, "kube-controller-manager").get("secure-port")
    return f"https://127.0.0.1:{port}/metrics" if port else None


def jobs_finished_total(url: str | None) -> int | None:
    """kube-controller-manager's count of Jobs it has seen finish (all namespaces, since it started)."""
    if not url:
        return None
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=10) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    lines = [ln for ln in text.splitlines() if ln.startswith("job_controller_jobs_finished_total")]
    return int(sum(float(ln.rsplit(" ", 1)[1]) for ln in lines)) if lines else 0


def helm_bin(kwok: Any) -> str:
    path = kwok.bin_dir() / "helm"
    if not path.exists():
        raise SystemExit(f"helm is not built: run tests/cluster/build-tools.sh ({path})")
    return str(path)


def install_base(cluster: Any, max_trials: int) -> None:
    """The CRD, the operator's home namespace with its ServiceAccount and Lease Role, and one kwok CPU node with
    room for every trial at once."""
    crd = subprocess.run([sys.executable, "-m", "kubesweep.crd"], check=True, capture_output=True, text=True,
                         cwd=ROOT).stdout
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=crd)
    names = [d["metadata"]["name"] for d in yaml.safe_load_all(crd) if d and d["kind"] == "CustomResourceDefinition"]
    cluster.wait_established(*names, timeout=60)
    if cluster.kubectl("get", "namespace", HOME_NS, check=False).returncode != 0:
        cluster.kubectl("create", "namespace", HOME_NS)
    node = load_kwok().cpu_node_manifest(NODE)
    room = {"cpu": str(max(64, math.ceil(max_trials * 0.1) + 64)), "memory": f"{max(1, max_trials // 2000 + 1)}Ti",
            "pods": str(max_trials + 500)}
    node["status"] = {"allocatable": room, "capacity": dict(room)}
    cluster.apply(node)
    # status is a subresource: a node that existed already keeps its old capacity without this
    cluster.kubectl("patch", "node", NODE, "--subresource=status", "--type=merge", "-p",
                    json.dumps({"status": node["status"]}))

    def ready() -> bool:
        got = cluster.get_json("node", NODE)
        conds = {c["type"]: c["status"] for c in got.get("status", {}).get("conditions") or []}
        return conds.get("Ready") == "True" and int(got["status"]["allocatable"]["pods"]) >= max_trials \
            and not (got.get("spec", {}).get("taints") or [])

    load_kwok().wait_until(f"node {NODE} Ready with room for {max_trials} pods", ready, 90)


def install_rbac(cluster: Any, kwok: Any, namespace: str) -> None:
    """The chart's ServiceAccount (release namespace) and operator Role + RoleBinding in `namespace`, as `helm
    template` renders them."""
    cmd = [helm_bin(kwok), "template", RELEASE, str(CHART), "-n", HOME_NS, *DIGEST_SETS,
           "--set", f"watch.namespaces={{{namespace}}}",
           "--show-only", "templates/serviceaccount.yaml", "--show-only", "templates/rbac.yaml"]
    rendered = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    sa = [d for d in docs if d["kind"] == "ServiceAccount"]
    if not sa or sa[0]["metadata"]["name"] != OPERATOR_SA:
        raise SystemExit(f"the chart's ServiceAccount is not {OPERATOR_SA!r} (the audit policy names that user)")
    cluster.apply(docs)


def install_kueue(cluster: Any, kwok: Any, max_trials: int) -> dict[str, Any]:
    """Kueue beside the cluster and a ClusterQueue with room for `max_trials` trials at once."""
    manager = kwok.start_kueue(cluster)
    cpu = math.ceil(max_trials * 0.1) + 1
    memory = f"{math.ceil(max_trials * 128 / 1024) + 1}Gi"
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([
        {"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": QUEUE}},
        {"apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": {"name": QUEUE}, "spec": {
            "namespaceSelector": {}, "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [
                {"name": QUEUE, "resources": [{"name": "cpu", "nominalQuota": cpu},
                                              {"name": "memory", "nominalQuota": memory}]}]}]}}]))
    return {"version": manager.version, "cluster_queue": {"cpu": cpu, "memory": memory},
            "log": str(manager.log_path)}


def local_queue(cluster: Any, namespace: str) -> None:
    cluster.kubectl("label", "namespace", namespace, "kubesweep.io/kueue=enabled")
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(
        {"apiVersion": KUEUE, "kind": "LocalQueue", "metadata": {"name": QUEUE, "namespace": namespace},
         "spec": {"clusterQueue": QUEUE}}))


def admission(batch: Any, namespace: str) -> dict[str, Any]:
    """(g): per Job, creation to start (status.startTime), from one paged list of the finished sweep."""
    waits: list[float] = []
    created: list[datetime] = []
    started: list[datetime] = []
    cont = None
    while True:
        page = batch.list_namespaced_job(namespace, label_selector=f"{LABEL_SWEEP}={SWEEP}", limit=500,
                                         _continue=cont)
        for job in page.items:
            if job.status and job.status.start_time:
                created.append(job.metadata.creation_timestamp)
                started.append(job.status.start_time)
                waits.append((job.status.start_time - job.metadata.creation_timestamp).total_seconds())
        cont = page.metadata._continue
        if not cont:
            break
    if not waits:
        return {"jobs_started": 0}
    waits.sort()
    span = (max(started) - min(created)).total_seconds()
    return {"jobs_started": len(waits), "wait_p50_s": waits[len(waits) // 2],
            "wait_p95_s": waits[min(len(waits) - 1, math.ceil(0.95 * len(waits)) - 1)], "wait_max_s": waits[-1],
            "started_per_s": round(len(waits) / span, 1) if span > 0 else None,
            "resolution": "1 s (the API's timestamps)"}


def sa_kubeconfig(cluster: Any, path: Path) -> Path:
    """A kubeconfig with a token of the operator's ServiceAccount (as tests/operator/test_controller_cluster.py
    makes it)."""
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    server = next(c for c in admin["clusters"] if c["name"] == context["cluster"])["cluster"]
    token = cluster.kubectl("create", "token", OPERATOR_SA, "--duration=6h", namespace=HOME_NS).stdout.strip()
    entry = {k: server[k] for k in ("server", "certificate-authority", "certificate-authority-data") if k in server}
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "operator",
              "clusters": [{"name": "bench", "cluster": entry}],
              "users": [{"name": OPERATOR_SA, "user": {"token": token}}],
              "contexts": [{"name": "operator", "context": {"cluster": "bench", "user": OPERATOR_SA,
                                                           "namespace": HOME_NS}}]}
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


# --------------------------------------------------------------------------------------------- the operator
def compile_bytecode() -> dict[str, Any]:
    """Compile the interpreter's site-packages and kubesweep into `PYCACHE` (up-to-date files are skipped)."""
    paths = [*sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}), str(ROOT / "kubesweep")]
    say(f"compiling bytecode into {PYCACHE} (once; later runs reuse it)")
    started = time.monotonic()
    # a few packages ship files that are not Python 3 (templates, tests); compileall reports them and goes on
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", *paths],
                   env={**os.environ, "PYTHONPYCACHEPREFIX": str(PYCACHE)}, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=False)
    return {"bytecode": "precompiled, as in the operator image", "pycache_prefix": str(PYCACHE),
            "compile_s": round(time.monotonic() - started, 1)}


class Operator:
    """`python -m kubesweep.operator` as the chart's ServiceAccount, watching one namespace."""

    def __init__(self, kubeconfig: Path, namespace: str, log: Path, resync: float):
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.log = log
        self.resync = resync
        self.proc: subprocess.Popen[bytes] | None = None
        self.command: list[str] = []

    def start(self, timeout: float = 90) -> None:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PYTHONPYCACHEPREFIX": str(PYCACHE)}
        for var in ("MLFLOW_TRACKING_URI", "KUBESWEEP_TEST_KILL_AT", "KUBESWEEP_TEST_STOP_AT"):
            env.pop(var, None)
        self.command = [sys.executable, "-m", "kubesweep.operator", "--namespace", self.namespace,
                        "--lease-name", OPERATOR_SA, "--lease-namespace", HOME_NS, "--identity", IDENTITY,
                        "--test-hooks", "--resync", str(self.resync)]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        deadline = time.monotonic() + timeout
        while "leading" not in self.text():
            if self.proc.poll() is not None:
                raise RuntimeError(f"the operator exited ({self.proc.returncode}):\n{self.text()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the operator did not take the Lease in {timeout:.0f} s:\n{self.text()[-3000:]}")
            time.sleep(0.3)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def cpu_seconds(self) -> float:
        """utime + stime of the operator process (/proc/<pid>/stat fields 14 and 15)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def memory_mib(self) -> dict[str, float]:
        """VmHWM (peak RSS) and VmRSS, MiB."""
        out = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                out[key] = round(int(value.split()[0]) / 1024, 1)
        return out

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def warnings(self) -> dict[str, Any]:
        """Warning/error lines of the operator's log: how many, and the first few distinct ones."""
        lines = [ln for ln in self.text().splitlines()
                 if any(word in ln for word in ("WARNING", "ERROR", "Traceback", "step failed"))]
        distinct: list[str] = []
        for ln in lines:
            short = ln[:400]
            if short not in distinct and "TEST HOOKS ENABLED" not in ln:
                distinct.append(short)
        return {"count": len(lines), "first": distinct[:6],
                "step_failed": sum("step failed" in ln for ln in lines)}

    def stop(self) -> None:
        if not self.alive():
            return
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            say(f"the operator (pid {self.pid}) did not stop in 30 s after SIGTERM: SIGKILL")
            self.proc.kill()
            self.proc.wait(timeout=30)


# --------------------------------------------------------------------------------------------- measuring
def sweep_doc(trials: int, queue: str | None = None) -> dict[str, Any]:
    if trials % SEEDS:
        raise SystemExit(f"--trials must be multiples of {SEEDS} (learning_rate x seed); got {trials}")
    learning_rates = [round(1e-6 * (i + 1), 9) for i in range(trials // SEEDS)]
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Sweep",
            "metadata": {"name": SWEEP, "annotations": {
                TEST_POD_ANNOTATIONS: json.dumps({"kubesweep.io/test-duration": "1s"})}},
            "spec": {"image": JOB_IMAGE, "job": {"max_steps": 2},
                     "matrix": {"learning_rate": learning_rates, "seed": list(range(SEEDS))},
                     "resources": dict(TRIAL_RESOURCES), "concurrency": {"max_parallel": trials},
                     **({"queue": queue} if queue else {})}}


def count_jobs(batch: Any, namespace: str) -> int:
    """How many of the sweep's Jobs exist: paged metadata-only LISTs (no Job bodies)."""
    total, cont = 0, None
    while True:
        resp = batch.list_namespaced_job(namespace, label_selector=f"{LABEL_SWEEP}={SWEEP}", limit=1000,
                                         _continue=cont, _preload_content=False, _headers={"Accept": META_LIST})
        data = json.loads(resp.data)
        total += len(data.get("items") or [])  # a metadata list of nothing has "items": null
        cont = (data.get("metadata") or {}).get("continue")
        if not cont:
            return total


def get_sweep(custom: Any, namespace: str) -> tuple[dict[str, Any], int]:
    """The Sweep as the API server has it, and the size of its compact JSON."""
    resp = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, SWEEP, _preload_content=False)
    body: dict[str, Any] = json.loads(resp.data)
    return body, len(json.dumps(body, separators=(",", ":")))


@dataclass
class AuditEvent:
    received: datetime
    verb: str
    resource: str
    agent: str
    code: int


@dataclass
class AuditReader:
    """The operator's requests, from the API server's audit log (one entry per request: a watch is logged at
    ResponseStarted and ResponseComplete, under one auditID)."""

    path: Path
    start_offset: int = 0
    seen: set[str] = field(default_factory=set)
    events: list[AuditEvent] = field(default_factory=list)

    def mark(self) -> None:
        self.start_offset = self.path.stat().st_size if self.path.exists() else 0
        self.seen.clear()
        self.events.clear()

    def read(self) -> None:
        marker = f'"username":"{SA_USER}"'
        with self.path.open("rb") as fh:
            fh.seek(self.start_offset)
            data = fh.read()
        end = data.rfind(b"\n") + 1  # a line being written stays for the next read
        self.start_offset += end
        for raw in data[:end].splitlines():
            line = raw.decode(errors="replace")
            if marker not in line:
                continue
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("user", {}).get("username") != SA_USER or ev["auditID"] in self.seen:
                continue
            self.seen.add(ev["auditID"])
            ref = ev.get("objectRef") or {}
            resource = ref.get("resource") or ev.get("requestURI", "?").split("?")[0]
            if ref.get("subresource"):
                resource += "/" + ref["subresource"]
            self.events.append(AuditEvent(
                datetime.fromisoformat(ev["requestReceivedTimestamp"].replace("Z", "+00:00")), ev.get("verb", "?"),
                resource, (ev.get("userAgent") or "?").split("/")[0], int(ev.get("responseStatus", {}).get("code", 0))))

    def window(self, start: datetime, end: datetime) -> list[AuditEvent]:
        self.read()
        return [e for e in self.events if start <= e.received < end]


def summarize_requests(events: list[AuditEvent], per: int) -> dict[str, Any]:
    by_verb = Counter(e.verb for e in events)
    writes = sum(n for verb, n in by_verb.items() if verb in WRITE_VERBS)
    lease_writes = sum(1 for e in events if e.verb in WRITE_VERBS and e.resource == "leases")
    return {
        "total": len(events),
        "per_trial": round(len(events) / per, 3),
        "by_verb": dict(by_verb.most_common()),
        "per_trial_by_verb": {verb: round(n / per, 3) for verb, n in by_verb.most_common()},
        "by_resource": dict(Counter(e.resource for e in events).most_common()),
        "by_verb_resource": dict(Counter(f"{e.verb} {e.resource}" for e in events).most_common()),
        "by_user_agent": dict(Counter(e.agent for e in events).most_common()),
        "by_user_agent_verb": dict(Counter(f"{e.agent} {e.verb}" for e in events).most_common()),
        "errors_by_code": dict(Counter(str(e.code) for e in events if e.code >= 400).most_common()),
        "writes": writes,
        "writes_per_trial": round(writes / per, 3),
        "writes_per_trial_without_lease": round((writes - lease_writes) / per, 3),
    }


def wait_with_progress(what: str, fn: Callable[[], tuple[bool, str]], timeout: float, interval: float = 1.0,
                       every: float = 5.0, origin: float | None = None, since: str = "") -> bool:
    """Call fn (-> done, progress text) until done or `timeout` s passed; a progress line every `every` s, its time
    counted from `origin` (a time.monotonic(); default: now), e.g. the submit. Returns whether it got done."""
    start = time.monotonic()
    origin = start if origin is None else origin
    last = -every
    while True:
        done, text = fn()
        t = time.monotonic() - origin
        if done:
            say(f"{what}: {text} after {t:.1f} s{since}")
            return True
        if time.monotonic() - start >= timeout:
            say(f"{what}: TIMEOUT, {text} after {t:.0f} s{since}")
            return False
        if time.monotonic() - start - last >= every:
            say(f"{what}: {text} after {t:.0f} s{since}")
            last = time.monotonic() - start
        time.sleep(interval)


def measure_size(n: int, cluster: Any, api: Any, audit: AuditReader, args: argparse.Namespace, tmp: Path,
                 logs: Path, result: dict[str, Any], cleanup_wait: bool, kcm_url: str | None) -> None:
    """Measure one sweep size into `result`."""
    from kubernetes import client

    kwok = load_kwok()
    batch, core, custom = client.BatchV1Api(api), client.CoreV1Api(api), client.CustomObjectsApi(api)
    namespace = f"kubesweep-bench-n{n}"
    result["namespace"] = namespace
    doc = sweep_doc(n, QUEUE if args.kueue else None)
    p = plan(parse_sweep(doc))
    if len(p.trials) != n:
        raise SystemExit(f"the matrix plans {len(p.trials)} trials, not {n}")
    say(f"=== N = {n:,}: namespace {namespace}")
    if cluster.kubectl("get", "namespace", namespace, check=False).returncode == 0:
        say(f"namespace {namespace} exists (an earlier run): deleting it first")
        delete_leftover_namespace(cluster, batch, namespace, args.cleanup_timeout)
    cluster.kubectl("create", "namespace", namespace)
    install_rbac(cluster, kwok, namespace)
    if args.kueue:
        local_queue(cluster, namespace)
    op = Operator(sa_kubeconfig(cluster, tmp / f"sa-{n}.yaml"), namespace, logs / f"operator-{n}.log", args.resync)
    result["operator_log"] = str(op.log)
    try:
        op.start()
        result["operator_command"] = " ".join(op.command[1:])
        say(f"operator pid {op.pid} leads; log {op.log}")
        time.sleep(2)  # its watches are listed
        result["operator"] = {"idle_rss_mib": op.memory_mib().get("VmRSS")}
        audit.mark()
        finished_before = jobs_finished_total(kcm_url)
        cpu_before = op.cpu_seconds()
        body = resource_body(parse_sweep(doc), namespace)

        # (a) submit -> every Job exists
        submit_at = now_utc()
        t_submit = time.monotonic()
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
        first_job: float | None = None
        timeline: list[tuple[float, int]] = []
        jobs_seen = 0

        def jobs_exist() -> tuple[bool, str]:
            nonlocal first_job, jobs_seen
            jobs_seen = count_jobs(batch, namespace)
            t = time.monotonic() - t_submit
            if jobs_seen and first_job is None:
                first_job = t
            timeline.append((round(t, 1), jobs_seen))
            return jobs_seen >= n, f"jobs {jobs_seen:,}/{n:,}"

        ok = wait_with_progress("jobs", jobs_exist, args.timeout, interval=0.25 if n <= 2000 else 1.0,
                                origin=t_submit, since=" (since the submit)")
        all_jobs = time.monotonic() - t_submit if ok else None
        result["jobs"] = {"all_jobs_exist_s": round(all_jobs, 2) if all_jobs is not None else None,
                          "first_job_s": round(first_job, 2) if first_job is not None else None,
                          "jobs_seen": jobs_seen,
                          "jobs_per_s": round(n / all_jobs, 1) if all_jobs else None,
                          "timeline": thin(timeline)}

        # (b) -> Succeeded
        state: dict[str, Any] = {}
        jobs_done_at: float | None = None
        progress_line: list[tuple[float, str]] = []

        def succeeded() -> tuple[bool, str]:
            nonlocal jobs_done_at
            status = get_sweep(custom, namespace)[0].get("status") or {}
            state.update(phase=status.get("phase"), progress=status.get("progress"), counts=status.get("counts"),
                         message=status.get("message"))
            t = time.monotonic() - t_submit
            if jobs_done_at is None and finished_before is not None:
                finished = jobs_finished_total(kcm_url)
                if finished is not None and finished - finished_before >= n:
                    jobs_done_at = t
            progress_line.append((round(t, 1), f"{state['phase']} {state['progress']}"))
            if not op.alive():
                return True, f"the operator EXITED ({op.proc.returncode if op.proc else '?'})"
            terminal = state["phase"] in ("Succeeded", "Failed", "Cancelled", "Invalid")
            return terminal, f"phase {state['phase']}, done {state['progress']}"

        remaining = max(1.0, args.timeout - (time.monotonic() - t_submit))
        wait_with_progress("sweep", succeeded, remaining, interval=2.0, every=10.0, origin=t_submit,
                           since=" (since the submit)")
        t_end = time.monotonic() - t_submit
        reached = state.get("phase") == "Succeeded"
        finished_now = jobs_finished_total(kcm_url)
        result["sweep"] = {"phase": state.get("phase"), "progress": state.get("progress"),
                           "counts": state.get("counts"), "message": state.get("message"),
                           "succeeded_s": round(t_end, 2) if reached else None,
                           "waited_s": round(t_end, 2),
                           "job_controller_finished_all_s": round(jobs_done_at, 2) if jobs_done_at else None,
                           "job_controller_finished_jobs": finished_now - finished_before
                           if finished_now is not None and finished_before is not None else None,
                           "timeline": thin([(t, s) for t, s in progress_line], 40)}
        time.sleep(args.settle)
        end_at = now_utc()
        cpu_after = op.cpu_seconds() if op.alive() else None

        # (c) requests over the sweep's life
        events = audit.window(submit_at, end_at)
        result["requests"] = {"window_s": round((end_at - submit_at).total_seconds(), 1),
                              **summarize_requests(events, n)}
        result["operator"].update({"pid": op.pid, **(op.memory_mib() if op.alive() else {}),
                                   "cpu_s_during_sweep": round(cpu_after - cpu_before, 2) if cpu_after is not None
                                   else None})

        # (e) object sizes
        result["objects"] = object_sizes(batch, core, custom, namespace)
        # (g) admission
        result["admission"] = admission(batch, namespace)

        # (f) CPU per reconcile of the finished sweep (of one still running, steps would overlap the pokes)
        if op.alive() and state.get("phase") in ("Succeeded", "Failed"):
            result["reconcile_cpu"] = reconcile_cpu(op, custom, audit, namespace, args, state.get("phase"))
        elif op.alive():
            result["reconcile_cpu"] = {"skipped": f"the sweep did not finish (phase {state.get('phase')})",
                                       "cpu_s_per_reconcile": None}
        if op.alive():
            result["operator"].update({k: v for k, v in op.memory_mib().items() if k == "VmHWM"})
            result["operator"]["peak_rss_mib"] = result["operator"].get("VmHWM")
        result["operator"]["log_warnings"] = op.warnings()
        result["goals"] = goals(result, n)
        print_size(result)
    finally:
        cleanup(cluster, core, op, namespace, wait=cleanup_wait, timeout=args.cleanup_timeout)


def delete_leftover_namespace(cluster: Any, batch: Any, namespace: str, timeout: float) -> None:
    """Delete a namespace an interrupted run left behind. No operator runs for it, so the finalizers of its Jobs
    (the operator's) and pods (the Job controller's, which a throttled controller-manager removes slowly) are
    removed here: nothing of it is to be recorded any more. `--recreate-cluster` is quicker."""
    from concurrent.futures import ThreadPoolExecutor

    from kubernetes import client

    core = client.CoreV1Api(batch.api_client)
    cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    patch = {"metadata": {"finalizers": None}}

    def held(list_fn: Callable[..., Any]) -> list[str]:
        resp = list_fn(namespace, _preload_content=False, _headers={"Accept": META_LIST})
        return [o["metadata"]["name"] for o in json.loads(resp.data).get("items") or []
                if o["metadata"].get("finalizers")]

    def release(call: tuple[Callable[..., Any], str]) -> None:
        with contextlib.suppress(Exception):
            call[0](call[1], namespace, patch, _content_type=MERGE)

    def gone() -> tuple[bool, str]:
        if cluster.kubectl("get", "namespace", namespace, check=False).returncode != 0:
            return True, "gone"
        calls = [(batch.patch_namespaced_job, n) for n in held(batch.list_namespaced_job)]
        calls += [(core.patch_namespaced_pod, n) for n in held(core.list_namespaced_pod)]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(release, calls))
        return False, f"released the finalizers of {len(calls):,} Jobs and pods"

    if not wait_with_progress(f"delete namespace {namespace}", gone, timeout, interval=2.0, every=15.0):
        raise RuntimeError(f"namespace {namespace} of an earlier run does not go away")


def thin(points: list[tuple[float, Any]], keep: int = 60) -> list[tuple[float, Any]]:
    """At most `keep` points of a timeline, the last always included."""
    if len(points) <= keep:
        return points
    step = len(points) / keep
    out = [points[int(i * step)] for i in range(keep)]
    return [*out, points[-1]] if out[-1] != points[-1] else out


def object_sizes(batch: Any, core: Any, custom: Any, namespace: str) -> dict[str, Any]:
    body, sweep_bytes = get_sweep(custom, namespace)
    status_bytes = len(json.dumps(body.get("status") or {}, separators=(",", ":")))
    sizes: list[tuple[str, str, int]] = [("Sweep", SWEEP, sweep_bytes)]
    cms = core.list_namespaced_config_map(namespace, label_selector=f"{LABEL_SWEEP}={SWEEP}", _preload_content=False)
    for cm in json.loads(cms.data)["items"]:
        sizes.append(("ConfigMap", cm["metadata"]["name"], len(json.dumps(cm, separators=(",", ":")))))
    try:  # TrialSlices: each trial's phase and outcome, in slices (where the CRD exists)
        slices = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "trialslices",
                                                      label_selector=f"{LABEL_SWEEP}={SWEEP}", _preload_content=False)
        for obj in json.loads(slices.data)["items"]:
            sizes.append(("TrialSlice", obj["metadata"]["name"], len(json.dumps(obj, separators=(",", ":")))))
    except Exception as exc:  # no such resource: an operator that keeps no slices
        if getattr(exc, "status", None) != 404:
            raise
    jobs = batch.list_namespaced_job(namespace, label_selector=f"{LABEL_SWEEP}={SWEEP}", limit=1,
                                     _preload_content=False)
    items = json.loads(jobs.data)["items"]
    if items:
        sizes.append(("Job", items[0]["metadata"]["name"], len(json.dumps(items[0], separators=(",", ":")))))
    largest = max(sizes, key=lambda s: s[2])
    return {"sweep_bytes": sweep_bytes, "sweep_status_bytes": status_bytes,
            "status_trial_entries": len((body.get("status") or {}).get("trials") or {}),
            "configmaps": {name: b for kind, name, b in sizes if kind == "ConfigMap"},
            "trialslices": {name: b for kind, name, b in sizes if kind == "TrialSlice"},
            "sample_job_bytes": next((b for kind, _, b in sizes if kind == "Job"), None),
            "largest": {"kind": largest[0], "name": largest[1], "bytes": largest[2]}}


def wait_quiet(op: Operator, quiet: float = 0.6, threshold: float = 0.03, limit: float = 60) -> None:
    """Until the operator's CPU stays flat: under `threshold` s of CPU over `quiet` s (its step is over)."""
    deadline = time.monotonic() + limit
    last = op.cpu_seconds()
    while time.monotonic() < deadline:
        time.sleep(quiet)
        current = op.cpu_seconds()
        if current - last < threshold:
            return
        last = current


def reconcile_cpu(op: Operator, custom: Any, audit: AuditReader, namespace: str, args: argparse.Namespace,
                  phase: str | None) -> dict[str, Any]:
    """CPU per reconcile: the operator's CPU over `pokes` annotation patches (each a Sweep event, so a step), each
    waited out (`poke_interval`, then until its CPU stays flat, so no two pokes share a step), minus its idle CPU
    at the rate measured over `pokes * poke_interval` s just before."""
    idle_for = args.pokes * args.poke_interval
    wait_quiet(op)
    say(f"reconcile CPU: {idle_for:.0f} s idle, then {args.pokes} pokes at least {args.poke_interval} s apart")
    idle_start, t0, c0 = now_utc(), time.monotonic(), op.cpu_seconds()
    time.sleep(idle_for)
    idle_end, t1, c1 = now_utc(), time.monotonic(), op.cpu_seconds()
    for i in range(args.pokes):
        custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, SWEEP,
                                              {"metadata": {"annotations": {POKE_ANNOTATION: str(i)}}},
                                              _content_type=MERGE)
        time.sleep(args.poke_interval)
        wait_quiet(op)
    poke_end, t2, c2 = now_utc(), time.monotonic(), op.cpu_seconds()
    idle_rate = (c1 - c0) / (t1 - t0)
    net = (c2 - c1) - idle_rate * (t2 - t1)
    idle_events = audit.window(idle_start, idle_end)
    poke_events = audit.window(idle_end, poke_end)
    per_poke = Counter(f"{e.verb} {e.resource}" for e in poke_events if e.resource != "leases")
    return {"pokes": args.pokes, "min_interval_s": args.poke_interval,
            "idle_window_s": round(t1 - t0, 1), "idle_cpu_s": round(c1 - c0, 3),
            "poke_window_s": round(t2 - t1, 1), "poke_cpu_s": round(c2 - c1, 3),
            "cpu_s_per_reconcile": round(net / args.pokes, 3),
            "idle_requests": dict(Counter(f"{e.verb} {e.resource}" for e in idle_events).most_common()),
            "poke_requests": dict(Counter(f"{e.verb} {e.resource}" for e in poke_events).most_common()),
            "requests_per_reconcile": {k: round(v / args.pokes, 2) for k, v in per_poke.most_common()},
            "sweep_phase": phase}


def goals(result: dict[str, Any], n: int) -> dict[str, Any]:
    jobs_goal = GOAL_JOBS_S_PER_1000 * n / 1000
    all_jobs = result["jobs"]["all_jobs_exist_s"]
    writes = result["requests"]["writes_per_trial"]
    rss = result["operator"].get("peak_rss_mib")
    largest = result["objects"]["largest"]["bytes"]
    return {
        "all_jobs_exist_s": {"goal": f"<= {jobs_goal:g} s" + ("" if n == 1000 else " (20 s per 1,000 trials)"),
                             "value": all_jobs, "pass": all_jobs is not None and all_jobs <= jobs_goal},
        "reaches_succeeded": {"goal": "phase Succeeded within --timeout", "value": result["sweep"]["phase"],
                              "pass": result["sweep"]["phase"] == "Succeeded"},
        "writes_per_trial": {"goal": f"<= {GOAL_WRITES_PER_TRIAL:g}", "value": writes,
                             "pass": writes <= GOAL_WRITES_PER_TRIAL},
        "peak_rss_mib": {"goal": f"<= {GOAL_RSS_MIB:g} MiB (stated for 10,000 trials)", "value": rss,
                         "pass": rss is not None and rss <= GOAL_RSS_MIB},
        "largest_object_bytes": {"goal": f"<= {GOAL_OBJECT_BYTES} (256 KiB)", "value": largest,
                                 "pass": largest <= GOAL_OBJECT_BYTES},
    }


def cleanup(cluster: Any, core: Any, op: Operator, namespace: str, *, wait: bool, timeout: float) -> None:
    """Delete the namespace with the operator still running (it removes its finalizer from Jobs whose Sweep is
    gone), wait until it is gone when `wait`, then stop the operator."""
    from kubernetes import client

    try:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        if wait:
            batch = client.BatchV1Api(core.api_client)

            def gone() -> tuple[bool, str]:
                if cluster.kubectl("get", "namespace", namespace, check=False).returncode != 0:
                    return True, "gone"
                try:
                    return False, f"{count_jobs(batch, namespace):,} jobs left"
                except Exception as exc:  # the namespace vanished between the two requests
                    return False, f"({type(exc).__name__})"

            done = wait_with_progress(f"delete namespace {namespace}", gone, timeout, interval=2.0, every=15.0)
            if not done:
                say(f"WARNING: namespace {namespace} is still there; delete it by hand (or the cluster)")
    finally:
        op.stop()


# --------------------------------------------------------------------------------------------- report
def machine() -> dict[str, Any]:
    cpu = "?"
    with contextlib.suppress(OSError):
        cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name")), "?")
    mem_kib = 0
    with contextlib.suppress(OSError, StopIteration):
        mem_kib = int(next(ln for ln in Path("/proc/meminfo").read_text().splitlines()
                           if ln.startswith("MemTotal")).split()[1])
    return {"cpu_model": cpu, "cores": os.cpu_count(), "memory_gib": round(mem_kib / 1024 ** 2, 1),
            "kernel": platform.release(), "python": platform.python_version(),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}


def code_state() -> dict[str, Any]:
    def git(*a: str) -> str:
        proc = subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, check=False)
        return proc.stdout.strip()

    commit = git("rev-parse", "HEAD")
    if not commit and (ROOT / ".bench-commit").exists():  # a `git archive` snapshot of a commit
        return {"commit": (ROOT / ".bench-commit").read_text().strip(), "snapshot": str(ROOT),
                "uncommitted_changes": []}
    changed = [ln[3:] for ln in git("status", "--porcelain", "--", "kubesweep", "charts").splitlines()]
    return {"commit": commit, "uncommitted_changes": changed}


def print_size(r: dict[str, Any]) -> None:
    say(f"N = {r['trials']:,}: jobs {r['jobs']['all_jobs_exist_s']} s, phase {r['sweep']['phase']} "
        f"({r['sweep']['progress']}) after {r['sweep']['waited_s']} s, "
        f"{r['requests']['writes_per_trial']} writes/trial, peak RSS {r['operator'].get('peak_rss_mib')} MiB, "
        f"largest object {r['objects']['largest']['bytes']:,} B")


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.3f}".rstrip("0").rstrip(".") if abs(v) < 100 else f"{v:,.1f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def table(results: list[dict[str, Any]]) -> str:
    def row(name: str, get: Callable[[dict[str, Any]], Any]) -> list[str]:
        cells = []
        for r in results:
            try:
                cells.append(fmt(get(r)))
            except (KeyError, TypeError):
                cells.append("-")
        return [name, *cells]

    def goal(key: str) -> Callable[[dict[str, Any]], Any]:
        return lambda r: "pass" if r["goals"][key]["pass"] else "FAIL"

    rows = [["", *[f"N = {r['trials']:,}" for r in results]],
            row("first Job exists (s)", lambda r: r["jobs"]["first_job_s"]),
            row("all Jobs exist (s)", lambda r: r["jobs"]["all_jobs_exist_s"]),
            row("  goal", goal("all_jobs_exist_s")),
            row("Job controller finished all (s)", lambda r: r["sweep"]["job_controller_finished_all_s"]),
            row("Jobs finished (Job controller)", lambda r: r["sweep"]["job_controller_finished_jobs"]),
            row("Sweep phase reached", lambda r: f"{r['sweep']['phase']} {r['sweep']['progress']}"),
            row("Succeeded after (s)", lambda r: r["sweep"]["succeeded_s"]),
            row("  after the Job controller (s)", lambda r: round(r["sweep"]["succeeded_s"]
                                                                 - r["sweep"]["job_controller_finished_all_s"], 2)),
            row("  goal", goal("reaches_succeeded")),
            row("operator requests / trial", lambda r: r["requests"]["per_trial"])]
    def per_verb(verb: str) -> Callable[[dict[str, Any]], Any]:
        return lambda r: r["requests"]["per_trial_by_verb"].get(verb, 0)

    verbs = sorted({v for r in results for v in r.get("requests", {}).get("by_verb", {})})
    rows += [row(f"  {verb} / trial", per_verb(verb)) for verb in verbs]
    rows += [row("writes / trial", lambda r: r["requests"]["writes_per_trial"]),
             row("  without Lease renewals", lambda r: r["requests"]["writes_per_trial_without_lease"]),
             row("  goal", goal("writes_per_trial")),
             row("requests by kopf/ agent", lambda r: r["requests"]["by_user_agent"].get("kopf", 0)),
             row("requests by kubesweep-operator/", lambda r: r["requests"]["by_user_agent"].get(
                 "kubesweep-operator", 0)),
             row("error responses", lambda r: sum(r["requests"]["errors_by_code"].values())),
             row("operator RSS idle (MiB)", lambda r: r["operator"].get("idle_rss_mib")),
             row("operator peak RSS (MiB)", lambda r: r["operator"]["peak_rss_mib"]),
             row("  goal", goal("peak_rss_mib")),
             row("operator CPU over the sweep (s)", lambda r: r["operator"]["cpu_s_during_sweep"]),
             row("Sweep JSON (bytes)", lambda r: r["objects"]["sweep_bytes"]),
             row("sample Job JSON (bytes)", lambda r: r["objects"]["sample_job_bytes"]),
             row("largest object (bytes)", lambda r: r["objects"]["largest"]["bytes"]),
             row("  goal", goal("largest_object_bytes")),
             row("CPU per reconcile, finished (s)", lambda r: r["reconcile_cpu"]["cpu_s_per_reconcile"]),
             row("operator log warnings", lambda r: r["operator"]["log_warnings"]["count"]),
             row("Job created -> started p50 (s)", lambda r: r["admission"]["wait_p50_s"]),
             row("Job created -> started p95 (s)", lambda r: r["admission"]["wait_p95_s"]),
             row("Job created -> started max (s)", lambda r: r["admission"]["wait_max_s"]),
             row("Jobs started / s", lambda r: r["admission"]["started_per_s"])]
    widths = [max(len(row_[i]) for row_ in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths,
                                                                                                    strict=True)))
                     for r in rows)


# --------------------------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, nargs="+", default=[1000, 10000],
                        help=f"sweep sizes, multiples of {SEEDS} (default: 1000 10000)")
    parser.add_argument("--label", default="kwok", help="results file: bench/results/operator_scale-LABEL.json")
    parser.add_argument("--output", type=Path, default=None, help="write the results here instead")
    parser.add_argument("--timeout", type=float, default=1800,
                        help="seconds from the submit to wait for Succeeded, per size (default 1800)")
    parser.add_argument("--settle", type=float, default=5, help="seconds counted after Succeeded (default 5)")
    parser.add_argument("--pokes", type=int, default=10, help="reconciles triggered for the CPU figure (default 10)")
    parser.add_argument("--poke-interval", type=float, default=1.5, help="seconds between pokes (default 1.5)")
    parser.add_argument("--resync", type=float, default=30, help="the operator's --resync (default 30)")
    parser.add_argument("--cleanup-timeout", type=float, default=900,
                        help="seconds to wait for a size's namespace to go before the next size (default 900)")
    parser.add_argument("--kueue", action="store_true",
                        help="run Kueue beside the cluster and submit the Sweep to a LocalQueue (spec.queue)")
    parser.add_argument("--keep-cluster", action="store_true", help="leave the kwok cluster running at the end")
    parser.add_argument("--recreate-cluster", action="store_true",
                        help="delete and create the kwok cluster first (e.g. after the audit policy changed)")
    args = parser.parse_args()
    # SIGTERM, and SIGINT where a non-interactive shell started us with it ignored, end the run through the
    # `finally`s: the operator is stopped, the namespace and (without --keep-cluster) the cluster deleted
    def terminated(signum: int, _frame: Any) -> None:
        say(f"received signal {signum}: stopping")
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, terminated)
    signal.signal(signal.SIGHUP, terminated)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for n in args.trials:
        sweep_doc(n)  # refuses sizes the matrix cannot make

    from kubernetes import config

    kwok = load_kwok()
    name = os.environ.get("KUBESWEEP_TEST_CLUSTER", DEFAULT_CLUSTER)
    command = " ".join([os.path.relpath(sys.executable, ROOT) if sys.executable.startswith(str(ROOT))
                        else sys.executable, os.path.relpath(__file__, ROOT), *sys.argv[1:]])
    report: dict[str, Any] = {"benchmark": "bench/operator_scale.py", "label": args.label,
                              "date": now_utc().strftime("%Y-%m-%dT%H:%M:%SZ"), "command": command,
                              "machine": machine(), "code": code_state()}
    out = args.output or RESULTS / f"operator_scale-{args.label}.json"
    cluster = kwok.start_cluster(name, recreate=args.recreate_cluster)
    results: list[dict[str, Any]] = []
    try:
        audit = AuditReader(check_audit_rule(cluster))
        others = sorted(p.name for p in (kwok.kwok_workdir() / "clusters").glob("*") if p.name != name)
        report["cluster"] = {"name": name, "kind": "kwok test control plane (tests/cluster), no real node",
                             "versions": cluster.versions, "other_kwok_clusters_on_machine": others,
                             "reused": not cluster.started_here,
                             "controller_manager_kube_api_qps": component_args(cluster, "kube-controller-manager")
                             .get("kube-api-qps", "20 (client-go default)"),
                             "scheduler_kube_api_qps": component_args(cluster, "kube-scheduler")
                             .get("kube-api-qps", "50 (default)")}
        report["settings"] = {"timeout_s": args.timeout, "settle_s": args.settle, "pokes": args.pokes,
                              "poke_interval_s": args.poke_interval, "operator_resync_s": args.resync,
                              "trial_resources": TRIAL_RESOURCES, "job": {"max_steps": 2},
                              "pod_duration": "1s", "matrix": f"learning_rate (N/{SEEDS}) x seed ({SEEDS})",
                              "operator_identity": IDENTITY, "service_account": SA_USER}
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
        install_base(cluster, max(args.trials))
        report["kueue"] = install_kueue(cluster, kwok, max(args.trials)) if args.kueue else None
        report["operator_python"] = compile_bytecode()
        kcm_url = kcm_metrics_url(cluster)
        logs = Path(tempfile.gettempdir()) / f"operator_scale-{args.label}"  # the operators' logs stay there
        logs.mkdir(exist_ok=True)
        for old in logs.glob("operator-*.log"):
            old.unlink()
        with tempfile.TemporaryDirectory(prefix="operator-scale-") as tmp_name:
            tmp = Path(tmp_name)
            report["results"] = results
            for i, n in enumerate(args.trials):
                last = i == len(args.trials) - 1
                result: dict[str, Any] = {"trials": n}  # filled as it goes: an interrupted size keeps its figures
                results.append(result)
                try:
                    measure_size(n, cluster, api, audit, args, tmp, logs, result,
                                 cleanup_wait=not last or args.keep_cluster, kcm_url=kcm_url)
                except Exception as exc:
                    say(f"N = {n:,} FAILED: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
                    result["error"] = f"{type(exc).__name__}: {exc}"
                except BaseException as exc:
                    result["error"] = f"interrupted ({type(exc).__name__} {exc})"
                    raise
                finally:
                    write_report(out, report)
    finally:
        if not args.keep_cluster:
            say(f"deleting the kwok cluster {name!r} (--keep-cluster keeps it)")
            kwok.stop_cluster(name, cluster.bin_dir)
        else:
            say(f"the kwok cluster {name!r} keeps running: KUBECONFIG={cluster.kubeconfig}; "
                f"tests/cluster/down --name {name} deletes it")
    measured = [r for r in results if "jobs" in r]
    if measured:
        print(table(measured))
    for r in results:
        if "error" in r:
            print(f"N = {r['trials']:,}: {r['error']}")
    print(f"results: {os.path.relpath(out, ROOT)}")


def write_report(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
