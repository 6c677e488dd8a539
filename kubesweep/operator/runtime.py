"""The operator's moving parts between kopf's events and `SweepController.step` (asyncio, kopf-free).

- `Supervisor`: one asyncio task per known Sweep. It runs a step (in a worker thread) whenever the Sweep, one
  of its Jobs or one of its pods changes (kopf's Sweep watch calls `notice`, the Job and pod caches `wake`), and
  at least every `resync` seconds while the sweep is not finished (a finished sweep costs nothing until
  something of it changes). Steps of one sweep never overlap; a burst of events becomes one step. A Job that
  is being deleted while it still carries the operator's finalizer, of a sweep with no task (its Sweep is gone),
  gets one step of its own (`orphaned`), which removes the finalizer, so nothing waits on a Sweep that no longer
  exists.
- `Runtime`: the Lease loop, the supervisor and the Job and pod caches (`ClusterCache`, whose events it turns
  into wake-ups). While this replica does not hold the Lease, steps are skipped; when it gains the Lease, it
  forgets what it remembered (`on_lead`) and every sweep is stepped at once, so a new leader picks up where
  the old one stopped, from the cluster's state alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubesweep.manifests import LABEL_SWEEP
from kubesweep.operator.cache import ClusterCache
from kubesweep.operator.leader import LeaseElector
from kubesweep.operator.store import FINALIZER_OUTCOME

log = logging.getLogger("kubesweep.operator")
Key = tuple[str, str]


class Supervisor:
    def __init__(self, step: Callable[[str, str], Any], *, is_leader: Callable[[], bool], resync: float = 30.0,
                 debounce: float = 0.2, workers: int = 4):
        self.step = step
        self.is_leader = is_leader
        self.resync = resync
        self.debounce = debounce
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sweep-step")
        self.tasks: dict[Key, asyncio.Task[None]] = {}
        self.wakeups: dict[Key, asyncio.Event] = {}
        self.orphans: set[Key] = set()  # sweeps without a task whose Jobs wait on our finalizer
        self._releasing: dict[Key, asyncio.Task[None]] = {}

    def notice(self, namespace: str, name: str, *, deleted: bool = False) -> None:
        """A Sweep was listed, added, changed or deleted."""
        key = (namespace, name)
        if deleted:
            task = self.tasks.pop(key, None)
            self.wakeups.pop(key, None)
            if task is not None:
                task.cancel()
            self.orphans.add(key)  # one more step: it removes the finalizers of the Jobs being collected
            self.release_orphans()
            return
        self.orphans.discard(key)
        if key not in self.tasks:
            self.wakeups[key] = asyncio.Event()
            self.tasks[key] = asyncio.create_task(self._drive(key), name=f"sweep-{namespace}-{name}")
        self.wakeups[key].set()

    def wake(self, namespace: str, name: str) -> None:
        """Something of the sweep's (a Job, a pod) changed."""
        event = self.wakeups.get((namespace, name))
        if event is not None:
            event.set()

    def wake_all(self) -> None:
        for event in self.wakeups.values():
            event.set()
        self.release_orphans()

    def orphaned(self, namespace: str, name: str) -> None:
        """A Job of this sweep is being deleted and still carries the operator's finalizer. A sweep with a task
        is woken (its step removes the finalizer once the outcome is recorded); for one without (its Sweep was
        deleted, or is not listed yet) one step runs now, and again on every Lease round of a leader until one
        step ran to its end."""
        key = (namespace, name)
        if key in self.tasks:
            self.wakeups[key].set()
            return
        self.orphans.add(key)
        self.release_orphans()

    def release_orphans(self) -> None:
        if not self.is_leader():
            return
        for key in list(self.orphans):
            if key not in self._releasing:
                self._releasing[key] = asyncio.create_task(self._release(key), name=f"release-{key[0]}-{key[1]}")

    async def _release(self, key: Key) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self.executor, self.step, *key)
            if self.is_leader():  # else the step did nothing: the next leader does it
                self.orphans.discard(key)
        except Exception as exc:
            log.warning("sweep %s/%s: releasing its Jobs failed (%s); retrying", *key, exc)
        finally:
            self._releasing.pop(key, None)

    async def _drive(self, key: Key) -> None:
        loop = asyncio.get_running_loop()
        event = self.wakeups[key]
        failures = 0
        while True:
            event.clear()
            resync: float | None = self.resync
            if self.is_leader():
                try:
                    status = await loop.run_in_executor(self.executor, self.step, *key)
                    failures = 0
                    if getattr(status, "done", False):  # finished: only a change (an event) brings a step
                        resync = None
                except Exception as exc:
                    failures += 1
                    log.warning("sweep %s/%s: step failed (%s); retrying", *key, exc, exc_info=failures == 1)
                    await asyncio.sleep(min(2.0 ** failures, 30.0))
                    event.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout=resync)
            await asyncio.sleep(self.debounce)

    async def stop(self) -> None:
        tasks = [*self.tasks.values(), *self._releasing.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.tasks.clear()
        self._releasing.clear()
        self.executor.shutdown(wait=False, cancel_futures=True)


class Runtime:
    def __init__(self, elector: LeaseElector, supervisor: Supervisor, *, cache: ClusterCache | None = None,
                 on_lead: Callable[[], None] | None = None):
        self.elector = elector
        self.supervisor = supervisor
        self.cache = cache
        self.on_lead = on_lead
        self._lease_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        loop = asyncio.get_running_loop()

        def from_cache(kind: str, event: str, obj: dict[str, Any]) -> None:  # a cache's thread → the loop
            loop.call_soon_threadsafe(self.changed, kind, event, obj)

        if self.cache is not None:
            self.cache.start(from_cache)
        self._lease_task = asyncio.create_task(self._lease_loop(), name="lease")

    def changed(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        """A cached Job or pod changed: wake its sweep. A Job being deleted while it still carries the
        operator's finalizer is `orphaned` (its sweep may be gone; that step removes the finalizer)."""
        meta = obj["metadata"]
        namespace, sweep = meta.get("namespace") or "", (meta.get("labels") or {}).get(LABEL_SWEEP)
        if not sweep:
            return
        held = meta.get("deletionTimestamp") and FINALIZER_OUTCOME in (meta.get("finalizers") or [])
        if kind == "Job" and held and event != "DELETED":
            self.supervisor.orphaned(namespace, sweep)
        elif event != "LISTED":  # a list wakes nothing: `notice` steps every sweep it finds
            self.supervisor.wake(namespace, sweep)

    async def _lease_loop(self) -> None:
        was_leader = False
        while True:
            try:
                leader = await asyncio.to_thread(self.elector.try_acquire_or_renew)
            except Exception as exc:  # never let the loop die: holding() lapses on its own
                log.warning("Lease round failed: %s", exc)
                leader = self.elector.holding()
            if leader and not was_leader:
                if self.on_lead is not None:
                    await asyncio.to_thread(self.on_lead)
                log.info("leading (Lease %s/%s, identity %s): driving %d sweep(s)", self.elector.namespace,
                         self.elector.name, self.elector.identity, len(self.supervisor.tasks))
                self.supervisor.wake_all()
            elif was_leader and not leader:
                log.warning("lost the Lease %s/%s; standing by", self.elector.namespace, self.elector.name)
            elif not leader and not was_leader:
                log.debug("standing by: the Lease is held by %s", self.elector.holder)
            if leader:
                self.supervisor.release_orphans()  # retries those whose step failed
            was_leader = leader
            await asyncio.sleep(self.elector.renew_every)

    async def stop(self) -> None:
        if self._lease_task is not None:
            self._lease_task.cancel()
            await asyncio.gather(self._lease_task, return_exceptions=True)
        await self.supervisor.stop()
        if self.cache is not None:
            self.cache.stop()
        await asyncio.to_thread(self.elector.release)
