"""The loss-curve PNG."""

from __future__ import annotations

import struct
from pathlib import Path

from kubesweep.jobs.plot import loss_curve_png


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def test_loss_curve_with_eval_accuracy(tmp_path: Path) -> None:
    points = [{"step": s, "loss": 1.0 / s} for s in range(1, 301)]  # long enough for the moving average
    evals = [{"step": 150, "accuracy": 0.7}, {"step": 300, "accuracy": 0.8}]
    path = tmp_path / "loss_curve.png"
    assert loss_curve_png(points, evals, "trial t-1", path)
    assert png_size(path) == (800, 450)


def test_loss_curve_without_evals(tmp_path: Path) -> None:
    path = tmp_path / "loss.png"
    assert loss_curve_png([{"step": 1, "loss": 0.7}, {"step": 2, "loss": 0.6}], [], "t", path)
    assert png_size(path) == (800, 450)


def test_no_points_no_png(tmp_path: Path) -> None:
    assert not loss_curve_png([], [{"step": 1, "accuracy": 0.5}], "t", tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()
