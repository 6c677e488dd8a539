"""Where the local backend's pending trials start: one trial per GPU (or per CPU slot on a machine without one),
within the sweep's concurrency, and which trials start early behind a running GPU trial (prestart).

A trial staged behind a running one gets the same GPUs; its process prepares (imports, tracking run, data, model
in host memory) and waits for their lease (kubesweep/jobs/gpu_lease.py), so GPU phases never overlap. At most
`prestart` trials are staged behind each running one; a sweep placed `alone` runs one trial at a time and stages
none (a trial preparing behind another is its neighbour on the host).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from kubesweep.backends._local_store import SweepRow, TrialRow
from kubesweep.backends._local_trials import Running
from kubesweep.backends.base import Phase
from kubesweep.backends.local_machine import Device
from kubesweep.gpus import Catalog


@dataclass(frozen=True)
class Start:
    """Start `row` on `devices` ([]: a CPU slot); `after`: the running trial it is staged behind."""

    row: TrialRow
    devices: list[int]
    after: Running | None = None


@dataclass(frozen=True)
class Scheduler:
    """The machine's slots: its GPUs, its CPU slots, how many trials may be staged behind each GPU trial, and the GPU
    catalog its trials' GPU types are looked up in."""

    devices: list[Device]
    cpu_slots: int
    prestart: int
    catalog: Catalog  # the backend's, loaded once: a GPU type's product label

    def starts(self, state: SweepRow, trials: list[TrialRow], running: Mapping[str, Running],
               any_gpu: bool) -> Iterator[Start]:
        """The pending trials of `trials` to start now, in order. Each is to be started (and put in `running`)
        before the next is asked for: the next one's place depends on it."""
        alone = state.placement.alone  # one machine is one node: one trial at a time
        max_parallel = 1 if alone else state.concurrency.max_parallel
        per_type = state.concurrency.per_gpu_type
        prestart = self.prestart and not alone  # a trial preparing behind another is its neighbour on the host
        for row in trials:
            if row.phase != Phase.PENDING:
                continue
            active = [r for r in running.values() if not r.staged]
            if len(active) >= max_parallel and not (prestart and self.devices):
                break  # nothing more starts this step, early or not
            by_type = Counter(r.row.gpu for r in active)
            devices = None
            if len(active) < max_parallel and not (per_type and row.gpu and by_type[row.gpu] >= per_type):
                devices = self.free_devices(running, row, any_gpu)
            if devices is not None:
                yield Start(row, devices)
                continue
            behind = self.stage_behind(running, row, any_gpu) if prestart else None
            if behind is not None:
                yield Start(row, behind.devices, after=behind)

    def free_devices(self, running: Mapping[str, Running], row: TrialRow, any_gpu: bool) -> list[int] | None:
        """Device indices for the trial ([] = CPU), or None when it has to wait."""
        busy = {i for r in running.values() for i in r.devices}
        cpu_busy = sum(1 for r in running.values() if not r.devices)
        if row.gpus == 0 or (not self.devices and row.gpu is None):
            return [] if cpu_busy < self.cpu_slots else None
        product = self.catalog[row.gpu].product if row.gpu else None
        fits = [d.index for d in self.devices
                if d.index not in busy and (product is None or any_gpu or d.product == product)]
        if row.gpu and not any_gpu and not any(d.product == product for d in self.devices):
            return None
        return fits[: row.gpus] if len(fits) >= row.gpus else None

    def stage_behind(self, running: Mapping[str, Running], row: TrialRow, any_gpu: bool) -> Running | None:
        """The running GPU trial this pending one can start behind (same devices, fewer than `prestart` trials
        staged there already)."""
        if not self.prestart or row.gpus == 0 or not self.devices:
            return None
        runs = list(running.values())
        staged = Counter(i for r in runs if r.staged for i in r.devices)
        product = self.catalog[row.gpu].product if row.gpu else None
        products = {d.index: d.product for d in self.devices}
        for run in runs:
            if run.staged or run.proc is None or len(run.devices) != row.gpus or \
                    any(staged[i] >= self.prestart for i in run.devices):
                continue
            if product is None or any_gpu or all(products.get(i) == product for i in run.devices):
                return run
        return None
