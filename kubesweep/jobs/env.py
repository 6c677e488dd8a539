"""Environment capture (what ran where) and the GPU identity check.

Environment variables read here:
- `KUBESWEEP_IMAGE`: the container image reference the trial runs in (set by the backends);
- `KUBESWEEP_NODE_NAME`: the node's name (Kubernetes downward API); the hostname otherwise;
- `KUBESWEEP_TEST_GPU_NAME`: test hook, stands in for the NVML device name of every device this process
  would use, so the `gpu_mismatch` path can be exercised without that GPU.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import socket
from importlib import metadata
from pathlib import Path
from typing import Any

import pynvml
import torch

from kubesweep.jobs.metrics import nvml_handle
from kubesweep.jobs.runtime import cpu_quota

TEST_GPU_NAME_ENV = "KUBESWEEP_TEST_GPU_NAME"


def product_label(nvml_name: str) -> str:
    """The GPU Feature Discovery `nvidia.com/gpu.product` value of an NVML device name."""
    return nvml_name.strip().replace(" ", "-")


def local_devices() -> list[int]:
    """CUDA device indices this process uses (its LOCAL_RANK's device under torchrun)."""
    if not torch.cuda.is_available():
        return []
    return [int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()]


def gpu_names(devices: list[int]) -> list[str]:
    override = os.environ.get(TEST_GPU_NAME_ENV)
    if override:
        return [override] * max(1, len(devices))
    names = []
    for index in devices:
        try:
            pynvml.nvmlInit()
            name = pynvml.nvmlDeviceGetName(nvml_handle(index))
            names.append(name.decode() if isinstance(name, bytes) else str(name))
        except Exception:
            names.append(torch.cuda.get_device_name(index))
    return names


def check_gpu(requested_product: str | None, names: list[str]) -> str | None:
    """None when the devices match the requested product label (or none was requested); else why not."""
    if not requested_product:
        return None
    if not names:
        return f"asked for {requested_product}, but no GPU is visible to the job"
    labels = sorted({product_label(n) for n in names})
    if labels != [requested_product]:
        return f"asked for {requested_product}, the device is {', '.join(labels)}"
    return None


def capture(devices: list[int]) -> dict[str, Any]:
    gpus: list[dict[str, Any]] = []
    driver = None
    for index, name in zip(devices, gpu_names(devices), strict=False):
        props = torch.cuda.get_device_properties(index)
        gpus.append(
            {
                "index": index,
                "name": name,
                "product": product_label(name),
                "memory_total_bytes": int(props.total_memory),
                "compute_capability": f"{props.major}.{props.minor}",
                "uuid": str(getattr(props, "uuid", "")) or None,
                **nvml_identity(index),
            }
        )
    if devices:
        try:
            pynvml.nvmlInit()
            raw = pynvml.nvmlSystemGetDriverVersion()
            driver = raw.decode() if isinstance(raw, bytes) else str(raw)
        except Exception:
            driver = None
    cudnn_backend: Any = torch.backends.cudnn
    cudnn = cudnn_backend.version() if cudnn_backend.is_available() else None
    return {
        "captured_at": dt.datetime.now(dt.UTC).isoformat(),
        "node_name": os.environ.get("KUBESWEEP_NODE_NAME") or socket.gethostname(),
        "hostname": socket.gethostname(),
        "boot_id": _boot_id(),
        "image": os.environ.get("KUBESWEEP_IMAGE"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": {
            "model": _cpu_model(),
            "logical_cores": os.cpu_count(),
            "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "affinity": cpu_list(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else None,
            "quota_cores": cpu_quota(),  # the pod's CPU limit, where a cgroup sets one
            "torch_threads": torch.get_num_threads(),
        },
        "memory_total_bytes": _mem_total(),
        "gpus": gpus,
        "gpu_test_override": os.environ.get(TEST_GPU_NAME_ENV),
        "driver_version": driver,
        "cuda_version": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "cudnn_version": cudnn,
        "nccl_version": _nccl_version(),
        "packages": {
            name: _version(name) for name in ("torch", "transformers", "datasets", "numpy", "mlflow")
        },
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
    }


def nvml_identity(index: int) -> dict[str, str | None]:
    """The device as NVML reads it inside this container: its UUID and PCI bus id, the two names that stay the
    same whichever index CUDA_VISIBLE_DEVICES or the device plugin gave it (None where NVML cannot say)."""
    try:
        pynvml.nvmlInit()
        handle = nvml_handle(index)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        bus = pynvml.nvmlDeviceGetPciInfo(handle).busId
    except Exception:
        return {"nvml_uuid": None, "pci_bus_id": None}
    return {"nvml_uuid": uuid.decode() if isinstance(uuid, bytes) else str(uuid),
            "pci_bus_id": bus.decode() if isinstance(bus, bytes) else str(bus)}


def cpu_list(cpus: list[int]) -> str:
    """CPUs in the kernel's list format (`0-3,8,10-11`), as /sys and cpuset.cpus write them."""
    parts: list[str] = []
    start = prev = None
    for cpu in cpus:
        if prev is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = cpu
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(parts)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _mem_total() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except ImportError:
        return None


def _nccl_version() -> str | None:
    try:
        if torch.cuda.is_available():
            nccl: Any = torch.cuda.nccl
            version = nccl.version()
            return ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)
    except Exception:
        return None
    return None


def _boot_id() -> str | None:
    """The running kernel's boot id: one per boot of a machine, the same in every container on it; it tells two
    machines of one hostname apart (`kubesweep.tracking.aggregate.machine_of`). None where the kernel gives none."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None
