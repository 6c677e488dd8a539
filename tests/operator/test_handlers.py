"""The kopf handlers (`kubesweep.operator.handlers`): registered for Sweeps, they set kopf's settings and only
tell the runtime what changed."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import kopf

from kubesweep.crd import GROUP, PLURAL
from kubesweep.operator import handlers


class Runtime:
    """What the handlers reach of `kubesweep.operator.runtime.Runtime`."""

    def __init__(self) -> None:
        self.started = self.stopped = False
        self.noticed: list[tuple[str, str, bool]] = []
        self.holding = False
        self.supervisor = SimpleNamespace(notice=lambda ns, name, deleted: self.noticed.append((ns, name, deleted)))
        self.elector = SimpleNamespace(holding=lambda: self.holding)

    def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True


def test_startup_settings_and_the_runtimes_start_and_stop() -> None:
    settings = kopf.OperatorSettings()
    runtime = Runtime()
    memo: Any = kopf.Memo(runtime=runtime)
    asyncio.run(handlers.configure(settings=settings, memo=memo))
    assert settings.scanning.disabled and settings.posting.level == logging.WARNING
    assert settings.watching.server_timeout == 300 and list(settings.networking.error_backoffs) == [1, 2, 5, 10]
    assert runtime.started and not runtime.stopped
    asyncio.run(handlers.shutdown(memo=memo))
    assert runtime.stopped


def test_a_sweep_event_is_noticed_and_the_probe_reports_the_lease() -> None:
    runtime = Runtime()
    memo: Any = kopf.Memo(runtime=runtime)
    asyncio.run(handlers.sweep_changed(event={"type": "MODIFIED"}, name="s", namespace="ns", memo=memo))
    asyncio.run(handlers.sweep_changed(event={"type": "DELETED"}, name="s", namespace=None, memo=memo))
    assert runtime.noticed == [("ns", "s", False), ("", "s", True)]
    assert handlers.leader(memo=memo) is False
    runtime.holding = True
    assert handlers.leader(memo=memo) is True


def test_the_handlers_are_registered_for_the_sweep_resource() -> None:
    registry = kopf.get_default_registry()
    (selector,) = {h.selector for h in registry._watching.get_all_handlers() if h.fn is handlers.sweep_changed}
    assert (selector.group, selector.any_name) == (GROUP, PLURAL)
