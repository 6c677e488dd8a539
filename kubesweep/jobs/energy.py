"""GPU energy over the measured window, from NVML's energy counter (`nvmlDeviceGetTotalEnergyConsumption`).

The counter is the board's cumulative energy in millijoules since the driver loaded, so the energy of a window
is the difference of two readings. The training loop reads it where it already waits for the GPU (the host sync
of each log window) and counts only windows whose steps were all measured: warm-up, evaluation and checkpoint
pauses are left out, as they are from samples/s. The counter is the whole board's: another process on the same
GPU would be counted too (a trial holds its GPU alone under the GPU lease and on Kubernetes).

Figures (`Results.energy`, docs/results-schema.md):
- joules per sample = measured energy / measured samples (all ranks, each rank's GPU);
- kWh per epoch = joules per sample x training rows per epoch / 3.6e6;
- mean power = measured energy / measured time.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pynvml

from kubesweep.jobs.metrics import nvml_handle

log = logging.getLogger(__name__)

JOULES_PER_KWH = 3.6e6


@dataclass
class EnergyMeter:
    """Reads the energy counters of this process's GPUs; `read_j` is None where a board has no counter."""

    handles: list[Any] = field(default_factory=list)

    @classmethod
    def open(cls, devices: Sequence[int]) -> EnergyMeter | None:
        """The meter of these CUDA devices, or None without NVML or without an energy counter (pre-Volta)."""
        if not devices:
            return None
        try:
            pynvml.nvmlInit()
            meter = cls([nvml_handle(i) for i in devices])
        except Exception as err:  # no driver, no NVML: the run goes on without energy figures
            log.warning("energy meter off: %s", err)
            return None
        if meter.read_j() is None:
            log.warning("energy meter off: the GPU has no energy counter")
            return None
        return meter

    def read_j(self) -> float | None:
        try:
            return sum(float(pynvml.nvmlDeviceGetTotalEnergyConsumption(h)) for h in self.handles) / 1000.0
        except Exception:  # NVMLError_NotSupported on boards without the counter
            return None


@dataclass
class EnergyWindow:
    """Energy of measured work, accumulated window by window: `mark` where a window starts, `close` where it ends
    (after a host sync), counting it only when all its steps were measured."""

    meter: EnergyMeter
    joules: float = 0.0
    seconds: float = 0.0
    samples: int = 0
    _mark: float | None = None

    def mark(self) -> None:
        self._mark = self.meter.read_j()

    def close(self, *, measured: bool, samples: int, seconds: float) -> None:
        now = self.meter.read_j()
        if measured and samples and now is not None and self._mark is not None and now >= self._mark:
            self.joules += now - self._mark
            self.samples += samples
            self.seconds += seconds
        self._mark = now


def energy_stats(joules: float, seconds: float, samples: int, samples_per_epoch: int | None) -> dict[str, Any] | None:
    """The results' `energy` block (None when nothing was measured)."""
    if samples <= 0 or seconds <= 0 or joules <= 0:
        return None
    per_sample = joules / samples
    return {
        "source": "nvml_total_energy",
        "measured_j": joules,
        "measured_s": seconds,
        "measured_samples": samples,
        "j_per_sample": per_sample,
        "kwh_per_epoch": per_sample * samples_per_epoch / JOULES_PER_KWH if samples_per_epoch else None,
        "mean_power_w": joules / seconds,
    }


def energy_metrics(stats: dict[str, Any] | None) -> dict[str, float]:
    """The energy block as MLflow metrics: `result/j_per_sample`, `result/kwh_per_epoch` (where known)."""
    if not stats:
        return {}
    out = {"result/j_per_sample": float(stats["j_per_sample"]), "result/gpu_power_w": float(stats["mean_power_w"])}
    if stats.get("kwh_per_epoch") is not None:
        out["result/kwh_per_epoch"] = float(stats["kwh_per_epoch"])
    return out
