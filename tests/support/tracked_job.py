"""A stand-in for `python -m kubesweep.jobs` that logs to MLflow exactly as the job does, without training.

It honours the job's contract (`--config trial.json --output-dir DIR`, exit codes) and writes a `results.json`
validated by the job's own schema (`kubesweep.wire.results.Results`), with numbers that are a fixed function of
the trial's settings and repeat, so tests can check aggregation, the report and the MLflow layout quickly. It
logs through the same API as the job's runner: `kubesweep.jobs.mlflow_logger.MlflowTrialLogger.from_env`
(child run under $KUBESWEEP_PARENT_RUN_ID, found again by trial id), with the job's tags, params, metric names
and artifacts. Outcomes:
  job.batch_size >= 256   -> oom (exit 3)
  gpu == "v100-32gb"      -> gpu_mismatch (exit 4): as if the node had another GPU
  job.learning_rate >= 1e-3 -> succeeded, its dev accuracy at chance (0.509): training that diverged
Each start appends a line to DIR/../../starts.log.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import sys
from pathlib import Path
from typing import Any

from kubesweep.gpus import load_catalog
from kubesweep.jobs.mlflow_logger import MlflowTrialLogger
from kubesweep.wire.config import TrialConfig
from kubesweep.wire.flags import comparison_tags
from kubesweep.wire.results import Results
from kubesweep.wire.trial_metrics import comparison_metrics, gpu_type, physics
from kubesweep.wire.trial_run import run_name, run_params, run_tags

GIB = 1024**3
BASE_RATE = {"h100-80gb": 1000.0, "l40s": 600.0, "a100-40gb": 700.0, "v100-32gb": 300.0, None: 40.0}


def _rate(trial: TrialConfig) -> float:
    job = trial.job
    rate = BASE_RATE.get(trial.gpu, 500.0) * (job.batch_size / 16) ** 0.3
    rate *= 1.8 if job.precision in ("fp16", "bf16") else 1.0
    rate *= 1.25 if job.compile else 1.0
    rate *= 1.8 if trial.gpus_per_trial > 1 else 1.0
    return rate * (1.0 + 0.04 * (trial.repeat - 0.5))  # repeats differ by 4%


def _pct(value: float) -> dict[str, Any]:
    return {"p50": value, "p90": value * 1.05, "p99": value * 1.1, "mean": value * 1.01, "n": 50}


def build(trial: TrialConfig, now: str) -> tuple[dict[str, Any], int]:
    job = trial.job
    world = max(1, trial.gpus_per_trial)
    base: dict[str, Any] = {
        "trial": {"sweep": trial.sweep, "trial_id": trial.trial_id, "name": trial.name, "repeat": trial.repeat,
                  "gpu": trial.gpu, "gpu_product": trial.gpu_product, "gpus_per_trial": trial.gpus_per_trial},
        "config": job.model_dump(mode="json"), "device": "cuda" if trial.gpu else "cpu", "world_size": world,
        "started_at": now, "finished_at": now,
    }
    if trial.gpu == "v100-32gb":
        return {**base, "outcome": "gpu_mismatch", "exit_code": 4, "timings": {"total_s": 1.0},
                "error": {"type": "GpuMismatch", "message": "asked for Tesla-V100-SXM2-32GB, found NVIDIA-L4"}}, 4
    if job.batch_size >= 256:
        return {**base, "outcome": "oom", "exit_code": 3, "timings": {"total_s": 1.0},
                "error": {"type": "OutOfMemoryError", "message": "CUDA out of memory (stand-in)"}}, 3
    rate = _rate(trial)
    memory = {"torch_peak_allocated_bytes": int((0.5 + 0.05 * job.batch_size)
                                                * (0.6 if job.precision in ("fp16", "bf16") else 1.0) * GIB)}
    if job.task == "inference":
        latency = job.batch_size / rate
        return {**base, "outcome": "succeeded", "exit_code": 0, "memory": memory,
                "timings": {"total_s": 5.0, "eval_s": latency * 100, "compile_warmup_s": 0.5},
                "inference": {"batch_size": job.batch_size, "seq_len": job.max_seq_len, "dtype": job.precision,
                              "compiled": job.compile, "warmup_batches": 10, "warmup_s": 0.5, "batches": 100,
                              "latency_s": _pct(latency), "samples_per_s": rate, "tokens_per_s": rate * 30,
                              "padded_tokens_per_s": rate * job.max_seq_len}}, 0
    rows = job.train_samples or 1000
    per_step = job.batch_size * world
    steps_per_epoch = math.ceil(rows / per_step)
    epochs = int(job.epochs)
    steps = steps_per_epoch * epochs
    step_s = per_step / rate
    warm_steps = 3 + (2 if job.compile else 0)
    warm_s = warm_steps * step_s + (5.0 if job.compile else 0.0)
    train_s = warm_s + (steps - warm_steps) * step_s
    evals = []
    for epoch in range(1, epochs + 1):
        accuracy = 0.80 + 0.06 * epoch - 0.005 * math.log2(job.batch_size / 16)
        if job.learning_rate >= 1e-3:
            accuracy = 0.509
        evals.append({"epoch": float(epoch), "step": steps_per_epoch * epoch, "accuracy": accuracy,
                      "loss": 1.0 - accuracy, "samples": 200})
    train = {"steps": steps, "target_steps": steps, "epochs_completed": float(epochs), "samples": steps * per_step,
             "warmup_steps": warm_steps, "warmup_time_s": warm_s, "measured_steps": steps - warm_steps,
             "measured_samples": (steps - warm_steps) * per_step, "measured_time_s": (steps - warm_steps) * step_s,
             "samples_per_s": rate, "tokens_per_s": rate * 30, "padded_tokens_per_s": rate * job.max_seq_len,
             "step_time_s": _pct(step_s), "final_loss": 0.3}
    return {**base, "outcome": "succeeded", "exit_code": 0, "memory": memory, "train": train, "eval": evals,
            "final_accuracy": evals[-1]["accuracy"], "data": {"train_rows": rows, "eval_rows": 200},
            "timings": {"total_s": train_s + 2.0, "train_s": train_s, "eval_s": 0.5 * epochs,
                        "compile_warmup_s": warm_s}}, 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--output-dir", required=True)
    args = parser.parse_args()
    trial = TrialConfig.model_validate_json(Path(args.config).read_text())
    out = Path(args.output_dir)
    with (out.parent.parent / "starts.log").open("a") as log:
        log.write(f"{trial.trial_id} {os.getpid()}\n")
    tracker = MlflowTrialLogger.from_env(trial.trial_id, run_name(trial), run_tags(trial),
                                         out / "mlflow-spool.jsonl")
    params = run_params(trial)
    tracker.log_params(params)
    data, code = build(trial, dt.datetime.now(dt.UTC).isoformat())
    results = Results.model_validate(data)
    results.write(out / "results.json")
    if results.train is not None:
        for point in results.eval:
            tracker.log_metrics({"eval/accuracy": point.accuracy, "eval/loss": point.loss}, point.step)
        tracker.log_metrics({"result/samples_per_s": results.train.samples_per_s or 0.0,
                             "result/final_accuracy": results.final_accuracy or 0.0}, results.train.steps)
    if results.inference is not None:
        tracker.log_metrics({"inference/samples_per_s": results.inference.samples_per_s,
                             "inference/latency_p50_s": results.inference.latency_s.p50}, 0)
    tracker.log_artifact(out / "results.json")
    catalog = load_catalog()
    gpu = gpu_type(trial.gpu, results, catalog.by_product)
    price, peak = catalog.price_and_peak(gpu, trial.job.precision)
    metrics = comparison_metrics(results, gpus=trial.gpus_per_trial, price_per_hour=price, peak_tflops=peak)
    tracker.set_tags({"kubesweep.outcome": results.outcome.value, **comparison_tags(results, physics(metrics))})
    tracker.log_metrics(metrics, results.train.steps if results.train else 0)
    tracker.close("FINISHED" if code == 0 else "FAILED")
    print(f"stand-in: {results.outcome.value}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
