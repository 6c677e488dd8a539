"""The backend contract on the operator's client (`SweepClient`) with the operator running: the client writes only
the Sweep resource (and its cancel and resume requests), `python -m kubesweep.operator` runs the trials and
publishes the status and TrialSlices the client reads. So the suite checks the operator and its client together,
on the same test control plane and chart install as tests/operator/test_controller_cluster.py.

kwok runs no containers: each contract Sweep carries `kubesweep.io/test-pod-annotations` rules (the operator runs
with `--test-hooks`) that give every trial's pod the outcome the stand-in job would have produced
(`kwok_annotations`). A trial's starts are its Job UIDs, from a watch over every trial Job in the namespace.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kubesweep.operator.client import SweepClient
from kubesweep.operator.testhooks import ANNOTATION
from kubesweep.plan import Plan, plan
from kubesweep.sweep_spec import parse_sweep
from tests.backends.contract import BackendContract, Harness, kwok_annotations
from tests.operator.test_controller_cluster import (  # noqa: F401  (installed, operator: fixtures used by name)
    JOB_IMAGE,
    Installed,
    OperatorProcess,
    Recorder,
    installed,
    operator,
)

pytestmark = pytest.mark.cluster


@pytest.fixture(autouse=True)
def _run_by_the_operator(monkeypatch: pytest.MonkeyPatch) -> None:
    """Contract plans get the job image, small CPU requests (the install's plain kwok node runs them) and the
    test-hook rules for their trials' outcomes."""
    import tests.backends.contract as contract

    real = contract.make_plan

    def with_hooks(name: str, matrix: dict[str, Any], **spec: Any) -> Plan:
        spec.setdefault("resources", {})
        spec["resources"] = {"gpus_per_trial": 0, "retries": 0, "cpu": "100m", "memory": "64Mi", **spec["resources"]}
        doc = real(name, matrix, image=JOB_IMAGE, **spec).sweep.to_document()
        rules = [{"match": t.axes, "annotations": dict(kwok_annotations(t))}
                 for t in plan(parse_sweep(doc)).trials]
        doc["metadata"]["annotations"] = {ANNOTATION: json.dumps(rules)}
        return plan(parse_sweep(doc))

    monkeypatch.setattr(contract, "make_plan", with_hooks)


@pytest.fixture
def harness(installed: Installed, operator: OperatorProcess  # noqa: F811  (the imported fixtures)
            ) -> Iterator[Harness]:
    # named as parameters, not fetched inside: the fixtures a test names put it in the worker group of the chart
    # release (tests/conftest.py), so it never installs the release beside another module that does
    inst, op = installed, operator
    client = SweepClient(namespace=inst.namespace, kubeconfig=inst.cluster.kubeconfig, poll=0.2)
    recorder = Recorder(inst).__enter__()

    def starts(sweep: str, trial_id: str) -> int:
        time.sleep(0.5)  # a Job created just now reaches the recorder's watch
        return len(recorder.trials.get((sweep, trial_id), []))

    def gone(sweep: str, trial_id: str) -> bool:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if not client.batch.list_namespaced_job(inst.namespace,
                                                    label_selector=f"kubesweep.io/trial={trial_id}").items:
                return True
            time.sleep(0.2)
        return False

    marker = sys.modules["kubesweep_kwok_cluster"].POD_LOG_MARKER  # kwok serves one log file for every pod
    try:
        yield Harness(backend=client, starts=starts, timeout=120, log_marker=lambda trial: marker, gone=gone,
                      searches=False)
    finally:
        for name in client.list_sweeps():  # the next test starts from an empty namespace
            client.delete(name)
        recorder.__exit__()
        client.close()
        assert "Traceback" not in op.text(), op.text()[-3000:]


class TestOperatorClient(BackendContract):
    pass
