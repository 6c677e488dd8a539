"""The GPUs a cluster's nodes offer (`k8s_gpus`): Node objects as the API server sends them; read from the test
control plane's kwok GPU nodes, and refused to a user without the right to list nodes, in
tests/test_cli_cluster_gpus.py."""

from __future__ import annotations

from typing import Any

from kubesweep.backends.k8s_gpus import ClusterGpus, gpus_of


def node(product: str | None, gpus: Any = "8", **spec: Any) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.product": product} if product else {}
    return {"metadata": {"name": "n", "labels": labels}, "spec": spec,
            "status": {"allocatable": {"nvidia.com/gpu": gpus} if gpus is not None else {}}}


def test_each_product_label_with_its_nodes_allocatable_gpus() -> None:
    cluster = gpus_of([node("NVIDIA-L4"), node("NVIDIA-L4", "4"), node("NVIDIA-L40S", None), node(None),
                       node("NVIDIA-H100-80GB-HBM3", "8", unschedulable=True), node("Tesla-T4", "1.5")])
    assert cluster.products == {"NVIDIA-L4": [8, 4], "NVIDIA-L40S": [0], "Tesla-T4": [0]}  # a cordoned node: none


def test_fits_counts_nodes_with_enough_gpus() -> None:
    cluster = ClusterGpus({"NVIDIA-L4": [8, 4]})
    assert cluster.fits("NVIDIA-L4", 4, 2) and cluster.fits("NVIDIA-L4", 8)
    assert not cluster.fits("NVIDIA-L4", 8, 2) and not cluster.fits("NVIDIA-L4", 16)
    assert not cluster.fits("NVIDIA-L40S", 1)  # exact: an L40S is no L4, and an L4 no L40S
