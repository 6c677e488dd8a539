"""`python -m kubesweep.operator`'s start: it waits for the API server to serve the Sweep resource before kopf looks
for what to serve (kopf looks once; a replica that started before the chart's CRD was served would serve nothing).
The discovery itself (`client.crd_installed`) runs against the real control plane in tests/operator/."""

from __future__ import annotations

import pytest

from kubesweep.backends.base import BackendError
from kubesweep.operator import __main__ as operator_main


def test_the_operator_waits_until_the_sweep_resource_is_served(monkeypatch: pytest.MonkeyPatch) -> None:
    replies: list[bool | Exception] = [BackendError("cannot reach the Kubernetes API"), False, True]
    asked: list[object] = []

    def served(api_client: object) -> bool:
        asked.append(api_client)
        reply = replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply

    monkeypatch.setattr(operator_main, "crd_installed", served)
    assert operator_main.wait_served("client", timeout=30, interval=0.01) is True
    assert asked == ["client"] * 3


def test_an_operator_that_never_sees_the_sweep_resource_gives_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(operator_main, "crd_installed", lambda api_client: False)
    assert operator_main.wait_served("client", timeout=0.05, interval=0.01) is False
