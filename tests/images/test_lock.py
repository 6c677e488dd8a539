"""The image lock and how specs resolve image keys through it (fast: no image build, no registry)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from kubesweep.images.lock import (
    DEFAULT_LOCK,
    LockError,
    dump_lock,
    load_lock,
    locked_reference,
)
from kubesweep.manifests import RenderError, render_plan
from kubesweep.plan import plan
from kubesweep.sweep_spec import SpecError, load_sweep_file, parse_sweep
from kubesweep.sweep_spec.model import is_image_key

ROOT = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "ab" * 32


def _arg_defaults(containerfile: Path) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S*)$", containerfile.read_text(), flags=re.M))


def _spec(tmp_path: Path, image: str, images: dict[str, str] | None = None) -> Path:
    path = tmp_path / "s.yaml"
    spec: dict[str, object] = {"image": image, "resources": {"gpus_per_trial": 0}}
    if images:
        spec["images"] = images
    path.write_text(yaml.safe_dump({"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep",
                                    "metadata": {"name": "s"}, "spec": spec}, sort_keys=False))
    return path


def _confirmed_lock(tmp_path: Path) -> Path:
    data = yaml.safe_load(DEFAULT_LOCK.read_text())
    data["images"]["torch-2.8-cu128"].update(repository="registry.example/kubesweep-job", digest=DIGEST,
                                             status="confirmed", resolved_at="2026-01-01T00:00:00Z")
    data["images"]["torch-2.8-cu128"].pop("reason")
    path = tmp_path / "lock.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_shipped_lock_is_honest() -> None:
    lock = load_lock(DEFAULT_LOCK)
    assert {"torch-2.8-cu128", "torch-2.7-cu118", "operator"} <= set(lock.images)
    for key, entry in lock.images.items():
        # nothing here was resolved by skopeo against a registry, so nothing claims to be confirmed
        assert entry.status == "unconfirmed" and entry.digest is None and entry.reason, key
        assert entry.base.status == "unverified-here" and entry.base.source, key
        assert entry.base.digest and ":" in entry.base.ref.rsplit("/", 1)[1], "base by tag and digest"
        assert (ROOT / entry.containerfile).is_file()


@pytest.mark.parametrize("key", ["torch-2.8-cu128", "operator"])
def test_containerfile_defaults_match_the_lock(key: str) -> None:
    entry = load_lock(DEFAULT_LOCK).images[key]
    defaults = _arg_defaults(ROOT / entry.containerfile)
    assert defaults["BASE"] == entry.base.pinned
    for name, value in entry.build_args.items():
        assert defaults[name] == value


def test_every_job_line_has_matching_tag_and_build_args() -> None:
    for key, entry in load_lock(DEFAULT_LOCK).images.items():
        if key == "operator":
            continue
        torch, cuda = entry.build_args["TORCH_VERSION"], entry.build_args["CUDA_VERSION"]
        assert key == f"torch-{'.'.join(torch.split('.')[:2])}-cu{cuda.replace('.', '')}"
        assert f"{torch}-cuda{cuda}-cudnn9-runtime" in entry.base.ref
        assert entry.tag.endswith(key.replace("torch-", "torch"))


def test_a_key_not_built_yet_loads_and_is_refused_where_an_image_is_needed(tmp_path: Path) -> None:
    """A lock key is a valid spec (the local backend needs no image); rendering it says how to build it."""
    sweep = load_sweep_file(_spec(tmp_path, "torch-2.8-cu128"), allow_unpinned=False)
    for allow_unpinned in (False, True):  # --allow-unpinned does not make an entry without a digest usable
        with pytest.raises(RenderError) as info:
            render_plan(plan(sweep), allow_unpinned=allow_unpinned)
        assert str(info.value) == (
            f"{tmp_path / 's.yaml'}: spec.image: image key 'torch-2.8-cu128' is not built yet (the shipped image "
            "lock has it unconfirmed: not published yet). Build, push and lock it with `make images "
            "REGISTRY=<your registry>` (this key alone: `sweep images build --registry <your registry> --key "
            "torch-2.8-cu128`), or give spec.images.torch-2.8-cu128 a digest-pinned reference")


def test_spec_key_resolves_through_a_confirmed_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBESWEEP_IMAGES_LOCK", str(_confirmed_lock(tmp_path)))
    sweep = load_sweep_file(_spec(tmp_path, "torch-2.8-cu128"))
    ref = f"registry.example/kubesweep-job:0.1.0-torch2.8-cu128@{DIGEST}"
    assert sweep.image_reference() == ref
    job = render_plan(plan(sweep))[0]
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == ref
    # spec.images still wins over the lock
    own = f"mine.example/job@{DIGEST}"
    assert load_sweep_file(_spec(tmp_path, "torch-2.8-cu128", {"torch-2.8-cu128": own})).image_reference() == own


def test_unknown_key_lists_spec_and_lock_keys(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        load_sweep_file(_spec(tmp_path, "torch-9"))
    assert "'torch-9' is not a key of spec.images () nor of the image lock (torch-2.8-cu128," in str(info.value)


@pytest.mark.parametrize(("change", "message"), [
    ({"status": "confirmed"}, "status confirmed needs a digest"),
    ({"digest": "sha256:1234"}, "is not sha256:<64 hex>"),
    ({"digest": DIGEST}, "an unconfirmed entry carries no digest"),
    ({"reason": None}, "an unconfirmed entry says why"),
    ({"status": "maybe"}, "status"),
])
def test_lock_validation(tmp_path: Path, change: dict[str, object], message: str) -> None:
    data = yaml.safe_load(DEFAULT_LOCK.read_text())
    data["images"]["operator"].update(change)
    path = tmp_path / "lock.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(LockError, match=re.escape(message)):
        load_lock(path)


def test_unverified_base_needs_a_source(tmp_path: Path) -> None:
    data = yaml.safe_load(DEFAULT_LOCK.read_text())
    del data["images"]["operator"]["base"]["source"]
    path = tmp_path / "lock.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(LockError, match=r"images\.operator\.base: an unverified-here digest says where"):
        load_lock(path)


def test_dump_round_trips() -> None:
    lock = load_lock(DEFAULT_LOCK)
    assert load_lock_text(dump_lock(lock)) == lock


def load_lock_text(text: str) -> object:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
    try:
        return load_lock(f.name)
    finally:
        Path(f.name).unlink()


def test_locked_reference_of_unknown_key_is_none() -> None:
    assert locked_reference("no-such-image", DEFAULT_LOCK) is None


def test_a_bare_name_is_a_key_and_a_reference_is_not() -> None:
    for key in ("torch-2.8-cu128", "Xformers-X", "job"):
        assert is_image_key(key), key
    for ref in ("registry.example/job", "job:1.0", f"job@{DIGEST}", "localhost:5000/job"):
        assert not is_image_key(ref), ref


def test_no_image_named_resolves_to_none(tmp_path: Path) -> None:
    # an empty spec.image is no image (the backend's default), as an absent one is: never an empty reference
    for spec in ({}, {"image": ""}):
        doc = {"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "s"}, "spec": spec}
        assert parse_sweep(doc, allow_unpinned=True).image_reference() is None
