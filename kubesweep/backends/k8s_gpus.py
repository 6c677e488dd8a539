"""The GPUs a cluster offers, as its nodes say: what `sweep submit` and `sweep validate --backend kubernetes` read
before anything is applied (`kubesweep.preflight.gpu_fit` splits a plan by them).

A node offers GPUs of one type: its GPU Feature Discovery label `nvidia.com/gpu.product` (matched exactly against
the GPU catalog, as trial pods select their nodes) and its allocatable `nvidia.com/gpu`. Listing nodes is a
cluster-wide right a namespace's user may not have: that is `NodesHidden` (the caller says so and goes on), while
an API server that cannot be reached is the `BackendError` every other request gives. A sweep with a Kueue queue
(`spec.queue`) runs only the GPU types its ClusterQueue has a ResourceFlavor of (`nodeLabels` naming the product,
an `nvidia.com/gpu` quota): `read_queue_flavors`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubesweep.backends.base import BackendError
from kubesweep.backends.k8s_client import Api, api_message
from kubesweep.backends.k8s_kueue import GROUP, VERSION
from kubesweep.gpus import GPU_RESOURCE, PRODUCT_LABEL


class NodesHidden(BackendError):
    """This user may not list the cluster's nodes (403), or read a queue's ClusterQueue and ResourceFlavors; the
    message is the API server's."""


@dataclass(frozen=True)
class QueueFlavors:
    """The GPU types a Kueue LocalQueue admits trials of: the products its ClusterQueue's ResourceFlavors (those
    with an `nvidia.com/gpu` quota) name in their `nodeLabels`."""

    queue: str
    cluster_queue: str
    products: frozenset[str]


@dataclass(frozen=True)
class ClusterGpus:
    """GPU product label → the allocatable GPUs of each node that carries it (a node cordoned for maintenance
    is left out: nothing new is placed on it); with a Kueue queue, the GPU types its flavors admit."""

    products: dict[str, list[int]] = field(default_factory=dict)
    queue: QueueFlavors | None = None

    def fits(self, product: str, gpus_per_node: int, num_nodes: int = 1) -> bool:
        """Whether `num_nodes` nodes of `product` each offer `gpus_per_node` GPUs (all of them free), and the
        queue (if any) has a flavor of it."""
        if self.queue is not None and product not in self.queue.products:
            return False
        return sum(1 for n in self.products.get(product, []) if n >= gpus_per_node) >= num_nodes


def _allocatable(node: Mapping[str, Any]) -> int:
    value = str((node.get("status") or {}).get("allocatable", {}).get(GPU_RESOURCE) or "0")
    try:
        return max(int(value), 0)
    except ValueError:  # not a whole number: a device plugin's quantity kubesweep cannot ask for
        return 0


def gpus_of(nodes: Sequence[Mapping[str, Any]]) -> ClusterGpus:
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
    resp = api.call(_hidden(api, api.core.list_node), label_selector=PRODUCT_LABEL, _preload_content=False)
    return gpus_of(json.loads(resp.data).get("items") or [])


def _hidden(api: Api, fn: Any) -> Any:
    """`fn` whose 403 is `NodesHidden` (Api.call turns any other error into a `BackendError`)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except api.ApiException as exc:
            if getattr(exc, "status", None) == 403:
                raise NodesHidden(api_message(exc)) from None
            raise
    return call


def flavor_products(cluster_queue: Mapping[str, Any], flavors: Sequence[Mapping[str, Any]]) -> frozenset[str]:
    """The GPU products the ClusterQueue's flavors with an `nvidia.com/gpu` quota name (`flavors`: the cluster's
    ResourceFlavors)."""
    labels = {str((f.get("metadata") or {}).get("name")): (f.get("spec") or {}).get("nodeLabels") or {}
              for f in flavors}
    products = set()
    for group in (cluster_queue.get("spec") or {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            if any(r.get("name") == GPU_RESOURCE for r in flavor.get("resources") or []):
                product = labels.get(str(flavor.get("name")), {}).get(PRODUCT_LABEL)
                if product:
                    products.add(str(product))
    return frozenset(products)


def read_queue_flavors(api: Api, queue: str) -> QueueFlavors:
    """The GPU types LocalQueue `queue` (of the Api's namespace) admits. `NodesHidden` when this user may not read
    its ClusterQueue or the ResourceFlavors; `BackendError` when the LocalQueue is not there or the server fails."""
    try:
        local = api.call(_hidden(api, api.custom.get_namespaced_custom_object), GROUP, VERSION, api.namespace,
                         "localqueues", queue)
    except api.ApiException:  # 404: no such LocalQueue (or no Kueue)
        raise BackendError(f"no Kueue LocalQueue {queue!r} in namespace {api.namespace!r} (spec.queue)") from None
    name = str((local.get("spec") or {}).get("clusterQueue") or "")
    try:
        cluster_queue = api.call(_hidden(api, api.custom.get_cluster_custom_object), GROUP, VERSION,
                                 "clusterqueues", name)
        flavors = api.call(_hidden(api, api.custom.list_cluster_custom_object), GROUP, VERSION, "resourceflavors")
    except api.ApiException:  # 404: the ClusterQueue is not there
        raise BackendError(f"Kueue LocalQueue {queue!r} points at ClusterQueue {name!r}, which is not there") from None
    return QueueFlavors(queue, name, flavor_products(cluster_queue, flavors.get("items") or []))
