"""Real image tooling for the image tests (tests/images/test_build_images.py): a local OCI registry, buildah, and
stand-ins for the public base images.

Public registries cannot be reached here, so the bases the Containerfiles name are replaced (through the BASE
build argument) by stand-ins built from Debian packages and from the PyPI wheels the project already installs:

- stand-in for `pytorch/pytorch:<ver>-cuda<x>-cudnn9-runtime`: a Debian bookworm rootfs (mmdebstrap: python3,
  python3-venv, passwd) with a virtual environment at /opt/conda (the official image's Python prefix) holding the
  very torch wheel of this checkout's .venv and everything it requires (its CUDA libraries, triton) from PyPI,
  unpacked offline from uv's cache. All of it is needed: torch's CUDA build does not import without the CUDA
  libraries, and pip checks torch's requirements when the job image installs packages that need torch.
- stand-in for `python:3.12.x-slim-bookworm`: the same Debian rootfs (Debian's Python 3.11 stands in for 3.12).

Everything slow is cached under ~/.cache/kubesweep-images/ (override: KUBESWEEP_IMAGES_CACHE), keyed by inputs:
the rootfs tarball, the torch tree, the dependency wheelhouse, buildah's image store and its layer cache; and the
registry's storage and port, which let the next run's pushes find what it holds (`start_registry`). `push_standins`
and `build_images` are what the image fixtures and `python -m tests.images.prepare` run.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata as md
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from kubesweep.images.build import EXTRAS, find_uv
from kubesweep.images.lock import DEFAULT_LOCK, load_lock

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("KUBESWEEP_IMAGES_CACHE", Path.home() / ".cache" / "kubesweep-images"))
SUITE = "bookworm"
MIRROR = os.environ.get("KUBESWEEP_DEBIAN_MIRROR", "http://deb.debian.org/debian")
ROOTFS_PACKAGES = ("python3", "python3-venv", "passwd", "ca-certificates")
STANDIN_DIR = Path(__file__).parent / "standin"
TOOLS = {
    "buildah": "buildah",
    "skopeo": "skopeo",
    "docker-registry": "docker-registry",
    "mmdebstrap": "mmdebstrap",
}


class ImageToolError(RuntimeError):
    pass


def missing_tools() -> list[str]:
    return [pkg for exe, pkg in TOOLS.items() if shutil.which(exe) is None]


def run(cmd: list[str], *, timeout: float = 900, env: dict[str, str] | None = None, quiet: bool = False,
        cwd: Path | None = None) -> str:
    """Run a command; on failure raise with the end of its output (the reason a test fails)."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd, check=False)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-4000:]
        raise ImageToolError(f"{' '.join(cmd[:4])} ... exited {proc.returncode}:\n{tail}")
    if not quiet and proc.stderr.strip():
        sys.stderr.write(proc.stderr[-2000:])
    return proc.stdout


def key_of(*parts: object) -> str:
    return hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------------------
# Registry


REGISTRY_SEED = CACHE / "registry-seed"


@dataclass
class Registry:
    host: str
    process: subprocess.Popen[bytes]
    log: Path
    storage: Path

    def stop(self, *, keep_as_seed: bool = False) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        if keep_as_seed:
            shutil.rmtree(REGISTRY_SEED, ignore_errors=True)
            _link_tree(self.storage, REGISTRY_SEED)


def _link_tree(src: Path, dst: Path) -> None:
    def link(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    shutil.copytree(src, dst, copy_function=link, dirs_exist_ok=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


REGISTRY_PORT = CACHE / "registry-port"


def registry_port() -> int:
    """The port the last registry had, if it is free, else any free one.

    buildah remembers which registry holds which layer by host and port (containers/image's blob-info cache), not
    by content. With the port of the last run, a push into the seeded registry finds the multi-GB PyTorch layers
    known there and sends nothing (about 10 s); on a new port it reads them all back to learn that (about 90 s)."""
    with contextlib.suppress(OSError, ValueError):
        port = int(REGISTRY_PORT.read_text())
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the registry binds: past TIME_WAIT
            s.bind(("127.0.0.1", port))
        return port
    return free_port()


def start_registry(workdir: Path, *, seeded: bool = True) -> Registry:
    """Debian's docker-registry (distribution) on 127.0.0.1 (`registry_port`), config and storage under `workdir`.

    `seeded`: the storage starts as a hardlinked copy of the previous run's (REGISTRY_SEED), so pushing a layer the
    registry already holds is skipped, as with any registry that has it; what is new is pushed in full.
    """
    port = registry_port()
    storage = workdir / "storage"
    storage.mkdir(parents=True)
    if seeded and REGISTRY_SEED.is_dir():
        _link_tree(REGISTRY_SEED, storage)
    config = workdir / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log: {level: warn}\n"
        f"storage: {{filesystem: {{rootdirectory: {storage}}}, delete: {{enabled: true}}}}\n"
        f"http: {{addr: '127.0.0.1:{port}'}}\n"
    )
    log = workdir / "registry.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=out, stderr=subprocess.STDOUT)
    reg = Registry(f"127.0.0.1:{port}", proc, log, storage)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ImageToolError(f"docker-registry exited {proc.returncode}: {log.read_text()[-2000:]}")
        with contextlib.suppress(OSError), urllib.request.urlopen(f"http://{reg.host}/v2/", timeout=2) as resp:
            if resp.status == 200:
                REGISTRY_PORT.parent.mkdir(parents=True, exist_ok=True)
                REGISTRY_PORT.write_text(f"{port}\n")
                return reg
        time.sleep(0.2)
    reg.stop()
    raise ImageToolError(f"docker-registry did not answer on {reg.host} in 30s: {log.read_text()[-2000:]}")


# ---------------------------------------------------------------------------------------------------------
# buildah


def storage_driver() -> str:
    """overlay where the kernel mounts it (much less copying of the multi-GB torch layer), else vfs."""
    forced = os.environ.get("KUBESWEEP_IMAGES_STORAGE_DRIVER")
    if forced:
        return forced
    probe = CACHE / "overlay-probe"
    shutil.rmtree(probe, ignore_errors=True)
    probe.mkdir(parents=True)
    lower, upper, work, merged = (probe / d for d in ("lower", "upper", "work", "merged"))
    for d in (lower, upper, work, merged):
        d.mkdir()
    proc = subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                           f"lowerdir={lower},upperdir={upper},workdir={work}", str(merged)],
                          capture_output=True, check=False)
    if proc.returncode == 0:
        subprocess.run(["umount", str(merged)], check=False)
    shutil.rmtree(probe, ignore_errors=True)
    return "overlay" if proc.returncode == 0 else "vfs"


@dataclass(frozen=True)
class Buildah:
    driver: str
    root: Path
    runroot: Path

    @classmethod
    def cached(cls) -> Buildah:
        driver = storage_driver()
        return cls(driver, CACHE / f"storage-{driver}", CACHE / f"run-{driver}")

    @property
    def global_args(self) -> list[str]:
        return [f"--root={self.root}", f"--runroot={self.runroot}", f"--storage-driver={self.driver}"]

    def __call__(self, *args: str, timeout: float = 900, quiet: bool = False) -> str:
        return run(["buildah", *self.global_args, *args], timeout=timeout, quiet=quiet,
                   env={**os.environ, "BUILDAH_ISOLATION": "chroot"})

    def has_image(self, name: str) -> bool:
        proc = subprocess.run(["buildah", *self.global_args, "inspect", "--type", "image", name],
                              capture_output=True, check=False)
        return proc.returncode == 0

    def push(self, name: str, dest: str, workdir: Path) -> str:
        """Push uncompressed (fast, and the same digest every time) and return the pushed manifest's digest."""
        digest_file = workdir / f"digest-{key_of(dest)}"
        self("push", "--tls-verify=false", "--disable-compression", "--digestfile", str(digest_file), name,
             f"docker://{dest}", quiet=True)
        return digest_file.read_text().strip()

    @contextlib.contextmanager
    def container(self, image: str) -> Iterator[str]:
        name = self("from", "--tls-verify=false", "--pull=missing", "--quiet", image, quiet=True).strip()
        try:
            yield name
        finally:
            subprocess.run(["buildah", *self.global_args, "rm", name], capture_output=True, check=False)


# ---------------------------------------------------------------------------------------------------------
# Stand-in inputs


def rootfs_tarball() -> Path:
    """A minimal Debian rootfs with Python (mmdebstrap, from Debian's archive), cached by suite and packages."""
    out = CACHE / "rootfs" / f"{SUITE}-{key_of(SUITE, MIRROR, ROOTFS_PACKAGES)}.tar"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial.tar")
    scratch = CACHE / "tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    run(["mmdebstrap", "--quiet", "--variant=minbase", f"--include={','.join(ROOTFS_PACKAGES)}",
         "--aptopt=Acquire::Retries 3", SUITE, str(partial), MIRROR], timeout=900, quiet=True,
        env={**os.environ, "TMPDIR": str(scratch)})
    partial.rename(out)
    return out


def _dist_requires(dist: md.Distribution, extras: Iterable[str]) -> list[Requirement]:
    env: dict[str, str] = {k: str(v) for k, v in default_environment().items()}
    out = []
    for raw in dist.requires or []:
        req = Requirement(raw)
        if req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in ("", *extras)):
            out.append(req)
    return out


def installed_closure(roots: Iterable[tuple[str, tuple[str, ...]]]) -> dict[str, str]:
    """name -> installed version of `roots` (name, extras) and everything they need, read from this venv."""
    seen: dict[str, str] = {}
    todo = [(canonicalize_name(n), tuple(e)) for n, e in roots]
    done: set[tuple[str, tuple[str, ...]]] = set()
    while todo:
        name, extras = todo.pop()
        if (name, extras) in done:
            continue
        done.add((name, extras))
        dist = md.distribution(name)
        seen[name] = dist.version
        todo += [(canonicalize_name(r.name), tuple(sorted(r.extras))) for r in _dist_requires(dist, extras)]
    return seen


def torch_closure() -> dict[str, str]:
    """What the stand-in PyTorch base installs: torch and everything it needs, as the official image has."""
    return installed_closure([("torch", ())])


def job_wheel_closure() -> dict[str, str]:
    """Wheels the job image installs on top of the base: kubesweep[job,tracking]'s closure less the base's."""
    closure = installed_closure([("kubesweep", EXTRAS["job"])])
    base = installed_closure([("torch", ())])
    return {n: v for n, v in closure.items() if n not in base and n != "kubesweep"}


def operator_wheel_closure() -> dict[str, str]:
    """Wheels the operator image installs (it runs the tuner too): kubesweep[k8s,tune,tracking]'s closure."""
    closure = installed_closure([("kubesweep", EXTRAS["operator"])])
    closure.pop("kubesweep")
    return closure


def torch_tree() -> tuple[Path, str, str]:
    """site-packages holding torch and its CUDA libraries, unpacked offline from uv's cache (hardlinks)."""
    pins = torch_closure()
    out = CACHE / "torch" / key_of(sorted(pins.items()), sys.version_info[:2])
    site = out / "site-packages"
    if not (out / "done").is_file():
        shutil.rmtree(out, ignore_errors=True)
        site.mkdir(parents=True)
        uv = find_uv()
        if uv is None:
            raise ImageToolError("no uv (UV, PATH or ~/.local/bin/uv) to unpack torch from its cache: run make setup")
        run([uv, "pip", "install", "--quiet", "--offline", "--no-deps", "--link-mode=hardlink", "--target",
             str(site), "--python", sys.executable, *[f"{n}=={v}" for n, v in sorted(pins.items())]],
            timeout=900, quiet=True)
        (out / "done").touch()
    import torch

    return site, md.version("torch").split("+")[0], str(torch.version.cuda)


def wheelhouse(pins: dict[str, str], name: str) -> Path:
    """The wheels of `pins` from PyPI (pip download, binary only), cached by the pin set."""
    out = CACHE / "wheelhouse" / f"{name}-{key_of(sorted(pins.items()), sys.version_info[:2])}"
    if (out / "done").is_file():
        return out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    pip = _pip()
    reqs = out / "pins.txt"
    reqs.write_text("".join(f"{n}=={v}\n" for n, v in sorted(pins.items())))
    run([*pip, "download", "--quiet", "--disable-pip-version-check", "--no-deps", "--only-binary=:all:",
         "--dest", str(out), "--requirement", str(reqs)], timeout=900, quiet=True)
    reqs.unlink()
    (out / "done").touch()
    return out


def _pip() -> list[str]:
    for python in (sys.executable, shutil.which("python3") or "python3"):
        if subprocess.run([python, "-m", "pip", "--version"], capture_output=True, check=False).returncode == 0:
            return [python, "-m", "pip"]
    raise ImageToolError("no pip to download wheels with (python3 -m pip)")


# ---------------------------------------------------------------------------------------------------------
# Stand-in base images


@dataclass(frozen=True)
class StandIn:
    name: str  # local image name
    torch: str | None = None
    cuda: str | None = None


def python_standin(bh: Buildah) -> StandIn:
    tar = rootfs_tarball()
    recipe = (STANDIN_DIR / "python.Containerfile").read_text()
    name = f"localhost/kubesweep-standin/python:{key_of(tar.name, recipe)}"
    if not bh.has_image(name):
        ctx = CACHE / "context" / "python"
        shutil.rmtree(ctx, ignore_errors=True)
        ctx.mkdir(parents=True)
        os.link(tar, ctx / "rootfs.tar")
        bh("bud", "--layers", "-f", str(STANDIN_DIR / "python.Containerfile"), "-t", name, str(ctx), quiet=True)
        shutil.rmtree(ctx, ignore_errors=True)
    return StandIn(name)


def pytorch_standin(bh: Buildah) -> StandIn:
    tar = rootfs_tarball()
    site, torch_version, cuda = torch_tree()
    recipe = (STANDIN_DIR / "pytorch.Containerfile").read_text()
    name = f"localhost/kubesweep-standin/pytorch:{key_of(tar.name, site, recipe)}"
    if not bh.has_image(name):
        ctx = CACHE / "context" / "pytorch"
        shutil.rmtree(ctx, ignore_errors=True)
        ctx.mkdir(parents=True)
        os.link(tar, ctx / "rootfs.tar")
        shutil.copytree(site, ctx / "site-packages", copy_function=os.link, symlinks=True)
        bh("bud", "--layers", "-f", str(STANDIN_DIR / "pytorch.Containerfile"),
           "--build-arg", f"TORCH_VERSION={torch_version}", "--build-arg", f"CUDA_VERSION={cuda}",
           "-t", name, str(ctx), timeout=1800, quiet=True)
        shutil.rmtree(ctx, ignore_errors=True)
    return StandIn(name, torch_version, cuda)


# ---------------------------------------------------------------------------------------------------------
# The images the tests use: stand-ins pushed, then the job and operator images built on them


@dataclass(frozen=True)
class Bases:
    python: str  # digest-pinned references in the local registry
    pytorch: str
    torch_version: str
    cuda_version: str


@dataclass(frozen=True)
class Built:
    lock_path: Path
    job: str  # digest-pinned references as the lock has them
    operator: str
    bases: Bases
    build_seconds: float


JOB_KEY = "torch-2.8-cu128"


def push_standins(registry: Registry, bh: Buildah, work: Path) -> Bases:
    """The stand-ins for the public bases, built (or taken from the cache) and pushed to `registry`."""
    python = python_standin(bh)
    pytorch = pytorch_standin(bh)
    refs = {}
    for key, standin in (("python", python), ("pytorch", pytorch)):
        repo = f"{registry.host}/standin/{key}"
        tag = standin.name.rsplit(":", 1)[1]
        digest = bh.push(standin.name, f"{repo}:{tag}", work)
        refs[key] = f"{repo}:{tag}@{digest}"
    if not (pytorch.torch and pytorch.cuda):
        raise ImageToolError(f"the PyTorch stand-in {pytorch.name} says no torch or CUDA version")
    return Bases(refs["python"], refs["pytorch"], pytorch.torch, pytorch.cuda)


def build_images(registry: Registry, bh: Buildah, bases: Bases, work: Path) -> Built:
    """`images/build.sh` builds the job image (line JOB_KEY) and the operator image on the stand-in bases, offline
    from a wheelhouse, pushes both to `registry` and writes their digests into a copy of the lock in `work`."""
    lock_path = work / "images.lock.yaml"
    shutil.copy(DEFAULT_LOCK, lock_path)
    job_wheels = wheelhouse(job_wheel_closure(), "job")
    op_wheels = wheelhouse(operator_wheel_closure(), "operator")
    wheels = work / "wheels"
    wheels.mkdir()
    for house in (job_wheels, op_wheels):
        for whl in house.glob("*.whl"):
            if not (wheels / whl.name).exists():
                os.link(whl, wheels / whl.name)
    env = {**os.environ, "REGISTRY": registry.host, "BUILDER": "buildah", "BUILDAH_ISOLATION": "chroot",
           "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ.get('PATH', '')}"}
    cmd = [
        str(ROOT / "images" / "build.sh"),
        "--key", JOB_KEY, "--key", "operator", "--lock", str(lock_path),
        "--base", f"{JOB_KEY}={bases.pytorch}", "--base", f"operator={bases.python}",
        "--build-arg", f"TORCH_VERSION={bases.torch_version}",
        "--build-arg", f"CUDA_VERSION={bases.cuda_version}",
        *[f"--builder-arg={a}" for a in bh.global_args],
        "--wheelhouse", str(wheels), "--no-compress", "--no-tls-verify",
    ]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800, check=False)
    seconds = time.monotonic() - t0
    (work / "build.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise ImageToolError(f"images/build.sh exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-6000:]}")
    lock = load_lock(lock_path)
    job, operator = lock.images[JOB_KEY].reference, lock.images["operator"].reference
    if not (job and operator):
        raise ImageToolError(f"images/build.sh wrote no digest into {lock_path}:\n{proc.stdout[-2000:]}")
    return Built(lock_path, job, operator, bases, seconds)
