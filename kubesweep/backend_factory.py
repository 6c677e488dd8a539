"""A backend by name: the one place the CLI, the session and the tuner get theirs from. It stands above both
`backends` and `operator` because a kubernetes sweep on a cluster with the Sweep CRD is the operator's client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubesweep.backends.base import Backend, BackendError
from kubesweep.backends.local import LocalBackend

BACKENDS = ("local", "kubernetes")


def make_backend(name: str, *, home: Path | None = None, **options: Any) -> Backend:
    """A backend by name; its SDK is imported only here, so a missing extra breaks nothing else.

    `kubernetes`: on a cluster with the Sweep CRD, the Sweep resource is the interface and the operator drives
    the trials (`kubesweep.operator.client`); with `direct=True`, this process drives the Jobs itself and keeps
    the state in a ConfigMap (`kubesweep.backends.kubernetes`).
    """
    if name == "local":
        return LocalBackend(home, any_gpu=bool(options.get("any_gpu")), cpu_slots=int(options.get("cpu_slots", 1)),
                            tracking=options.get("tracking"))
    if name == "kubernetes":
        try:
            from kubesweep.backends.kubernetes import KubernetesBackend
        except ImportError as exc:
            raise BackendError(
                f"the kubernetes backend needs the k8s extra ({exc.name} is missing): pip install 'kubesweep[k8s]'"
            ) from None
        if options.get("direct"):
            backend: Backend = KubernetesBackend(namespace=options.get("namespace"),
                                                 kubeconfig=options.get("kubeconfig"),
                                                 tracking=options.get("tracking"),
                                                 allow_unpinned=bool(options.get("allow_unpinned")))
            return backend
        from kubesweep.operator.client import INSTALL_HINT, SweepClient, crd_installed

        client = SweepClient(namespace=options.get("namespace"), kubeconfig=options.get("kubeconfig"),
                             allow_unpinned=bool(options.get("allow_unpinned")))
        if not crd_installed(client.client):
            raise BackendError(f"this cluster has no Sweep CRD (sweeps.kubesweep.io), so no kubesweep operator: "
                               f"{INSTALL_HINT}")
        return client
    raise BackendError(f"unknown backend {name!r}; expected one of {', '.join(BACKENDS)}")
