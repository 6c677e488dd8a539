"""Checkpoints: atomic step directories, the newest `keep` kept, state and RNG restored exactly."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from kubesweep.jobs import checkpoint


def test_save_lists_and_keeps_the_newest(tmp_path: Path) -> None:
    import torch

    directory = tmp_path / "ckpt"
    assert checkpoint.list_checkpoints(directory) == [] and checkpoint.latest(directory) is None
    for step in (4, 8, 12):
        saved = checkpoint.save(directory, step, {"step": step, "w": torch.full((3,), float(step))}, keep=2)
        assert saved == directory / f"step-{step:08d}"
    assert [p.name for p in checkpoint.list_checkpoints(directory)] == ["step-00000008", "step-00000012"]
    (directory / ".tmp-step-00000016-1").mkdir()  # a write that was killed
    (directory / "step-00000020").mkdir()  # no state file
    (directory / "notes").mkdir()
    latest = checkpoint.latest(directory)
    assert latest == directory / "step-00000012"
    state = checkpoint.load(latest)
    assert state["step"] == 12 and torch.equal(state["w"], torch.full((3,), 12.0))
    assert not list(directory.glob(".tmp-step-00000012-*"))


def test_saving_a_step_again_replaces_it(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, 5, {"v": 1}, keep=3)
    checkpoint.save(tmp_path, 5, {"v": 2}, keep=3)
    assert checkpoint.list_checkpoints(tmp_path) == [tmp_path / "step-00000005"]
    assert checkpoint.load(tmp_path / "step-00000005") == {"v": 2}


def test_rng_state_round_trips_through_a_checkpoint(tmp_path: Path) -> None:
    import torch

    checkpoint.save(tmp_path, 1, {"rng": checkpoint.rng_state()}, keep=1)
    first = (random.random(), float(np.random.rand()), torch.rand(3))
    checkpoint.set_rng_state(checkpoint.load(tmp_path / "step-00000001")["rng"])
    again = (random.random(), float(np.random.rand()), torch.rand(3))
    assert first[:2] == again[:2] and torch.equal(first[2], again[2])


class _Planted:
    """What a hostile trial (another sweep naming the same claim) leaves as a checkpoint: unpickling it runs code."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, ...]]:
        return (Path.touch, (str(self.marker),))  # type: ignore[return-value]


def test_a_planted_checkpoint_runs_no_code_in_the_trial_that_resumes(tmp_path: Path) -> None:
    """The attack: a `state.pt` on a shared checkpoint claim whose unpickling runs code. It is refused, and
    nothing of it runs; a checkpoint of our own (tensors, numbers, RNG states) still loads."""
    import torch

    marker = tmp_path / "ran"
    planted = tmp_path / "ckpt" / "step-00000001"
    planted.mkdir(parents=True)
    torch.save({"step": 1, "model": _Planted(marker)}, planted / checkpoint.STATE_FILE)
    with pytest.raises(checkpoint.UnsafeCheckpoint, match="holds more than tensors and plain values"):
        checkpoint.load(planted)
    assert not marker.exists()
    own = checkpoint.save(tmp_path / "own", 2, {"step": 2, "model": {"w": torch.ones(2)},
                                                "rng": checkpoint.rng_state(), "loss_curve": [(1, 0.5)]}, keep=1)
    assert checkpoint.load(own)["step"] == 2
