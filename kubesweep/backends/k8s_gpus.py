"""The GPUs a cluster offers, as its nodes say: what `sweep submit` and `sweep validate --backend kubernetes` read
before anything is applied (`kubesweep.preflight.gpu_fit` splits a plan by them).

A node offers GPUs of one type: its GPU Feature Discovery label `nvidia.com/gpu.product` (matched exactly against
the GPU catalog, as trial pods select their nodes) and its allocatable `nvidia.com/gpu`. Listing nodes is a
cluster-wide right a namespace's user may not have: that is `NodesHidden` (the caller says so and goes on), while
an API server that cannot be reached is the `BackendError` every other request gives.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubesweep.backends.base import BackendError
from kubesweep.backends.k8s_client import Api, api_message
from kubesweep.gpus import GPU_RESOURCE, PRODUCT_LABEL


class NodesHidden(BackendError):
    """This user may not list the cluster's nodes (403); the message is the API server's."""


@dataclass(frozen=True)
class ClusterGpus:
    """GPU product label → the allocatable GPUs of each node that carries it (a node cordoned for maintenance
    is left out: nothing new is placed on it)."""

    products: dict[str, list[int]] = field(default_factory=dict)

    def fits(self, product: str, gpus_per_node: int, num_nodes: int = 1) -> bool:
        """Whether `num_nodes` nodes of `product` each offer `gpus_per_node` GPUs (all of them free)."""
        return sum(1 for n in self.products.get(product, []) if n >= gpus_per_node) >= num_nodes


def _allocatable(node: Mapping[str, Any]) -> int:
    value = str((node.get("status") or {}).get("allocatable", {}).get(GPU_RESOURCE) or "0")
    try:
        return max(int(value), 0)
    except ValueError:  # not a whole number: a device plugin's quantity kubesweep cannot ask for
        return 0


def gpus_of(nodes: list[Mapping[str, Any]]) -> ClusterGpus:
    """The GPUs `nodes` (Node objects as the API server sends them) offer."""
    products: dict[str, list[int]] = {}
    for node in nodes:
        product = (node.get("metadata") or {}).get("labels", {}).get(PRODUCT_LABEL)
        if not product or (node.get("spec") or {}).get("unschedulable"):
            continue
        products.setdefault(str(product), []).append(_allocatable(node))
    return ClusterGpus(products)


def read_cluster_gpus(api: Api) -> ClusterGpus:
    """The GPUs the cluster's nodes offer. `NodesHidden` when this user may not list nodes; `BackendError` when
    the API server cannot be reached or answers with another error."""
    def list_nodes(**kwargs: Any) -> Any:
        try:
            return api.core.list_node(**kwargs)
        except api.ApiException as exc:
            if getattr(exc, "status", None) == 403:
                raise NodesHidden(api_message(exc)) from None
            raise

    resp = api.call(list_nodes, label_selector=PRODUCT_LABEL, _preload_content=False)
    return gpus_of(json.loads(resp.data).get("items") or [])
