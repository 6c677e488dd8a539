"""How busy a sweep kept its GPUs: each trial's span from its results file, and the sweep's measured training time
over its wall time (`sweep results`, the report's answer and its GPU timeline)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator
from typing import Any

from kubesweep.tracking.records import TrialRecord
from kubesweep.wire.flags import finite
from kubesweep.wire.results import EnvironmentGpu, Results


def _unix(iso: str) -> float | None:
    try:
        return dt.datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return None


def trial_span(results: Results) -> tuple[float, float] | None:
    """A trial's process in Unix seconds: its start (the job's start less its start-up) to its results file."""
    start, end = _unix(results.started_at), _unix(results.finished_at)
    if start is None or end is None:
        return None
    return start - (finite(results.timings.startup_s) or 0.0), end


def measured_train_s(results: Results) -> float:
    """Seconds of measured training steps (0 for a trial without them)."""
    return (finite(results.train.measured_time_s) or 0.0) if results.train is not None else 0.0


def environment_gpus(results: Results) -> list[EnvironmentGpu]:
    """The GPUs the trial's environment names, as NVML named them inside its container."""
    return results.environment.gpus


def node_name(results: Results) -> str | None:
    """The node a trial ran on: its name (the hostname outside Kubernetes), with the kernel's boot id where the job
    recorded it (`vm (5275ba46)`), since VMs of one image may all be called `vm`."""
    node, boot = results.environment.node_name, results.environment.boot_id
    if not node:
        return None
    return f"{node} ({boot[:8]})" if boot else node


def gpu_trials(records: Iterable[TrialRecord]) -> Iterator[tuple[Results, tuple[float, float]]]:
    """The results and process span of every GPU trial that has both."""
    for record in records:
        res = record.results
        if res is None or res.device != "cuda":
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
        world = res.world_size or 1
        widest = max(widest, world)
        measured += measured_train_s(res) * world
        for gpu in environment_gpus(res):
            devices.add((str(node_name(res)), str(gpu.uuid or gpu.index)))
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
    """`GPU busy 74.2%: ...`; a fraction over 1 is no share of anything (the trials' measured time exceeds what
    the sweep's wall allows its GPUs: their clocks or the GPUs they name disagree), and says so."""
    fraction = busy.get("fraction")
    share = f"{fraction:.1%}" if isinstance(fraction, float) else "-"
    gpus = f" on {busy['gpus']} GPUs" if busy.get("gpus", 1) > 1 else ""
    if isinstance(fraction, float) and fraction > 1:
        return (f"GPU busy not known: {busy['measured_train_s']:,.1f} s of measured training in "
                f"{busy['wall_s']:,.1f} s of sweep wall{gpus} is more than its GPUs had (the results files' clocks "
                f"or the GPUs they name disagree; {busy['trials']} GPU trials)")
    return (f"GPU busy {share}: {busy['measured_train_s']:,.1f} s of measured training in {busy['wall_s']:,.1f} s "
            f"of sweep wall{gpus} ({busy['trials']} GPU trials, {busy['wall_per_trial_s']:,.1f} s each)")
