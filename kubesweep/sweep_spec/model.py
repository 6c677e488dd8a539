"""The `Sweep` document's model: its fields, bounds and axes (`kubesweep.sweep_spec` parses and checks documents into
it).

`Matrix` and `Cell` have a field per axis: `gpu`, the resource axes and every `JobConfig` setting.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BeforeValidator, Field, PrivateAttr, create_model
from pydantic.fields import FieldInfo

from kubesweep.images.lock import locked_reference
from kubesweep.sweep_spec.file import LineMap
from kubesweep.sweep_spec.file import Problem as Problem
from kubesweep.sweep_spec.file import SpecError as SpecError
from kubesweep.wire.base import StrictModel
from kubesweep.wire.config import MAX_BATCH_SIZE, MAX_SEED, MAX_STEPS, JobConfig, normalize_compile
from kubesweep.wire.metrics import REPEAT_METRICS
from kubesweep.wire.trial_metrics import DEFAULT_TARGET_ACCURACY

API_VERSION = "kubesweep.io/v1alpha1"
KIND = "Sweep"
DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DIGEST_RE = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")
QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
# Bounds that keep one Sweep from asking for more than any cluster has (and the operator from working on it)
MAX_GPUS_PER_NODE = 16
MAX_NODES = 512
MAX_AXIS_VALUES = 10_000  # values of one matrix axis; include and exclude cells (the trial cap is 10,000 too)
MAX_CPU = 1024.0  # cores per pod
MAX_SECONDS = 366 * 86400  # a trial's deadline, a finished Job's time to live: a year
MAX_RETRIES = 100  # a trial's Job's backoffLimit
MAX_TRIALS_AT_ONCE = 10_000  # trials running at once (max_parallel, per_gpu_type, a tune search's max_concurrent)
MAX_SEARCH_TRIALS = 10**7  # a search's budget; --max-trials (default 10,000) is the limit a sweep meets first
MAX_SEARCH_VALUE = 1e15  # a search space's bounds and a constraint's value
MAX_MEMORY = 64 * 2**40  # bytes per pod (64Ti), for memory and shm_size
# Sizes as JSON. A Kubernetes object's annotations hold 256 KiB in all, an object 1.5 MiB (etcd's request limit).
MAX_JOB_BYTES = 64 * 1024  # spec.job: each trial Job's annotation carries its settings
MAX_SEARCH_BYTES = 192 * 1024  # a search sweep: its tuner Job's annotation carries the whole sweep
MAX_DOCUMENT_BYTES = 1024 * 1024  # any sweep: the Sweep resource

# ---------------------------------------------------------------------------------------------------------
# Matrix axes: `gpu`, the resource axes, and every JobConfig field. Axis value types come from JobConfig, so
# a new job setting is a sweep axis with no change here.

RESOURCE_AXES: dict[str, Any] = {
    "gpu": (str, Field(description="GPU type: a name from the GPU catalog")),
    "gpus_per_trial": (Annotated[int, Field(ge=0, le=MAX_GPUS_PER_NODE)],
                       Field(description="GPUs per trial (0 = CPU only)")),
    "num_nodes": (Annotated[int, Field(ge=1, le=MAX_NODES)], Field(description="nodes per trial (multi-node DDP)")),
}


def _job_axis_type(name: str, info: FieldInfo) -> Any:
    annotation: Any = Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation
    if name == "compile":
        annotation = Annotated[bool | str, BeforeValidator(normalize_compile)]
    return annotation


def _axis_types() -> dict[str, tuple[Any, FieldInfo]]:
    axes: dict[str, tuple[Any, FieldInfo]] = {}
    for name, (annotation, info) in RESOURCE_AXES.items():
        axes[name] = (annotation, info)
    for name, info in JobConfig.model_fields.items():
        axes[name] = (_job_axis_type(name, info), Field(description=info.description))
    return axes


AXIS_TYPES = _axis_types()
AXES: tuple[str, ...] = tuple(AXIS_TYPES)

Matrix = create_model(  # type: ignore[call-overload]
    "Matrix",
    __base__=StrictModel,
    __doc__="Axis → the values to sweep. Every cell of the product is one trial (times `repeats`).",
    **{
        name: (list[annotation] | None, Field(None, min_length=1, max_length=MAX_AXIS_VALUES,  # type: ignore[valid-type]
                                              description=info.description))
        for name, (annotation, info) in AXIS_TYPES.items()
    },
)

Cell = create_model(  # type: ignore[call-overload]
    "Cell",
    __base__=StrictModel,
    __doc__="A partial assignment of axis values: an `include` cell or an `exclude` rule.",
    **{
        name: (annotation | None, Field(None, description=info.description))
        for name, (annotation, info) in AXIS_TYPES.items()
    },
)


def set_axes(model: StrictModel) -> dict[str, Any]:
    """The axes a Matrix or Cell sets, in declaration order."""
    return {k: v for k, v in model.model_dump(exclude_none=True).items() if k in model.model_fields_set}


# ---------------------------------------------------------------------------------------------------------


class Metadata(StrictModel):
    name: str = Field(max_length=63, pattern=DNS1123_LABEL, description="DNS-1123 label: a-z, 0-9, '-'")
    namespace: str | None = Field(None, pattern=DNS1123_LABEL)
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class Resources(StrictModel):
    gpus_per_trial: int = Field(1, ge=0, le=MAX_GPUS_PER_NODE, description="GPUs per trial (0 = CPU only)")
    num_nodes: int = Field(1, ge=1, le=MAX_NODES, description="nodes per trial (> 1: an Indexed Job, multi-node DDP)")
    cpu: str = Field("8", pattern=QUANTITY, max_length=32, description=f"cores per pod (at most {MAX_CPU:g})")
    memory: str = Field("32Gi", pattern=QUANTITY, max_length=32, description="memory per pod (at most 64Ti)")
    shm_size: str = Field("8Gi", pattern=QUANTITY, max_length=32,
                          description="/dev/shm size for DataLoader workers (at most 64Ti)")
    deadline_seconds: int = Field(6 * 3600, ge=60, le=MAX_SECONDS, description="a trial running longer is stopped")
    retries: int = Field(1, ge=0, le=MAX_RETRIES,
                         description="re-runs of a failed trial (OOM and GPU mismatch never retry)")
    ttl_seconds_after_finished: int = Field(7 * 86400, ge=0, le=MAX_SECONDS,
                                            description="finished Jobs are deleted after this")
    unschedulable_seconds: int = Field(
        600, ge=1, le=MAX_SECONDS,
        description="Kubernetes: a trial whose pod no node can take (no node of its GPU type, or its labels or "
                    "taints rule every node out) for this long ends `unschedulable` with the scheduler's reason, "
                    "so the sweep ends; `sweep resume` runs it again. A pod waiting for GPUs in use waits on")


class Storage(StrictModel):
    """Persistent volumes a trial mounts; without them, scratch volumes that end with the pod."""

    cache_claim: str | None = Field(None, pattern=DNS1123_LABEL,
                                    description="PVC for the Hugging Face cache and the compile cache (/cache)")
    checkpoint_claim: str | None = Field(None, pattern=DNS1123_LABEL,
                                         description="PVC for checkpoints (/checkpoints), so a retried pod resumes")


class Concurrency(StrictModel):
    max_parallel: int = Field(8, ge=1, le=MAX_TRIALS_AT_ONCE,
                              description="trials running at once in the sweep (with spec.queue: trial Jobs in the "
                              "cluster at once, admitted or waiting in the queue)")
    per_gpu_type: int | None = Field(None, ge=1, le=MAX_TRIALS_AT_ONCE,
                                     description="trials running at once per GPU type (with spec.queue: trial Jobs "
                                     "per GPU type)")


class Placement(StrictModel):
    """Whom a trial shares its node with while it is measured."""

    alone: bool = Field(False, description="true: no other trial of the namespace's sweeps runs on a trial's node "
                                           "while it runs (Kubernetes: pod anti-affinity per node; local: one "
                                           "trial at a time, none preparing behind it)")


class Tracking(StrictModel):
    experiment: str | None = Field(None, description="MLflow experiment (default: the sweep's name)")
    uri: str | None = Field(None, description="MLflow tracking URI (default: flag, env, or the local store)")


# The search rule, in one place: the strategies that make their trials while they run ("adaptive": a tuner
# drives them, in this process for the local backend or --direct, else as the operator's tuner Job), each with
# the function that runs one to its end ("module:function", imported only where a search runs, by
# `kubesweep.tune.dispatch.run_search`). A grid or random sweep's plan holds every trial before it starts.
SEARCH_RUNNERS: dict[str, str] = {
    "tune": "kubesweep.tune.driver:run_tune",
    "max_batch": "kubesweep.tune.maxbatch:run_max_batch",
}


class _SearchRule(StrictModel):
    # what every strategy answers about how it runs (no fields: the CRD schema is the strategies' own)
    if TYPE_CHECKING:
        strategy: str

    @property
    def adaptive(self) -> bool:
        """The search makes its trials while it runs (a tune or max-batch search)."""
        return self.strategy in SEARCH_RUNNERS

    @property
    def runner(self) -> str | None:
        """`module:function` that runs the search to its end; None when the plan holds every trial."""
        return SEARCH_RUNNERS.get(self.strategy)


class GridSearch(_SearchRule):
    strategy: Literal["grid"] = "grid"


class RandomSearch(_SearchRule):
    strategy: Literal["random"]
    num_samples: int = Field(ge=1, le=MAX_SEARCH_TRIALS, description="cells drawn from the grid, without replacement")
    seed: int = Field(0, ge=0, le=MAX_SEED)


class Distribution(StrictModel):
    """A typed distribution of one axis: `choice` (values), `uniform`/`loguniform` (low, high), `randint`
    (integers low..high-1), `quniform`/`qloguniform` (low, high rounded to multiples of q)."""

    type: Literal["choice", "uniform", "loguniform", "randint", "quniform", "qloguniform"]
    values: list[Any] | None = Field(None, min_length=1, description="for choice")
    low: float | None = Field(None, ge=-MAX_SEARCH_VALUE, le=MAX_SEARCH_VALUE)
    high: float | None = Field(None, ge=-MAX_SEARCH_VALUE, le=MAX_SEARCH_VALUE)
    q: float | None = Field(None, gt=0, le=MAX_SEARCH_VALUE, description="step, for the quantized types")


class Constraint(StrictModel):
    metric: str
    op: Literal[">=", "<=", ">", "<"]
    value: float = Field(ge=-MAX_SEARCH_VALUE, le=MAX_SEARCH_VALUE)


class TuneSearch(_SearchRule):
    strategy: Literal["tune"]
    algorithm: Literal["optuna", "hyperopt", "random", "grid"] = "optuna"
    scheduler: Literal["asha", "median", "fifo"] = "asha"
    metric: str | list[str] = "samples_per_second"
    mode: Literal["max", "min"] | list[Literal["max", "min"]] = "max"
    num_samples: int = Field(16, ge=1, le=MAX_SEARCH_TRIALS)
    max_concurrent: int = Field(4, ge=1, le=MAX_TRIALS_AT_ONCE)
    space: dict[str, Distribution] = Field(default_factory=dict)
    constraints: list[Constraint] = Field(default_factory=list)
    grace_period: int = Field(1, ge=1, le=MAX_STEPS, description="reports before a scheduler may stop a trial")
    reduction_factor: int = Field(2, ge=2, le=1000, description="ASHA: a rung keeps the best 1/reduction_factor")
    seed: int = Field(0, ge=0, le=MAX_SEED)

    @property
    def metrics(self) -> list[str]:
        return self.metric if isinstance(self.metric, list) else [self.metric]

    @property
    def modes(self) -> list[str]:
        return list(self.mode) if isinstance(self.mode, list) else [self.mode] * len(self.metrics)


class MaxBatchSearch(_SearchRule):
    """Per GPU type and precision of the matrix, the largest batch size that fits, by bisection on OOM."""

    strategy: Literal["max_batch"]
    low: int = Field(1, ge=1, le=MAX_BATCH_SIZE, description="smallest batch size tried")
    high: int = Field(4096, ge=1, le=MAX_BATCH_SIZE, description="largest batch size tried")
    step: int = Field(1, ge=1, le=MAX_BATCH_SIZE, description="answer is a multiple of step (8: 8, 16, 24, ...)")
    probes: int = Field(1, ge=1, le=8, description="batch sizes tried at once per cell (k-ary search)")
    max_steps: int = Field(3, ge=1, le=MAX_STEPS, description="optimizer steps a probe trial runs")


Search = Annotated[GridSearch | RandomSearch | TuneSearch | MaxBatchSearch, Field(discriminator="strategy")]

# `repeat_until` runs as a search of its own (it adds repeats while the sweep runs)
REPEATS_RUNNER = "kubesweep.tune.repeats:run_repeats"
MAX_REPEATS = 100


def _percent(value: Any) -> Any:
    """`3%` or 3 -> 3.0 (percent of the mean)."""
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            return float(value.strip()[:-1])
        except ValueError:
            return value
    return value


class RepeatUntil(StrictModel):
    """After `spec.repeats` runs, repeat each cell again until the 95% interval of its `metric` is within `target`
    of its mean, or it has run `max` times (`kubesweep.tune.repeats`)."""

    target: Annotated[float, BeforeValidator(_percent)] = Field(
        3.0, ge=0.1, le=50, description="the 95% half-width to reach, in percent of the mean (3%: within ±3%)")
    max: int = Field(10, ge=2, le=MAX_REPEATS, description="runs of a cell at most")
    metric: Literal[REPEAT_METRICS] = Field(  # type: ignore[valid-type]
        "samples_per_s", description="what the interval is of (samples_per_s: training or inference throughput)")


@dataclass(frozen=True)
class SequentialRepeats:
    """The rule as it runs: `min` (spec.repeats) runs of every cell, then more up to `max` until the 95% interval
    of `metric` is within ±`target` percent."""

    min: int = 3
    max: int = 10
    target: float = 3.0
    metric: str = "samples_per_s"


class SweepSpec(StrictModel):
    image: str | None = Field(None, description="a key of `images`, or a full reference pinned by @sha256")
    images: dict[str, str] = Field(default_factory=dict, description="image key → digest-pinned reference")
    job: JobConfig = Field(default_factory=JobConfig, description="settings shared by every trial")
    matrix: Matrix = Field(default_factory=Matrix)  # type: ignore[valid-type]
    include: list[Cell] = Field(default_factory=list, max_length=MAX_AXIS_VALUES,  # type: ignore[valid-type]
                                description="extra cells added to the product")
    exclude: list[Cell] = Field(default_factory=list, max_length=MAX_AXIS_VALUES,  # type: ignore[valid-type]
                                description="rules: cells matching all keys are dropped")
    repeats: int = Field(1, ge=1, le=MAX_REPEATS,
                         description="runs of each cell (with repeat_until: the runs every cell gets first)")
    repeat_until: RepeatUntil | None = Field(
        None, description="repeat each cell beyond `repeats` until the 95% interval of its metric is within target")
    target_accuracy: float | None = Field(
        None, ge=0.0, le=1.0,
        description="dev accuracy that time-to-accuracy measures the time to in the sweep's results, report and "
                    "answer (what its model reaches in its epochs); `--target-accuracy` overrides it; default 0.9")
    resources: Resources = Field(default_factory=Resources)
    concurrency: Concurrency = Field(default_factory=Concurrency)
    placement: Placement = Field(default_factory=Placement)
    tracking: Tracking = Field(default_factory=Tracking)
    storage: Storage = Field(default_factory=Storage)
    service_account: str | None = Field(None, pattern=DNS1123_LABEL, description="ServiceAccount of trial pods")
    search: Search = Field(default_factory=GridSearch)
    suspend: bool = Field(False, description="true: start no new trials")
    warm_pods: bool = Field(True, description="Kubernetes: run the one-node trials in warm pods, one per GPU "
                                              "slot, each running the sweep's trials one after another (a fresh "
                                              "process each, imports and compile cache kept); false: a pod per "
                                              "trial")
    queue: str | None = Field(None, max_length=63, pattern=DNS1123_LABEL,
                              description="Kueue LocalQueue of the sweep's namespace: trial Jobs are created "
                                          "suspended and run when Kueue admits them")
    priority_class: str | None = Field(None, max_length=63, pattern=DNS1123_LABEL,
                                       description="Kueue WorkloadPriorityClass of the trials (needs spec.queue)")


    @property
    def tta_target(self) -> float:
        """The dev accuracy time-to-accuracy is measured to: `target_accuracy`, else the default (0.9)."""
        return self.target_accuracy if self.target_accuracy is not None else DEFAULT_TARGET_ACCURACY

    @property
    def repeat_rule(self) -> SequentialRepeats | None:
        """The sequential repeats rule (`repeat_until`, with `repeats` its min), None for a fixed count."""
        until = self.repeat_until
        if until is None:
            return None
        return SequentialRepeats(self.repeats, max(until.max, self.repeats), until.target, until.metric)

    @property
    def first_repeats(self) -> int:
        """Repeats of each cell the plan holds from the start: `repeats`."""
        return self.repeats

    @property
    def most_repeats(self) -> int:
        """Repeats of each cell at most: `repeats`, or repeat_until's max."""
        rule = self.repeat_rule
        return rule.max if rule is not None else self.repeats

    @property
    def search_title(self) -> str:
        """`max_batch search`, or `sequential repeats` (a grid or random sweep with `repeat_until`)."""
        return "sequential repeats" if self.repeat_rule is not None else f"{self.search.strategy} search"

    @property
    def adaptive(self) -> bool:
        """The sweep makes trials while it runs: a tune or max-batch search, or sequential repeats."""
        return self.runner is not None

    @property
    def runner(self) -> str | None:
        """`module:function` that drives the sweep to its end; None when the plan holds every trial."""
        return self.search.runner or (REPEATS_RUNNER if self.repeat_rule is not None else None)


class Sweep(StrictModel):
    apiVersion: Literal["kubesweep.io/v1alpha1"] = "kubesweep.io/v1alpha1"
    kind: Literal["Sweep"] = "Sweep"
    metadata: Metadata
    spec: SweepSpec = Field(default_factory=SweepSpec)
    _source: str = PrivateAttr("<input>")
    _warnings: list[Problem] = PrivateAttr(default_factory=list)
    _lines: LineMap = PrivateAttr(default_factory=LineMap)  # field path -> its line in the source, or its --set
    _sets: list[str] = PrivateAttr(default_factory=list)  # the --set options applied to the source, as typed

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def warnings(self) -> list[str]:
        """What the spec allows but a person likely did not mean, as `source:line: path: message` lines."""
        return SpecError(self._source, self._warnings).format().splitlines() if self._warnings else []

    def problem(self, path: tuple[str | int, ...], message: str) -> Problem:
        """A problem at `path` of this spec, with its line (or its nearest parent's) in the source text when it was
        parsed from one, or the command-line option (`--set`) that set its value."""
        return self._lines.problem(path, message)

    @property
    def source(self) -> str:
        return self._source

    @property
    def set_options(self) -> list[str]:
        """The `--set` options applied to the source's values, as words of a command (`--set`, `job.max_steps=5`)."""
        return [word for text in self._sets for word in ("--set", text)]

    @property
    def base_dir(self) -> Path:
        """Directory that relative paths in the spec (dataset, model) are resolved against."""
        return Path(self._source).parent if self._source not in ("<input>", "-") else Path.cwd()

    @property
    def experiment(self) -> str:
        return self.spec.tracking.experiment or self.name

    def image_reference(self) -> str | None:
        """`spec.image` resolved: a key of `spec.images`, else a key of the image lock, else a reference."""
        image = self.spec.image
        if not image or image in self.spec.images:
            return self.spec.images.get(image, image) if image else None
        if is_image_key(image):
            return locked_reference(image) or image
        return image

    def to_document(self) -> dict[str, Any]:
        """The sweep as a YAML/JSON-ready mapping (the custom resource body)."""
        return self.model_dump(mode="json", by_alias=True, exclude_defaults=False)




def is_image_key(image: str) -> bool:
    """A bare name (`torch-2.8-cu128`), not a reference (which has a registry path, a tag or a digest)."""
    return not any(c in image for c in "/:@")
