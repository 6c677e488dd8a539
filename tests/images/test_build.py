"""The image build's steps that need no builder or registry: the requirements of each image, finding uv, and
kubesweep's wheel."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kubesweep.images.build import find_uv, requirements_for, wheel_command
from kubesweep.images.lock import ResolveError

ROOT = Path(__file__).resolve().parents[2]


def test_requirements_leave_torch_to_the_base() -> None:
    reqs = requirements_for(ROOT / "pyproject.toml", ("job", "tracking"))
    assert not [r for r in reqs if re.match(r"torch\b", r)]
    assert any(r.startswith("transformers") for r in reqs) and any(r.startswith("mlflow") for r in reqs)
    assert any(r.startswith("kubernetes") for r in requirements_for(ROOT / "pyproject.toml", ("k8s",)))


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


def test_looking_for_pip_leaves_this_process_able_to_import_setuptools(tmp_path: Path) -> None:
    """The pip fallback asks a child Python: a lookup of pip in this process turns setuptools' distutils shim off
    for good, and torch's compiler (which imports setuptools) then fails in the same process."""
    code = ("import contextlib; from pathlib import Path; from kubesweep.images.build import wheel_command\n"
            "with contextlib.suppress(Exception):  # no uv here, so the pip fallback is looked for\n"
            f"    wheel_command(Path({str(ROOT)!r}), Path({str(tmp_path)!r}))\n"
            "import setuptools; print('imported')")
    env = {**os.environ, "HOME": str(tmp_path), "PATH": str(tmp_path)}
    env.pop("UV", None)
    env.pop("SETUPTOOLS_USE_DISTUTILS", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False,
                          timeout=120)
    assert proc.returncode == 0 and "imported" in proc.stdout, proc.stderr[-2000:]


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
    code = ("import sys; from pathlib import Path; from kubesweep.images.build import build_wheel, wheel_command; "
            "out = Path(sys.argv[1]); print(wheel_command(Path('.'), out)[0]); print(build_wheel(Path.cwd(), out))")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "dist")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    used, wheel = proc.stdout.split()
    assert used == str(home / ".local" / "bin" / "uv")
    assert Path(wheel).is_file() and Path(wheel).name.startswith("kubesweep-")
