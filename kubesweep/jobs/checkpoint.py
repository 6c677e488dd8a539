"""Checkpoints with exact resume: model, optimizer, scheduler, grad scaler, step, RNG states, data position.

Layout: `CHECKPOINT_DIR/step-00000040/state.pt`. A checkpoint is written to a temporary directory and renamed
into place, so a job killed while writing never leaves a half checkpoint that a restart would pick up. Only
rank 0 writes; every rank restores the same state (DDP keeps replicas identical). RNG states are per rank.
"""

from __future__ import annotations

import os
import pickle
import random
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch

STEP_DIR = re.compile(r"^step-(\d{8})$")
STATE_FILE = "state.pt"


def rng_state() -> dict[str, Any]:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        # plain values, not an ndarray: a checkpoint holds only what loads without unpickling code (`load`)
        "numpy": [name, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_tuples(state["python"]))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
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
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"step-{step:08d}"
    tmp = directory / f".tmp-step-{step:08d}-{os.getpid()}-{uuid.uuid4().hex[:12]}"  # pods all run as pid 1
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(state, tmp / STATE_FILE)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    for old in list_checkpoints(directory)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


class UnsafeCheckpoint(ValueError):
    """A checkpoint that holds more than tensors and plain values: never unpickled."""


def load(path: Path) -> dict[str, Any]:
    """The checkpoint's state, read with `weights_only`: tensors, numbers, strings and containers, nothing that
    runs code when unpickled. A checkpoint directory is shared (a claim every trial of a sweep mounts, and others
    may name it too), so a planted `state.pt` must not run code in the trial that resumes from it."""
    try:
        state: dict[str, Any] = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise UnsafeCheckpoint(f"{path / STATE_FILE} holds more than tensors and plain values, so it is not "
                               f"loaded (no code in a checkpoint runs): {str(exc).splitlines()[0]}") from None
    return state


def _tuples(value: Any) -> Any:
    """random.setstate wants the tuples random.getstate gave (a checkpoint may hand back lists)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list | tuple) else value
