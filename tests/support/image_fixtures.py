"""Fixtures for the tests that need real images (tests/test_images_build.py, and the real node's tests in
tests/operator/test_controller_realnode.py): a local registry, buildah, stand-in bases, and the job and operator
images built and pushed by `images/build.sh`. The root conftest makes them available to every test module, so
the images are built once per session whoever asks first. Missing tools or a registry that will not start FAIL
these tests (never skip)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from kubesweep.images import DEFAULT_LOCK, load_lock
from tests.images import support

APT_LINE = "apt-get install -y buildah skopeo docker-registry mmdebstrap"


@pytest.fixture(scope="session")
def image_tools() -> None:
    missing = support.missing_tools()
    if missing:
        pytest.fail(f"image tests need {', '.join(missing)} (Debian: {APT_LINE})", pytrace=False)
    if os.geteuid() != 0:
        pytest.fail("image tests run buildah as root (chroot isolation); run them as root", pytrace=False)


@pytest.fixture(scope="session")
def registry(image_tools: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[support.Registry]:
    try:
        reg = support.start_registry(tmp_path_factory.mktemp("registry"))
    except support.ImageToolError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield reg
    reg.stop(keep_as_seed=True)


@pytest.fixture(scope="session")
def buildah(image_tools: None) -> support.Buildah:
    return support.Buildah.cached()


@dataclass(frozen=True)
class Bases:
    python: str  # digest-pinned references in the local registry
    pytorch: str
    torch_version: str
    cuda_version: str


@pytest.fixture(scope="session")
def standin_bases(registry: support.Registry, buildah: support.Buildah,
                  tmp_path_factory: pytest.TempPathFactory) -> Bases:
    """The stand-ins for the public bases, built (or taken from the cache) and pushed to the local registry."""
    work = tmp_path_factory.mktemp("standins")
    try:
        python = support.python_standin(buildah)
        pytorch = support.pytorch_standin(buildah)
        refs = {}
        for key, standin in (("python", python), ("pytorch", pytorch)):
            repo = f"{registry.host}/standin/{key}"
            tag = standin.name.rsplit(":", 1)[1]
            digest = buildah.push(standin.name, f"{repo}:{tag}", work)
            refs[key] = f"{repo}:{tag}@{digest}"
    except support.ImageToolError as exc:
        pytest.fail(f"building the stand-in bases failed: {exc}", pytrace=False)
    assert pytorch.torch and pytorch.cuda
    return Bases(refs["python"], refs["pytorch"], pytorch.torch, pytorch.cuda)


@dataclass(frozen=True)
class Built:
    lock_path: Path
    job: str  # digest-pinned references as the lock has them
    operator: str
    bases: Bases
    build_seconds: float


JOB_KEY = "torch-2.8-cu128"


@pytest.fixture(scope="session")
def built_images(registry: support.Registry, buildah: support.Buildah, standin_bases: Bases,
                 tmp_path_factory: pytest.TempPathFactory) -> Built:
    """`images/build.sh` builds the job image (line torch-2.8-cu128) and the operator image on the stand-in bases,
    offline from a wheelhouse, pushes both to the local registry and writes their digests into a copy of the lock."""
    work = tmp_path_factory.mktemp("build")
    lock_path = work / "images.lock.yaml"
    shutil.copy(DEFAULT_LOCK, lock_path)
    try:
        job_wheels = support.wheelhouse(support.job_wheel_closure(), "job")
        op_wheels = support.wheelhouse(support.operator_wheel_closure(), "operator")
    except support.ImageToolError as exc:
        pytest.fail(f"downloading the dependency wheels failed: {exc}", pytrace=False)
    wheels = work / "wheels"
    wheels.mkdir()
    for house in (job_wheels, op_wheels):
        for whl in house.glob("*.whl"):
            if not (wheels / whl.name).exists():
                os.link(whl, wheels / whl.name)
    env = {**os.environ, "REGISTRY": registry.host, "BUILDER": "buildah", "BUILDAH_ISOLATION": "chroot",
           "PATH": f"{support.ROOT / '.venv' / 'bin'}:{os.environ.get('PATH', '')}"}
    cmd = [
        str(support.ROOT / "images" / "build.sh"),
        "--key", JOB_KEY, "--key", "operator", "--lock", str(lock_path),
        "--base", f"{JOB_KEY}={standin_bases.pytorch}", "--base", f"operator={standin_bases.python}",
        "--build-arg", f"TORCH_VERSION={standin_bases.torch_version}",
        "--build-arg", f"CUDA_VERSION={standin_bases.cuda_version}",
        *[f"--builder-arg={a}" for a in buildah.global_args],
        "--wheelhouse", str(wheels), "--no-compress", "--no-tls-verify",
    ]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=support.ROOT, timeout=1800, check=False)
    seconds = time.monotonic() - t0
    (work / "build.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        pytest.fail(f"images/build.sh exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-6000:]}", pytrace=False)
    lock = load_lock(lock_path)
    job, operator = lock.images[JOB_KEY].reference, lock.images["operator"].reference
    assert job and operator, proc.stdout
    return Built(lock_path, job, operator, standin_bases, seconds)


def by_digest(ref: str) -> str:
    """NAME:TAG@DIGEST -> NAME@DIGEST: Kubernetes takes both (the digest wins), skopeo and buildah only this."""
    name, digest = ref.rsplit("@", 1)
    if ":" in name.rsplit("/", 1)[-1]:
        name = name.rsplit(":", 1)[0]
    return f"{name}@{digest}"


def skopeo_json(*args: str) -> dict[str, object]:
    out = support.run(["skopeo", *args], timeout=120, quiet=True)
    data = json.loads(out)
    assert isinstance(data, dict)
    return data


def write_yaml(path: Path, data: object) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
