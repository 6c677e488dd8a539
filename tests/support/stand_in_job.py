"""A stand-in for `python -m kubesweep.jobs`, for backend tests that exercise orchestration, not training.

It honours the job's contract — `--config trial.json --output-dir DIR`, a `results.json` valid against the schema
with the outcome, the documented exit codes — and decides its outcome from the trial's settings, so a test can
drive every path quickly:
  job.batch_size >= 256       -> outcome oom, exit 3
  job.learning_rate == 0.123  -> crashes with exit 1 and no results file
  job.learning_rate == 0.456  -> fails with exit 1: a CUDA assert, with terminal escape sequences, as its error
  job.learning_rate == 0.111  -> exits 0 with a results file of 200,000 nested brackets (a parser that recurses
                                 dies on it)
  job.learning_rate == 0.222  -> exits 0 with a whole results file whose outcome is "bogus"
  job.learning_rate == 0.333  -> succeeds, having printed HOSTILE_LOG (clipboard write, link, bidi override)
  job.learning_rate == 0.321  -> samples/s 2% above, then 2% below the batch's rate (repeats 0 and 1), then at it
  job.learning_rate == 0.789  -> samples/s 20% above or below the batch's rate, by the repeat's parity
  job.learning_rate == 0.654  -> the same, and host-bound: its GPU busy 20% of its measured steps (gpu_monitor)
  job.max_steps (if set)      -> sleeps max_steps / 10 seconds first (0.2 s by default), printing the job's step
                                 line (kubesweep.wire.progress) every 5 steps
Each start appends a line to DIR/../../starts.log so tests can count how often a trial ran.
With KUBESWEEP_TEST_STAND_IN_LINGER_S=N it stays N seconds after writing its results file, as the real job does
while it sends them to MLflow.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the checkout's package
from kubesweep.wire.progress import step_line

LINGER_ENV = "KUBESWEEP_TEST_STAND_IN_LINGER_S"
# what a trial may write: Rich markup look-alikes and escape sequences (colour, window title), to be shown as text
CUDA_ASSERT = ("[/pytorch/aten/src/ATen/native/cuda/Loss.cu:12] \x1b[31mAssertion `t >= 0` failed\x1b[0m"
               "\x1b]0;title\x07 [bold]")

# what a trial may print to its log: an OSC 52 clipboard write, an OSC 8 link, BEL, a C1 CSI, a right-to-left
# override (U+202E: `exe.txt` reads as `txt.exe`) and a zero-width space
HOSTILE_LOG = ("\x1b]52;c;cm0gLXJmIH4K\x07 \x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\ bell\x07 "
               "\x9b2J \u202etxt.exe\u202c zero\u200bwidth")
BOMB = "[" * 200_000 + "]" * 200_000


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--output-dir", required=True)
    args = parser.parse_args()
    trial = json.loads(Path(args.config).read_text())
    out = Path(args.output_dir)
    job = trial["job"]
    with (out.parent.parent / "starts.log").open("a") as log:
        log.write(f"{trial['trial_id']} {os.getpid()} {os.environ.get('CUDA_VISIBLE_DEVICES', '')}\n")
    print(f"stand-in job for {trial['name']}", flush=True)
    steps = job.get("max_steps") or 2
    for step in range(1, steps + 1):
        time.sleep(0.1)
        if step % 5 == 0 or step == steps:
            print(step_line(step, steps, step / steps, 0.69, 2e-5, 800.0 if step > 5 else None), flush=True)
    if job.get("learning_rate") == 0.123:
        print("simulated crash", file=sys.stderr, flush=True)
        return 1
    outcome, code = ("oom", 3) if job["batch_size"] >= 256 else ("succeeded", 0)
    if job.get("learning_rate") == 0.456:
        outcome, code = "failed", 1
    now = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    results: dict[str, object] = {  # a whole results file of the schema (kubesweep.wire.results), little measured
        "schema": "kubesweep.io/results/v1",
        "outcome": outcome,
        "exit_code": code,
        "trial": {key: trial.get(key) for key in ("sweep", "trial_id", "name", "repeat", "gpu", "gpu_product",
                                                  "gpus_per_trial")},
        "config": job,
        "device": "cpu",
        "started_at": now,
        "finished_at": now,
        "timings": {"total_s": 0.2},
    }
    if code == 1:
        results["error"] = {"type": "RuntimeError", "message": CUDA_ASSERT}
        print(CUDA_ASSERT, file=sys.stderr, flush=True)
    if outcome == "succeeded":
        rate = 100.0 * job["batch_size"]
        repeat = int(trial.get("repeat") or 0)
        if job.get("learning_rate") == 0.321:
            rate *= {0: 1.02, 1: 0.98}.get(repeat, 1.0)
        if job.get("learning_rate") in (0.789, 0.654):
            rate *= 1.2 if repeat % 2 == 0 else 0.8
        if job.get("learning_rate") == 0.654:
            results["gpu_monitor"] = {"interval_s": 0.25, "devices": [{
                "index": 0, "samples": 12, "utilization_mean_pct": 20.0, "utilization_max_pct": 40.0,
                "power_mean_w": None, "power_max_w": None, "temperature_max_c": None, "memory_used_max_bytes": 0,
                "process_memory_max_bytes": None, "measured_samples": 8, "utilization_measured_pct": 20.0}]}
        results["train"] = {"steps": 2, "target_steps": 2, "epochs_completed": 1.0, "samples": 2 * job["batch_size"],
                            "warmup_steps": 0, "warmup_time_s": 0.0, "measured_steps": 2,
                            "measured_samples": 2 * job["batch_size"], "measured_time_s": 0.02,
                            "samples_per_s": rate, "tokens_per_s": None, "padded_tokens_per_s": None,
                            "step_time_s": None, "final_loss": None}
    if job.get("learning_rate") == 0.333:
        print(HOSTILE_LOG, flush=True)
    if job.get("learning_rate") == 0.111:
        (out / "results.json").write_text(BOMB)
    elif job.get("learning_rate") == 0.222:
        (out / "results.json").write_text(json.dumps({**results, "outcome": "bogus"}))
    else:
        (out / "results.json").write_text(json.dumps(results))
    time.sleep(float(os.environ.get(LINGER_ENV) or 0))
    print(f"done: {outcome}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
