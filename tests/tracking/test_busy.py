"""How busy a sweep kept its GPUs, as text: a share of the wall, or, where the trials' measured time exceeds what
the wall allows, no share at all."""

from __future__ import annotations

from kubesweep.tracking.busy import busy_text


def summary(measured: float, wall: float, gpus: int = 1, trials: int = 14) -> dict[str, object]:
    return {"fraction": measured / (wall * gpus), "measured_train_s": measured, "wall_s": wall, "gpus": gpus,
            "trials": trials, "wall_per_trial_s": round(wall / trials, 2)}


def test_a_share_of_the_sweeps_wall() -> None:
    assert busy_text(summary(36.3, 48.9, gpus=1)) == (
        "GPU busy 74.2%: 36.3 s of measured training in 48.9 s of sweep wall (14 GPU trials, 3.5 s each)")
    assert busy_text(summary(120.0, 48.9, gpus=4)).startswith("GPU busy 61.3%: 120.0 s of measured training in "
                                                             "48.9 s of sweep wall on 4 GPUs")


def test_more_measured_time_than_the_wall_allows_is_no_share() -> None:
    # results files whose measured steps took 742.5 s inside 48.9 s on what they name as one GPU (stand-in
    # numbers, or clocks that disagree): not "GPU busy 1518.4%"
    text = busy_text(summary(742.5, 48.9))
    assert text.startswith("GPU busy not known: 742.5 s of measured training in 48.9 s of sweep wall is more than "
                           "its GPUs had") and "%" not in text
