"""The machine's own ceiling: a short GEMM probe at the trial's precision on its GPU.

Square matmuls of `size` (8192 on a GPU) in the trial's dtype (fp32 strict, tf32 with TF32 matmuls, fp16, bf16),
after a warm-up, timed `repeats` times over `inner` matmuls each; the best time gives the probe's TFLOP/s (2 size^3
FLOPs a matmul). It runs on GPU trials only, after the measured steps (outside their window), in about a second
on an H100 (a T4 in fp32: a few). What it reads is what that machine, at that moment and clock, delivers on the
easiest dense work there is: a trial's MFU against it says how far the model's steps are from the machine, where
MFU against the data sheet's peak also holds the machine's own distance from the sheet.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from kubesweep.jobs.flops import gemm_flops

log = logging.getLogger(__name__)

GPU_SIZE = 8192
WARMUP = 3
REPEATS = 5
INNER = 10
DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def should_probe(device: str) -> bool:
    """A GPU trial probes its GPU; a CPU trial has no GPU ceiling to measure (and no peak to hold it against)."""
    return device.startswith("cuda")


def gemm_probe(precision: str, device: str, *, size: int = GPU_SIZE, warmup: int = WARMUP, repeats: int = REPEATS,
               inner: int = INNER) -> dict[str, Any]:
    """The best TFLOP/s of `repeats` timings of `inner` square `size` matmuls in `precision`'s dtype on `device`
    (`Results.probe`). TF32 matmuls are allowed for `tf32` only, and the setting is put back as it was."""
    dtype = DTYPES[precision]
    cuda = device.startswith("cuda")
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    try:
        generator = torch.Generator(device=device).manual_seed(0)
        a = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
        b = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
        out = torch.empty(size, size, device=device, dtype=dtype)
        t0 = time.perf_counter()
        for _ in range(warmup):
            torch.matmul(a, b, out=out)
        times = [_timed(lambda: [torch.matmul(a, b, out=out) for _ in range(inner)], cuda) for _ in range(repeats)]
        seconds = time.perf_counter() - t0
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    best = min(times)
    return {"precision": precision, "dtype": str(dtype).removeprefix("torch."), "size": size, "repeats": repeats,
            "matmuls_per_repeat": inner, "best_s": best,
            "tflops_per_s": inner * gemm_flops(size) / best / 1e12, "seconds": seconds}


def _timed(work: Any, cuda: bool) -> float:
    """Seconds `work` took on the device: CUDA events around it (synchronized), else the host's clock."""
    if not cuda:
        t0 = time.perf_counter()
        work()
        return time.perf_counter() - t0
    events: Any = torch.cuda  # Event() is untyped
    start, end = events.Event(enable_timing=True), events.Event(enable_timing=True)
    start.record()
    work()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) / 1000.0


def probe_trial(precision: str, device: str) -> tuple[dict[str, Any] | None, str | None]:
    """The probe of a trial's GPU (None on the CPU, by `should_probe`), and a note where it could not run (its
    memory taken, a kernel refused): the trial's figures stand without it, and MFU against the probe is none."""
    if not should_probe(device):
        return None, None
    try:
        return gemm_probe(precision, device), None
    except Exception as err:  # the trial has succeeded; a probe that cannot run is said, not fatal
        log.warning("GEMM probe failed: %s", err)
        return None, f"GEMM probe not run: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
