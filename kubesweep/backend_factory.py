"""Backends by name, each made from a typed configuration: the one place the CLI, the session and the tuner get
theirs from. It stands above both `backends` and `operator` because a kubernetes sweep on a cluster with the Sweep
CRD is the operator's client.

A backend is registered once, in `REGISTRY`: its name, and its configuration (a `BackendConfig`: the options it
is made from, typed; the class it makes, whose declared capabilities a caller may read before making one; and how
it is made, importing its SDK only there, so a missing extra breaks nothing else). The CLI's and the tuner's
choices of backend, and every question about one, read from there: adding a backend is its module, its contract
test (`tests/backends/contract.py`) and one registration.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Self

from kubesweep.backends.base import Backend, BackendError
from kubesweep.backends.local import LocalBackend
from kubesweep.wire.env import TrackingEnv


@dataclass(frozen=True)
class Flags:
    """A command's backend flags (the `sweep` options of the same names), whatever the backend: each
    configuration takes the ones it reads."""

    home: Path | None = None  # local: the state directory (default ~/.kubesweep, $KUBESWEEP_HOME)
    namespace: str | None = None  # kubernetes
    kubeconfig: Path | None = None  # kubernetes
    direct: bool = False  # kubernetes: drive the Jobs from this process, not through the operator
    any_gpu: bool = False  # local: run trials on whatever GPU is here
    parallel: int = 1  # local: CPU-only trials at once
    allow_unpinned: bool = False  # kubernetes: accept a job image by tag, not pinned by digest


class BackendConfig(ABC):
    """A backend's configuration: what it is made from, the class it makes, and how."""

    name: ClassVar[str]
    # making the backend reaches a cluster (a sweep it may not take is said by the cluster, before anything of it
    # is opened; `sweep validate` makes none unless asked); the job runs in its pods, from a built image
    asks_cluster: ClassVar[bool]

    @classmethod
    @abstractmethod
    def from_flags(cls, flags: Flags) -> Self:
        """The configuration a command's flags give."""

    @abstractmethod
    def kind(self) -> type[Backend]:
        """The class `make` returns: its declared capabilities, read without making one (nothing is reached)."""

    @abstractmethod
    def make(self, tracking: TrackingEnv | None = None) -> Backend:
        """The backend; `tracking`: the MLflow env of the trials it starts (None: not tracked)."""


@dataclass(frozen=True)
class LocalConfig(BackendConfig):
    """The local backend (`backends.local`): trials as processes of this machine."""

    name: ClassVar[str] = LocalBackend.name
    asks_cluster: ClassVar[bool] = False
    home: Path | None = None
    any_gpu: bool = False
    cpu_slots: int = 1

    @classmethod
    def from_flags(cls, flags: Flags) -> Self:
        return cls(home=flags.home, any_gpu=flags.any_gpu, cpu_slots=flags.parallel)

    def kind(self) -> type[Backend]:
        return LocalBackend

    def make(self, tracking: TrackingEnv | None = None) -> Backend:
        return LocalBackend(self.home, any_gpu=self.any_gpu, cpu_slots=self.cpu_slots, tracking=tracking)


@dataclass(frozen=True)
class KubernetesConfig(BackendConfig):
    """Kubernetes: on a cluster with the Sweep CRD, the Sweep resource is the interface and the operator drives the
    trials (`operator.client.SweepClient`); with `direct`, this process drives the Jobs itself and keeps the state
    in ConfigMaps (`backends.kubernetes.KubernetesBackend`)."""

    name: ClassVar[str] = "kubernetes"
    asks_cluster: ClassVar[bool] = True
    namespace: str | None = None
    kubeconfig: Path | None = None
    direct: bool = False
    allow_unpinned: bool = False

    @classmethod
    def from_flags(cls, flags: Flags) -> Self:
        return cls(namespace=flags.namespace, kubeconfig=flags.kubeconfig, direct=flags.direct,
                   allow_unpinned=flags.allow_unpinned)

    def kind(self) -> type[Backend]:
        try:
            if self.direct:
                from kubesweep.backends.kubernetes import KubernetesBackend

                return KubernetesBackend
            from kubesweep.operator.client import SweepClient

            return SweepClient
        except ImportError as exc:
            raise BackendError(
                f"the kubernetes backend needs the k8s extra ({exc.name} is missing): pip install 'kubesweep[k8s]'"
            ) from None

    def make(self, tracking: TrackingEnv | None = None) -> Backend:
        self.kind()  # the k8s extra is installed, or a BackendError says so
        if self.direct:
            from kubesweep.backends.kubernetes import KubernetesBackend

            return KubernetesBackend(namespace=self.namespace, kubeconfig=self.kubeconfig, tracking=tracking,
                                     allow_unpinned=self.allow_unpinned)
        from kubesweep.operator.client import INSTALL_HINT, SweepClient, crd_installed

        client = SweepClient(namespace=self.namespace, kubeconfig=self.kubeconfig,
                             allow_unpinned=self.allow_unpinned)
        if not crd_installed(client.client):
            raise BackendError(f"this cluster has no Sweep CRD (sweeps.kubesweep.io), so no kubesweep operator: "
                               f"{INSTALL_HINT}")
        return client


# The backends, by name: one registration each.
REGISTRY: dict[str, type[BackendConfig]] = {config.name: config for config in (LocalConfig, KubernetesConfig)}
BACKENDS = tuple(REGISTRY)
DEFAULT_BACKEND = LocalConfig.name  # where `sweep` commands run trials unless told


def configure(name: str, flags: Flags | None = None) -> BackendConfig:
    """The configuration of the backend `name` that a command's flags give (`BackendError` for an unknown name)."""
    registered = REGISTRY.get(name)
    if registered is None:
        raise BackendError(f"unknown backend {name!r}; expected one of {', '.join(BACKENDS)}")
    return registered.from_flags(flags or Flags())


def make_backend(config: BackendConfig, tracking: TrackingEnv | None = None) -> Backend:
    """The backend a configuration describes; its SDK is imported only here."""
    return config.make(tracking)
