"""Watch-backed caches of Jobs and pods: what the Kubernetes backend and the operator read instead of LISTs.

An `Informer` lists one kind once (label-selected, in one namespace or in all), then follows a watch from that
list's resourceVersion, with bookmarks, and lists again only when the API server says the version is too old
(410 Gone) or the connection broke. It keeps each object trimmed to the fields kubesweep reads (`trim_job`,
`trim_pod`), indexed by the `kubesweep.io/sweep` label, and calls `on_event` for every change, from its own
thread.

A cache lags the API server by one watch event at most: callers must not take a missing Job for proof that none
exists when that would start a trial twice. The backend only ever creates a trial's Job under the trial's own
name, so a stale read costs a refused create (409, taken as "exists"), never a second run.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kubesweep.manifests import LABEL_SWEEP

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name)
OnEvent = Callable[[str, Obj], None]  # (event type: ADDED, MODIFIED, DELETED, LISTED; the trimmed object)

PAGE = 500  # objects per LIST page

_META = ("name", "namespace", "labels", "annotations", "ownerReferences", "finalizers", "deletionTimestamp",
         "creationTimestamp", "uid")


def _meta(obj: Mapping[str, Any]) -> Obj:
    meta = obj.get("metadata") or {}
    return {k: meta[k] for k in _META if k in meta}


def trim_job(job: Mapping[str, Any]) -> Obj:
    """What kubesweep reads of a Job: identity, labels, owners, finalizers, the deadline, and status."""
    spec = job.get("spec") or {}
    return {"metadata": _meta(job), "spec": {k: spec[k] for k in ("activeDeadlineSeconds",) if k in spec},
            "status": job.get("status") or {}}


def trim_pod(pod: Mapping[str, Any]) -> Obj:
    """What kubesweep reads of a pod: identity, labels, phase, conditions, container states and messages."""
    status = pod.get("status") or {}
    kept = {k: status[k] for k in ("phase", "reason", "message", "startTime") if k in status}
    kept["conditions"] = [{k: c[k] for k in ("type", "status", "reason", "message") if k in c}
                          for c in status.get("conditions") or []]
    kept["containerStatuses"] = [{k: c[k] for k in ("name", "state", "lastState") if k in c}
                                 for c in status.get("containerStatuses") or []]
    return {"metadata": _meta(pod), "status": kept}


class Informer:
    """A label-selected list+watch of one kind, in `namespace` or (None) in all namespaces."""

    def __init__(self, list_fn: Callable[..., Any], namespace: str | None, selector: str, *,
                 trim: Callable[[Mapping[str, Any]], Obj] = dict, on_event: OnEvent | None = None,
                 changed: threading.Event | None = None, name: str = "informer"):
        self.list_fn = list_fn
        self.namespace = namespace
        self.selector = selector
        self.trim = trim
        self.on_event = on_event
        self.changed = changed or threading.Event()  # set on every event (a follower waits on it)
        self.synced = threading.Event()
        self.stopped = threading.Event()
        self.error: Exception | None = None
        self._objects: dict[Key, Obj] = {}
        self._by_sweep: dict[Key, dict[str, Obj]] = {}  # (namespace, sweep) -> name -> object
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"{name}-{selector}")

    def start(self) -> Informer:
        self._thread.start()
        return self

    # -- reading -----------------------------------------------------------------------------------------

    def of_sweep(self, namespace: str, sweep: str) -> list[Obj]:
        """The cached objects labelled with this sweep (shared, not copies: do not modify them)."""
        with self._lock:
            return list(self._by_sweep.get((namespace, sweep), {}).values())

    def wait_synced(self, timeout: float) -> bool:
        return self.synced.wait(timeout)

    def __len__(self) -> int:
        with self._lock:
            return len(self._objects)

    # -- the loop ----------------------------------------------------------------------------------------

    def _args(self) -> tuple[Any, ...]:
        return (self.namespace,) if self.namespace is not None else ()

    def _put(self, obj: Obj) -> None:
        meta = obj["metadata"]
        key = (meta.get("namespace") or self.namespace or "", meta["name"])
        self._drop(key)
        self._objects[key] = obj
        sweep = (meta.get("labels") or {}).get(LABEL_SWEEP)
        if sweep:
            self._by_sweep.setdefault((key[0], sweep), {})[key[1]] = obj

    def _drop(self, key: Key) -> None:
        old = self._objects.pop(key, None)
        if old is not None:
            sweep = (old["metadata"].get("labels") or {}).get(LABEL_SWEEP)
            members = self._by_sweep.get((key[0], sweep or ""))
            if members is not None:
                members.pop(key[1], None)
                if not members:
                    del self._by_sweep[(key[0], sweep or "")]

    def _list(self) -> str:
        """List in pages of `PAGE` (one consistent snapshot), trimming each page as it comes: memory stays
        bounded by the trimmed objects, not by one response holding every object whole."""
        items: list[Obj] = []
        token = ""
        while True:
            resp = self.list_fn(*self._args(), label_selector=self.selector, limit=PAGE, _continue=token or None,
                                _preload_content=False)
            body = json.loads(resp.data)
            items.extend(self.trim(o) for o in body.get("items", []))
            del resp
            token = body["metadata"].get("continue") or ""
            if not token:
                break
            del body
        with self._lock:
            self._objects.clear()
            self._by_sweep.clear()
            for obj in items:
                self._put(obj)
        self.synced.set()
        self.changed.set()
        if self.on_event is not None:
            for obj in items:
                self.on_event("LISTED", obj)
        return str(body["metadata"]["resourceVersion"])

    def _run(self) -> None:
        version = ""
        while not self.stopped.is_set():
            try:
                if not version:
                    version = self._list()
                resp = self.list_fn(*self._args(), label_selector=self.selector, watch=True,
                                    resource_version=version, allow_watch_bookmarks=True, timeout_seconds=60,
                                    _preload_content=False, _request_timeout=75)
                for line in resp:
                    if self.stopped.is_set():
                        break
                    version = self._apply(json.loads(line), version)
                    if not version:
                        break
                resp.release_conn()
                self.error = None
            except Exception as exc:  # the API server went away or the watch broke: back off, list again
                self.error = exc
                version = ""
                self.stopped.wait(1.0)

    def _apply(self, event: Mapping[str, Any], version: str) -> str:
        """Apply one watch event; returns the resourceVersion to resume from ("" to list again)."""
        kind, raw = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            return ""  # 410 Gone (too old) or another error: list again
        version = str(raw.get("metadata", {}).get("resourceVersion") or version)
        if kind == "BOOKMARK":
            return version
        obj = self.trim(raw)
        meta = obj["metadata"]
        with self._lock:
            if kind == "DELETED":
                self._drop((meta.get("namespace") or self.namespace or "", meta["name"]))
            else:
                self._put(obj)
        self.changed.set()
        if self.on_event is not None:
            self.on_event(str(kind), obj)
        return version

    def stop(self) -> None:
        self.stopped.set()
