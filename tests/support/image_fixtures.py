"""Fixtures for the tests that need real images (tests/images/test_build_images.py, and the real node's tests in
tests/operator/test_controller_realnode.py): a local registry, buildah, stand-in bases, and the job and operator
images built and pushed by `images/build.sh`. The root conftest makes them available to every test module, so
the images are built once per session whoever asks first. Missing tools or a registry that will not start FAIL
these tests (never skip)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.images import support
from tests.images.support import Bases, Built

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


@pytest.fixture(scope="session")
def standin_bases(registry: support.Registry, buildah: support.Buildah,
                  tmp_path_factory: pytest.TempPathFactory) -> Bases:
    """The stand-ins for the public bases, built (or taken from the cache) and pushed to the local registry."""
    try:
        return support.push_standins(registry, buildah, tmp_path_factory.mktemp("standins"))
    except support.ImageToolError as exc:
        pytest.fail(f"building the stand-in bases failed: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def built_images(registry: support.Registry, buildah: support.Buildah, standin_bases: Bases,
                 tmp_path_factory: pytest.TempPathFactory) -> Built:
    """`images/build.sh` builds the job image (line torch-2.8-cu128) and the operator image on the stand-in bases,
    offline from a wheelhouse, pushes both to the local registry and writes their digests into a copy of the lock."""
    try:
        return support.build_images(registry, buildah, standin_bases, tmp_path_factory.mktemp("build"))
    except support.ImageToolError as exc:
        pytest.fail(f"building the images failed: {exc}", pytrace=False)


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
