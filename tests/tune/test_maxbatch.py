"""The max-batch search on the local backend with the real BERT job (tiny, random-init, CPU), whose OOM
threshold is set by the job's test hook `KUBESWEEP_TEST_OOM_ABOVE_BATCH` (the first forward raises
torch.OutOfMemoryError above it: outcome oom, exit code 3, the same path a real CUDA OOM takes)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from kubesweep.backends.local import LocalBackend
from kubesweep.wire.outcomes import Outcome
from tests.support.mlflow_fixtures import MlflowServer
from tests.tune.support import SST2, search_env, sweep_argv, tiny_job

NAME = "max-batch"
SPEC = f"""\
apiVersion: kubesweep.io/v1alpha1
kind: Sweep
metadata: {{name: {NAME}}}
spec:
  job: {tiny_job(log_every=1)}
  resources: {{gpus_per_trial: 0, retries: 0}}
  concurrency: {{max_parallel: 2}}
  search: {{strategy: max_batch, low: 8, high: 64, step: 8, probes: 2, max_steps: 2}}
"""


@pytest.mark.slow
def test_max_batch_bisects_to_the_oom_threshold(mlflow_server: MlflowServer, tmp_path: Path) -> None:
    assert SST2.is_dir(), f"SST-2 TSVs expected at {SST2}"
    (tmp_path / "mb.yaml").write_text(SPEC)
    home = tmp_path / "home"
    env = search_env(mlflow_server, home, KUBESWEEP_TEST_OOM_ABOVE_BATCH="40")
    # detached: the search goes on in the background, its output in the sweep's driver.log
    proc = subprocess.run(sweep_argv("submit", "mb.yaml", "--parallel", "2", "--detach"), env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    assert "max_batch search detached" in proc.stdout
    driver_log = home / "sweeps" / NAME / "driver.log"
    summary_file = home / "sweeps" / NAME / "search" / "max_batch.json"
    deadline = time.monotonic() + 600
    while not (summary_file.exists() and "max batch size cpu fp32: 40" in driver_log.read_text()):
        assert time.monotonic() < deadline, driver_log.read_text()[-5000:]
        time.sleep(1)
    while _submitting(home):  # the detached driver prints its summary last, then exits
        assert time.monotonic() < deadline, "the detached search did not exit"
        time.sleep(0.2)

    status = LocalBackend(home, devices=[]).status(NAME)
    tried = {t.axes["batch_size"]: t.outcome for t in status.trials}
    # candidates 8..64 by 8, two probes a round: (24, 48), then (32, 40)
    assert tried == {24: Outcome.SUCCEEDED, 48: Outcome.OOM, 32: Outcome.SUCCEEDED, 40: Outcome.SUCCEEDED}
    summary = json.loads(summary_file.read_text())
    (cell,) = summary["cells"]
    assert (cell["max_batch"], cell["smallest_oom"], cell["probes"]) == (40, 48, 4)

    # run again: every probe's outcome is known, nothing runs twice
    again = subprocess.run(sweep_argv("submit", "mb.yaml"), env=env, cwd=tmp_path, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr
    assert all(t.attempts == 1 for t in LocalBackend(home, devices=[]).status(NAME).trials)

    results = subprocess.run(sweep_argv("results", NAME), env=env, cwd=tmp_path, capture_output=True, text=True,
                             timeout=120)
    assert results.returncode == 0, results.stderr
    assert "max batch size cpu fp32: 40" in results.stdout


def _submitting(home: Path) -> bool:
    """A `sweep submit --home HOME` process is alive."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"submit" in argv and str(home).encode() in argv:
            return True
    return False


