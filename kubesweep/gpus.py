"""The GPU catalog: short names → exact GPU Feature Discovery product labels, memory, capabilities, prices.

The shipped catalog is `kubesweep/data/gpus.yaml`; a file of the same shape replaces it
(`--gpu-catalog FILE`, env `KUBESWEEP_GPU_CATALOG`, or the Helm chart's ConfigMap).
Matching is exact on purpose: a prefix or substring match would take an `NVIDIA-L40S` node for `l4`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from kubesweep.wire.base import StrictModel

PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"
CATALOG_ENV = "KUBESWEEP_GPU_CATALOG"


class GpuType(StrictModel):
    product: str = Field(description="exact value of the node label nvidia.com/gpu.product")
    memory_gib: float = Field(gt=0)
    compute_capability: str = Field(pattern=r"^\d+\.\d+$")
    bf16: bool
    fp8: bool = False
    price_per_hour: float = Field(ge=0, description="USD per GPU-hour, for $/epoch")
    dense_tflops: dict[Literal["fp32", "tf32", "fp16", "bf16"], float] = Field(
        default_factory=dict, description="the data sheet's dense peak TFLOP/s (not with sparsity) per precision: "
        "the denominator of MFU; a precision left out has none")
    dense_tflops_source: str | None = Field(None, min_length=1, description="the data sheet the peaks come from")

    @model_validator(mode="after")
    def _peaks_have_a_source(self) -> GpuType:
        if any(v <= 0 for v in self.dense_tflops.values()):
            raise ValueError("dense_tflops: every peak must be greater than 0")
        if self.dense_tflops and not self.dense_tflops_source:
            raise ValueError("dense_tflops needs dense_tflops_source: the data sheet the peaks come from")
        return self

    @property
    def sm(self) -> tuple[int, int]:
        major, minor = self.compute_capability.split(".")
        return int(major), int(minor)

    def peak_tflops(self, precision: str | None) -> float | None:
        """The dense peak TFLOP/s of one GPU of this type at the job's `precision` (None: the catalog has none)."""
        return next((v for k, v in self.dense_tflops.items() if k == precision), None)

    def unsupported_precision(self, precision: str) -> str | None:
        """Why this GPU cannot run `precision`, or None when it can."""
        if precision == "bf16" and not self.bf16:
            return f"bf16 is not supported on {self.product} (compute capability {self.compute_capability})"
        if precision == "tf32" and self.sm < (8, 0):
            return f"tf32 needs compute capability 8.0+, {self.product} has {self.compute_capability}"
        return None


class _CatalogFile(StrictModel):
    apiVersion: str = "kubesweep.io/v1alpha1"
    kind: str = "GpuCatalog"
    gpus: dict[str, GpuType]


class CatalogError(ValueError):
    pass


@dataclass(frozen=True)
class Catalog:
    gpus: dict[str, GpuType]
    source: str

    def __contains__(self, name: object) -> bool:
        return name in self.gpus

    def __getitem__(self, name: str) -> GpuType:
        try:
            return self.gpus[name]
        except KeyError:
            raise KeyError(f"unknown GPU type {name!r}; known: {', '.join(self.names)}") from None

    @property
    def names(self) -> list[str]:
        return list(self.gpus)

    def price_and_peak(self, name: str | None, precision: str | None) -> tuple[float | None, float | None]:
        """A GPU type's price per hour and dense peak TFLOP/s at `precision`, what $/epoch and MFU are computed
        against; (None, None) for no type (a CPU trial) or one the catalog does not know."""
        if name is None or name not in self.gpus:
            return None, None
        return self.gpus[name].price_per_hour, self.gpus[name].peak_tflops(precision)

    def by_product(self, product: str) -> str | None:
        """The catalog name whose product label is exactly `product`."""
        for name, gpu in self.gpus.items():
            if gpu.product == product:
                return name
        return None

    @classmethod
    def from_mapping(cls, data: Any, source: str) -> Catalog:
        try:
            parsed = _CatalogFile.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise CatalogError(f"{source}: {where}: {first['msg']}") from None
        products = [g.product for g in parsed.gpus.values()]
        dupes = {p for p in products if products.count(p) > 1}
        if dupes:
            raise CatalogError(f"{source}: product labels used twice: {', '.join(sorted(dupes))}")
        return cls(gpus=dict(parsed.gpus), source=source)

    @classmethod
    def from_file(cls, path: str | Path) -> Catalog:
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text())
        except OSError as exc:
            raise CatalogError(f"{path}: cannot read GPU catalog: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise CatalogError(f"{path}: not valid YAML: {exc}") from None
        return cls.from_mapping(data, str(path))


@cache
def default_catalog() -> Catalog:
    text = resources.files("kubesweep").joinpath("data/gpus.yaml").read_text()
    return Catalog.from_mapping(yaml.safe_load(text), "kubesweep/data/gpus.yaml")


def load_catalog(path: str | Path | None = None) -> Catalog:
    """The catalog from `path`, else from $KUBESWEEP_GPU_CATALOG, else the shipped one: read once per process
    (a file again only once it has changed); the catalog is shared, never to be changed by its users."""
    path = path or os.environ.get(CATALOG_ENV)
    if not path:
        return default_catalog()
    try:
        stat = Path(path).stat()
    except OSError:
        return Catalog.from_file(path)  # the error, naming the file
    return _catalog_file(str(path), stat.st_mtime_ns, stat.st_size)


@cache
def _catalog_file(path: str, mtime_ns: int, size: int) -> Catalog:
    """The catalog in the file `path` as it was when its modification time and size were these."""
    return Catalog.from_file(path)


def product_from_device_name(name: str) -> str:
    """GPU Feature Discovery's label value for an NVML device name ("NVIDIA H100 80GB HBM3")."""
    return "-".join(name.split())
