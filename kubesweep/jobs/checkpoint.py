"""Checkpoints with exact resume: model, optimizer, scheduler, grad scaler, step, RNG states, data position.

Layout: `CHECKPOINT_DIR/step-00000040/state.pt`. A checkpoint is written to a temporary directory and renamed
into place, so a job killed while writing never leaves a half checkpoint that a restart would pick up. Only
rank 0 writes; every rank restores the same state (DDP keeps replicas identical). RNG states are per rank.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np

STEP_DIR = re.compile(r"^step-(\d{8})$")
STATE_FILE = "state.pt"


def rng_state() -> dict[str, Any]:
    import torch

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def list_checkpoints(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if STEP_DIR.match(p.name) and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: p.name)


def latest(directory: Path) -> Path | None:
    found = list_checkpoints(directory)
    return found[-1] if found else None


def save(directory: Path, step: int, state: dict[str, Any], keep: int) -> Path:
    """Write `state` atomically as the checkpoint of `step`; keep the newest `keep` checkpoints."""
    import torch

    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"step-{step:08d}"
    tmp = directory / f".tmp-step-{step:08d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(state, tmp / STATE_FILE)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    for old in list_checkpoints(directory)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load(path: Path) -> dict[str, Any]:
    import torch

    # The state holds RNG tuples and numpy arrays besides tensors: it is our own file, read in full.
    state: dict[str, Any] = torch.load(path / STATE_FILE, map_location="cpu", weights_only=False)
    return state
