"""The sweep's experiment as the MLflow UI shows it: a training experiment whose runs view answers "which
setting is best" at a glance.

Every experiment kubesweep creates or logs a sweep into carries two tags:
- `mlflow.experimentKind = custom_model_development`: the UI treats it as model training (runs, charts,
  artifacts), not as a GenAI app (traces, judges);
- `mlflow.sharedViewState.kubesweep`: a view of the runs table that the UI opens from `runs_url`: every run,
  sorted by `wire.trial_metrics.RANK_METRIC` (samples/s of the runs that learned, best first; runs whose accuracy stayed
  at chance have no such metric and come after them, with the OOM, mismatched and failed runs; sorted, the UI
  lists child runs by themselves, not folded under the parent), with the comparison metrics
  (`wire.trial_metrics.COMPARISON_METRICS`, logged by each trial under those names), the trial's flags (`OOM`, `GPU
  mismatch`, `chance accuracy (0.51)`) as the run's description (the UI's Description column, left of the
  metrics, so it is seen without scrolling), the outcome and the cell's GPU, batch size, precision and compile
  setting as columns.
"""

from __future__ import annotations

import json

from kubesweep.wire.trial_metrics import RANK_METRIC

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
VIEW_KEY = "kubesweep"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"
SORT_METRIC = RANK_METRIC
DESCRIPTION = "attributes.`Description`"  # the run's description (tag mlflow.note.content): its flags
COLUMNS = [
    DESCRIPTION,
    *(f"metrics.`{m}`" for m in ("samples_per_s", "accuracy", "peak_mem_gib", "cost_per_epoch", "step_p50_ms")),
    *(f"tags.`kubesweep.{t}`" for t in ("outcome", "gpu", "batch_size", "precision", "compile")),
]


def view_state() -> str:
    return json.dumps({"orderByKey": f"metrics.`{SORT_METRIC}`", "orderByAsc": False, "selectedColumns": COLUMNS},
                      separators=(",", ":"))


def experiment_tags() -> dict[str, str]:
    return {EXPERIMENT_KIND_TAG: EXPERIMENT_KIND, VIEW_TAG: view_state()}


def runs_url(base: str, experiment_id: str) -> str:
    """The sweep's runs view on the MLflow server at `base` (the model-training side of the UI)."""
    return (f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"
            f"&viewStateShareKey={VIEW_KEY}")
