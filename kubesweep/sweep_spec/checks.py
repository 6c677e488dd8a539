"""What the schema cannot say of a `Sweep`: its semantic problems (duplicate values, unknown GPU types, sizes, search
settings, images) and its warnings (what it allows but a person likely did not mean). `kubesweep.sweep_spec` runs
them on every document it parses.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import TypeAdapter, ValidationError

from kubesweep.gpus import Catalog
from kubesweep.images.lock import LockError, load_lock, lock_keys
from kubesweep.sweep_spec.errors import message, short
from kubesweep.sweep_spec.file import Problem as Problem
from kubesweep.sweep_spec.file import SpecError as SpecError
from kubesweep.sweep_spec.model import (
    AXES,
    AXIS_TYPES,
    DIGEST_RE,
    MAX_CPU,
    MAX_DOCUMENT_BYTES,
    MAX_JOB_BYTES,
    MAX_MEMORY,
    MAX_SEARCH_BYTES,
    Distribution,
    MaxBatchSearch,
    RandomSearch,
    Sweep,
    SweepSpec,
    TuneSearch,
    is_image_key,
    set_axes,
)
from kubesweep.wire.metrics import TUNE_METRICS


def warnings_of(sweep: Sweep) -> list[Problem]:
    """What is allowed but likely not meant: an `include` cell that an `exclude` rule matches (it runs: includes
    are added after the excludes)."""
    warnings = []
    excludes = [set_axes(cell) for cell in sweep.spec.exclude]
    for i, cell in enumerate(sweep.spec.include):
        axes = set_axes(cell)
        for j, rule in enumerate(excludes):
            if all(k in axes and axes[k] == v for k, v in rule.items()):
                warnings.append(Problem(("spec", "include", i),
                                        f"{cell_text(axes)} matches exclude[{j}] ({cell_text(rule)}) and runs "
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


def cell_text(axes: Mapping[str, Any]) -> str:
    """A cell's axis values as `k=v, ...`."""
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
        if size > limit and (sweep.spec.adaptive or not adaptive):
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


def semantic_problems(sweep: Sweep, catalog: Catalog, allow_unpinned: bool) -> Iterable[Problem]:
    spec = sweep.spec
    matrix_axes = set_axes(spec.matrix)
    for axis, values in matrix_axes.items():
        first: dict[Any, int] = {}  # one pass: a value's key → where it was first listed
        for i, value in enumerate(values):
            j = first.setdefault(_same_key(value), i)
            if j != i:
                same = " (true is torch.compile's mode 'default')" if axis == "compile" and value == "default" else ""
                yield Problem(("spec", "matrix", axis, i),
                              f"{short(value)} is the same setting as {axis}[{j}]{same}; list each once")
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
    if spec.repeat_until is not None:
        if spec.search.adaptive:
            yield Problem(("spec", "repeat_until"), f"repeat_until repeats the cells of a grid or random search; a "
                                                    f"{spec.search.strategy} search makes its own trials")
        if spec.repeats < 2:
            yield Problem(("spec", "repeats"), f"repeat_until needs repeats of at least 2 (the runs every cell gets "
                                               f"before its interval is read), got {spec.repeats}")
        if spec.repeat_until.max < spec.repeats:
            yield Problem(("spec", "repeat_until", "max"), f"{spec.repeat_until.max} is fewer than repeats "
                                                           f"({spec.repeats}), the runs every cell gets first")
    if isinstance(spec.search, TuneSearch):
        yield from _tune_problems(spec.search, matrix_axes, catalog)
    if isinstance(spec.search, MaxBatchSearch):
        yield from _max_batch_problems(spec.search, matrix_axes)
    if spec.image:
        if spec.image not in spec.images and is_image_key(spec.image):
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
        if ref == spec.image and is_image_key(ref) and (spec.images or not allow_unpinned):
            yield Problem(("spec", "image"), f"{short(ref)} is not a key of spec.images ({', '.join(spec.images)}) "
                                             f"nor of the image lock ({', '.join(lock_keys())}) nor an image reference")
            return
        if not allow_unpinned and not DIGEST_RE.match(ref):
            path: tuple[str | int, ...] = ("spec", "images", spec.image) if spec.image in spec.images else (
                "spec", "image")
            yield Problem(path, f"{short(ref)} is not pinned by digest (expected NAME@sha256:<64 hex>; "
                                "pass --allow-unpinned to accept a tag)")


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
            yield Problem(where, f"{short(name)} is not a tune metric (one of {', '.join(TUNE_METRICS)}, "
                                 "or an MLflow metric key such as result/tokens_per_s)")
    if len(set(metrics)) != len(metrics):
        yield Problem((*base, "metric"), "a metric is listed twice")
    if len(metrics) > 1 and search.algorithm != "optuna":
        yield Problem((*base, "algorithm"), f"multi-objective search ({len(metrics)} metrics) needs algorithm "
                                            f"optuna, got {search.algorithm!r}")
    for i, constraint in enumerate(search.constraints):
        if constraint.metric not in TUNE_METRICS and "/" not in constraint.metric:
            yield Problem((*base, "constraints", i, "metric"),
                          f"{short(constraint.metric)} is not a tune metric (one of {', '.join(TUNE_METRICS)}, "
                          "or an MLflow metric key)")
    if search.algorithm == "grid":
        for axis, dist in search.space.items():
            if dist.type != "choice":
                yield Problem((*base, "space", axis, "type"),
                              f"algorithm grid needs choice distributions, got {dist.type!r}")
    if search.algorithm == "hyperopt" and importlib.util.find_spec("hyperopt") is None:
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
        adapter: TypeAdapter[Any] = TypeAdapter(annotation)
        for i, value in enumerate(dist.values):
            try:
                adapter.validate_python(value, strict=True)
            except ValidationError as exc:
                first = exc.errors()[0]
                yield Problem((*path, "values", i), message(first, (*path, "values", i)))
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


def _unknown_gpu(path: tuple[str | int, ...], gpu: str, catalog: Catalog) -> Problem:
    hint = [n for n in catalog.names if n.startswith(gpu)][:1] or difflib.get_close_matches(gpu, catalog.names, n=1)
    suggestion = f"; did you mean {hint[0]!r}?" if hint else f"; known: {', '.join(catalog.names)}"
    return Problem(path, f"{short(gpu)} is not a GPU type in the catalog{suggestion}")
