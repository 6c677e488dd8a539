"""How busy a sweep kept its GPUs: each trial's span from its results file, and the sweep's measured training time
over its wall time (`sweep results`, the report's answer and its GPU timeline)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator
from typing import Any

from kubesweep.tracking.records import TrialRecord, dig


def _unix(iso: Any) -> float | None:
    if not isinstance(iso, str):
        return None
    try:
        return dt.datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return None


def trial_span(results: dict[str, Any]) -> tuple[float, float] | None:
    """A trial's process in Unix seconds: its start (the job's start less its start-up) to its results file."""
    start, end = _unix(results.get("started_at")), _unix(results.get("finished_at"))
    if start is None or end is None:
        return None
    return start - float(dig(results, "timings", "startup_s") or 0.0), end


def gpu_trials(records: Iterable[TrialRecord]) -> Iterator[tuple[dict[str, Any], tuple[float, float]]]:
    """The results and process span of every GPU trial that has both."""
    for record in records:
        res = record.results
        if not res or res.get("device") != "cuda":
            continue
        span = trial_span(res)
        if span is not None:
            yield res, span


def gpu_busy(records: list[TrialRecord]) -> dict[str, Any] | None:
    """How much of the sweep's wall time its GPUs spent in measured training steps.

    fraction = Σ measured training time * GPUs of the trial / (sweep wall * GPUs the sweep used), where the
    sweep wall runs from the first trial process's start to the last results file, and the GPUs used are the
    distinct devices the trials ran on (at least the largest trial). Warm-up (compilation, first steps),
    evaluation, start-up and everything between trials count as idle. None for sweeps without GPU trials.
    """
    starts: list[float] = []
    ends: list[float] = []
    measured = 0.0
    devices: set[tuple[str, str]] = set()
    widest = 0
    trials = 0
    for res, (start, end) in gpu_trials(records):
        starts.append(start)
        ends.append(end)
        world = int(res.get("world_size") or 1)
        widest = max(widest, world)
        measured += float(dig(res, "train", "measured_time_s") or 0.0) * world
        env = res.get("environment") or {}
        for gpu in env.get("gpus") or []:
            devices.add((str(env.get("node_name")), str(gpu.get("uuid") or gpu.get("index"))))
        trials += 1
    wall = max(ends) - min(starts) if trials else 0.0
    if wall <= 0:
        return None
    gpus = max(len(devices), widest, 1)
    return {
        "fraction": measured / (wall * gpus),
        "measured_train_s": round(measured, 2),
        "wall_s": round(wall, 2),
        "gpus": gpus,
        "trials": trials,
        "wall_per_trial_s": round(wall / trials, 2),
    }


def busy_text(busy: dict[str, Any]) -> str:
    fraction = busy.get("fraction")
    share = f"{fraction:.1%}" if isinstance(fraction, float) else "-"
    gpus = f" on {busy['gpus']} GPUs" if busy.get("gpus", 1) > 1 else ""
    return (f"GPU busy {share}: {busy['measured_train_s']:,.1f} s of measured training in {busy['wall_s']:,.1f} s "
            f"of sweep wall{gpus} ({busy['trials']} GPU trials, {busy['wall_per_trial_s']:,.1f} s each)")
