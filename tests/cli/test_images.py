"""`sweep images list / lock / build` on the command line (fast: no build, no registry)."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from kubesweep.cli.commands import app
from kubesweep.images.lock import DEFAULT_LOCK


def test_images_list_cli() -> None:
    result = CliRunner().invoke(app, ["images", "list", "--lock", str(DEFAULT_LOCK)])
    assert result.exit_code == 0, result.output
    assert re.search(r"^torch-2\.7-cu118\s+unconfirmed\s+\(not published yet", result.output, flags=re.M)
    assert "base unverified-here docker.io/pytorch/pytorch:2.7.1-cuda11.8-cudnn9-runtime@sha256:" in result.output


def test_images_build_refuses_outside_a_checkout(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["images", "build", "--registry", "127.0.0.1:1", "--root", str(tmp_path)])
    assert result.exit_code == 2
    assert "not a kubesweep checkout" in result.output
