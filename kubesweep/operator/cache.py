"""The operator's watch caches: one Job informer and one pod informer per watched namespace (or one of each
for all namespaces), selecting `kubesweep.io/sweep`. A step reads its sweep's Jobs and pods here instead of
listing them; every change wakes the sweep it belongs to (`on_event`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from kubesweep.backends.k8s_watch import Informer, Obj, trim_job, trim_pod
from kubesweep.manifests import LABEL_SWEEP

SYNC_TIMEOUT = 60.0  # how long a step waits for the first list of a namespace's caches
OnEvent = Callable[[str, str, Obj], None]  # (kind: "Job" | "Pod", event type, trimmed object)


class ClusterCache:
    def __init__(self, api_client: Any, namespaces: list[str] | None):
        """`namespaces`: those watched; None: all namespaces (one informer per kind)."""
        import kubernetes

        self.batch = kubernetes.client.BatchV1Api(api_client)
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.namespaces = namespaces
        self._informers: dict[str | None, tuple[Informer, Informer]] = {}
        self._lock = threading.Lock()
        self._changes: dict[tuple[str, str], int] = {}  # (namespace, sweep) -> events seen of its Jobs and pods
        self.on_event: OnEvent | None = None

    def start(self, on_event: OnEvent | None = None) -> None:
        self.on_event = on_event
        for namespace in self.namespaces if self.namespaces is not None else [None]:
            self._informers[namespace] = self._make(namespace)

    def _make(self, namespace: str | None) -> tuple[Informer, Informer]:
        list_jobs: Callable[..., Any] = self.batch.list_namespaced_job
        list_pods: Callable[..., Any] = self.core.list_namespaced_pod
        if namespace is None:
            list_jobs, list_pods = self.batch.list_job_for_all_namespaces, self.core.list_pod_for_all_namespaces
        jobs = Informer(list_jobs, namespace, LABEL_SWEEP, trim=trim_job, name="jobs",
                        on_event=lambda kind, obj: self._event("Job", kind, obj))
        pods = Informer(list_pods, namespace, LABEL_SWEEP, trim=trim_pod, name="pods",
                        on_event=lambda kind, obj: self._event("Pod", kind, obj))
        return jobs.start(), pods.start()

    def _event(self, kind: str, event: str, obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        sweep = (meta.get("labels") or {}).get(LABEL_SWEEP)
        if sweep:
            key = (meta.get("namespace") or "", sweep)
            with self._lock:
                self._changes[key] = self._changes.get(key, 0) + 1
        if self.on_event is not None:
            self.on_event(kind, event, obj)

    def changes(self, namespace: str, sweep: str) -> int:
        """How many changes of the sweep's Jobs and pods the caches have seen (a step that finds the count as
        it was knows that none of them changed since)."""
        with self._lock:
            return self._changes.get((namespace, sweep), 0)

    def synced(self, namespace: str) -> tuple[Informer, Informer] | None:
        """The Job and pod caches holding `namespace`, once both listed (waits up to SYNC_TIMEOUT); None when
        the namespace is not watched or the caches did not sync (the caller lists instead)."""
        pair = self._informers.get(None) or self._informers.get(namespace)
        if pair is None:
            return None
        if not (pair[0].wait_synced(SYNC_TIMEOUT) and pair[1].wait_synced(SYNC_TIMEOUT)):
            return None
        return pair

    def stop(self) -> None:
        for jobs, pods in self._informers.values():
            jobs.stop()
            pods.stop()

    def size(self) -> int:
        return sum(len(j) + len(p) for j, p in self._informers.values())


class CacheSource:
    """The caches as a reconciler's object source (`k8s_reconcile.ObjectSource`) for one namespace: both
    informers once synced, else None (the reconciler lists)."""

    def __init__(self, cache: ClusterCache, namespace: str):
        self.cache = cache
        self.namespace = namespace

    def informers(self, sweep: str) -> tuple[Informer, Informer] | None:
        return self.cache.synced(self.namespace)
