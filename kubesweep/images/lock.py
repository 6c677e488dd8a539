"""Container images: the image lock, and resolving its tags to digests.

The lock (`kubesweep/data/images.lock.yaml`, or the file `$KUBESWEEP_IMAGES_LOCK` names) maps each image key that
specs and the chart use (`torch-2.8-cu128`, `operator`, ...) to a digest-pinned reference, and records the base
image each one is built on, by tag and digest. Every digest carries a status:

- `confirmed`: skopeo resolved it against the registry (`resolved_at` says when);
- `unverified-here`: a digest published elsewhere (`source` says where), not resolved by skopeo here;
- `unconfirmed`: no digest (`reason` says why). A spec naming such a key is refused.

`relock` (`sweep images lock`) re-resolves tags to digests with `skopeo inspect --format {{.Digest}}
docker://REF`; `sweep images build` builds and pushes the images, then locks them (kubesweep/images/build.py). The
command line is kubesweep/cli/images.py.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator

from kubesweep.wire.base import StrictModel

LOCK_ENV = "KUBESWEEP_IMAGES_LOCK"
DEFAULT_LOCK = Path(__file__).parents[1] / "data" / "images.lock.yaml"
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


def utc_now() -> str:
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
    for key in checked_keys(lock, keys):
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
                entry.digest, entry.status, entry.reason, entry.resolved_at = digest, "confirmed", None, utc_now()
        if bases:
            base = entry.base
            try:
                digest = resolve_digest(base.ref, tls_verify=tls_verify, skopeo=skopeo)
            except ResolveError as exc:
                failures.append(f"{key} base: {exc}")
            else:
                if base.digest and base.digest != digest:
                    base.note = f"tag moved: was {base.digest} ({base.source or base.status})"
                base.digest, base.status, base.reason, base.resolved_at = digest, "confirmed", None, utc_now()
    return failures


def repository_name(key: str, entry: ImageEntry) -> str:
    if entry.repository:
        return entry.repository.rsplit("/", 1)[-1]
    return "kubesweep-operator" if key == "operator" else "kubesweep-job"


def checked_keys(lock: ImageLock, keys: Iterable[str] | None) -> list[str]:
    """`keys` (all the lock's when none), each a key of the lock; LockError naming those that are not."""
    chosen = list(keys) if keys else list(lock.images)
    unknown = [k for k in chosen if k not in lock.images]
    if unknown:
        raise LockError(f"unknown image key(s) {', '.join(unknown)}; the lock has {', '.join(lock.images)}")
    return chosen
