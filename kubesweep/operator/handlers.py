"""kopf handlers: thin, they only tell the supervisor what changed (see `runtime` and `controller`).

kopf here is the watch machinery for Sweeps: list+watch with reconnects and backoff. Jobs and pods are watched
by the operator's own caches (`cache.ClusterCache`, started by the runtime), which keep them trimmed and indexed
by sweep, so a step reads them without a request. The handlers are event handlers only, so kopf writes nothing
to Sweeps (no finalizers, no progress annotations): deleting a Sweep never waits for the operator, and the Jobs
go with it through their ownerReferences (a Job whose trial had no recorded outcome waits for the operator to
remove its `kubesweep.io/outcome` finalizer: the runtime asks for that even when the Sweep is gone).
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from kubesweep.crd import GROUP, PLURAL, VERSION


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.scanning.disabled = True  # no cluster-wide list of namespaces or CRDs: least privilege
    settings.posting.level = logging.WARNING  # handler problems become Warning events on the Sweep
    settings.watching.server_timeout = 300  # watches are re-established every 5 min
    settings.networking.error_backoffs = [1, 2, 5, 10]
    if not logging.getLogger().isEnabledFor(logging.DEBUG):  # one line per watch event is noise
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    memo.runtime.start()


@kopf.on.cleanup()
async def shutdown(memo: kopf.Memo, **_: Any) -> None:
    await memo.runtime.stop()


@kopf.on.event(GROUP, VERSION, PLURAL)
async def sweep_changed(event: kopf.RawEvent, name: str, namespace: str | None, memo: Any, **_: Any) -> None:
    memo.runtime.supervisor.notice(namespace or "", name, deleted=event["type"] == "DELETED")


@kopf.on.probe(id="leader")
def leader(memo: kopf.Memo, **_: Any) -> bool:
    """Reported by the liveness endpoint: whether this replica holds the Lease (standbys are healthy too)."""
    return bool(memo.runtime.elector.holding())
