"""The sweep's runs view in the MLflow UI (kubesweep/tracking/view.py): what it sorts by and which columns it shows,
then what it lists for a sweep with a setting at chance accuracy (the fastest of all), an OOM and a GPU mismatch,
asked of the real `mlflow server` that `sweep ui` starts (tests/support/mlflow_fixtures.py `marked_sweep`) the way
the UI asks it: the experiment's shared view state gives the order, the runs search returns the rows. What a
person sees on that page is tests/tracking/test_view_browser.py."""

from __future__ import annotations

import json
import re
import urllib.request
from typing import Any

from kubesweep.tracking.view import (
    AXES,
    COLUMNS,
    CREATED,
    DESCRIPTION,
    DURATION,
    FIRST_SCREEN,
    KEY_METRICS,
    RUN_NAME,
    VIEW_KEY,
    VIEW_TAG,
    WIDTHS,
    runs_url,
    view_state,
)
from kubesweep.wire import tags
from kubesweep.wire.trial_metrics import RANK_METRIC
from tests.support.mlflow_fixtures import MARKS_TRIALS, MarkedSweep


def test_the_view_ranks_by_a_metric_runs_at_chance_lack_and_shows_the_flags() -> None:
    state = json.loads(view_state())
    assert state["orderByKey"] == f"metrics.`{RANK_METRIC}`" and state["orderByAsc"] is False
    # the trial's task and cell as the params the job logs (short headers; `compile` in the CLI's words), the key
    # metrics (step p50: an inference run's latency), the outcome, then the run's description (its flags)
    assert AXES == ("params.`task`", "params.`gpu`", "params.`batch_size`", "params.`precision`",
                    "params.`compile`")
    assert KEY_METRICS == ("metrics.`samples_per_s`", "metrics.`step_p50_ms`", "metrics.`accuracy`")
    assert (*AXES, *KEY_METRICS, "tags.`kubesweep.outcome`") == FIRST_SCREEN
    assert DESCRIPTION == "attributes.`Description`"
    assert state["selectedColumns"] == COLUMNS == [*FIRST_SCREEN, DESCRIPTION, *COLUMNS[len(FIRST_SCREEN) + 1:]]
    # in that order after the columns MLflow always shows, each with its width
    assert state["columnOrder"] == [RUN_NAME, CREATED, DURATION, *COLUMNS]
    assert state["columnWidths"] == {c: WIDTHS[c] for c in state["columnOrder"]}
    # at 1,400 px the table is 1,146 px wide beside MLflow's side bar, 73 of them the row checkboxes: every
    # column up to the outcome and a vertical scroll bar (15) fit
    first = state["columnOrder"][:state["columnOrder"].index(FIRST_SCREEN[-1]) + 1]
    assert 73 + sum(WIDTHS[c] for c in first) + 15 <= 1146
    # grouped by the trial's task: every group open, the parent run's (no task) too
    assert state["groupBy"] == {"aggregateFunction": "average",
                                "groupByKeys": [{"mode": "param", "groupByData": "task"}]}
    assert state["groupsExpanded"] == {"param.task": True}


def api(base: str, path: str, body: dict[str, Any] | None = None) -> Any:
    request = urllib.request.Request(f"{base}/api/2.0/mlflow/{path}", method="POST" if body else "GET",
                                     headers={"Content-Type": "application/json"},
                                     data=json.dumps(body).encode() if body else None)
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def test_the_runs_view_lists_runs_that_learned_first_and_flags_the_rest(marked_sweep: MarkedSweep) -> None:
    ms = marked_sweep
    found = re.fullmatch(rf"{re.escape(ms.base)}/kubesweep/runs/(\d+)", ms.runs_view)  # `sweep ui`'s link
    assert found, ms.runs_view
    assert runs_url(ms.base, found[1]) == (f"{ms.base}/#/experiments/{found[1]}/runs"
                                           f"?workflowType=machine_learning&viewStateShareKey={VIEW_KEY}")
    experiment = api(ms.base, f"experiments/get?experiment_id={found[1]}")["experiment"]
    state = json.loads({t["key"]: t["value"] for t in experiment["tags"]}[VIEW_TAG])
    order = f"{state['orderByKey']} {'ASC' if state['orderByAsc'] else 'DESC'}"  # as the UI sends it
    runs = api(ms.base, "runs/search", {"experiment_ids": [found[1]], "order_by": [order], "max_results": 100})["runs"]
    children = [r for r in runs if any(t["key"] == "mlflow.parentRunId" for t in r["data"]["tags"])]
    assert len(children) == MARKS_TRIALS

    def metrics(run: dict[str, Any]) -> dict[str, float]:
        return {m["key"]: m["value"] for m in run["data"].get("metrics", [])}

    def run_tags(run: dict[str, Any]) -> dict[str, str]:
        return {t["key"]: t["value"] for t in run["data"]["tags"]}

    flags = [run_tags(r).get(tags.FLAGS) for r in children]
    assert flags == [run_tags(r).get(tags.NOTE) for r in children]  # what the Description column shows
    chance = [i for i, f in enumerate(flags) if f == "chance accuracy (0.51)"]
    learned = [i for i, r in enumerate(children) if RANK_METRIC in metrics(r)]
    assert len(chance) == 2 and len(learned) == 8
    # the runs at chance are the fastest of the sweep, and listed after every run that learned
    fastest = max(children, key=lambda r: metrics(r).get("samples_per_s", 0.0))
    assert children.index(fastest) in chance
    assert max(learned) < min(chance) and learned == list(range(8))
    assert metrics(children[0])["samples_per_s"] == max(metrics(children[i])["samples_per_s"] for i in learned)
    assert all(metrics(children[i])["accuracy"] == 0.509 for i in chance)  # their numbers stay in the row
    outcomes = {run_tags(r)["kubesweep.outcome"]: run_tags(r).get(tags.FLAGS) for r in children if not metrics(r)}
    assert outcomes == {"oom": "OOM", "gpu_mismatch": "GPU mismatch"}
    assert {flags[i] for i in learned} == {""}
