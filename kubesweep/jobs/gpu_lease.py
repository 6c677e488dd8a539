"""The GPU lease: a trial holds its GPU alone from CUDA start to its last GPU work.

A scheduler that starts a trial's process before its GPU is free (the local backend starts the next trial on a
GPU while the one before it still trains) names one lock file per device of the trial in `KUBESWEEP_GPU_LEASE`
(separated by `os.pathsep`, in `CUDA_VISIBLE_DEVICES` order). The job does its host-only preparation first
(imports, tracking run, tokenizer, data, the model built in host memory), then takes the lock of its own device
(`LOCAL_RANK`), and gives it back once its GPU memory is freed. So the GPU phases of trials on one device never
overlap: no trial creates a CUDA context, samples NVML or allocates while another one measures.

The lock is an `flock` on the file: the kernel drops it when the process dies, whatever killed it.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import IO

LEASE_ENV = "KUBESWEEP_GPU_LEASE"


class GpuLease:
    """The lock of this process's device; a no-op where the job runs without a lease (one trial per GPU)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._handle: IO[str] | None = None
        self._acquired_at: float | None = None
        self.held_s: float | None = None
        self.acquired_at_unix: float | None = None
        self.released_at_unix: float | None = None

    @classmethod
    def from_env(cls, local_rank: int = 0) -> GpuLease:
        paths = [p for p in os.environ.get(LEASE_ENV, "").split(os.pathsep) if p]
        if not paths:
            return cls(None)
        return cls(Path(paths[local_rank % len(paths)]))

    @property
    def held(self) -> bool:
        return self._handle is not None

    def acquire(self, holder: str = "") -> float | None:
        """Wait for the device; returns the seconds waited (None without a lease)."""
        if self.path is None:
            return None
        t0 = time.monotonic()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = self.path.open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder_now = handle.read().strip() or "another process"
            print(f"waiting for the GPU: {self.path} is held by {holder_now}", flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()} {holder}\n")
        handle.flush()
        self._handle = handle
        self._acquired_at = time.monotonic()
        self.acquired_at_unix = time.time()
        return self._acquired_at - t0

    def release(self) -> None:
        """Give the device back (idempotent); `held_s` is how long it was held."""
        if self._handle is None:
            return
        if self._acquired_at is not None:
            self.held_s = time.monotonic() - self._acquired_at
        self.released_at_unix = time.time()
        fcntl.flock(self._handle, fcntl.LOCK_UN)
        self._handle.close()
        self._handle = None

    def record(self) -> dict[str, object] | None:
        """For results.json: which lock, and when it was held (Unix seconds); None without a lease."""
        if self.path is None:
            return None
        return {"path": str(self.path), "acquired_at": self.acquired_at_unix, "released_at": self.released_at_unix}
