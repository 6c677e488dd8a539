"""One trial from start to results: identity check, engine, measurements, outcome, files, tracking.

Files written to OUTPUT_DIR (rank 0): `trial.json` (the resolved trial), `environment.json`, `results.json`
(see kubesweep/wire/results.py), `loss_curve.png`, `export/` and, when enabled, `checkpoints/`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubesweep.gpus import load_catalog
from kubesweep.jobs import data as data_mod
from kubesweep.jobs import distributed, env, export, inference, plot, probe, runtime
from kubesweep.jobs import model as model_mod
from kubesweep.jobs.command import LAUNCHED_ENV, QUEUE_TAGS, QUEUED_AT_ENV
from kubesweep.jobs.data import TokenizedSplit
from kubesweep.jobs.energy import EnergyMeter, energy_metrics
from kubesweep.jobs.errors import UsageError
from kubesweep.jobs.gpu_lease import GpuLease
from kubesweep.jobs.metrics import NvmlSampler, host_peak_rss_bytes, system_metrics, torch_memory_peaks
from kubesweep.jobs.mlflow_logger import MlflowTrialLogger, NullLogger
from kubesweep.jobs.train import FineTuner, TrainOutcome
from kubesweep.wire import tags, trial_run
from kubesweep.wire.config import JobConfig, TrialConfig
from kubesweep.wire.flags import comparison_tags
from kubesweep.wire.metrics import INFERENCE_KEYS, TRAINING_KEYS, job_summary
from kubesweep.wire.outcomes import ExitCode, Outcome
from kubesweep.wire.results import Results
from kubesweep.wire.trial_metrics import comparison_metrics, gpu_type, physics

log = logging.getLogger(__name__)

# A pod being stopped (eviction, drain, deletion) gets SIGTERM and a grace period (30 s by default) before SIGKILL:
# the trial ends its MLflow logging within this many seconds, spooling what it could not send.
TERMINATE_FLUSH_S = 10.0


class Terminated(BaseException):
    """SIGTERM: the trial is being stopped from outside (its pod evicted or deleted, the process killed)."""


@dataclass
class Inputs:
    """A trial's model (in host memory until the engine moves it), tokenizer and data."""

    loaded: model_mod.LoadedModel
    train_data: TokenizedSplit | None
    eval_data: TokenizedSplit
    load_s: float


def process_start_time() -> float:
    """When the trial's process started: a forked trial's client's start (kubesweep/jobs/forkserver.py)."""
    launched = os.environ.get(LAUNCHED_ENV)
    if launched:
        with contextlib.suppress(ValueError):
            return float(launched)
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:
        return time.time()


def _float_env(name: str) -> float | None:
    try:
        return float(os.environ[name])
    except (KeyError, ValueError):
        return None


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat()


class TrialRun:
    def __init__(self, trial: TrialConfig, output_dir: Path) -> None:
        self.trial = trial
        self.cfg: JobConfig = trial.job
        self.output_dir = output_dir
        self.started_at = now_iso()
        self.t_process = process_start_time()
        self.timings: dict[str, float | None] = {"startup_s": time.time() - self.t_process}
        queued_at = _float_env(QUEUED_AT_ENV)
        if queued_at is not None:  # a queued trial: its Job's creation to this process's start
            self.timings["queue_wait_s"] = max(0.0, self.t_process - queued_at)
        self.fields: dict[str, Any] = {}
        self.notes: list[str] = []
        self.artifacts: dict[str, str] = {}
        self.outcome = Outcome.SUCCEEDED
        self.exit_code: int = ExitCode.OK
        self.error: dict[str, str] | None = None
        self.terminated = False  # SIGTERM ended the trial
        self.environment: dict[str, Any] = {}
        self.lease = GpuLease(None)

    # --------------------------------------------------------------------------------------------- driver

    def state_dir(self) -> Path:
        """Where the trial keeps what its next attempt needs (checkpoints, the MLflow spool and step record):
        the checkpoint directory when there is one (on Kubernetes, on the checkpoint claim), else the output
        directory."""
        return Path(self.cfg.checkpoint_dir).expanduser() if self.cfg.checkpoint_dir else self.output_dir

    def run(self) -> int:
        main = threading.current_thread() is threading.main_thread()  # only there can a handler be set
        previous = signal.signal(signal.SIGTERM, _raise_terminated) if main else None
        try:
            return self._run()
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)

    def _run(self) -> int:
        self.dist = dist = distributed.identity()  # ranks from the environment; the device comes with the lease
        cfg = self.cfg
        if dist.is_main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            self.state_dir().mkdir(parents=True, exist_ok=True)
            self._write_json("trial.json", self.trial.model_dump(mode="json", by_alias=True), "trial")
        self.lease = GpuLease.from_env(dist.local_rank)
        tracker = self._tracker() if dist.is_main else NullLogger()
        self.tracker = tracker
        self._system_step = tracker.prior_step("system/")  # an earlier attempt's GPU samples come first
        sampler: NvmlSampler | None = None
        inputs: Inputs | None = None
        model: Any = None
        try:
            # the GPU's identity from NVML, and then the host-only preparation: another trial may hold the GPU
            # PyTorch's threads within the pod's CPU limit from the start (tokenization and the model build too),
            # so the environment records the threads the trial ran with
            runtime.limit_threads()
            mismatch = env.check_gpu(self.trial.gpu_product, env.gpu_names(env.local_devices()))
            # Under a GPU lease another trial may be measuring on this machine: prepare on a few cores.
            with runtime.few_threads() if self.lease.path is not None else contextlib.nullcontext():
                inputs = None if mismatch else self._prepare()
            self.timings["gpu_wait_s"] = self.lease.acquire(f"{self.trial.sweep}/{self.trial.name}")
            self.dist = dist = distributed.init()
            devices = env.local_devices()
            self.environment = env.capture(devices)
            if dist.is_main:
                self._write_json("environment.json", self.environment, "environment")
                gpu = ", ".join(g["name"] for g in self.environment["gpus"]) or "none (CPU)"
                print(
                    f"trial {self.trial.trial_id} ({self.trial.name}): {cfg.task} {cfg.engine} model {cfg.model} "
                    f"batch {cfg.batch_size} {cfg.precision} compile {cfg.compile} padding {cfg.padding}; "
                    f"gpu {gpu}; world {dist.world_size}",
                    flush=True,
                )
            sampler = NvmlSampler(devices, cfg.nvml_interval_s, on_sample=self._on_gpu_sample)
            if mismatch or inputs is None:
                self._end(Outcome.GPU_MISMATCH, ExitCode.GPU_MISMATCH, "GpuMismatch", mismatch or "")
            else:
                sampler.start()
                runtime.check_attention_kernels(cfg, cuda=dist.cuda)
                model = self._execute(inputs)
                self.fields["compile_cache"] = runtime.compile_cache_stats()
        except UsageError as err:
            self._end(Outcome.FAILED, ExitCode.USAGE, "UsageError", str(err))
        except BaseException as err:
            self._failed(err)
        finally:
            if sampler is not None:
                sampler.stop()
        self.fields["gpu_monitor"] = (sampler.summary(*self._measured_window()) if sampler is not None
                                      and sampler.samples else None)
        memory = {**torch_memory_peaks(),
                  "nvml_peak_used_bytes": sampler.peak_used_bytes() if sampler is not None else None}
        memory["host_peak_rss_bytes"] = host_peak_rss_bytes()
        self.fields["memory"] = memory
        # after the memory peaks are read: the probe's allocations are not the trial's
        if self.outcome == Outcome.SUCCEEDED and dist.is_main:
            self._probe()
        keep = model is not None and dist.is_main and bool(cfg.export) and self.outcome == Outcome.SUCCEEDED
        model = runtime.free_device_memory(model, keep=keep)
        self.lease.release()
        self.timings["gpu_held_s"] = self.lease.held_s
        self.fields["gpu_lease"] = self.lease.record()
        if not self.environment:  # failed before the device was set up
            self.environment = env.capture(env.local_devices() if self.lease.path is None else [])
        if keep and inputs is not None:
            try:
                self._export(model, inputs.loaded.tokenizer, inputs.eval_data)
            except BaseException as err:
                self._failed(err)
        if dist.is_main:
            self._finish()
        distributed.shutdown(dist)
        return int(self.exit_code)

    def _probe(self) -> None:
        """The GEMM probe of the trial's GPU (none on the CPU), outside the measured window: the machine's ceiling
        at the trial's precision (kubesweep/jobs/probe.py). The model is still on the GPU; a probe that cannot run
        leaves a note."""
        try:
            self.fields["probe"], note = probe.probe_trial(self.cfg.precision, self.dist.device)
        except BaseException as err:  # SIGTERM, Ctrl-C while it runs
            self._failed(err)
            return
        if note is not None:
            self.notes.append(note)
        elif self.fields["probe"] is not None:
            print(f"GEMM probe ({self.cfg.precision}, {self.fields['probe']['size']}^3): "
                  f"{self.fields['probe']['tflops_per_s']:,.0f} TFLOP/s", flush=True)

    def _stopped_reason(self) -> str:
        """What stopped the trial and what its next attempt starts from, as they are here: a pod or a process, a
        checkpoint or the beginning."""
        who = ("its pod evicted or deleted, or a search stopped it" if os.environ.get("KUBERNETES_SERVICE_HOST")
               else "cancelled, or a search stopped it")
        kept = ("resumes from its last checkpoint" if self.cfg.task == "finetune" and self.cfg.checkpoint_every
                else "starts from the beginning")
        return f"stopped by SIGTERM ({who}); the next attempt {kept}"

    def _failed(self, err: BaseException) -> None:
        if isinstance(err, KeyboardInterrupt):
            self._end(Outcome.CANCELLED, ExitCode.FAILED, "KeyboardInterrupt", "interrupted")
        elif isinstance(err, Terminated):
            self.terminated = True
            self._end(Outcome.CANCELLED, ExitCode.FAILED, "Terminated", self._stopped_reason())
            if isinstance(self.tracker, MlflowTrialLogger):
                self.tracker.flush_timeout_s = min(self.tracker.flush_timeout_s, TERMINATE_FLUSH_S)
        elif runtime.is_oom(err):
            self._end(
                Outcome.OOM,
                ExitCode.OOM,
                type(err).__name__,
                str(err).splitlines()[0] if str(err) else "",
            )
        else:
            traceback.print_exc()
            self._end(Outcome.FAILED, ExitCode.FAILED, type(err).__name__, str(err) or repr(err))

    def _end(self, outcome: Outcome, code: ExitCode, kind: str, message: str) -> None:
        self.outcome, self.exit_code = outcome, code
        self.error = {"type": kind, "message": message}
        if self.dist.is_main:
            print(f"{outcome.value}: {message}", flush=True)

    # ------------------------------------------------------------------------------------------- engines

    def _prepare(self) -> Inputs:
        """What the trial needs before it touches the GPU: the model in host memory, the tokenizer, the data."""
        cfg, dist = self.cfg, self.dist
        t0 = time.perf_counter()
        loaded = model_mod.load(cfg)
        self.notes.extend(loaded.notes)
        self.fields["model"] = loaded.info
        t1 = time.perf_counter()
        eval_data, eval_cached = data_mod.load_split(cfg, loaded.tokenizer, "validation")
        train_data = None
        train_cached = None
        if cfg.task == "finetune":
            train_data, train_cached = data_mod.load_split(cfg, loaded.tokenizer, "train")
        t2 = time.perf_counter()
        self.timings["data_s"] = t2 - t1
        self.fields["data"] = {
            "dataset": cfg.dataset,
            "train_rows": len(train_data) if train_data is not None else None,
            "eval_rows": len(eval_data),
            "train_mean_tokens": float(train_data.lengths.mean()) if train_data is not None else None,
            "eval_mean_tokens": float(eval_data.lengths.mean()),
            "tokenization_cached": bool(eval_cached and (train_cached is not False)),
        }
        if dist.is_main:
            print(
                f"data: {self.fields['data']['train_rows']} train / {len(eval_data)} dev rows "
                f"({t2 - t1:.1f}s{', cached' if self.fields['data']['tokenization_cached'] else ''}); "
                f"model {loaded.info['architecture']} {loaded.info['parameters'] / 1e6:.1f}M params "
                f"({t1 - t0:.1f}s)",
                flush=True,
            )
        for note in loaded.notes:
            print(f"note: {note}", flush=True)
        return Inputs(loaded, train_data, eval_data, load_s=t1 - t0)

    def _execute(self, inputs: Inputs) -> Any:
        """The measured work, on sdpa_backend's attention kernels; returns the trained model (None: inference)."""
        with runtime.attention_kernels(self.cfg):
            if self.cfg.task == "inference":
                self._inference(inputs.loaded, inputs.eval_data, load_s=inputs.load_s)
                return None
            assert inputs.train_data is not None
            return self._finetune(inputs.loaded, inputs.train_data, inputs.eval_data, load_s=inputs.load_s)

    def _inference(self, loaded: model_mod.LoadedModel, eval_data: TokenizedSplit, *, load_s: float) -> None:
        self.timings["model_s"] = load_s
        t0 = time.perf_counter()
        meter = EnergyMeter.open(env.local_devices()) if self.dist.cuda else None
        stats, self.fields["energy"] = inference.run(self.cfg, loaded.model, eval_data, self.dist, meter)
        self.fields["inference"] = stats
        self.timings["compile_warmup_s"] = stats["warmup_s"]
        self.timings["eval_s"] = time.perf_counter() - t0
        self._metrics_summary({**job_summary(INFERENCE_KEYS, self.fields), **energy_metrics(self.fields["energy"])}, 0)

    def _finetune(
        self,
        loaded: model_mod.LoadedModel,
        train_data: TokenizedSplit,
        eval_data: TokenizedSplit,
        *,
        load_s: float,
    ) -> Any:
        """Train with the configured engine; returns the trained (unwrapped) model."""
        cfg, dist = self.cfg, self.dist
        checkpoint_dir = None
        if cfg.checkpoint_every:
            checkpoint_dir = self.state_dir() if cfg.checkpoint_dir else self.output_dir / "checkpoints"
        if cfg.engine == "hf-trainer":
            from kubesweep.jobs import hf_trainer

            outcome, setup_s = hf_trainer.run(
                cfg, loaded, train_data, eval_data, dist, checkpoint_dir, self.tracker.log_metrics
            )
            self.timings["model_s"] = load_s + setup_s
            self._record_training(outcome)
            return loaded.model
        t0 = time.perf_counter()
        tuner = FineTuner(cfg, loaded.model, train_data, eval_data, dist, checkpoint_dir, self.tracker.log_metrics,
                          energy=EnergyMeter.open(env.local_devices()) if dist.cuda else None)
        self.timings["model_s"] = load_s + (time.perf_counter() - t0)
        self._record_training(tuner.run())
        return tuner.raw

    def _export(self, model: Any, tokenizer: Any, eval_data: TokenizedSplit) -> None:
        cfg = self.cfg
        t0 = time.perf_counter()
        probe_plan = data_mod.plan_batches(
            eval_data.lengths,
            min(8, len(eval_data)),
            padding="dynamic",
            max_seq_len=cfg.max_seq_len,
            bucket_multiple=cfg.bucket_multiple,
            shuffle=True,
            seed=cfg.seed,
            epoch=0,
        )
        probe = data_mod.BatchDataset(eval_data, probe_plan[:1], "dynamic", cfg.max_seq_len, 1)[0]
        with runtime.eager():  # layers compiled in place (compile_scope layers) export as written
            records = export.export_all(model, tokenizer, probe, self.output_dir / "export", list(cfg.export))
        self.fields["exports"] = records
        for record in records:
            self.artifacts[f"export_{record['format']}"] = os.path.relpath(record["path"], self.output_dir)
        self.timings["export_s"] = time.perf_counter() - t0

    def _record_training(self, out: TrainOutcome) -> None:
        stats = out.stats()
        self.fields["train"] = stats
        self.fields["energy"] = out.energy
        self.fields["eval"] = out.eval_points
        self.fields["final_accuracy"] = out.eval_points[-1]["accuracy"] if out.eval_points else None
        self.fields["loss_curve"] = out.loss_curve
        self.fields["checkpoints"] = out.checkpoints
        self.timings["compile_warmup_s"] = out.warmup_time_s
        self.timings["train_s"] = out.train_s
        self.timings["eval_s"] = out.eval_s
        parts = {**self.fields, "timings": self.timings}
        self._metrics_summary({**job_summary(TRAINING_KEYS, parts), **energy_metrics(out.energy)}, out.steps)
        if self.dist.is_main:
            rate = (
                f"{stats['samples_per_s']:,.1f} samples/s" if stats["samples_per_s"] else "no measured steps"
            ) + (f", {stats['tflops_per_s']:,.2f} TFLOP/s ({stats['padded_tokens_per_sample']:.1f} padded tokens a "
                 "sample)" if stats["tflops_per_s"] and stats["padded_tokens_per_sample"] else "")
            acc = (
                f", dev accuracy {self.fields['final_accuracy']:.4f}"
                if self.fields["final_accuracy"] is not None
                else ""
            )
            print(f"train: {out.steps} steps in {out.train_s:.1f}s, {rate}{acc}", flush=True)

    # ------------------------------------------------------------------------------------------- outputs

    def _tracker(self) -> MlflowTrialLogger | NullLogger:
        trial = self.trial
        run_tags = {**trial_run.run_tags(trial),
                    **{tag: os.environ[env] for env, tag in QUEUE_TAGS.items() if os.environ.get(env)}}
        tracker = MlflowTrialLogger.from_env(
            trial.trial_id, trial_run.run_name(trial), run_tags, self.state_dir() / "mlflow-spool.jsonl"
        )
        params = trial_run.run_params(trial)
        tracker.log_params(params)
        return tracker

    def _on_gpu_sample(self, batch: list[Any]) -> None:
        self._system_step += 1
        self.tracker.log_metrics(system_metrics(batch), self._system_step, int(batch[0].t * 1000))

    def _metrics_summary(self, metrics: dict[str, float | None], step: int) -> None:
        self.tracker.log_metrics({k: v for k, v in metrics.items() if v is not None}, step)

    def _measured_window(self) -> tuple[tuple[float, float] | None, list[tuple[float, float]]]:
        """The Unix times of the first measured step's start and the last one's end (training or inference), and
        the pauses between measured steps (an evaluation, a checkpoint)."""
        stats = self.fields.get("train") or self.fields.get("inference")
        if not isinstance(stats, dict):
            return None, []
        start, end = stats.get("measured_from"), stats.get("measured_until")
        pauses = [(float(a), float(b)) for a, b in stats.get("measured_pauses") or []]
        return ((float(start), float(end)) if start is not None and end is not None else None), pauses

    def _write_json(self, name: str, content: Any, key: str) -> None:
        (self.output_dir / name).write_text(
            json.dumps(content, indent=2, default=str) + "\n", encoding="utf-8"
        )
        self.artifacts[key] = name

    def _log_comparison(self, results: Results) -> None:
        """The numbers `sweep results` shows for this trial, as metrics of the same names, and its flags (OOM,
        GPU mismatch, chance accuracy) as a tag: the columns of the sweep's runs view in the MLflow UI."""
        catalog = load_catalog()
        gpu = gpu_type(self.trial.gpu, results, catalog.by_product)
        price, peak = catalog.price_and_peak(gpu, self.cfg.precision)
        metrics = comparison_metrics(results, gpus=self.trial.gpus_per_trial, price_per_hour=price, peak_tflops=peak)
        self.tracker.set_tags(comparison_tags(results, physics(metrics)))
        step = results.train.steps if results.train is not None else 0
        self.tracker.log_metrics(metrics, step)

    def _finish(self) -> None:
        fields = self.fields
        if fields.get("loss_curve"):
            png = self.output_dir / "loss_curve.png"
            title = f"{self.trial.name}: {self.cfg.model} bs{self.cfg.batch_size} {self.cfg.precision}"
            if plot.loss_curve_png(fields["loss_curve"], fields.get("eval", []), title, png):
                self.artifacts["loss_curve"] = png.name
        if self.cfg.checkpoint_every and self.cfg.checkpoint_dir is None:
            self.artifacts["checkpoints"] = "checkpoints"
        self.artifacts["results"] = "results.json"
        self.timings["total_s"] = time.time() - self.t_process
        results = Results(
            outcome=self.outcome,
            exit_code=int(self.exit_code),
            error=self.error,
            trial={
                k: getattr(self.trial, k)
                for k in ("sweep", "trial_id", "name", "repeat", "gpu", "gpu_product", "gpus_per_trial")
            },
            config=self.cfg,
            device="cuda" if self.dist.cuda else "cpu",
            world_size=self.dist.world_size,
            started_at=self.started_at,
            finished_at=now_iso(),
            timings=self.timings,
            artifacts=self.artifacts,
            environment=self.environment,
            notes=self.notes,
            **fields,
        )
        results.write(self.output_dir / "results.json")
        tracker = self.tracker
        if self.terminated:
            # Whoever stopped the trial says how its run ends (a search scheduler: stopped; an evicted pod's
            # replacement: by finishing it): send what was logged, end nothing.
            tracker.close(None)
        else:
            for key in ("trial", "environment", "results", "loss_curve"):
                if key in self.artifacts:
                    tracker.log_artifact(self.output_dir / self.artifacts[key])
            if (self.output_dir / "export").is_dir():
                tracker.log_artifact(self.output_dir / "export", "export")
            tracker.set_tags({tags.OUTCOME: self.outcome.value})
            self._log_comparison(results)
            tracker.close("FINISHED" if self.outcome == Outcome.SUCCEEDED else "FAILED")
        t = self.timings
        print(
            f"{self.outcome.value} (exit {int(self.exit_code)}) in {t['total_s']:.1f}s: "
            f"{self.output_dir / 'results.json'}",
            flush=True,
        )


def _raise_terminated(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the trial is already ending within the grace period
    raise Terminated()


def run_trial(trial: TrialConfig, output_dir: Path) -> int:
    return TrialRun(trial, output_dir).run()
