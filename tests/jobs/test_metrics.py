"""The measurement helpers that need no GPU: percentiles, the CPU step clock, peak RSS, sampler summaries."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace

import pytest

from kubesweep.jobs import metrics
from kubesweep.jobs.metrics import GpuSample, NvmlSampler
from tests.support.job_fixtures import REPO


def test_percentiles() -> None:
    assert metrics.percentiles([]) is None
    stats = metrics.percentiles([float(v) for v in range(1, 101)])
    assert stats == pytest.approx({"p50": 50.5, "p90": 90.1, "p99": 99.01, "mean": 50.5, "n": 100})
    assert metrics.percentiles([2.0]) == {"p50": 2.0, "p90": 2.0, "p99": 2.0, "mean": 2.0, "n": 1}


def test_cpu_step_clock_returns_the_intervals_since_the_last_drain() -> None:
    clock = metrics.StepClock(cuda=False)
    assert clock.drain() == []
    clock.mark()
    time.sleep(0.05)
    clock.mark()
    clock.mark()
    first = clock.drain()
    assert len(first) == 2 and first[0] >= 0.045 and 0 <= first[1] < first[0]
    assert clock.drain() == []  # the last mark is kept as the next interval's start
    time.sleep(0.02)
    clock.mark()
    (second,) = clock.drain()
    assert second >= 0.018
    clock.reset()
    clock.mark()
    assert clock.drain() == []


def test_host_peak_rss_covers_what_was_touched() -> None:
    """In a fresh process that touches 200 MiB: the peak, in bytes, is at least the resident size /proc reports.
    (A child's peak also counts its parent's at the fork, so its growth is not measured here.)"""
    script = (
        "from kubesweep.jobs.metrics import host_peak_rss_bytes as peak\n"
        "before = peak()\n"
        "block = bytearray(200 * 2**20)\n"
        "block[::4096] = b'\\x01' * len(block[::4096])\n"
        "rss = next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmRSS:'))\n"
        "print(before, peak(), rss)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    before, after, rss = map(int, proc.stdout.split())
    assert rss >= 200 * 2**20
    assert after >= before and after >= rss * 0.98  # bytes, not KiB (ru_maxrss is KiB on Linux)


def test_torch_memory_peaks_without_cuda() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    assert metrics.torch_memory_peaks() == {"torch_peak_allocated_bytes": None, "torch_peak_reserved_bytes": None}


def sample(index: int, util: float, used: int, power: float | None, proc: int | None) -> GpuSample:
    return GpuSample(t=0.0, index=index, utilization_pct=util, memory_utilization_pct=util / 2, power_w=power,
                     temperature_c=None if power is None else 60.0, memory_used_bytes=used, process_memory_bytes=proc)


def test_sampler_summary_and_peaks() -> None:
    sampler = NvmlSampler(devices=[0, 1, 2], interval_s=0.5)
    sampler.samples = [sample(0, 50, 100, 200.0, 40), sample(0, 100, 300, 300.0, 80), sample(1, 10, 50, None, None)]
    summary = sampler.summary()
    assert summary["interval_s"] == 0.5 and [d["index"] for d in summary["devices"]] == [0, 1]  # 2: no samples
    zero, one = summary["devices"]
    assert zero == {"index": 0, "samples": 2, "utilization_mean_pct": 75.0, "utilization_max_pct": 100.0,
                    "power_mean_w": 250.0, "power_max_w": 300.0, "temperature_max_c": 60.0,
                    "memory_used_max_bytes": 300, "process_memory_max_bytes": 80, "measured_samples": None,
                    "utilization_measured_pct": None}
    assert one["power_mean_w"] is None and one["temperature_max_c"] is None and one["process_memory_max_bytes"] is None
    assert sampler.peak_used_bytes() == 80  # this process's memory where the driver reports it
    sampler.samples = [sample(1, 10, 50, None, None)]
    assert sampler.peak_used_bytes() == 50  # else the device's
    sampler.samples = []
    assert sampler.peak_used_bytes() is None


def test_utilization_over_the_measured_steps_alone() -> None:
    """A sample reports the interval before it: those whose whole interval lay inside the measured window count
    (start-up, warm-up and evaluation around it do not); a window shorter than one interval has no figure."""
    sampler = NvmlSampler(devices=[0], interval_s=1.0)
    sampler.samples = [replace(sample(0, util, 100, None, None), t=t)
                       for t, util in ((100.0, 0), (101.0, 100), (102.0, 40), (103.0, 60), (104.0, 100), (105.0, 0))]
    (device,) = sampler.summary((101.0, 104.0))["devices"]
    assert device["utilization_mean_pct"] == pytest.approx(50.0)  # the trial's life: 300 / 6
    assert (device["measured_samples"], device["utilization_measured_pct"]) == (3, pytest.approx(200 / 3))
    (device,) = sampler.summary((101.5, 102.2))["devices"]
    assert device["measured_samples"] == 0 and device["utilization_measured_pct"] is None
    # an evaluation or a checkpoint between measured steps (the step clock paused): the samples whose interval
    # overlapped it are not the steps' (here the 40% one, 101..102, overlaps a pause from 101.5 to 101.8)
    (device,) = sampler.summary((101.0, 104.0), [(101.5, 101.8)])["devices"]
    assert (device["measured_samples"], device["utilization_measured_pct"]) == (2, pytest.approx(80.0))
    (device,) = sampler.summary((100.0, 105.0), [(99.0, 100.2), (104.9, 106.0)])["devices"]
    assert device["measured_samples"] == 3  # pauses at the window's ends take the samples they touch


def test_sampler_without_devices_does_not_start() -> None:
    sampler = NvmlSampler(devices=[])
    assert not sampler.start()
    sampler.stop()
    assert sampler.samples == [] and sampler.summary() == {"interval_s": 1.0, "devices": []}


def test_system_metric_names() -> None:
    assert metrics.system_metrics([sample(1, 40, 2**21, 150.0, None), sample(0, 5, 0, None, None)]) == {
        "system/gpu1/utilization_pct": 40, "system/gpu1/memory_utilization_pct": 20,
        "system/gpu1/memory_used_mib": 2.0, "system/gpu1/power_w": 150.0, "system/gpu1/temperature_c": 60.0,
        "system/gpu0/utilization_pct": 5, "system/gpu0/memory_utilization_pct": 2.5, "system/gpu0/memory_used_mib": 0.0,
    }  # fmt: skip
