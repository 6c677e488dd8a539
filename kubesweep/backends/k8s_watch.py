"""Watch-backed caches of Jobs and pods: what the Kubernetes backend and the operator read instead of LISTs.

An `Informer` lists one kind once (label-selected, in one namespace or in all), then follows a watch from that
list's resourceVersion, with bookmarks, and lists again only when the API server says the version is too old
(410 Gone) or the connection broke. It keeps each object trimmed to the fields kubesweep reads (`trim_job`,
`trim_pod`), indexed by the `kubesweep.io/sweep` label, and calls `on_event` for every change, from its own
thread. `Followers` keeps a pair of them (Jobs, pods) per sweep a process follows.

A cache lags the API server by one watch event at most: callers must not take a missing Job for proof that none
exists when that would start a trial twice. The backend only ever creates a trial's Job under the trial's own
name, so a stale read costs a refused create (409, taken as "exists"), never a second run.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kubesweep.backends.k8s_kueue import EVICTIONS_NOTED
from kubesweep.manifests import LABEL_SWEEP, LABEL_TRIAL, LABEL_WORKER
from kubesweep.wire.handover import HANDED_ANNOTATION, HANDOVER_ANNOTATION

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name)
OnEvent = Callable[[str, Obj], None]  # (event type: ADDED, MODIFIED, DELETED, LISTED; the trimmed object)

PAGE = 500  # objects per LIST page

_META = ("name", "namespace", "finalizers", "deletionTimestamp", "creationTimestamp", "uid")
_LABELS = (LABEL_SWEEP, LABEL_TRIAL, LABEL_WORKER)
_ANNOTATIONS = (EVICTIONS_NOTED, HANDOVER_ANNOTATION, HANDED_ANNOTATION)  # a warm pod: what it runs, was handed
_CONDITION = ("type", "status", "reason", "message", "lastTransitionTime")
_JOB_STATUS = ("startTime", "completionTime", "active")
_POD_CONDITIONS = ("PodScheduled", "DisruptionTarget")
_TERMINATED = ("exitCode", "reason", "message", "finishedAt")


def _meta(obj: Mapping[str, Any]) -> Obj:
    """Identity, finalizers, the sweep and trial labels, the Kueue evictions noted and the owners' UIDs: a cache
    holds every trial's Job and pod, so what is not read (the trial's config, other labels) is not kept."""
    meta = obj.get("metadata") or {}
    kept = {k: meta[k] for k in _META if k in meta}
    labels = meta.get("labels") or {}
    kept["labels"] = {k: labels[k] for k in _LABELS if k in labels}
    noted = {k: v for k, v in (meta.get("annotations") or {}).items() if k in _ANNOTATIONS}
    if noted:
        kept["annotations"] = noted
    if meta.get("ownerReferences"):
        kept["ownerReferences"] = [{"uid": ref.get("uid")} for ref in meta["ownerReferences"]]
    return kept


def _conditions(status: Mapping[str, Any]) -> list[Obj]:
    return [{k: c[k] for k in _CONDITION if k in c} for c in status.get("conditions") or []]


def trim_job(job: Mapping[str, Any]) -> Obj:
    """What kubesweep reads of a Job: identity, owners, finalizers, the deadline, whether it is suspended (a Job
    waiting for Kueue), and status."""
    spec = job.get("spec") or {}
    status = job.get("status") or {}
    kept = {k: status[k] for k in _JOB_STATUS if k in status}
    kept["conditions"] = _conditions(status)
    return {"metadata": _meta(job), "spec": {k: spec[k] for k in ("activeDeadlineSeconds", "suspend") if k in spec},
            "status": kept}


def trim_pod(pod: Mapping[str, Any]) -> Obj:
    """What kubesweep reads of a pod: identity, phase, the scheduling and disruption conditions, and how each
    container ended (exit code, reason, termination message)."""
    status = pod.get("status") or {}
    kept = {k: status[k] for k in ("phase", "reason", "message", "startTime") if k in status}
    kept["conditions"] = [c for c in _conditions(status) if c.get("type") in _POD_CONDITIONS]
    kept["containerStatuses"] = [{"name": c.get("name"), "state": _ended(c.get("state")),
                                  "lastState": _ended(c.get("lastState"))}
                                 for c in status.get("containerStatuses") or []]
    return {"metadata": _meta(pod), "status": kept}


def _ended(state: Mapping[str, Any] | None) -> Obj:
    term = (state or {}).get("terminated")
    return {"terminated": {k: term[k] for k in _TERMINATED if k in term}} if term else {}


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


class Followers:
    """Watch-backed caches of the sweeps a process follows (`sweep submit --wait`, a search's tuner): a pair of
    informers per followed sweep, selecting its label, started by `follow` and stopped by `unfollow`. As an object
    source it gives a sweep's pair once both listed, else None (the reader lists instead)."""

    def __init__(self, batch: Any, core: Any, namespace: str):
        self.batch = batch
        self.core = core
        self.namespace = namespace
        self._followed: dict[str, tuple[threading.Event, Informer, Informer]] = {}

    def follow(self, sweep: str) -> threading.Event:
        """Start the sweep's informers (once); returns the event each of their changes sets."""
        followed = self._followed.get(sweep)
        if followed is None:
            changed = threading.Event()
            selector = f"{LABEL_SWEEP}={sweep}"
            jobs = Informer(self.batch.list_namespaced_job, self.namespace, selector, trim=trim_job, changed=changed,
                            name="jobs").start()
            pods = Informer(self.core.list_namespaced_pod, self.namespace, selector, trim=trim_pod, changed=changed,
                            name="pods").start()
            followed = self._followed[sweep] = (changed, jobs, pods)
            jobs.wait_synced(10)
            pods.wait_synced(10)
        return followed[0]

    def informers(self, sweep: str) -> tuple[Informer, Informer] | None:
        followed = self._followed.get(sweep)
        if followed is not None and followed[1].synced.is_set() and followed[2].synced.is_set():
            return followed[1], followed[2]
        return None

    def unfollow(self, sweep: str) -> None:
        followed = self._followed.pop(sweep, None)
        if followed is not None:
            followed[1].stop()
            followed[2].stop()

    def close(self) -> None:
        for sweep in list(self._followed):
            self.unfollow(sweep)
