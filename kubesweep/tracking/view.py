"""The sweep's experiment as the MLflow UI shows it: a training experiment whose runs view answers "which
setting is best" at a glance, on a laptop (a 1,400 px wide window, MLflow's side bar open).

Every experiment kubesweep creates or logs a sweep into carries two tags:
- `mlflow.experimentKind = custom_model_development`: the UI treats it as model training (runs, charts,
  artifacts), not as a GenAI app (traces, judges);
- `mlflow.sharedViewState.kubesweep`: the runs table that `runs_url` opens (`&viewStateShareKey=kubesweep`, or
  through `sweep ui`'s page, below):
  every run, grouped by the trial's task (`GROUP_BY`: the param `task`; a group per task, each open, the parent
  run in MLflow's group of runs without the param), so runs of different tasks are never ranked against each
  other, and within each group sorted by `wire.trial_metrics.RANK_METRIC` (samples/s of the runs that learned,
  best first; runs whose accuracy stayed at chance have no such metric and come after them, with the OOM,
  mismatched and failed runs); these columns, in this order and width: the run's name, its Created column
  (narrowed to the run's status icon) and Duration; the trial's task and cell as the run's params `task`, `gpu`,
  `batch_size`, `precision`, `compile` (the job logs them, `compile` in the CLI's words: wire/trial_run.py; short
  headers, where the tags `kubesweep.gpu`... would head their columns with the whole tag name); the key metrics
  `samples_per_s`, `step_p50_ms` (an inference run's latency), `accuracy` (`wire.metrics`: `Metric.logged`,
  logged by each trial under those names); the tag `kubesweep.outcome`; then, to scroll to, the run's description
  (the UI's Description column: a trial's flags `OOM`, `GPU mismatch`, `chance accuracy (0.51)`, the parent's
  answer), `peak_mem_gib` and `cost_per_epoch`. `FIRST_SCREEN` lists what must be seen without scrolling
  sideways at that width.

How MLflow's runs page (3.17.2; read from its bundle, `mlflow/server/js/build/static/js/`) gets its state:
- the sort, filter and time range ("search facets": `searchFilter, orderByKey, orderByAsc, startTime,
  lifecycleFilter, modelVersionFilter, datasetsFilter`) come from the URL, else from the browser's saved view;
- everything else ("UI state": `selectedColumns, columnOrder, columnWidths, runsExpanded, runsPinned, runsHidden,
  runsVisibilityMap, runsHiddenMode, compareRunCharts, compareRunSections, viewMaximized, runListHidden,
  isAccordionReordered, groupBy, groupsExpanded, autoRefreshEnabled, useGroupedValuesInCharts, hideEmptyCharts,
  globalLineChartConfig, chartsSearchFilter`) comes from the browser's localStorage (the user's saved view of
  those experiments), or from a shared view: the experiment tag `mlflow.sharedViewState.<key>` that the URL
  names with `viewStateShareKey=<key>` (raw JSON, or 3.15's named saved-view envelope; `runsExpanded`,
  `runsPinned`, `runsHidden`, `runsVisibilityMap` and `autoRefreshEnabled` are not taken from it). With neither,
  the table shows Run Name, Created, Dataset, Duration, Source and Models, and no metric, param or tag column:
  no URL parameter, tag or param selects columns otherwise, and a link to MLflow's page cannot write localStorage;
- so the link names the shared view, and MLflow shows its "You're viewing a shared view" banner above the table
  whenever it applies one (saved views included; no parameter turns it off). Its x hides it for the visit,
  "Override saved view" makes the view the browser's own. Narrowing Created and Duration is as far as the
  state reaches: Run Name, Created and Duration cannot be hidden, only sized (`columnWidths` sizes the columns
  `columnOrder` lists, by their grid ids: `runDateAndNestInfo` is Created, `duration` Duration);
- MLflow's assistant panel (a quarter of the window) opens by itself once per browser profile when the page's
  host is localhost, 127.0.0.1 or ::1 (localStorage `mlflow.assistant.fab.autoOpenedOnFirstLoad`), whatever the
  server says; closed once, it stays closed (`mlflow.assistant.panelOpen`). A link to MLflow's page
  cannot keep it shut; docs/tracking.md says how to close it. `FIRST_SCREEN` fits with it closed.

The server `sweep ui` starts is MLflow's own app plus one page (kubesweep/tracking/ui_app.py, `--app-name
kubesweep`), and its links (`runs_url(..., served=True)`) go through it: `/kubesweep/runs/<id>` writes the view
into that browser's saved view of the experiment and marks the assistant as already opened once, then goes on to
the plain runs URL with the sort in it (`plain_runs_fragment`): no shared view, so no banner, and no panel. What
it writes, in MLflow's formats (3.17.2):
- `STORAGE_KEY`: `MLflowLocalStorage-1.1-ExperimentPage-["<id>"]-ReactComponentState` (LocalStorageUtils,
  version 1.1, scope `ExperimentPage-` + the JSON of the sorted id list), a JSON object: the search facets and the
  UI state side by side (what "Override saved view" writes); the page reads the facets from it only when the URL
  has none, and the URL's win (missing ones at their defaults), so the sort goes in both (`saved_state`);
- `ASSISTANT_FLAG`: `mlflow.assistant.fab.autoOpenedOnFirstLoad_v1` (useLocalStorage: `<key>_v<version>`, the
  value as JSON), `true`.
Remote servers (the cluster's, any `--tracking-uri`) keep the shared-view link: banner and all.
"""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

from kubesweep.wire import tags
from kubesweep.wire.trial_metrics import RANK_METRIC

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
VIEW_KEY = "kubesweep"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"
SORT_METRIC = RANK_METRIC

# the runs table's column ids (AG Grid's: Created and Duration have no canonical key)
RUN_NAME = "attributes.`Run Name`"
CREATED = "runDateAndNestInfo"
DURATION = "duration"
DESCRIPTION = "attributes.`Description`"  # the run's description (tag mlflow.note.content): its flags
TASK = "params.`task`"
AXES = (TASK, *(f"params.`{p}`" for p in ("gpu", "batch_size", "precision", "compile")))
# samples/s; the step time's p50, which is an inference run's latency (one batch); accuracy
KEY_METRICS = tuple(f"metrics.`{m}`" for m in ("samples_per_s", "step_p50_ms", "accuracy"))
OUTCOME = f"tags.`{tags.OUTCOME}`"
MORE = tuple(f"metrics.`{m}`" for m in ("peak_mem_gib", "cost_per_epoch"))  # right of the description
FIRST_SCREEN = (*AXES, *KEY_METRICS, OUTCOME)  # seen at 1,400 px without scrolling sideways
COLUMNS = [*FIRST_SCREEN, DESCRIPTION, *MORE]  # the columns the view adds to name, Created and Duration

# Widths in px, for MLflow's 12-13 px type: each header and value whole (the longest values: `inference`,
# `h100-80gb`, `gpu_mismatch`; the longest header `kubesweep.outcome`), the name cut after its leading axes (the
# columns say them too; the whole name is the link's), Created down to the run's status icon. At 1,400 px the
# table is 1,146 px wide beside MLflow's side bar: the row checkboxes (73), these up to the outcome (1,038) and a
# vertical scroll bar (15) fit. The description comes next: a trial's flags (`chance accuracy (0.51)`, `OOM`) a
# scroll away, the parent's answer in full on the parent run's page.
WIDTHS = {
    RUN_NAME: 130, CREATED: 40, DURATION: 62,
    TASK: 80, "params.`gpu`": 84, "params.`batch_size`": 80, "params.`precision`": 74, "params.`compile`": 68,
    "metrics.`samples_per_s`": 106, "metrics.`step_p50_ms`": 100, "metrics.`accuracy`": 74, OUTCOME: 140,
    DESCRIPTION: 320,
    "metrics.`peak_mem_gib`": 104, "metrics.`cost_per_epoch`": 112,
}
ORDER = [RUN_NAME, CREATED, DURATION, *COLUMNS]
# the runs grouped by the trial's task, each group ranked on its own: a batch-8 inference run is never listed
# above a fine-tuning run for its samples/s. Every group open, the runs without a task (the sweep's parent run)
# too; each group's row shows its runs' mean (MLflow's default).
GROUP_BY = {"aggregateFunction": "average", "groupByKeys": [{"mode": "param", "groupByData": "task"}]}
GROUPS_EXPANDED = {"param.task": True}  # MLflow's id of the group of runs without the key: closed by default


def view_state() -> str:
    return json.dumps({"orderByKey": f"metrics.`{SORT_METRIC}`", "orderByAsc": False, "selectedColumns": COLUMNS,
                       "columnOrder": ORDER, "columnWidths": {c: WIDTHS[c] for c in ORDER}, "groupBy": GROUP_BY,
                       "groupsExpanded": GROUPS_EXPANDED},
                      separators=(",", ":"))


def experiment_tags() -> dict[str, str]:
    return {EXPERIMENT_KIND_TAG: EXPERIMENT_KIND, VIEW_TAG: view_state()}


SERVED_PATH = "/kubesweep/runs/"  # + the experiment id: the page `sweep ui`'s server adds (ui_app.py)
ASSISTANT_FLAG = "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1"
FACETS = ("orderByKey", "orderByAsc")  # of the view's keys, those the URL carries ("search facets")


def storage_key(experiment_id: str) -> str:
    """The browser's saved view of the experiment `experiment_id` (localStorage)."""
    return f"MLflowLocalStorage-1.1-ExperimentPage-{json.dumps([experiment_id])}-ReactComponentState"


def saved_state() -> dict[str, Any]:
    """The view as the browser's saved view holds it: the same keys as `view_state()`, facets and UI state."""
    state: dict[str, Any] = json.loads(view_state())
    return state


def plain_runs_fragment(experiment_id: str) -> str:
    """`#/experiments/<id>/runs?...`: the runs view with the view's sort in the URL and no shared view."""
    state = saved_state()
    query = urllib.parse.urlencode({"workflowType": "machine_learning",
                                    **{k: json.dumps(state[k]) if isinstance(state[k], bool) else state[k]
                                       for k in FACETS}})
    return f"#/experiments/{experiment_id}/runs?{query}"


def runs_url(base: str, experiment_id: str, *, served: bool = False) -> str:
    """The sweep's runs view on the MLflow server at `base` (the model-training side of the UI). `served`: the
    server `sweep ui` started (kubesweep's app), whose page opens it as the browser's own view (no banner, no
    assistant panel); otherwise the shared view the experiment's tag holds."""
    if served:
        return f"{base.rstrip('/')}{SERVED_PATH}{experiment_id}"
    return (f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"
            f"&viewStateShareKey={VIEW_KEY}")
