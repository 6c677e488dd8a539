"""The results file of one trial (`OUTPUT_DIR/results.json`): a versioned, validated schema.

`docs/results-schema.md` explains every field; `docs/results.schema.json` is the JSON Schema generated from
these models (`python -m kubesweep.wire.results > docs/results.schema.json`; a test fails when it drifts).
Readers check `schema` first: a new major version means a breaking change, new optional fields do not bump it.
Units are in the names: `_s` seconds, `_bytes`, `_pct`, `_w` watts, `_c` degrees Celsius, `per_s` rates.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kubesweep.wire.config import JobConfig
from kubesweep.wire.outcomes import Outcome

RESULTS_SCHEMA = "kubesweep.io/results/v1"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Percentiles(_Model):
    p50: float
    p90: float
    p99: float
    mean: float
    n: int = Field(description="number of measurements")


class ErrorInfo(_Model):
    type: str
    message: str


class TrialInfo(_Model):
    sweep: str
    trial_id: str
    name: str
    repeat: int
    gpu: str | None
    gpu_product: str | None
    gpus_per_trial: int


class Timings(_Model):
    """Wall-clock split of the trial; parts that did not run are null."""

    startup_s: float | None = Field(
        None, description="process start to job start: interpreter, imports, setup"
    )
    data_s: float | None = Field(None, description="dataset load and tokenization (or cache read)")
    model_s: float | None = Field(None, description="model and tokenizer load/build, move to device")
    compile_warmup_s: float | None = Field(
        None, description="warm-up steps: the first steps and, under compile, first step of each new shape"
    )
    train_s: float | None = Field(
        None, description="training loop wall time, warm-up and checkpoints included"
    )
    eval_s: float | None = Field(None, description="evaluation passes")
    export_s: float | None = None
    gpu_wait_s: float | None = Field(
        None, description="waiting for the GPU lease after the host-side preparation (null: no lease)"
    )
    gpu_held_s: float | None = Field(
        None, description="GPU lease held: device set-up, warm-up, training, evaluation (null: no lease)"
    )
    queue_wait_s: float | None = Field(
        None, description="a queued trial (spec.queue): its Job's creation to this process's start, the wait for "
                          "Kueue's admission, scheduling and image pull (null: not queued)"
    )
    total_s: float = Field(description="process start to results written")


class MeasuredWindow(_Model):
    """What training and inference both record of their measured window (warm-up excluded): its start and end,
    what a sample carried and the model FLOPs it computed (kubesweep/jobs/flops.py: `measured_figures`)."""

    tokens_per_sample: float | None = Field(None, description="measured non-padding tokens / measured samples")
    padded_tokens_per_sample: float | None = Field(None, description="measured tokens incl. padding / measured "
                                                   "samples: the width the model computed on, per sample")
    measured_flops: float | None = Field(None, description="model FLOPs of the measured steps (inference: batches), "
                                         "all ranks: forward + backward (3x forward) of each batch's padded shape "
                                         "(inference: one forward pass), matmuls and attention "
                                         "(kubesweep/jobs/flops.py); null where the model's shapes are not counted")
    tflops_per_s: float | None = Field(None, description="measured_flops / the measured time / 1e12: achieved "
                                       "TFLOP/s over the window samples_per_s is measured in (training: "
                                       "measured_time_s; inference: the measured batches' latency), all ranks")
    measured_from: float | None = Field(None, description="Unix time the first measured step began (its "
                                        "neighbours on the node are read against this window)")
    measured_until: float | None = Field(None, description="Unix time the last measured step ended")


class TrainStats(MeasuredWindow):
    steps: int = Field(description="optimizer steps completed (including any before a resume)")
    target_steps: int
    epochs_completed: float
    samples: int = Field(description="samples trained on in this process run, all ranks")
    warmup_steps: int
    warmup_time_s: float
    measured_steps: int
    measured_samples: int
    measured_time_s: float
    samples_per_s: float | None = Field(description="measured samples / measured time, all ranks")
    tokens_per_s: float | None = Field(description="non-padding tokens per second over measured steps")
    padded_tokens_per_s: float | None = Field(description="tokens incl. padding the model computed on")
    flops_per_step: float | None = Field(None, description="measured_flops / measured_steps")
    step_time_s: Percentiles | None
    final_loss: float | None
    resumed_from_step: int | None = None
    measured_pauses: list[tuple[float, float]] | None = Field(
        None, description="Unix times between measured steps that were not measured: the clock stood still (an "
        "evaluation, a checkpoint) or a warm-up step ran (a new shape's first steps: compile, graph capture); "
        "inside measured_from..measured_until")


class EvalPoint(_Model):
    epoch: float
    step: int
    accuracy: float
    loss: float
    samples: int


class LossPoint(_Model):
    step: int
    loss: float
    learning_rate: float | None = None


class InferenceStats(MeasuredWindow):
    batch_size: int
    seq_len: int = Field(description="max_seq_len; with max_length padding every batch has this width")
    dtype: str
    compiled: bool | str
    warmup_batches: int
    warmup_s: float
    batches: int
    latency_s: Percentiles
    samples_per_s: float
    tokens_per_s: float = Field(description="non-padding tokens per second")
    padded_tokens_per_s: float
    flops_per_batch: float | None = Field(None, description="measured_flops / batches")
    graph: bool = Field(False, description="each batch's forward pass replayed as one CUDA graph (step_graph)")
    launch_s: Percentiles | None = Field(
        None, description="host time to issue each measured batch (the call's return, before the device sync)")
    host_share: float | None = Field(
        None, description="issuing time / latency over the measured batches, on a GPU: near 1, the GPU waited "
        "for the host to launch its kernels (host-bound); near 0, the host waited for the GPU")


class EnergyStats(_Model):
    """GPU energy over the measured window, from NVML's energy counter (kubesweep/jobs/energy.py)."""

    source: str = Field(description="nvml_total_energy: the difference of two readings of the board's counter")
    measured_j: float = Field(description="joules of the measured steps (training: whole measured log windows), "
                              "all ranks' GPUs")
    measured_s: float = Field(description="the measured time those joules were spent in")
    measured_samples: int
    j_per_sample: float
    kwh_per_epoch: float | None = Field(description="j_per_sample x training rows / 3.6e6 (inference: null)")
    mean_power_w: float = Field(description="measured_j / measured_s")


class MemoryStats(_Model):
    torch_peak_allocated_bytes: int | None = None
    torch_peak_reserved_bytes: int | None = None
    nvml_peak_used_bytes: int | None = Field(
        None, description="this process on its GPU (device-wide if unknown)"
    )
    host_peak_rss_bytes: int | None = None


class GpuDeviceStats(_Model):
    index: int
    samples: int
    utilization_mean_pct: float
    utilization_max_pct: float
    power_mean_w: float | None
    power_max_w: float | None
    temperature_max_c: float | None
    memory_used_max_bytes: int
    process_memory_max_bytes: int | None
    measured_samples: int | None = Field(None, description="samples whose interval lay inside the measured steps' "
                                         "window (training's or inference's measured_from..measured_until)")
    utilization_measured_pct: float | None = Field(
        None, description="mean NVML utilization of those samples: the share of time a kernel ran while the "
        "measured steps ran (null: the window was shorter than a sample interval)")


class GpuMonitor(_Model):
    interval_s: float
    devices: list[GpuDeviceStats]


class ExportRecord(_Model):
    format: str = Field(description="weights | onnx | torchscript")
    path: str
    verified: bool = Field(description="loaded and run once; outputs matched the eager model")
    max_abs_diff: float | None = None
    error: str | None = None


class CompileCache(_Model):
    """What torch.compile found in its on-disk caches (compiled trials only)."""

    fx_graph_hits: int = Field(description="Inductor FX graphs loaded from the cache")
    fx_graph_misses: int = Field(description="Inductor FX graphs compiled (and then saved)")
    aot_autograd_hits: int
    aot_autograd_misses: int
    hit: bool = Field(description="every graph came from the cache: no compilation ran")
    dir: str | None = Field(None, description="the Inductor cache directory")


class GemmProbe(_Model):
    """The machine's own ceiling: square matmuls at the trial's precision on its GPU, after its measured steps
    (kubesweep/jobs/probe.py)."""

    precision: str = Field(description="the trial's precision: fp32 (strict), tf32, fp16 or bf16")
    dtype: str
    size: int = Field(description="the matrices' side: size x size times size x size")
    repeats: int = Field(description="timings taken after the warm-up; the best one counts")
    matmuls_per_repeat: int
    best_s: float = Field(description="the best timing of matmuls_per_repeat matmuls")
    tflops_per_s: float = Field(description="matmuls_per_repeat x 2 size^3 / best_s / 1e12, one GPU")
    seconds: float = Field(description="the probe's wall time, warm-up included")


class GpuLeaseInfo(_Model):
    """The GPU lease of a trial started before its GPU was free (see kubesweep/jobs/gpu_lease.py)."""

    path: str
    acquired_at: float | None = Field(None, description="Unix time the GPU became this trial's")
    released_at: float | None = Field(None, description="Unix time the trial gave the GPU back")


class _Open(BaseModel):
    """A part the job describes its machine with: the fields read here are typed, others are kept as written (a
    newer job's, read by an older reader)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


class EnvironmentGpu(_Open):
    index: int | None = Field(None, description="the CUDA index inside the trial's process")
    name: str | None = None
    product: str | None = Field(None, description="the product name NVML gives (`NVIDIA H100 80GB HBM3`)")
    memory_total_bytes: int | None = None
    compute_capability: str | None = None
    uuid: str | None = Field(None, description="the UUID CUDA gives")
    nvml_uuid: str | None = Field(None, description="the UUID NVML reads inside the container")
    pci_bus_id: str | None = Field(None, description="the PCI bus id NVML reads inside the container")


class EnvironmentCpu(_Open):
    model: str | None = None
    logical_cores: int | None = None
    usable_cores: int | None = Field(None, description="the CPUs this process may run on")
    affinity: str | None = Field(None, description="those CPUs in the kernel's list format (`0-3,8`)")
    quota_cores: float | None = Field(None, description="the cgroup's CPU limit in cores (null: none)")
    torch_threads: int | None = None


class Environment(_Open):
    """Where the trial ran (environment.json): node, host, CPU, GPUs and the versions of what ran it."""

    captured_at: str | None = None
    node_name: str | None = Field(None, description="the Kubernetes node (the hostname outside Kubernetes)")
    hostname: str | None = None
    boot_id: str | None = Field(None, description="the kernel's boot id: tells machines of one name apart")
    image: str | None = None
    python: str | None = None
    platform: str | None = None
    cpu: EnvironmentCpu | None = None
    memory_total_bytes: int | None = None
    gpus: list[EnvironmentGpu] = Field(default_factory=list)
    gpu_test_override: str | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    cuda_available: bool | None = None
    cudnn_version: int | None = None
    nccl_version: str | None = None
    packages: dict[str, str | None] = Field(default_factory=dict)
    world_size: int | None = None


class Results(_Model):
    schema_: str = Field(RESULTS_SCHEMA, alias="schema")
    outcome: Outcome
    exit_code: int
    error: ErrorInfo | None = None
    trial: TrialInfo
    config: JobConfig
    device: str = Field(description="cuda or cpu")
    world_size: int = 1
    started_at: str
    finished_at: str
    model: dict[str, Any] | None = None
    data: dict[str, Any] | None = None
    timings: Timings
    train: TrainStats | None = None
    eval: list[EvalPoint] = Field(default_factory=list, description="one point per evaluated epoch")
    final_accuracy: float | None = None
    inference: InferenceStats | None = None
    memory: MemoryStats = Field(default_factory=MemoryStats)
    energy: EnergyStats | None = None
    gpu_monitor: GpuMonitor | None = None
    compile_cache: CompileCache | None = None
    gpu_lease: GpuLeaseInfo | None = None
    probe: GemmProbe | None = Field(None, description="a GPU trial that succeeded: the GEMM probe of its (first) GPU")
    loss_curve: list[LossPoint] = Field(default_factory=list, description="training loss of every step")
    checkpoints: list[str] = Field(default_factory=list, description="checkpoint directories kept")
    exports: list[ExportRecord] = Field(default_factory=list)
    artifacts: dict[str, str] = Field(
        default_factory=dict, description="name -> file, relative to OUTPUT_DIR"
    )
    environment: Environment = Field(default_factory=Environment, description="same as environment.json")
    notes: list[str] = Field(default_factory=list, description="substitutions and caveats of this run")

    def write(self, path: Path) -> None:
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(self.model_dump_json(by_alias=True, indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)

    @classmethod
    def read(cls, path: Path) -> Results:
        return cls.model_validate_json(path.read_text(encoding="utf-8"))


def json_schema() -> dict[str, Any]:
    schema = Results.model_json_schema(by_alias=True)
    schema["$id"] = RESULTS_SCHEMA
    schema["title"] = "kubesweep trial results"
    return schema


if __name__ == "__main__":
    print(json.dumps(json_schema(), indent=2, sort_keys=True))
