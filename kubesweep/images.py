"""Container images: the image lock, `sweep images lock`, `sweep images list` and `sweep images build`.

The lock (`kubesweep/data/images.lock.yaml`, or the file `$KUBESWEEP_IMAGES_LOCK` names) maps each image key that
specs and the chart use (`torch-2.8-cu128`, `operator`, ...) to a digest-pinned reference, and records the base
image each one is built on, by tag and digest. Every digest carries a status:

- `confirmed`: skopeo resolved it against the registry (`resolved_at` says when);
- `unverified-here`: a digest published elsewhere (`source` says where), not resolved by skopeo here;
- `unconfirmed`: no digest (`reason` says why). A spec naming such a key is refused.

`sweep images lock` re-resolves tags to digests with `skopeo inspect --format {{.Digest}} docker://REF` and
rewrites the lock; `sweep images build` builds and pushes the images (buildah, podman or docker), then locks them.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
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
from typing import Annotated, Any, Literal

import typer
import yaml
from pydantic import Field, ValidationError, field_validator

from kubesweep import __version__
from kubesweep.wire.base import StrictModel

LOCK_ENV = "KUBESWEEP_IMAGES_LOCK"
DEFAULT_LOCK = Path(__file__).parent / "data" / "images.lock.yaml"
SHA256_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
KEY_RE = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"

Status = Literal["confirmed", "unverified-here", "unconfirmed"]


class LockError(ValueError):
    """A lock file that cannot be read, or a key that cannot be used."""


class _Pinned(StrictModel):
    digest: str | None = Field(None, description="sha256:<64 hex>, or null when none is known")
    status: Status = "unconfirmed"
    reason: str | None = Field(None, description="why there is no usable digest")
    source: str | None = Field(None, description="where an unverified digest was found")
    note: str | None = None
    resolved_at: str | None = Field(None, description="when skopeo confirmed the digest (UTC, ISO 8601)")

    @field_validator("digest")
    @classmethod
    def _digest(cls, value: str | None) -> str | None:
        if value is not None and not SHA256_RE.match(value):
            raise ValueError(f"{value!r} is not sha256:<64 hex>")
        return value

    def check(self) -> None:
        if self.status in ("confirmed", "unverified-here") and self.digest is None:
            raise ValueError(f"status {self.status} needs a digest")
        if self.status == "unconfirmed" and self.digest is not None:
            raise ValueError("an unconfirmed entry carries no digest; set digest: null")
        if self.status == "unconfirmed" and not self.reason:
            raise ValueError("an unconfirmed entry says why (reason)")
        if self.status == "unverified-here" and not self.source:
            raise ValueError("an unverified-here digest says where it came from (source)")


class BaseImage(_Pinned):
    ref: str = Field(description="the base image by tag, e.g. docker.io/pytorch/pytorch:2.8.0-cuda12.8-...")

    @property
    def pinned(self) -> str | None:
        return f"{self.ref}@{self.digest}" if self.digest else None


class ImageEntry(_Pinned):
    containerfile: str = Field(description="recipe, relative to the repository root")
    repository: str | None = Field(None, description="where the image is pushed, e.g. registry.example/kubesweep-job")
    tag: str
    build_args: dict[str, str] = Field(default_factory=dict)
    base: BaseImage

    @field_validator("build_args", mode="before")
    @classmethod
    def _strings(cls, value: Any) -> Any:
        return {str(k): str(v) for k, v in value.items()} if isinstance(value, Mapping) else value

    @property
    def tagged(self) -> str | None:
        return f"{self.repository}:{self.tag}" if self.repository else None

    @property
    def reference(self) -> str | None:
        """The digest-pinned reference, only for a confirmed entry."""
        if self.status != "confirmed" or not self.repository or not self.digest:
            return None
        return f"{self.repository}:{self.tag}@{self.digest}"


class ImageLock(StrictModel):
    apiVersion: Literal["kubesweep.io/v1alpha1"] = "kubesweep.io/v1alpha1"
    kind: Literal["ImageLock"] = "ImageLock"
    images: dict[str, ImageEntry]


@dataclass(frozen=True)
class LockedImage:
    key: str
    entry: ImageEntry
    path: Path


def lock_path(path: str | Path | None = None) -> Path:
    return Path(path or os.environ.get(LOCK_ENV) or DEFAULT_LOCK)


def load_lock(path: str | Path | None = None) -> ImageLock:
    where = lock_path(path)
    try:
        data = yaml.safe_load(where.read_text(encoding="utf-8"))
    except OSError as exc:
        raise LockError(f"{where}: cannot read the image lock: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise LockError(f"{where}: not valid YAML: {exc}") from None
    try:
        lock = ImageLock.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise LockError(f"{where}: {loc}: {first['msg']}") from None
    for key, entry in lock.images.items():
        if not re.match(KEY_RE, key):
            raise LockError(f"{where}: images.{key}: not a valid image key (lowercase letters, digits, '-', '.')")
        for part, pinned in (("", entry), (".base", entry.base)):
            try:
                pinned.check()
            except ValueError as exc:
                raise LockError(f"{where}: images.{key}{part}: {exc}") from None
    return lock


def locked_reference(key: str, path: str | Path | None = None) -> str | None:
    """The digest-pinned reference a lock key stands for; None if the lock has no such key.

    Raises LockError for a key whose digest is not confirmed: such an image is never used.
    """
    where = lock_path(path)
    entry = load_lock(where).images.get(key)
    if entry is None:
        return None
    ref = entry.reference
    if ref is None:
        reason = (entry.reason or "").split(";")[0].strip()  # its first clause; how to build it follows here
        why = f"{entry.status}: {reason}" if reason else f"{entry.status}, no confirmed digest"
        raise LockError(f"image key {key!r} is not built yet ({_lock_name(where)} has it {why}). Build, push and "
                        f"lock it with `make images REGISTRY=<your registry>` (this key alone: `sweep images build "
                        f"--registry <your registry> --key {key}`), or give spec.images.{key} a digest-pinned "
                        "reference")
    return ref


def _lock_name(where: Path) -> str:
    return "the shipped image lock" if where == DEFAULT_LOCK else f"the image lock {where}"


def lock_keys(path: str | Path | None = None) -> list[str]:
    try:
        return list(load_lock(path).images)
    except LockError:
        return []


def dump_lock(lock: ImageLock) -> str:
    header = (
        "# kubesweep image lock: image key -> digest-pinned reference, and the base each image is built on.\n"
        "# Rewritten by `sweep images lock` and `sweep images build`. Status of each digest:\n"
        "#   confirmed        skopeo resolved it against the registry (resolved_at)\n"
        "#   unverified-here  published elsewhere (source); not resolved by skopeo where this file was written\n"
        "#   unconfirmed      no digest (reason); a spec naming this key is refused\n"
    )
    body = lock.model_dump(mode="json", exclude_none=True)
    for entry in body["images"].values():
        entry.setdefault("digest", None)
        entry["base"].setdefault("digest", None)
    return header + yaml.safe_dump(body, sort_keys=False, width=118)


def save_lock(lock: ImageLock, path: str | Path | None = None) -> Path:
    where = lock_path(path)
    text = dump_lock(lock)
    tmp = where.with_name(f".{where.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(where)
    return where


# ---------------------------------------------------------------------------------------------------------
# Resolving digests


class ResolveError(RuntimeError):
    pass


def resolve_digest(ref: str, *, tls_verify: bool = True, skopeo: str = "skopeo", timeout: float = 120) -> str:
    """The manifest digest `ref` (NAME:TAG) has in its registry, as skopeo reports it."""
    exe = shutil.which(skopeo)
    if exe is None:
        raise ResolveError(f"{skopeo} not found on PATH (Debian: apt-get install skopeo)")
    cmd = [exe, "inspect", "--format", "{{.Digest}}", f"--tls-verify={str(tls_verify).lower()}", f"docker://{ref}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise ResolveError(f"skopeo inspect {ref}: no answer in {timeout:.0f}s") from None
    out = proc.stdout.strip()
    if proc.returncode != 0 or not SHA256_RE.match(out):
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        raise ResolveError(f"skopeo inspect {ref}: {lines[-1] if lines else out or f'exit {proc.returncode}'}")
    return out


def _now() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def relock(
    lock: ImageLock,
    keys: Iterable[str] | None = None,
    *,
    registry: str | None = None,
    bases: bool = True,
    tls_verify: bool = True,
    skopeo: str = "skopeo",
) -> list[str]:
    """Re-resolve the images (and their bases) of `keys` in place; returns one line per failure.

    `registry` sets each image's repository to REGISTRY/<repository name> first. An image tag that resolves
    becomes `confirmed`; one that does not keeps a confirmed digest it had (with the failure reported) or stays
    `unconfirmed` with the failure as its reason. A base digest is checked against its tag the same way.
    """
    failures: list[str] = []
    for key in _checked_keys(lock, keys):
        entry = lock.images[key]
        if registry:
            entry.repository = f"{registry.rstrip('/')}/{repository_name(key, entry)}"
        if entry.tagged is None:
            failures.append(f"{key}: no repository to resolve; pass --registry")
        else:
            try:
                digest = resolve_digest(entry.tagged, tls_verify=tls_verify, skopeo=skopeo)
            except ResolveError as exc:
                failures.append(f"{key}: {exc}")
                if entry.status != "confirmed":
                    entry.digest, entry.status, entry.reason = None, "unconfirmed", str(exc)
            else:
                entry.digest, entry.status, entry.reason, entry.resolved_at = digest, "confirmed", None, _now()
        if bases:
            base = entry.base
            try:
                digest = resolve_digest(base.ref, tls_verify=tls_verify, skopeo=skopeo)
            except ResolveError as exc:
                failures.append(f"{key} base: {exc}")
            else:
                if base.digest and base.digest != digest:
                    base.note = f"tag moved: was {base.digest} ({base.source or base.status})"
                base.digest, base.status, base.reason, base.resolved_at = digest, "confirmed", None, _now()
    return failures


def repository_name(key: str, entry: ImageEntry) -> str:
    if entry.repository:
        return entry.repository.rsplit("/", 1)[-1]
    return "kubesweep-operator" if key == "operator" else "kubesweep-job"


def _checked_keys(lock: ImageLock, keys: Iterable[str] | None) -> list[str]:
    chosen = list(keys) if keys else list(lock.images)
    unknown = [k for k in chosen if k not in lock.images]
    if unknown:
        raise LockError(f"unknown image key(s) {', '.join(unknown)}; the lock has {', '.join(lock.images)}")
    return chosen


# ---------------------------------------------------------------------------------------------------------
# Building


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


def wheel_command(root: Path, out: Path) -> list[str]:
    """The command that builds kubesweep's wheel from `root` into `out`: uv (find_uv), else this Python's pip (a
    virtualenv made by uv has none)."""
    uv = find_uv()
    if uv:
        return [uv, "build", "--wheel", "--quiet", "--out-dir", str(out), str(root)]
    if importlib.util.find_spec("pip") is not None:
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
    chosen = _checked_keys(lock, keys)
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
            entry.digest, entry.status, entry.reason, entry.resolved_at = digest, "confirmed", None, _now()
            out[key] = f"{tag}@{digest}"
            say(f"==> {key}: {out[key]}")
    return out


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, check=False)
    if proc.returncode != 0:
        raise ResolveError(f"{' '.join(cmd[:3])} ... exited {proc.returncode}")


# ---------------------------------------------------------------------------------------------------------
# CLI: `sweep images ...`

app = typer.Typer(name="images", help="Job and operator images: the image lock, building and pushing.",
                  no_args_is_help=True, rich_markup_mode=None)

LockOpt = Annotated[Path | None, typer.Option("--lock", envvar=LOCK_ENV, help="image lock file [default: shipped]")]
KeyOpt = Annotated[list[str] | None, typer.Option("--key", "-k", help="only this image key (repeatable)")]
TlsOpt = Annotated[bool, typer.Option("--tls-verify/--no-tls-verify", help="verify the registry's TLS certificate")]


def _fail(message: str, code: int) -> typer.Exit:
    sys.stderr.write(message.rstrip() + "\n")
    return typer.Exit(code)


@app.command("list")
def list_cmd(lock: LockOpt = None, output: Annotated[str, typer.Option("--output", "-o",
                                                                       help="table or json")] = "table") -> None:
    """Each image key, its status and its digest-pinned reference (or why it has none)."""
    try:
        data = load_lock(lock)
    except LockError as exc:
        raise _fail(str(exc), 2) from None
    if output == "json":
        sys.stdout.write(json.dumps({k: {"status": e.status, "reference": e.reference, "reason": e.reason,
                                         "base": e.base.pinned or e.base.ref, "base_status": e.base.status}
                                     for k, e in data.images.items()}, indent=2) + "\n")
        return
    for key, entry in data.images.items():
        what = entry.reference or f"({entry.reason})"
        sys.stdout.write(f"{key:<18} {entry.status:<16} {what}\n")
        sys.stdout.write(f"{'':<18} base {entry.base.status:<11} {entry.base.pinned or entry.base.ref}\n")


@app.command("lock")
def lock_cmd(
    lock: LockOpt = None,
    key: KeyOpt = None,
    registry: Annotated[str | None, typer.Option("--registry", help="images live under REGISTRY/<name>")] = None,
    bases: Annotated[bool, typer.Option("--bases/--no-bases", help="also re-resolve the base images")] = True,
    tls_verify: TlsOpt = True,
) -> None:
    """Re-resolve tags to digests with skopeo and rewrite the lock file. Exit 4 if any did not resolve."""
    where = lock_path(lock)
    try:
        data = load_lock(where)
        failures = relock(data, key, registry=registry, bases=bases, tls_verify=tls_verify)
    except LockError as exc:
        raise _fail(str(exc), 2) from None
    save_lock(data, where)
    for k in _checked_keys(data, key):
        sys.stdout.write(f"{k}: {data.images[k].status} {data.images[k].reference or ''}\n".rstrip() + "\n")
    if failures:
        raise _fail("not resolved:\n  " + "\n  ".join(failures), 4)


@app.command("build")
def build_cmd(
    registry: Annotated[str, typer.Option("--registry", envvar="REGISTRY", help="push to REGISTRY/<name>:<tag>")],
    key: KeyOpt = None,
    lock: LockOpt = None,
    base: Annotated[list[str] | None, typer.Option("--base", help="KEY=REF@sha256:... replaces a base")] = None,
    build_arg: Annotated[list[str] | None, typer.Option("--build-arg", help="NAME=VALUE for every image")] = None,
    builder: Annotated[str | None, typer.Option("--builder", envvar="BUILDER",
                                                help="buildah, podman or docker [default: the first found]")] = None,
    builder_arg: Annotated[list[str] | None, typer.Option("--builder-arg", help="global builder flag, e.g. "
                                                          "--builder-arg=--storage-driver=vfs")] = None,
    wheelhouse: Annotated[Path | None, typer.Option("--wheelhouse", help="install dependencies only from these "
                                                    "wheels (offline build)")] = None,
    compress: Annotated[bool, typer.Option("--compress/--no-compress", help="compress pushed layers")] = True,
    tls_verify: TlsOpt = True,
    root: Annotated[Path, typer.Option("--root", help="the kubesweep checkout")] = Path("."),
) -> None:
    """Build the images, push them to REGISTRY, resolve their digests and rewrite the lock file."""
    root = root.resolve()
    if not (root / "images" / "job" / "Containerfile").is_file():
        raise _fail(f"{root}: not a kubesweep checkout (images/job/Containerfile missing); pass --root", 2)
    where = lock_path(lock)
    try:
        data = load_lock(where)
        tool = Builder.detect(builder, builder_arg or [])
        results = build_and_push(
            data, key, registry=registry, root=root, builder=tool, bases=_pairs(base, "--base"),
            extra_args=_pairs(build_arg, "--build-arg"), wheelhouse=wheelhouse, tls_verify=tls_verify,
            compress=compress,
        )
    except LockError as exc:
        raise _fail(str(exc), 2) from None
    except ResolveError as exc:
        raise _fail(f"error: {exc}", 4) from None
    save_lock(data, where)
    for k, ref in results.items():
        sys.stdout.write(f"{k}: {ref}\n")


def _pairs(values: list[str] | None, flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values or []:
        name, sep, rest = value.partition("=")
        if not sep or not name:
            raise LockError(f"{flag} expects NAME=VALUE, got {value!r}")
        out[name] = rest
    return out
