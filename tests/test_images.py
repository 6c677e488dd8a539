"""The image lock, how specs resolve image keys through it, and the wheel step (fast: no image build, no registry)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from kubesweep.cli import app
from kubesweep.images import (
    DEFAULT_LOCK,
    LockError,
    ResolveError,
    dump_lock,
    find_uv,
    load_lock,
    locked_reference,
    requirements_for,
    wheel_command,
)
from kubesweep.manifests import RenderError, render_plan
from kubesweep.plan import plan
from kubesweep.spec import SpecError, load_sweep_file

ROOT = Path(__file__).resolve().parents[1]
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


def test_requirements_leave_torch_to_the_base() -> None:
    reqs = requirements_for(ROOT / "pyproject.toml", ("job", "tracking"))
    assert not [r for r in reqs if re.match(r"torch\b", r)]
    assert any(r.startswith("transformers") for r in reqs) and any(r.startswith("mlflow") for r in reqs)
    assert any(r.startswith("kubernetes") for r in requirements_for(ROOT / "pyproject.toml", ("k8s",)))


def test_images_list_cli() -> None:
    result = CliRunner().invoke(app, ["images", "list", "--lock", str(DEFAULT_LOCK)])
    assert result.exit_code == 0, result.output
    assert re.search(r"^torch-2\.7-cu118\s+unconfirmed\s+\(not published yet", result.output, flags=re.M)
    assert "base unverified-here docker.io/pytorch/pytorch:2.7.1-cuda11.8-cudnn9-runtime@sha256:" in result.output


def test_images_build_refuses_outside_a_checkout(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["images", "build", "--registry", "127.0.0.1:1", "--root", str(tmp_path)])
    assert result.exit_code == 2
    assert "not a kubesweep checkout" in result.output


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def test_uv_is_found_where_make_setup_put_it_without_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh login shell has no ~/.local/bin on PATH: uv is still found there, and $UV (the Makefile's) wins."""
    home_uv = _executable(tmp_path / "home" / ".local" / "bin" / "uv")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("UV", raising=False)
    assert find_uv() == str(home_uv)
    assert wheel_command(ROOT, tmp_path / "out")[:2] == [str(home_uv), "build"]

    on_path = _executable(tmp_path / "bin" / "uv")
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert find_uv() == str(on_path)

    made = _executable(tmp_path / "make" / "uv")
    monkeypatch.setenv("UV", str(made))
    assert find_uv() == str(made)

    monkeypatch.setenv("UV", str(tmp_path / "missing" / "uv"))  # a stale $UV falls through to the next place
    assert find_uv() == str(on_path)


def test_no_uv_anywhere_means_pip_or_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("UV", raising=False)
    assert find_uv() is None
    try:
        cmd = wheel_command(ROOT, tmp_path / "out")
    except ResolveError as exc:
        assert "no uv (UV, PATH or ~/.local/bin/uv) and no pip" in str(exc)
    else:
        assert cmd[:4] == [sys.executable, "-m", "pip", "wheel"]


def test_wheel_builds_on_a_fresh_login_path(tmp_path: Path) -> None:
    """The image build's wheel step with a PATH that lacks ~/.local/bin (as a fresh login shell has) and no $UV:
    uv is found in ~/.local/bin, as `make setup` installs it (the virtualenv it makes has no pip to fall back on)."""
    real_uv = find_uv()
    assert real_uv, "no uv: run make setup"
    cache = subprocess.run([real_uv, "cache", "dir"], capture_output=True, text=True, check=True).stdout.strip()
    home = tmp_path / "home"
    (home / ".local" / "bin").mkdir(parents=True)
    (home / ".local" / "bin" / "uv").symlink_to(real_uv)
    env = {k: v for k, v in os.environ.items() if k not in ("UV", "VIRTUAL_ENV")}
    env.update(HOME=str(home), PATH="/usr/sbin:/usr/bin:/sbin:/bin", UV_CACHE_DIR=cache)
    assert not any((Path(d) / "uv").exists() for d in env["PATH"].split(":")), "uv on the minimal PATH"
    code = ("import sys; from pathlib import Path; from kubesweep.images import build_wheel, wheel_command; "
            "out = Path(sys.argv[1]); print(wheel_command(Path('.'), out)[0]); print(build_wheel(Path.cwd(), out))")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "dist")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    used, wheel = proc.stdout.split()
    assert used == str(home / ".local" / "bin" / "uv")
    assert Path(wheel).is_file() and Path(wheel).name.startswith("kubesweep-")
