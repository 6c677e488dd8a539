"""The small Sweep the operator's unit tests reconcile: one GPU type, batch 8 and 16, a digest-pinned image."""

from __future__ import annotations

from kubesweep.plan import Plan, plan
from kubesweep.sweep_spec import Sweep, parse_sweep

DIGEST = "registry.example/job@sha256:" + "0" * 64


def two_trial_plan() -> tuple[Sweep, Plan]:
    sweep = parse_sweep({"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "s"},
                         "spec": {"image": DIGEST, "matrix": {"gpu": ["l4"], "batch_size": [8, 16]}}})
    return sweep, plan(sweep)
