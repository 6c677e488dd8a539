"""`sweep images list / lock / build`: the image lock (kubesweep/images/lock.py) and building the images
(kubesweep/images/build.py) from the command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from kubesweep.cli.options import Group
from kubesweep.images.build import Builder, build_and_push
from kubesweep.images.lock import (
    LOCK_ENV,
    LockError,
    ResolveError,
    checked_keys,
    load_lock,
    lock_path,
    relock,
    save_lock,
)

app = typer.Typer(name="images", help="Job and operator images: the image lock, building and pushing.",
                  cls=Group, no_args_is_help=True, rich_markup_mode=None)

LockOpt = Annotated[Path | None, typer.Option("--lock", envvar=LOCK_ENV, metavar="FILE",
                                              help="image lock file [default: shipped]")]
KeyOpt = Annotated[list[str] | None, typer.Option("--key", "-k", metavar="KEY",
                                                  help="only this image key (repeatable)")]
TlsOpt = Annotated[bool, typer.Option("--tls-verify/--no-tls-verify", help="verify the registry's TLS certificate")]


def _fail(message: str, code: int) -> typer.Exit:
    sys.stderr.write(message.rstrip() + "\n")
    return typer.Exit(code)


@app.command("list")
def list_cmd(lock: LockOpt = None, output: Annotated[str, typer.Option("--output", "-o", metavar="table|json",
                                                                       help="table or json")] = "table") -> None:
    """Each image key, its status and its digest-pinned reference (or why it has none)."""
    if output not in ("table", "json"):
        raise _fail(f"--output: {output!r} is not one of 'table', 'json'", 2)
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
    registry: Annotated[str | None, typer.Option("--registry", metavar="REGISTRY",
                                                 help="images live under REGISTRY/<name>")] = None,
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
    for k in checked_keys(data, key):
        sys.stdout.write(f"{k}: {data.images[k].status} {data.images[k].reference or ''}\n".rstrip() + "\n")
    if failures:
        raise _fail("not resolved:\n  " + "\n  ".join(failures), 4)


@app.command("build")
def build_cmd(
    registry: Annotated[str, typer.Option("--registry", envvar="REGISTRY", metavar="REGISTRY",
                                          help="push to REGISTRY/<name>:<tag>")],
    key: KeyOpt = None,
    lock: LockOpt = None,
    base: Annotated[list[str] | None, typer.Option("--base", metavar="KEY=REF",
                                                             help="KEY=REF@sha256:... replaces a base")] = None,
    build_arg: Annotated[list[str] | None, typer.Option("--build-arg", metavar="NAME=VALUE",
                                                                  help="NAME=VALUE for every image")] = None,
    builder: Annotated[str | None, typer.Option("--builder", envvar="BUILDER", metavar="TOOL",
                                                help="buildah, podman or docker [default: the first found]")] = None,
    builder_arg: Annotated[list[str] | None, typer.Option("--builder-arg", metavar="FLAG",
                                                          help="global builder flag, e.g. "
                                                          "--builder-arg=--storage-driver=vfs")] = None,
    wheelhouse: Annotated[Path | None, typer.Option("--wheelhouse", metavar="DIR",
                                                    help="install dependencies only from these "
                                                    "wheels (offline build)")] = None,
    compress: Annotated[bool, typer.Option("--compress/--no-compress", help="compress pushed layers")] = True,
    tls_verify: TlsOpt = True,
    root: Annotated[Path, typer.Option("--root", metavar="DIR", help="the kubesweep checkout")] = Path("."),
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
