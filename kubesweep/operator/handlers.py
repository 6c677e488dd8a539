"""kopf handlers: thin, they only tell the supervisor what changed (see `runtime` and `controller`).

kopf here is the watch machinery: list+watch of Sweeps, and of the Jobs and pods labelled `kubesweep.io/sweep`,
with reconnects and backoff. The handlers are event handlers only, so kopf writes nothing to Sweeps (no
finalizers, no progress annotations): deleting a Sweep never waits for the operator, and the Jobs go with it
through their ownerReferences (a Job whose trial had no recorded outcome waits for the operator to remove its
`kubesweep.io/outcome` finalizer: `job_changed` asks for that even when the Sweep is gone).
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from kubesweep.crd import GROUP, PLURAL, VERSION
from kubesweep.manifests import LABEL_SWEEP
from kubesweep.operator.store import FINALIZER_OUTCOME


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


@kopf.on.event("batch", "v1", "jobs", labels={LABEL_SWEEP: kopf.PRESENT})
async def job_changed(event: kopf.RawEvent, labels: kopf.Labels, meta: kopf.Meta, namespace: str | None, memo: Any,
                      **_: Any) -> None:
    held = meta.get("deletionTimestamp") and FINALIZER_OUTCOME in (meta.get("finalizers") or [])
    if held and event["type"] != "DELETED":  # being deleted, waiting on us (its Sweep may be gone)
        memo.runtime.supervisor.orphaned(namespace or "", labels[LABEL_SWEEP])
    else:
        memo.runtime.supervisor.wake(namespace or "", labels[LABEL_SWEEP])


@kopf.on.event("v1", "pods", labels={LABEL_SWEEP: kopf.PRESENT})
async def pod_changed(labels: kopf.Labels, namespace: str | None, memo: Any, **_: Any) -> None:
    memo.runtime.supervisor.wake(namespace or "", labels[LABEL_SWEEP])


@kopf.on.probe(id="leader")
def leader(memo: kopf.Memo, **_: Any) -> bool:
    """Reported by the liveness endpoint: whether this replica holds the Lease (standbys are healthy too)."""
    return bool(memo.runtime.elector.holding())
