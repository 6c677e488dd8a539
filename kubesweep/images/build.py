"""Building the job and operator images (`sweep images build`): kubesweep's wheel, each image's build context
(the wheel, a wheelhouse for an offline build, its requirements), the build arguments (the base pinned by digest,
kubesweep's version and revision), then build and push with buildah, podman or docker, and lock the pushed digest
in the image lock (kubesweep/images/lock.py).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubesweep import __version__
from kubesweep.images.lock import (
    ImageEntry,
    ImageLock,
    LockError,
    ResolveError,
    checked_keys,
    repository_name,
    resolve_digest,
    utc_now,
)


@dataclass(frozen=True)
class Builder:
    """A container build tool: buildah (root: `--storage-driver vfs|overlay`, BUILDAH_ISOLATION=chroot), podman
    or docker. `global_args` go before the subcommand (e.g. buildah's `--root`, `--storage-driver`)."""

    tool: str
    global_args: tuple[str, ...] = ()

    @classmethod
    def detect(cls, name: str | None = None, global_args: Sequence[str] = ()) -> Builder:
        for tool in [name] if name else ["buildah", "podman", "docker"]:
            if shutil.which(tool):
                return cls(tool, tuple(global_args))
        raise ResolveError(f"no image builder found ({name or 'buildah, podman or docker'}); "
                           "Debian: apt-get install buildah skopeo")

    def build_cmd(self, *, containerfile: Path, tag: str, build_args: Mapping[str, str], context: Path,
                  tls_verify: bool) -> list[str]:
        cmd = [self.tool, *self.global_args, "bud" if self.tool == "buildah" else "build", "-f", str(containerfile),
               "-t", tag]
        if self.tool in ("buildah", "podman"):
            cmd += ["--layers", f"--tls-verify={str(tls_verify).lower()}"]
        for name, value in build_args.items():
            cmd += ["--build-arg", f"{name}={value}"]
        return [*cmd, str(context)]

    def push_cmd(self, tag: str, *, tls_verify: bool, compress: bool) -> list[str]:
        if self.tool == "docker":
            return ["docker", *self.global_args, "push", tag]
        cmd = [self.tool, *self.global_args, "push", f"--tls-verify={str(tls_verify).lower()}"]
        if not compress:
            cmd.append("--disable-compression")
        return [*cmd, tag, f"docker://{tag}"]


def requirements_for(pyproject: Path, extras: Sequence[str], *, exclude: Iterable[str] = ("torch",)) -> list[str]:
    """The project's requirements with `extras`, less `exclude` (taken from the base image instead)."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    reqs = list(project.get("dependencies", []))
    for extra in extras:
        reqs += project.get("optional-dependencies", {})[extra]
    skip = {_canonical(x) for x in exclude}
    out: list[str] = []
    for req in reqs:
        name = _canonical(re.split(r"[\s<>=!~\[;@]", req, maxsplit=1)[0])
        if name not in skip and req not in out:
            out.append(req)
    return out


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


EXTRAS = {"job": ("job", "tracking"), "operator": ("k8s", "tune", "tracking")}  # operator: also the tuner


def image_kind(entry: ImageEntry) -> str:
    return "operator" if "operator" in entry.containerfile else "job"


def find_uv() -> str | None:
    """uv where `make setup` puts it, found by path rather than only by PATH: `$UV` (the Makefile exports the uv it
    uses), else `uv` on PATH, else `~/.local/bin/uv` (pip's `--user` scripts directory, which a fresh login shell
    need not have on PATH). None where there is none."""
    for candidate in (os.environ.get("UV"), shutil.which("uv"), str(Path.home() / ".local" / "bin" / "uv")):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _has_pip() -> bool:
    """Whether this Python runs `-m pip`, asked of a child Python: looking pip up in this process
    (`importlib.util.find_spec("pip")`) makes setuptools' distutils shim give way to the standard library's for the
    rest of the process, after which importing setuptools (as torch's compiler does) fails."""
    probe = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, check=False)
    return probe.returncode == 0


def wheel_command(root: Path, out: Path) -> list[str]:
    """The command that builds kubesweep's wheel from `root` into `out`: uv (find_uv), else this Python's pip (a
    virtualenv made by uv has none)."""
    uv = find_uv()
    if uv:
        return [uv, "build", "--wheel", "--quiet", "--out-dir", str(out), str(root)]
    if _has_pip():
        return [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out), str(root)]
    raise ResolveError(f"no uv (UV, PATH or ~/.local/bin/uv) and no pip in {sys.executable} to build kubesweep's "
                       "wheel with: run `make setup`, or install uv")


def build_wheel(root: Path, out: Path) -> Path:
    """Build kubesweep's wheel from the checkout at `root` into `out` (wheel_command)."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("kubesweep-*.whl"):
        old.unlink()
    cmd = wheel_command(root, out)
    if subprocess.run(cmd, check=False, cwd=root).returncode != 0:
        raise ResolveError(f"building kubesweep's wheel failed: {' '.join(cmd)}")
    wheels = sorted(out.glob("kubesweep-*.whl"))
    if len(wheels) != 1:
        raise ResolveError(f"expected one kubesweep wheel in {out}, found {len(wheels)}")
    return wheels[0]


def git_revision(root: Path) -> str:
    try:
        proc = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=False)
    except OSError:
        return "unknown"
    return proc.stdout.strip() if proc.returncode == 0 else "unknown"


def git_source(root: Path) -> str:
    """The checkout's origin URL (the OCI source label), or "" when it has none."""
    try:
        proc = subprocess.run(["git", "-C", str(root), "config", "--get", "remote.origin.url"], capture_output=True,
                              text=True, check=False)
    except OSError:
        return ""
    return proc.stdout.strip() if proc.returncode == 0 else ""


def prepare_context(root: Path, kind: str, context: Path, *, wheel: Path, wheelhouse: Path | None) -> None:
    """The build context: dist/ (the wheel), wheels/ (a wheelhouse or empty), requirements.txt."""
    if context.exists():
        shutil.rmtree(context)
    (context / "dist").mkdir(parents=True)
    shutil.copy2(wheel, context / "dist" / wheel.name)
    wheels = context / "wheels"
    if wheelhouse is not None:
        shutil.copytree(wheelhouse, wheels, copy_function=_link_or_copy)
    else:
        wheels.mkdir()
    (wheels / ".keep").touch()
    reqs = requirements_for(root / "pyproject.toml", EXTRAS[kind])
    (context / "requirements.txt").write_text("\n".join(reqs) + "\n", encoding="utf-8")


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def build_args_for(key: str, entry: ImageEntry, *, root: Path, base: str | None, offline: bool,
                   extra: Mapping[str, str]) -> dict[str, str]:
    pinned = base or entry.base.pinned
    if pinned is None:
        raise LockError(f"{key}: base {entry.base.ref} has no digest ({entry.base.reason}); "
                        f"pass --base {key}=REF@sha256:... or run `sweep images lock --key {key}` where it resolves")
    args = {
        "BASE": pinned,
        **entry.build_args,
        "KUBESWEEP_VERSION": __version__,
        "VCS_REF": git_revision(root),
        "SOURCE": git_source(root),
        "PIP_OFFLINE": "1" if offline else "0",
    }
    args.update(extra)
    return args


def build_and_push(
    lock: ImageLock,
    keys: Sequence[str] | None,
    *,
    registry: str,
    root: Path,
    builder: Builder,
    bases: Mapping[str, str] | None = None,
    extra_args: Mapping[str, str] | None = None,
    wheelhouse: Path | None = None,
    tls_verify: bool = True,
    compress: bool = True,
    log: Any = None,
) -> dict[str, str]:
    """Build, push and lock each image of `keys`; returns key → digest-pinned reference."""
    say = log or (lambda msg: sys.stderr.write(msg + "\n"))
    chosen = checked_keys(lock, keys)
    out: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="kubesweep-images-") as tmp:
        wheel = build_wheel(root, Path(tmp) / "dist-src")
        for key in chosen:
            entry = lock.images[key]
            entry.repository = f"{registry.rstrip('/')}/{repository_name(key, entry)}"
            tag = entry.tagged
            assert tag is not None
            kind = image_kind(entry)
            context = Path(tmp) / f"context-{key}"
            prepare_context(root, kind, context, wheel=wheel, wheelhouse=wheelhouse)
            args = build_args_for(key, entry, root=root, base=(bases or {}).get(key), offline=wheelhouse is not None,
                                  extra=extra_args or {})
            say(f"==> {key}: building {tag} on {args['BASE']}")
            _run(builder.build_cmd(containerfile=root / entry.containerfile, tag=tag, build_args=args,
                                   context=context, tls_verify=tls_verify))
            say(f"==> {key}: pushing {tag}")
            _run(builder.push_cmd(tag, tls_verify=tls_verify, compress=compress))
            digest = resolve_digest(tag, tls_verify=tls_verify)
            entry.digest, entry.status, entry.reason, entry.resolved_at = digest, "confirmed", None, utc_now()
            out[key] = f"{tag}@{digest}"
            say(f"==> {key}: {out[key]}")
    return out


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, check=False)
    if proc.returncode != 0:
        raise ResolveError(f"{' '.join(cmd[:3])} ... exited {proc.returncode}")

