"""The GPU identity check and the product label NVML names map to."""

from __future__ import annotations

from kubesweep.jobs import env


def test_gpu_identity_check() -> None:
    assert env.product_label("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
    assert env.check_gpu(None, []) is None
    assert env.check_gpu("NVIDIA-L40S", ["NVIDIA L40S"]) is None
    assert env.check_gpu("NVIDIA-L4", ["NVIDIA L40S"]) is not None  # exact match only
    assert "no GPU" in (env.check_gpu("NVIDIA-L4", []) or "")


def test_cpu_list_is_the_kernels_list_format() -> None:
    assert env.cpu_list([]) == ""
    assert env.cpu_list([3]) == "3"
    assert env.cpu_list([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    assert env.cpu_list([0, 2, 4]) == "0,2,4"


def test_capture_records_the_cpu_set_the_process_may_run_on() -> None:
    import os

    cpu = env.capture([])["cpu"]
    assert cpu["affinity"] == env.cpu_list(sorted(os.sched_getaffinity(0)))


def test_nvml_identity_is_none_where_nvml_cannot_name_the_device() -> None:
    # CI has no GPU: NVML cannot start, and the identity says so rather than guessing (on a GPU machine the
    # trial's results carry the UUID and PCI bus id NVML reads inside the container: bench/gpu_node.py shared)
    assert env.nvml_identity(0) == {"nvml_uuid": None, "pci_bus_id": None}


def test_capture_records_the_kernels_boot_id_beside_the_hostname() -> None:
    """The boot id tells two machines of one hostname apart (kubesweep.tracking.aggregate.machine_of)."""
    from pathlib import Path

    captured = env.capture([])
    assert captured["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert captured["hostname"] and captured["node_name"]
