"""Trial ids are a promise across processes and releases: "the same spec always gives the same ids" (docs/spec.md).

Resume, reruns and the operator's records find a trial by its id, so an id must not depend on the process that
made it (Python's `hash()` changes with PYTHONHASHSEED), and every axis that changes where or how a trial runs
(its GPUs, its nodes, its job settings, its repeat) must change its id.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from kubesweep.plan import plan, trial_id
from kubesweep.sweep_spec import parse_sweep
from kubesweep.wire.config import JobConfig

ROOT = Path(__file__).parents[1]

SPEC: dict[str, Any] = {
    "apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "ids"},
    "spec": {"matrix": {"gpu": ["h100-80gb"], "gpus_per_trial": [1, 2], "num_nodes": [1, 2], "batch_size": [8]},
             "repeats": 2},
}
# (id, gpus_per_trial, num_nodes, repeat) of SPEC's trials, computed once and written down: a change to how ids
# are made changes these, and breaks every resume of a sweep planned before it.
PINNED = [
    ("85a5e8a39a", 1, 1, 0),
    ("b910adcd6b", 1, 2, 0),
    ("0777577e69", 2, 1, 0),
    ("e5564387b3", 2, 2, 0),
    ("d64b5b9efb", 1, 1, 1),
    ("9ee3c624df", 1, 2, 1),
    ("cc44f08550", 2, 1, 1),
    ("5a82a680ef", 2, 2, 1),
]


def _ids() -> list[tuple[str, int, int, int]]:
    return [(t.id, t.gpus_per_trial, t.num_nodes, t.repeat) for t in plan(parse_sweep(SPEC)).trials]


def test_a_known_spec_gives_the_ids_written_down() -> None:
    assert _ids() == PINNED
    assert plan(parse_sweep(SPEC)).trials[0].name == "ids-h100-80gb-bs8-fp32-r0-85a5e8a3"


def test_the_ids_are_the_same_in_a_fresh_process_with_another_hash_seed() -> None:
    code = ("import json; from tests.test_plan_ids import _ids; print(json.dumps(_ids()))")
    seen = []
    for seed in ("1", "2"):
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": path}
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=120, check=True)
        seen.append([tuple(row) for row in json.loads(out.stdout)])
    assert seen[0] == seen[1] == _ids() == PINNED


def test_every_axis_of_where_and_how_a_trial_runs_changes_its_id() -> None:
    job = JobConfig()
    base = dict(sweep_name="s", gpu="h100-80gb", gpus_per_trial=1, num_nodes=1, job=job, repeat=0)
    variants: list[dict[str, Any]] = [
        base,
        {**base, "sweep_name": "t"},
        {**base, "gpu": "a100-80gb"},
        {**base, "gpu": None},
        {**base, "gpus_per_trial": 2},
        {**base, "num_nodes": 2},
        {**base, "job": job.model_copy(update={"batch_size": job.batch_size * 2})},
        {**base, "repeat": 1},
    ]
    ids = [trial_id(**v) for v in variants]
    assert len(set(ids)) == len(ids), ids
    assert all(len(i) == 10 and set(i) <= set("0123456789abcdef") for i in ids)


def test_a_sweep_over_gpus_per_trial_and_num_nodes_plans_distinct_trials() -> None:
    trials = plan(parse_sweep(SPEC)).trials
    assert len({t.id for t in trials}) == len({t.name for t in trials}) == len(trials) == 8
    assert {(t.gpus_per_trial, t.num_nodes) for t in trials} == {(1, 1), (1, 2), (2, 1), (2, 2)}
