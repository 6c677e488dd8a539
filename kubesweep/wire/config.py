"""Settings of one BERT job run: the `job` section of a sweep spec and the body of a trial file.

This module depends on pydantic only, so the spec, the planner and the CLI can use it without the
`job` extra (torch, transformers) installed. Every field here can be a sweep matrix axis.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from kubesweep.wire.base import StrictModel

Precision = Literal["fp32", "tf32", "fp16", "bf16"]
PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16")
CompileMode = Literal["default", "reduce-overhead", "max-autotune"]
COMPILE_MODES: tuple[str, ...] = ("default", "reduce-overhead", "max-autotune")
CompileScope = Literal["model", "layers"]
SdpaBackend = Literal["auto", "flash", "efficient", "cudnn", "math"]
CUDA_ONLY_SDPA = ("efficient", "cudnn")  # attention kernels that exist only on a CUDA GPU
Padding = Literal["max_length", "dynamic", "bucketed", "packed"]
ResidualPrecision = Literal["fp32", "half"]
Task = Literal["finetune", "inference"]
Engine = Literal["kubesweep", "hf-trainer"]
ExportFormat = Literal["weights", "onnx", "torchscript"]

TRIAL_SCHEMA = "kubesweep.io/trial/v1"
# Bounds of the numeric settings: far beyond any real run, so a typo or a hostile number is an error at validation
MAX_BATCH_SIZE = 1 << 20  # per device; the max-batch search's bounds too
MAX_ROWS = 10**9  # train_samples, eval_samples
MAX_STEPS = 10**9  # max_steps, checkpoint_every
MAX_EPOCHS = 10_000.0
MAX_EVERY = 10**6  # log_every, measure_skip_steps, warm-up and measured batches
MAX_SEED = 2**32 - 1  # numpy's seed range
# A Hugging Face hub commit: a pin that cannot move (a branch or tag name can)
HUB_COMMIT = r"^[0-9a-f]{40}$"

# Settings that may name a local path: a directory of GLUE TSVs, a Hugging Face model or tokenizer directory.
PATH_SETTINGS: tuple[str, ...] = ("dataset", "model", "tokenizer")


def is_local_path(ref: str) -> bool:
    """Whether a dataset, model or tokenizer reference names a local path (it starts with `/`, `.` or `~`), not a
    `datasets` name (`glue/sst2`), a Hugging Face hub id or a `pkg:` model. The job reads it as such."""
    return ref.startswith(("/", ".", "~"))


def local_path(ref: str, base: Path) -> Path | None:
    """The path a reference names (`~` expanded; a relative one resolved against `base`, a spec file's
    directory), or None when it names no local path (see `is_local_path`)."""
    if not is_local_path(ref):
        return None
    path = Path(ref).expanduser()
    return path if path.is_absolute() else (base / path).resolve()


def normalize_compile(value: Any) -> bool | str:
    """`compile` is false, true (= torch.compile's default mode) or a mode name.

    Returns False for off, or the mode name (true becomes "default").
    """
    if value is None or value is False:
        return False
    if value is True:
        return "default"
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("false", "off", "no", "none", "eager"):
            return False
        if lowered in ("true", "on", "yes"):
            return "default"
        if lowered in COMPILE_MODES:
            return lowered
    raise ValueError(f"expected false, true or one of {', '.join(COMPILE_MODES)}")


class JobConfig(StrictModel):
    """What one trial runs. Defaults reproduce the seed recipe (bert-base-uncased, SST-2, 3 epochs)."""

    task: Task = "finetune"
    engine: Engine = Field(
        "kubesweep", description="kubesweep's own loop, or HF Trainer as the peer baseline"
    )
    model: str = Field(
        "bert-base-uncased",
        description="Hugging Face id, local directory, or pkg:DIST (a model shipped in a Python package)",
    )
    model_revision: str | None = Field(
        None, pattern=HUB_COMMIT,
        description="the Hugging Face hub commit (40 hex digits) of a model named by hub id, and of its own "
        "tokenizer: needed to download it; without it such a model loads only from the local Hugging Face cache",
    )
    tokenizer: str | None = Field(None, description="tokenizer reference like `model`; default: the model's")
    tokenizer_revision: str | None = Field(
        None, pattern=HUB_COMMIT, description="the hub commit of a `tokenizer` named by another hub id than `model`",
    )
    random_init: bool = Field(False, description="build the model from its config (speed-only runs)")
    model_overrides: dict[str, int | float | str | bool] = Field(
        default_factory=dict,
        description="config attributes set before building a random-init model, e.g. num_hidden_layers: 2",
    )
    dataset: str = Field("glue/sst2", description="`datasets` name (glue/sst2) or a directory of GLUE TSVs")
    dataset_revision: str | None = Field(
        None, pattern=HUB_COMMIT,
        description="the hub commit (40 hex digits) of a `datasets` name; none: the hub's current one",
    )
    train_samples: int | None = Field(None, ge=1, le=MAX_ROWS, description="use only the first N training rows")
    eval_samples: int | None = Field(None, ge=1, le=MAX_ROWS, description="use only the first N dev rows")
    epochs: float = Field(3.0, gt=0, le=MAX_EPOCHS)
    max_steps: int | None = Field(None, ge=1, le=MAX_STEPS,
                                  description="stop after N optimizer steps (overrides epochs)")
    batch_size: int = Field(32, ge=1, le=MAX_BATCH_SIZE, description="per-device batch size")
    eval_batch_size: int | None = Field(None, ge=1, le=MAX_BATCH_SIZE)
    max_seq_len: int = Field(128, ge=8, le=4096)
    learning_rate: float = Field(2e-5, gt=0, le=10.0)
    weight_decay: float = Field(0.0, ge=0, le=10.0)
    warmup_ratio: float = Field(0.0, ge=0, le=1, description="learning-rate warm-up, fraction of steps")
    max_grad_norm: float | None = Field(1.0, gt=0, le=1e6, description="gradient clipping (HF Trainer's default)")
    grad_accum: int = Field(1, ge=1, le=65_536, description="gradient accumulation steps")
    precision: Precision = "fp32"
    compile: bool | str = Field(False, description="false, true, or default | reduce-overhead | max-autotune")
    compile_scope: CompileScope = Field(
        "model",
        description="what compile covers: model (the whole model, static shapes, one compilation per padded "
        "shape) or layers (the repeated transformer layer, compiled once for every layer and shape)",
    )
    sdpa_backend: SdpaBackend = Field(
        "auto",
        description="attention kernels: auto (PyTorch picks per call) or only flash | efficient | cudnn | math",
    )
    step_graph: bool = Field(
        False,
        description="capture the whole optimizer step (forward, backward, clipping, AdamW) as one CUDA graph "
        "per batch shape (under DDP: two, the gradient all-reduce between them; fine-tuning: bf16/tf32/fp32, no "
        "gradient accumulation), or the inference task's forward pass; CUDA only",
    )
    residual_precision: ResidualPrecision = Field(
        "fp32",
        description="fine-tuning under bf16/fp16: the type of the residual stream between the model's layers. "
        "fp32: autocast runs LayerNorm in fp32, so its output, the residual stream and their gradients are fp32 "
        "(each matmul reads a cast copy); half: LayerNorm still computes in fp32 and its output is stored in the "
        "precision's 16-bit type, as a model held in that type stores it: half the bytes for the element-wise work "
        "between the matmuls",
    )
    padding: Padding = Field(
        "max_length",
        description="max_length (run_glue's recipe), dynamic, bucketed, or packed (fine-tuning: a batch's "
        "sentences end to end in rows of max_seq_len tokens, each attending only to itself)",
    )
    bucket_multiple: int = Field(16, ge=1, le=4096, description="bucketed padding: lengths round up to this multiple")
    num_workers: int = Field(2, ge=0, le=256, description="DataLoader workers")
    pin_memory: bool = True
    seed: int = Field(42, ge=0, le=MAX_SEED)
    eval_every_epoch: bool = True
    log_every: int = Field(20, ge=1, le=MAX_EVERY, description="read losses and log metrics every N optimizer steps")
    measure_skip_steps: int = Field(
        3, ge=0, le=MAX_EVERY, description="first N optimizer steps are warm-up: timed apart, not in samples/s"
    )
    checkpoint_every: int | None = Field(None, ge=1, le=MAX_STEPS, description="checkpoint every N optimizer steps")
    checkpoint_dir: str | None = Field(None, description="default: OUTPUT_DIR/checkpoints")
    keep_checkpoints: int = Field(2, ge=1, le=1000, description="newest checkpoints kept on disk")
    resume: bool = Field(
        True, description="resume from the newest checkpoint in checkpoint_dir if there is one"
    )
    export: list[ExportFormat] = Field(
        default_factory=list,
        description="after training: the weights (safetensors + tokenizer, reloadable with from_pretrained), ONNX, "
        "TorchScript; each checked against the trained model (none by default)",
    )
    cache_dir: str | None = Field(
        None, description="tokenization cache; default $KUBESWEEP_CACHE_DIR or ~/.cache/kubesweep"
    )
    compile_cache_dir: str | None = Field(None, description="torch.compile (Inductor) cache, shareable")
    nvml_interval_s: float = Field(1.0, ge=0.01, le=3600.0, description="GPU sampler period")
    # inference task
    inference_batches: int = Field(100, ge=1, le=MAX_EVERY, description="measured batches for the inference task")
    warmup_batches: int = Field(10, ge=0, le=MAX_EVERY, description="warm-up batches, reported apart")

    @field_validator("compile", mode="before")
    @classmethod
    def _compile(cls, value: Any) -> bool | str:
        return normalize_compile(value)

    @model_validator(mode="after")
    def _check(self) -> JobConfig:
        if self.engine == "hf-trainer" and self.task != "finetune":
            raise ValueError("engine hf-trainer supports task finetune only")
        if self.padding == "packed" and (self.engine != "kubesweep" or self.task != "finetune"):
            raise ValueError("padding packed applies to fine-tuning with kubesweep's engine (its own model call "
                             "on packed rows); use bucketed or dynamic")
        if self.padding == "packed" and self.sdpa_backend == "flash":
            raise ValueError("padding packed needs an attention mask (each sentence attends only to itself), which "
                             "flash attention does not take; use sdpa_backend efficient or auto")
        if self.residual_precision == "half":
            if self.precision not in ("bf16", "fp16"):
                raise ValueError(f"residual_precision half applies to bf16 and fp16 (autocast's 16-bit types); "
                                 f"precision {self.precision} keeps every activation in fp32")
            if self.engine != "kubesweep" or self.task != "finetune":
                raise ValueError("residual_precision half applies to fine-tuning with kubesweep's engine (the "
                                 "inference task runs the whole model in the precision's type already)")
        if self.step_graph:
            if self.engine != "kubesweep":
                raise ValueError("step_graph applies to kubesweep's own loops only (fine-tuning and inference)")
            if self.compile == "reduce-overhead":
                raise ValueError("step_graph replaces reduce-overhead's CUDA graphs; use compile: default")
            if self.task == "finetune" and self.precision == "fp16":
                raise ValueError("step_graph does not support fp16 fine-tuning (its loss scaler reads the GPU each "
                                 "step); use bf16")
            if self.task == "finetune" and self.grad_accum > 1:
                raise ValueError("step_graph does not support grad_accum > 1")
        if self.compile and self.compile_scope == "layers" and self.engine != "kubesweep":
            raise ValueError("compile_scope layers applies to kubesweep's engine only (HF Trainer compiles the "
                             "whole model)")
        if self.model_overrides and not self.random_init:
            raise ValueError("model_overrides needs random_init: pretrained weights fix the shapes")
        return self


JOB_FIELDS: frozenset[str] = frozenset(JobConfig.model_fields)


CPU = "cpu"  # the device of a trial that asks for no GPU
ANY_GPU = "any GPU"  # the device of a trial that takes whichever GPU it is given
# what earlier versions logged as the device of a trial without a GPU type: none, "any", str(None)
_EARLIER_NO_GPU_TYPE = frozenset({"", "any", "None"})


def gpu_type_of(device: object) -> str | None:
    """The GPU type a logged device names (`TrialConfig.device`, read back from a run's tag): None for `cpu`,
    `any GPU`, nothing, or what earlier versions logged for those."""
    text = "" if device is None else str(device)
    return None if text in (CPU, ANY_GPU) or text in _EARLIER_NO_GPU_TYPE else text


class TrialConfig(StrictModel):
    """A resolved trial as handed to the job (`python -m kubesweep.jobs --config trial.json`)."""

    schema_: str = Field(TRIAL_SCHEMA, alias="schema")
    sweep: str
    trial_id: str
    name: str
    repeat: int = 0
    gpu: str | None = Field(None, description="catalog name of the GPU type asked for; None = any/CPU")
    gpu_product: str | None = Field(None, description="the catalog's exact nvidia.com/gpu.product value")
    gpus_per_trial: int = 1
    job: JobConfig = Field(default_factory=JobConfig)

    @property
    def device(self) -> str:
        """What the trial runs on, named the same everywhere (labels, MLflow tags, results): its GPU type, `cpu`,
        or `any GPU`."""
        return self.gpu or (CPU if self.gpus_per_trial == 0 else ANY_GPU)
