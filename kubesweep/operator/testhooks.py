"""Test hooks: pod annotations taken from the Sweep, honoured ONLY by an operator started with `--test-hooks`.

The test cluster's kwok Stages decide a pod's fate from its annotations (`kubesweep.io/test-outcome`,
`kubesweep.io/test-exit-code`, `kubesweep.io/test-duration`; docs/testing.md). A Sweep annotated

    kubesweep.io/test-pod-annotations: '{"kubesweep.io/test-outcome": "oom"}'

or, per cell, with a list of rules (the first rule whose `match` fits the trial's axes applies)

    kubesweep.io/test-pod-annotations: '[{"match": {"batch_size": 64}, "annotations": {...}}, {"annotations": {...}}]'

gets those annotations on its trials' pod templates. Only keys under `kubesweep.io/test-` are copied. A
production operator (no flag) ignores the annotation entirely.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kubesweep.plan import Trial

ANNOTATION = "kubesweep.io/test-pod-annotations"
PREFIX = "kubesweep.io/test-"


class TestHookError(ValueError):
    pass


def parse_rules(raw: str | None) -> list[tuple[dict[str, Any], dict[str, str]]]:
    if not raw:
        return []
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise TestHookError(f"{ANNOTATION} is not JSON: {exc}") from None
    rules = [{"annotations": data}] if isinstance(data, dict) else data
    out = []
    for rule in rules:
        if not isinstance(rule, dict) or not isinstance(rule.get("annotations"), dict):
            raise TestHookError(f"{ANNOTATION}: each rule is {{'match': {{...}}, 'annotations': {{...}}}}")
        notes = {str(k): str(v) for k, v in rule["annotations"].items()}
        bad = [k for k in notes if not k.startswith(PREFIX)]
        if bad:
            raise TestHookError(f"{ANNOTATION}: only {PREFIX}* keys are copied, not {', '.join(bad)}")
        out.append((dict(rule.get("match") or {}), notes))
    return out


def annotations_for(trial: Trial, rules: list[tuple[dict[str, Any], dict[str, str]]]) -> Mapping[str, str]:
    for match, notes in rules:
        if all(trial.axes.get(k) == v for k, v in match.items()):
            return notes
    return {}
