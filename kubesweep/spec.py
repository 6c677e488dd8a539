"""The `Sweep` document: one typed, validated schema for spec files, the CLI and the custom resource.

    apiVersion: kubesweep.io/v1alpha1
    kind: Sweep
    metadata: {name: bert-gpu-matrix}
    spec: {image, images, job, matrix, include, exclude, repeats, resources, concurrency, tracking, search}

`load_sweep_file` and `parse_sweep` turn input into a `Sweep` or raise `SpecError`, whose message names the
file, the line, the field path and what was expected, one problem per line:

    sweeps/x.yaml:12: spec.matrix.precision[2]: 'bf61' is not one of fp32, tf32, fp16, bf16

Reading the file (its size, its YAML, its lines) is `kubesweep.specfile`'s. Values are validated strictly: a value
has its field's type (`"16"` is not an integer, `16.0` is not one either, `"true"` is not a boolean).
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BeforeValidator, Field, PrivateAttr, ValidationError, create_model
from pydantic.fields import FieldInfo

from kubesweep.base import StrictModel
from kubesweep.gpus import Catalog, load_catalog
from kubesweep.jobs.config import JobConfig, normalize_compile
from kubesweep.specfile import MAX_DEPTH, LineMap, load_document, read_spec_text, too_deep
from kubesweep.specfile import Problem as Problem
from kubesweep.specfile import SpecError as SpecError

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
    deadline_seconds: int = Field(6 * 3600, ge=60, description="a trial running longer is stopped")
    retries: int = Field(1, ge=0, description="re-runs of a failed trial (OOM and GPU mismatch never retry)")
    ttl_seconds_after_finished: int = Field(7 * 86400, ge=0, description="finished Jobs are deleted after this")


class Storage(StrictModel):
    """Persistent volumes a trial mounts; without them, scratch volumes that end with the pod."""

    cache_claim: str | None = Field(None, pattern=DNS1123_LABEL,
                                    description="PVC for the Hugging Face cache and the compile cache (/cache)")
    checkpoint_claim: str | None = Field(None, pattern=DNS1123_LABEL,
                                         description="PVC for checkpoints (/checkpoints), so a retried pod resumes")


class Concurrency(StrictModel):
    max_parallel: int = Field(8, ge=1, description="trials running at once in the sweep (with spec.queue: trial "
                                                   "Jobs in the cluster at once, admitted or waiting in the queue)")
    per_gpu_type: int | None = Field(None, ge=1, description="trials running at once per GPU type (with "
                                                             "spec.queue: trial Jobs per GPU type)")


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
    num_samples: int = Field(ge=1, description="cells drawn from the grid, without replacement")
    seed: int = 0


class Distribution(StrictModel):
    """A typed distribution of one axis: `choice` (values), `uniform`/`loguniform` (low, high), `randint`
    (integers low..high-1), `quniform`/`qloguniform` (low, high rounded to multiples of q)."""

    type: Literal["choice", "uniform", "loguniform", "randint", "quniform", "qloguniform"]
    values: list[Any] | None = Field(None, min_length=1, description="for choice")
    low: float | None = None
    high: float | None = None
    q: float | None = Field(None, gt=0, description="step, for the quantized types")


class Constraint(StrictModel):
    metric: str
    op: Literal[">=", "<=", ">", "<"]
    value: float


class TuneSearch(_SearchRule):
    strategy: Literal["tune"]
    algorithm: Literal["optuna", "hyperopt", "random", "grid"] = "optuna"
    scheduler: Literal["asha", "median", "fifo"] = "asha"
    metric: str | list[str] = "samples_per_second"
    mode: Literal["max", "min"] | list[Literal["max", "min"]] = "max"
    num_samples: int = Field(16, ge=1)
    max_concurrent: int = Field(4, ge=1)
    space: dict[str, Distribution] = Field(default_factory=dict)
    constraints: list[Constraint] = Field(default_factory=list)
    grace_period: int = Field(1, ge=1, description="reports before a scheduler may stop a trial")
    reduction_factor: int = Field(2, ge=2, description="ASHA: a rung keeps the best 1/reduction_factor")
    seed: int = 0

    @property
    def metrics(self) -> list[str]:
        return self.metric if isinstance(self.metric, list) else [self.metric]

    @property
    def modes(self) -> list[str]:
        return list(self.mode) if isinstance(self.mode, list) else [self.mode] * len(self.metrics)


class MaxBatchSearch(_SearchRule):
    """Per GPU type and precision of the matrix, the largest batch size that fits, by bisection on OOM."""

    strategy: Literal["max_batch"]
    low: int = Field(1, ge=1, description="smallest batch size tried")
    high: int = Field(4096, ge=1, description="largest batch size tried")
    step: int = Field(1, ge=1, description="answer is a multiple of step (8: 8, 16, 24, ...)")
    probes: int = Field(1, ge=1, le=8, description="batch sizes tried at once per cell (k-ary search)")
    max_steps: int = Field(3, ge=1, description="optimizer steps a probe trial runs")


Search = Annotated[GridSearch | RandomSearch | TuneSearch | MaxBatchSearch, Field(discriminator="strategy")]


class SweepSpec(StrictModel):
    image: str | None = Field(None, description="a key of `images`, or a full reference pinned by @sha256")
    images: dict[str, str] = Field(default_factory=dict, description="image key → digest-pinned reference")
    job: JobConfig = Field(default_factory=JobConfig, description="settings shared by every trial")
    matrix: Matrix = Field(default_factory=Matrix)  # type: ignore[valid-type]
    include: list[Cell] = Field(default_factory=list, max_length=MAX_AXIS_VALUES,  # type: ignore[valid-type]
                                description="extra cells added to the product")
    exclude: list[Cell] = Field(default_factory=list, max_length=MAX_AXIS_VALUES,  # type: ignore[valid-type]
                                description="rules: cells matching all keys are dropped")
    repeats: int = Field(1, ge=1, le=100)
    resources: Resources = Field(default_factory=Resources)
    concurrency: Concurrency = Field(default_factory=Concurrency)
    tracking: Tracking = Field(default_factory=Tracking)
    storage: Storage = Field(default_factory=Storage)
    service_account: str | None = Field(None, pattern=DNS1123_LABEL, description="ServiceAccount of trial pods")
    search: Search = Field(default_factory=GridSearch)
    suspend: bool = Field(False, description="true: start no new trials")
    queue: str | None = Field(None, max_length=63, pattern=DNS1123_LABEL,
                              description="Kueue LocalQueue of the sweep's namespace: trial Jobs are created "
                                          "suspended and run when Kueue admits them")
    priority_class: str | None = Field(None, max_length=63, pattern=DNS1123_LABEL,
                                       description="Kueue WorkloadPriorityClass of the trials (needs spec.queue)")


class Sweep(StrictModel):
    apiVersion: Literal["kubesweep.io/v1alpha1"] = "kubesweep.io/v1alpha1"
    kind: Literal["Sweep"] = "Sweep"
    metadata: Metadata
    spec: SweepSpec = Field(default_factory=SweepSpec)
    _source: str = PrivateAttr("<input>")
    _warnings: list[Problem] = PrivateAttr(default_factory=list)
    _lines: dict[tuple[str | int, ...], int] = PrivateAttr(default_factory=dict)  # field path -> line in the source

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def warnings(self) -> list[str]:
        """What the spec allows but a person likely did not mean, as `source:line: path: message` lines."""
        return SpecError(self._source, self._warnings).format().splitlines() if self._warnings else []

    def problem(self, path: tuple[str | int, ...], message: str) -> Problem:
        """A problem at `path` of this spec, with its line (or its nearest parent's) in the source text when it was
        parsed from one."""
        ends = (path[:end] for end in range(len(path), -1, -1))
        return Problem(path, message, next((self._lines[p] for p in ends if p in self._lines), None))

    @property
    def source(self) -> str:
        return self._source

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
        if _is_image_key(image):
            from kubesweep.images import locked_reference

            return locked_reference(image) or image
        return image

    def to_document(self) -> dict[str, Any]:
        """The sweep as a YAML/JSON-ready mapping (the custom resource body)."""
        return self.model_dump(mode="json", by_alias=True, exclude_defaults=False)


# ---------------------------------------------------------------------------------------------------------
# Errors


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _fields_at(model: type[StrictModel], path: Sequence[str | int]) -> list[str] | None:
    """The field names of the model found at `path` from `model`, for 'did you mean' hints."""
    current: Any = model
    for part in path:
        if isinstance(part, int) or not (isinstance(current, type) and issubclass(current, StrictModel)):
            continue
        info = current.model_fields.get(part)
        if info is None:
            return None
        current = _unwrap_model(info.annotation)
    if isinstance(current, type) and issubclass(current, StrictModel):
        return list(current.model_fields)
    return None


def _unwrap_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, StrictModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _unwrap_model(arg)
        if found is not None:
            return found
    return None


def _message(error: Mapping[str, Any], path: tuple[str | int, ...]) -> str:
    kind, ctx, value = error["type"], error.get("ctx") or {}, error.get("input")
    if kind == "literal_error":
        options = re.findall(r"'([^']*)'", str(ctx.get("expected", ""))) or [str(ctx.get("expected"))]
        return f"{_short(value)} is not one of {', '.join(options)}"
    if kind == "extra_forbidden":
        known = _fields_at(Sweep, path[:-1]) or []
        hint = difflib.get_close_matches(str(path[-1]), known, n=1)
        suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
        listing = f" (expected one of: {', '.join(known)})" if known and not hint else ""
        return f"unknown field{suggestion}{listing}"
    if kind == "missing":
        return "required field is missing"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return f"expected an integer, got {_short(value)}"
    if kind in ("float_parsing", "float_type"):
        return f"expected a number, got {_short(value)}"
    if kind in ("bool_parsing", "bool_type"):
        return f"expected true or false, got {_short(value)}"
    if kind == "string_type":
        return f"expected a string, got {_short(value)}"
    if kind in ("list_type", "tuple_type"):
        return f"expected a list, got {_short(value)}"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return f"expected a mapping, got {_short(value)}"
    if kind == "too_short":
        return "must not be empty"
    if kind == "string_too_long":
        return f"{_short(value)} is longer than {ctx.get('max_length')} characters"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        op = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}[kind]
        bound = next(iter(ctx.values()), "?")
        return f"must be {op} {bound}, got {_short(value)}"
    if kind == "string_pattern_mismatch":
        if ctx.get("pattern") == DNS1123_LABEL:
            return f"{_short(value)} is not a DNS-1123 label (lowercase letters, digits and '-')"
        if ctx.get("pattern") == QUANTITY:
            return f"{_short(value)} is not a Kubernetes quantity (e.g. 8, 500m, 32Gi)"
        return f"{_short(value)} does not match {ctx.get('pattern')}"
    if kind == "union_tag_invalid":
        return f"{ctx.get('tag')!r} is not one of {str(ctx.get('expected_tags')).replace(chr(39), '')}"
    if kind == "union_tag_not_found":
        return f"'{ctx.get('discriminator', 'strategy')}' is required"
    msg = str(error.get("msg", kind)).removeprefix("Value error, ")
    scalar = isinstance(value, (str, int, float, bool)) or value is None
    return f"{msg}, got {_short(value)}" if kind == "value_error" and scalar else msg


def _clean_path(loc: Sequence[str | int], data: Any) -> tuple[str | int, ...]:
    """Drop pydantic's union/validator tags from `loc`, keeping only keys that exist in the input data."""
    path: list[str | int] = []
    current = data
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(current, Mapping):
            if part in current:
                path.append(part)
                current = current[part]
            elif last or (isinstance(part, str) and not _is_tag(part)):
                path.append(part)
                current = None
        elif isinstance(current, list) and isinstance(part, int) and 0 <= part < len(current):
            path.append(part)
            current = current[part]
        elif current is None and not _is_tag(str(part)):
            path.append(part)
    return tuple(path)


def _is_tag(part: str) -> bool:
    return (
        "[" in part
        or part in ("int", "str", "bool", "float", "list", "dict", "none", "function-after", "function-before")
        or part in ("grid", "random", "tune", "max_batch")
    )


# ---------------------------------------------------------------------------------------------------------
# Loading


def load_sweep_file(
    path: str | Path, *, allow_unpinned: bool = False, catalog: Catalog | None = None
) -> Sweep:
    """The spec file at `path` as a `Sweep`; `SpecError` when it cannot be read (see `kubesweep.specfile`) or
    is not valid."""
    source = str(path)
    text = read_spec_text(path)
    return parse_sweep_text(text, source=source, allow_unpinned=allow_unpinned, catalog=catalog)


def parse_sweep_text(
    text: str, *, source: str = "<input>", allow_unpinned: bool = False, catalog: Catalog | None = None
) -> Sweep:
    data, lines = load_document(text, source)
    return parse_sweep(data, source=source, lines=lines, allow_unpinned=allow_unpinned, catalog=catalog)


def parse_sweep(
    data: Any,
    *,
    source: str = "<input>",
    lines: LineMap | None = None,
    allow_unpinned: bool = False,
    catalog: Catalog | None = None,
) -> Sweep:
    """Validate a mapping (a parsed file, a custom resource's body) into a `Sweep`, or raise `SpecError`.

    Strictly: a value of another type than its field's is an error, never converted (`"16"` for an integer).
    """
    lines = lines if lines is not None else LineMap()
    if not isinstance(data, Mapping):
        raise SpecError(source, [Problem((), f"expected a mapping with apiVersion, kind, metadata and spec, "
                                              f"got {type(data).__name__}", 1)])
    deep = too_deep(data)
    if deep is not None:
        raise SpecError(source, [Problem(deep, f"nested more than {MAX_DEPTH} levels deep; a sweep spec needs a "
                                               "few", lines.line(deep))])
    try:
        sweep = Sweep.model_validate(data, strict=True)
    except ValidationError as exc:
        problems: dict[tuple[str | int, ...], Problem] = {}
        for error in exc.errors():
            path = _clean_path(error["loc"], data)
            if error["type"] == "union_tag_invalid":
                path = (*path, str((error.get("ctx") or {}).get("discriminator", "")).strip("'"))
            problems.setdefault(path, Problem(path, _message(error, path), lines.line(path)))
        raise SpecError(source, sorted(problems.values(), key=lambda p: p.line or 0)) from None
    sweep._source = source
    sweep._lines = dict(lines.lines)
    sweep._warnings = [Problem(w.path, w.message, lines.line(w.path)) for w in _warnings_of(sweep)]
    problems_list = list(_semantic_problems(sweep, catalog or load_catalog(), allow_unpinned))
    if problems_list:
        raise SpecError(source, [Problem(p.path, p.message, lines.line(p.path)) for p in problems_list])
    return sweep


def _warnings_of(sweep: Sweep) -> list[Problem]:
    """What is allowed but likely not meant: an `include` cell that an `exclude` rule matches (it runs: includes
    are added after the excludes)."""
    warnings = []
    excludes = [set_axes(cell) for cell in sweep.spec.exclude]
    for i, cell in enumerate(sweep.spec.include):
        axes = set_axes(cell)
        for j, rule in enumerate(excludes):
            if all(k in axes and axes[k] == v for k, v in rule.items()):
                warnings.append(Problem(("spec", "include", i),
                                        f"{_cell_text(axes)} matches exclude[{j}] ({_cell_text(rule)}) and runs "
                                        "anyway: include cells are added after the excludes"))
    warnings += _fine_bucket_warnings(sweep)
    return warnings


FINE_BUCKETS = 16  # bucketed padding with a finer multiple, from random init: batches of one length class


def _fine_bucket_warnings(sweep: Sweep) -> list[Problem]:
    """A random-init model trained on batches of one fine length class (bucketed padding, multiple < 16) may stay
    at chance accuracy: on SST-2 at multiple 8, 41% of the batches hold only phrases of 8 tokens or fewer, 61%
    of them positive, and bert-base from random init learned that prior and stayed there in some runs
    (docs/benchmarks.md, "What padding costs in accuracy")."""
    job = sweep.spec.job.model_dump(exclude_none=True)
    matrix = {k: list(v) for k, v in set_axes(sweep.spec.matrix).items()}

    def values(cell: Mapping[str, Any], key: str, default: Any) -> list[Any]:
        if key in cell:
            return [cell[key]]
        return matrix.get(key, [job.get(key, default)])

    places: list[tuple[tuple[str | int, ...], Mapping[str, Any]]] = [(("spec", "job"), {})]
    places += [(("spec", "include", i), set_axes(cell)) for i, cell in enumerate(sweep.spec.include)]
    out = []
    for path, cell in places:
        bucketed = "bucketed" in values(cell, "padding", "max_length")
        fine = [m for m in values(cell, "bucket_multiple", 16) if isinstance(m, int) and m < FINE_BUCKETS]
        if bucketed and fine and True in values(cell, "random_init", False):
            out.append(Problem(path, f"bucketed padding with bucket_multiple {min(fine)} from random init: batches "
                                     "of one fine length class can keep the model at chance accuracy (use 16 or "
                                     "more for runs whose accuracy matters)"))
    return out


def _cell_text(axes: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in axes.items())


def _same_key(value: Any) -> Any:
    """A key equal for values `==` calls equal (1, 1.0 and true; the same mapping in any order)."""
    try:
        hash(value)
        return value
    except TypeError:
        return ("unhashable", json.dumps(value, sort_keys=True, default=str))


_SUFFIX = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def quantity(text: str) -> float:
    """A Kubernetes quantity (the QUANTITY pattern) as a number: "500m" → 0.5, "32Gi" → 34359738368."""
    number = text.rstrip("mkMGTPEi")
    return float(number) * _SUFFIX[text[len(number):]]


def _size_problems(sweep: Sweep) -> Iterable[Problem]:
    """What would not fit where it travels: a trial Job's annotation, a tuner Job's, the Sweep resource."""
    doc = sweep.to_document()
    job = len(json.dumps(doc["spec"]["job"]))
    if job > MAX_JOB_BYTES:
        yield Problem(("spec", "job"), f"the job settings are {job / 1024:,.0f} KiB as JSON, over "
                                       f"{MAX_JOB_BYTES // 1024} KiB: each trial Job carries them in an annotation")
    size = len(json.dumps(doc))
    for limit, adaptive, where in ((MAX_SEARCH_BYTES, True, "its tuner Job carries it in an annotation"),
                                   (MAX_DOCUMENT_BYTES, False, "it is stored as one Kubernetes object")):
        if size > limit and (sweep.spec.search.adaptive or not adaptive):
            yield Problem(("spec",), f"the sweep is {size / 1024:,.0f} KiB as JSON, over {limit // 1024} KiB: "
                                     f"{where}")
            return


def _resource_problems(spec: SweepSpec) -> Iterable[Problem]:
    res = spec.resources
    for field_name, limit, shown in (("cpu", MAX_CPU, f"{MAX_CPU:g} cores"), ("memory", MAX_MEMORY, "64Ti"),
                                     ("shm_size", MAX_MEMORY, "64Ti")):
        value = getattr(res, field_name)
        if quantity(value) > limit:
            yield Problem(("spec", "resources", field_name), f"{value} is more than a pod can have (at most {shown})")


def _semantic_problems(sweep: Sweep, catalog: Catalog, allow_unpinned: bool) -> Iterable[Problem]:
    spec = sweep.spec
    matrix_axes = set_axes(spec.matrix)
    for axis, values in matrix_axes.items():
        first: dict[Any, int] = {}  # one pass: a value's key → where it was first listed
        for i, value in enumerate(values):
            j = first.setdefault(_same_key(value), i)
            if j != i:
                same = " (true is torch.compile's mode 'default')" if axis == "compile" and value == "default" else ""
                yield Problem(("spec", "matrix", axis, i),
                              f"{_short(value)} is the same setting as {axis}[{j}]{same}; list each once")
    yield from _resource_problems(spec)
    yield from _size_problems(sweep)
    if spec.priority_class and not spec.queue:
        yield Problem(("spec", "priority_class"), "a Kueue priority class needs spec.queue (the LocalQueue whose "
                                                  "ClusterQueue orders workloads by it)")
    for i, gpu in enumerate(matrix_axes.get("gpu", [])):
        if gpu not in catalog:
            yield _unknown_gpu(("spec", "matrix", "gpu", i), gpu, catalog)
    for kind in ("include", "exclude"):
        for i, cell in enumerate(getattr(spec, kind)):
            axes = set_axes(cell)
            if not axes:
                yield Problem(("spec", kind, i), "an empty rule; name at least one axis")
            if "gpu" in axes and axes["gpu"] not in catalog:
                yield _unknown_gpu(("spec", kind, i, "gpu"), axes["gpu"], catalog)
            if kind == "exclude":
                for axis in axes:
                    if axis not in matrix_axes:
                        known = ", ".join(matrix_axes) or "none"
                        yield Problem(("spec", kind, i, axis), f"not a matrix axis (axes: {known})")
    if isinstance(spec.search, RandomSearch) and not matrix_axes:
        yield Problem(("spec", "search", "strategy"), "random search draws from the matrix, which is empty")
    if isinstance(spec.search, TuneSearch):
        yield from _tune_problems(spec.search, matrix_axes, catalog)
    if isinstance(spec.search, MaxBatchSearch):
        yield from _max_batch_problems(spec.search, matrix_axes)
    if spec.image:
        from kubesweep.images import LockError, load_lock, lock_keys

        if spec.image not in spec.images and _is_image_key(spec.image):
            try:  # a key of the image lock; whether it is built yet is checked where an image is needed
                if spec.image in load_lock().images:
                    return
            except LockError as exc:
                yield Problem(("spec", "image"), str(exc))
                return
        try:
            ref = sweep.image_reference() or ""
        except LockError as exc:
            yield Problem(("spec", "image"), str(exc))
            return
        if ref == spec.image and _is_image_key(ref) and (spec.images or not allow_unpinned):
            yield Problem(("spec", "image"), f"{_short(ref)} is not a key of spec.images ({', '.join(spec.images)}) "
                                             f"nor of the image lock ({', '.join(lock_keys())}) nor an image reference")
            return
        if not allow_unpinned and not DIGEST_RE.match(ref):
            path: tuple[str | int, ...] = ("spec", "images", spec.image) if spec.image in spec.images else (
                "spec", "image")
            yield Problem(path, f"{_short(ref)} is not pinned by digest (expected NAME@sha256:<64 hex>; "
                                "pass --allow-unpinned to accept a tag)")


# Tune metrics: a name here (see kubesweep.tune.metrics for what each reads) or an MLflow metric key with "/".
TUNE_METRICS: tuple[str, ...] = ("samples_per_second", "samples_per_s", "tokens_per_s", "accuracy", "eval_loss",
                                 "train_loss", "step_time_p50_s", "train_s", "inference_samples_per_s",
                                 "latency_p99_s")
_INT_TYPES = ("randint",)
_NUMERIC_TYPES = ("uniform", "loguniform", "randint", "quniform", "qloguniform")


def _tune_problems(search: TuneSearch, matrix_axes: Mapping[str, Any], catalog: Catalog) -> Iterable[Problem]:
    base = ("spec", "search")
    if not search.space:
        yield Problem((*base, "space"), "a tune search needs at least one axis in space")
    for axis, dist in search.space.items():
        path = (*base, "space", axis)
        if axis not in AXES:
            hint = difflib.get_close_matches(axis, AXES, n=1)
            known = f"did you mean {hint[0]!r}?" if hint else f"axes: {', '.join(AXES)}"
            yield Problem(path, f"not an axis; {known}")
            continue
        if axis in matrix_axes:
            yield Problem(path, f"{axis!r} is also a matrix axis; a tune search draws every axis from space, "
                                "and takes the other settings from job and resources")
        yield from _distribution_problems(path, axis, dist, catalog)
    metrics, modes = search.metrics, search.modes
    if isinstance(search.metric, list) != isinstance(search.mode, list) and isinstance(search.mode, list):
        yield Problem((*base, "mode"), "a list of modes needs a list of metrics")
    elif len(metrics) != len(modes):
        yield Problem((*base, "mode"), f"{len(modes)} modes for {len(metrics)} metrics; give one mode per metric")
    if not metrics:
        yield Problem((*base, "metric"), "must not be empty")
    for i, name in enumerate(metrics):
        if name not in TUNE_METRICS and "/" not in name:
            where = (*base, "metric", i) if isinstance(search.metric, list) else (*base, "metric")
            yield Problem(where, f"{_short(name)} is not a tune metric (one of {', '.join(TUNE_METRICS)}, "
                                 "or an MLflow metric key such as result/tokens_per_s)")
    if len(set(metrics)) != len(metrics):
        yield Problem((*base, "metric"), "a metric is listed twice")
    if len(metrics) > 1 and search.algorithm != "optuna":
        yield Problem((*base, "algorithm"), f"multi-objective search ({len(metrics)} metrics) needs algorithm "
                                            f"optuna, got {search.algorithm!r}")
    for i, constraint in enumerate(search.constraints):
        if constraint.metric not in TUNE_METRICS and "/" not in constraint.metric:
            yield Problem((*base, "constraints", i, "metric"),
                          f"{_short(constraint.metric)} is not a tune metric (one of {', '.join(TUNE_METRICS)}, "
                          "or an MLflow metric key)")
    if search.algorithm == "grid":
        for axis, dist in search.space.items():
            if dist.type != "choice":
                yield Problem((*base, "space", axis, "type"),
                              f"algorithm grid needs choice distributions, got {dist.type!r}")
    if search.algorithm == "hyperopt":
        import importlib.util

        if importlib.util.find_spec("hyperopt") is None:
            yield Problem((*base, "algorithm"), "hyperopt is not installed (pip install hyperopt); "
                                                "use optuna, random or grid")


def _distribution_problems(path: tuple[str | int, ...], axis: str, dist: Distribution,
                           catalog: Catalog) -> Iterable[Problem]:
    if dist.type == "choice":
        if dist.values is None:
            yield Problem((*path, "values"), "choice needs values")
            return
        for extra in ("low", "high", "q"):
            if getattr(dist, extra) is not None:
                yield Problem((*path, extra), f"choice takes values, not {extra}")
        annotation, _ = AXIS_TYPES[axis]
        from pydantic import TypeAdapter

        adapter: TypeAdapter[Any] = TypeAdapter(annotation)
        for i, value in enumerate(dist.values):
            try:
                adapter.validate_python(value, strict=True)
            except ValidationError as exc:
                first = exc.errors()[0]
                yield Problem((*path, "values", i), _message(first, (*path, "values", i)))
            if axis == "gpu" and isinstance(value, str) and value not in catalog:
                yield _unknown_gpu((*path, "values", i), value, catalog)
        return
    if dist.values is not None:
        yield Problem((*path, "values"), f"{dist.type} takes low and high, not values")
    if dist.low is None or dist.high is None:
        yield Problem(path, f"{dist.type} needs low and high")
        return
    if dist.low >= dist.high:
        yield Problem((*path, "high"), f"must be > low ({dist.low:g}), got {dist.high:g}")
    if dist.type in ("loguniform", "qloguniform") and dist.low <= 0:
        yield Problem((*path, "low"), f"{dist.type} needs low > 0, got {dist.low:g}")
    if dist.type.startswith("q") and dist.q is None:
        yield Problem((*path, "q"), f"{dist.type} needs q (the step)")
    if not dist.type.startswith("q") and dist.q is not None:
        yield Problem((*path, "q"), f"q is for quniform and qloguniform, not {dist.type}")
    kind = _axis_kind(axis)
    if kind not in ("int", "float"):
        yield Problem((*path, "type"), f"axis {axis!r} is not numeric; use choice")
    elif kind == "int" and dist.type in ("uniform", "loguniform"):
        yield Problem((*path, "type"), f"axis {axis!r} takes integers; use randint, quniform or qloguniform")
    elif kind == "int" and dist.q is not None and dist.q != int(dist.q):
        yield Problem((*path, "q"), f"axis {axis!r} takes integers; q must be a whole number, got {dist.q:g}")
    elif kind == "int" and (dist.low != int(dist.low) or dist.high != int(dist.high)):
        yield Problem(path, f"axis {axis!r} takes integers; low and high must be whole numbers")


def _axis_kind(axis: str) -> str:
    """'int', 'float' or 'other': what numeric distributions an axis accepts."""
    annotation, _ = AXIS_TYPES[axis]
    text = str(annotation)
    if "bool" in text or "str" in text or "Literal" in text or "dict" in text or "list" in text:
        return "other"
    if "float" in text:
        return "float"
    if "int" in text:
        return "int"
    return "other"


def axis_is_int(axis: str) -> bool:
    return _axis_kind(axis) == "int"


def _max_batch_problems(search: MaxBatchSearch, matrix_axes: Mapping[str, Any]) -> Iterable[Problem]:
    if search.low > search.high:
        yield Problem(("spec", "search", "high"), f"must be >= low ({search.low}), got {search.high}")
    if "batch_size" in matrix_axes:
        yield Problem(("spec", "matrix", "batch_size"), "a max_batch search chooses the batch size; "
                                                        "leave batch_size out of the matrix")
    if search.step > search.high:
        yield Problem(("spec", "search", "step"), f"must be <= high ({search.high}), got {search.step}")


def _is_image_key(image: str) -> bool:
    """A bare name (`torch-2.8-cu128`), not a reference (which has a registry path, a tag or a digest)."""
    return not any(c in image for c in "/:@")


def _unknown_gpu(path: tuple[str | int, ...], gpu: str, catalog: Catalog) -> Problem:
    hint = [n for n in catalog.names if n.startswith(gpu)][:1] or difflib.get_close_matches(gpu, catalog.names, n=1)
    suggestion = f"; did you mean {hint[0]!r}?" if hint else f"; known: {', '.join(catalog.names)}"
    return Problem(path, f"{_short(gpu)} is not a GPU type in the catalog{suggestion}")
