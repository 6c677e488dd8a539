"""The GPU identity check and the product label NVML names map to."""

from __future__ import annotations

from kubesweep.jobs import env


def test_gpu_identity_check() -> None:
    assert env.product_label("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
    assert env.check_gpu(None, []) is None
    assert env.check_gpu("NVIDIA-L40S", ["NVIDIA L40S"]) is None
    assert env.check_gpu("NVIDIA-L4", ["NVIDIA L40S"]) is not None  # exact match only
    assert "no GPU" in (env.check_gpu("NVIDIA-L4", []) or "")
