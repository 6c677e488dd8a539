"""Test hooks: pod annotations taken from the Sweep, honoured ONLY by an operator started with `--test-hooks`.

The test cluster's kwok Stages decide a pod's fate from its annotations (`kubesweep.io/test-outcome`,
`kubesweep.io/test-exit-code`, `kubesweep.io/test-duration`; docs/testing.md). A Sweep annotated

    kubesweep.io/test-pod-annotations: '{"kubesweep.io/test-outcome": "oom"}'

or, per cell, with a list of rules (the first rule whose `match` fits the trial's axes applies)

    kubesweep.io/test-pod-annotations: '[{"match": {"batch_size": 64}, "annotations": {...}}, {"annotations": {...}}]'

gets those annotations on its trials' pod templates. Only keys under `kubesweep.io/test-` are copied. A
production operator (no flag) ignores the annotation entirely.

`FaultPoints` (environment `KUBESWEEP_TEST_KILL_AT`, `KUBESWEEP_TEST_STOP_AT`, read at start, likewise only with
`--test-hooks`) makes the process SIGKILL or SIGSTOP itself at a named place, so the cluster tests can kill the
operator exactly between two writes.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections import Counter
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


# -- fault points: where a test makes the operator process die (SIGKILL) or freeze (SIGSTOP) ---------------

KILL_ENV = "KUBESWEEP_TEST_KILL_AT"
STOP_ENV = "KUBESWEEP_TEST_STOP_AT"
KILL_POINTS = {
    "job-apply": "right after a trial's Job was created",
    "outcome-recorded": "right after outcomes were recorded in the Sweep's status, before status is published "
                        "and before the finalizers of their Jobs are removed",
    "cancel-delete": "inside a cancel: right after a Job was deleted, before its finalizer is removed",
    "resume-delete": "inside a resume: right after a Job was deleted, before its finalizer is removed and "
                     "before the resume is recorded",
}
STOP_POINTS = {
    "write": "right after a write's leadership check passed, before the request is sent",
}


class FaultPoints:
    """Numbered places in the operator where a test process kills or stops itself.

    `KUBESWEEP_TEST_KILL_AT=job-apply:3` SIGKILLs the process when the 3rd Job apply has returned;
    `KUBESWEEP_TEST_STOP_AT=write:6` SIGSTOPs it just before the 6th write request (after that write's leadership
    check), so a test can let a standby take the Lease over and then SIGCONT it. Several points are separated by
    commas; counts are per process, over all sweeps. Read only by an operator started with `--test-hooks`; the
    default instance has no points and does nothing.
    """

    def __init__(self, kill_at: Mapping[str, int] | None = None, stop_at: Mapping[str, int] | None = None):
        self.kill_at = dict(kill_at or {})
        self.stop_at = dict(stop_at or {})
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> FaultPoints:
        """The points named by KUBESWEEP_TEST_KILL_AT / KUBESWEEP_TEST_STOP_AT; raises TestHookError naming a bad
        entry."""
        return cls(_parse_points(environ.get(KILL_ENV), KILL_POINTS, KILL_ENV),
                   _parse_points(environ.get(STOP_ENV), STOP_POINTS, STOP_ENV))

    def __bool__(self) -> bool:
        return bool(self.kill_at or self.stop_at)

    def reached(self, point: str) -> None:
        """Count one passage through `point`; kill or stop this process when a test asked for this one."""
        if not self:
            return
        with self._lock:
            self._counts[point] += 1
            n = self._counts[point]
        # pthread_kill to this very thread: it stops (or dies) before its next instruction. A signal sent to the
        # process (os.kill) may be taken by another thread, and this one runs on for a while meanwhile.
        if self.kill_at.get(point) == n:
            _announce(f"test hook: SIGKILL at {point} #{n} (pid {os.getpid()})")
            signal.pthread_kill(threading.get_ident(), signal.SIGKILL)
        if self.stop_at.get(point) == n:
            _announce(f"test hook: SIGSTOP at {point} #{n} (pid {os.getpid()})")
            signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
            _announce(f"test hook: continued after SIGSTOP at {point} #{n}")


def _parse_points(raw: str | None, known: Mapping[str, str], env: str) -> dict[str, int]:
    points: dict[str, int] = {}
    for item in (raw or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, _, count = item.partition(":")
        if name not in known:
            raise TestHookError(f"{env}: unknown point {name!r} (known: {', '.join(sorted(known))})")
        if not count.isdigit() or int(count) < 1:
            raise TestHookError(f"{env}: {item!r} is not POINT:N with N >= 1")
        points[name] = int(count)
    return points


def _announce(message: str) -> None:
    """Written straight to stderr (flushed): the process may be gone a moment later."""
    sys.stderr.write(f"{message}\n")
    sys.stderr.flush()
