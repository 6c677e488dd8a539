"""The loss-curve PNG (matplotlib, headless)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def loss_curve_png(points: list[dict[str, Any]], evals: list[dict[str, Any]], title: str, path: Path) -> bool:
    """Training loss per step (and its moving average), eval accuracy per epoch on a second axis."""
    if not points:
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
    except ImportError:
        log.warning("matplotlib is not installed: no loss-curve PNG")
        return False
    steps = np.array([p["step"] for p in points])
    losses = np.array([p["loss"] for p in points])
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    ax.plot(steps, losses, color="tab:blue", alpha=0.35, linewidth=0.8, label="loss per step")
    window = max(1, len(losses) // 50)
    if window > 1:
        smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
        ax.plot(steps[window - 1 :], smooth, color="tab:blue", linewidth=1.8, label=f"mean of {window} steps")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss")
    ax.grid(alpha=0.3)
    if evals:
        ax2 = ax.twinx()
        ax2.plot(
            [e["step"] for e in evals],
            [e["accuracy"] for e in evals],
            "o-",
            color="tab:orange",
            label="dev accuracy",
        )
        ax2.set_ylabel("dev accuracy")
        ax2.set_ylim(0, 1)
        ax2.legend(loc="upper right")
    ax.legend(loc="upper left")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True
