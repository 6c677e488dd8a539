"""Measurement helpers: step clocks that never stall the GPU, percentiles, memory peaks, the NVML sampler."""

from __future__ import annotations

import logging
import os
import resource
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import numpy as np
import pynvml
import torch

log = logging.getLogger(__name__)


class StepClock:
    """Times the intervals between `mark()` calls.

    On CUDA each mark records an event on the current stream (no host sync); `drain()` waits for the newest
    event only when it is called, at a log boundary, and returns the intervals completed since the last drain.
    The interval between two events spans everything the stream did or waited for between the marks, so it is
    the step's wall time as the GPU saw it. On the CPU, marks are `perf_counter` readings.
    """

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self._marks: list[Any] = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            event.record()
            self._marks.append(event)
        else:
            self._marks.append(time.perf_counter())

    def drain(self) -> list[float]:
        if len(self._marks) < 2:
            return []
        marks, self._marks = self._marks, self._marks[-1:]
        if self.cuda:
            marks[-1].synchronize()
            return [a.elapsed_time(b) / 1000.0 for a, b in pairwise(marks)]
        return [b - a for a, b in pairwise(marks)]

    def reset(self) -> None:
        self._marks.clear()


def percentiles(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    arr = np.asarray(values, dtype=np.float64)
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return {
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "mean": float(arr.mean()),
        "n": len(values),
    }


def host_peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def torch_memory_peaks() -> dict[str, int | None]:
    if not torch.cuda.is_available():
        return {"torch_peak_allocated_bytes": None, "torch_peak_reserved_bytes": None}
    return {
        "torch_peak_allocated_bytes": int(torch.cuda.max_memory_allocated()),
        "torch_peak_reserved_bytes": int(torch.cuda.max_memory_reserved()),
    }


# --------------------------------------------------------------------------------------------- NVML sampler


@dataclass
class GpuSample:
    t: float
    index: int  # CUDA device index as this process sees it
    utilization_pct: float
    memory_utilization_pct: float
    power_w: float | None
    temperature_c: float | None
    memory_used_bytes: int  # device-wide
    process_memory_bytes: int | None  # this process on that device, where the driver reports it


@dataclass
class NvmlSampler:
    """Samples this process's CUDA devices every `interval_s` in a daemon thread (no-op without NVML/GPU)."""

    devices: list[int]
    interval_s: float = 1.0
    on_sample: Callable[[list[GpuSample]], None] | None = None
    samples: list[GpuSample] = field(default_factory=list)
    _handles: list[tuple[int, Any]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> bool:
        if not self.devices:
            return False
        try:
            pynvml.nvmlInit()
            self._handles = [(i, nvml_handle(i)) for i in self.devices]
        except Exception as err:  # no driver, no NVML: the run goes on without GPU samples
            log.warning("NVML sampler off: %s", err)
            return False
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
            self._sample()  # one last reading

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        now = time.time()
        batch: list[GpuSample] = []
        for index, handle in self._handles:
            try:
                util = pynvml.nvmlDeviceGetUtilizationRates(handle)
                mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
                batch.append(
                    GpuSample(
                        t=now,
                        index=index,
                        utilization_pct=float(util.gpu),
                        memory_utilization_pct=float(util.memory),
                        power_w=_maybe(_power_w, handle),
                        temperature_c=_maybe(_temperature_c, handle),
                        memory_used_bytes=int(mem.used),
                        process_memory_bytes=_process_memory(handle),
                    )
                )
            except Exception as err:
                log.debug("NVML sample failed: %s", err)
        if batch:
            self.samples.extend(batch)
            if self.on_sample is not None:
                self.on_sample(batch)

    def summary(self, measured: tuple[float, float] | None = None,
                pauses: Sequence[tuple[float, float]] = ()) -> dict[str, Any]:
        """Per device over the trial's life; with `measured` (Unix times of the first measured step's start and
        the last one's end) also the utilization of the samples inside that window alone, less its `pauses` (when
        the step clock stood still between measured steps: an evaluation, a checkpoint): warm-up, evaluation and
        start-up excluded, what says whether the measured steps kept the GPU busy."""
        devices = []
        for index in self.devices:
            mine = [s for s in self.samples if s.index == index]
            if not mine:
                continue
            inside = [s for s in mine if measured is not None and self._measured(s.t, measured, pauses)]
            power = [s.power_w for s in mine if s.power_w is not None]
            temps = [s.temperature_c for s in mine if s.temperature_c is not None]
            proc = [s.process_memory_bytes for s in mine if s.process_memory_bytes is not None]
            devices.append(
                {
                    "index": index,
                    "samples": len(mine),
                    "utilization_mean_pct": float(np.mean([s.utilization_pct for s in mine])),
                    "utilization_max_pct": float(max(s.utilization_pct for s in mine)),
                    "power_mean_w": float(np.mean(power)) if power else None,
                    "power_max_w": float(max(power)) if power else None,
                    "temperature_max_c": float(max(temps)) if temps else None,
                    "memory_used_max_bytes": int(max(s.memory_used_bytes for s in mine)),
                    "process_memory_max_bytes": int(max(proc)) if proc else None,
                    "measured_samples": len(inside) if measured is not None else None,
                    "utilization_measured_pct": float(np.mean([s.utilization_pct for s in inside]))
                    if inside else None,
                }
            )
        return {"interval_s": self.interval_s, "devices": devices}

    def _measured(self, t: float, measured: tuple[float, float], pauses: Sequence[tuple[float, float]]) -> bool:
        """A sample reports the interval before it: it belongs to the measured steps if that interval lay inside
        their window and overlapped none of its pauses."""
        start = t - self.interval_s
        return measured[0] <= start and t <= measured[1] and not any(start < b and a < t for a, b in pauses)

    def peak_used_bytes(self) -> int | None:
        proc = [s.process_memory_bytes for s in self.samples if s.process_memory_bytes is not None]
        if proc:
            return max(proc)
        used = [s.memory_used_bytes for s in self.samples]
        return max(used) if used else None


def nvml_handle(cuda_index: int) -> Any:
    """The NVML handle of a CUDA device index, matched by UUID (CUDA_VISIBLE_DEVICES may renumber devices)."""
    uuid = getattr(torch.cuda.get_device_properties(cuda_index), "uuid", None)
    if uuid is not None:
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
        except pynvml.NVMLError:
            pass
    return pynvml.nvmlDeviceGetHandleByIndex(cuda_index)


def _process_memory(handle: Any) -> int | None:
    try:
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except pynvml.NVMLError:
        return None
    pid = os.getpid()
    for proc in procs:
        if proc.pid == pid and proc.usedGpuMemory is not None:
            return int(proc.usedGpuMemory)
    return None


def _power_w(handle: Any) -> float:
    return float(pynvml.nvmlDeviceGetPowerUsage(handle)) / 1000.0


def _temperature_c(handle: Any) -> float:
    return float(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))


def _maybe(read: Callable[[Any], float], handle: Any) -> float | None:
    """A reading some devices do not support (power on some boards): None instead of an error."""
    try:
        return read(handle)
    except Exception:
        return None


def system_metrics(batch: list[GpuSample]) -> dict[str, float]:
    """NVML samples as `system/gpuN/...` metric names."""
    out: dict[str, float] = {}
    for s in batch:
        prefix = f"system/gpu{s.index}"
        out[f"{prefix}/utilization_pct"] = s.utilization_pct
        out[f"{prefix}/memory_utilization_pct"] = s.memory_utilization_pct
        out[f"{prefix}/memory_used_mib"] = s.memory_used_bytes / 2**20
        if s.power_w is not None:
            out[f"{prefix}/power_w"] = s.power_w
        if s.temperature_c is not None:
            out[f"{prefix}/temperature_c"] = s.temperature_c
    return out
