from __future__ import annotations

from pathlib import Path

import pytest

from kubesweep.gpus import Catalog, CatalogError, default_catalog, load_catalog, product_from_device_name

REQUIRED = ["a100-40gb", "a100-80gb", "h100-80gb", "h200", "l40s", "l4", "a10g", "v100-32gb", "t4", "rtx-3090",
            "rtx-4090"]


def test_the_shipped_catalog_has_the_required_types() -> None:
    catalog = default_catalog()
    assert set(REQUIRED) <= set(catalog.names)
    assert all(catalog[n].price_per_hour > 0 for n in REQUIRED)


def test_matching_is_exact_l4_is_not_l40s() -> None:
    catalog = default_catalog()
    assert catalog.by_product("NVIDIA-L4") == "l4"
    assert catalog.by_product("NVIDIA-L40S") == "l40s"
    assert catalog.by_product("NVIDIA-L4-PCIe") is None
    assert catalog.by_product("nvidia-l4") is None


def test_gfd_label_from_the_nvml_name() -> None:
    assert product_from_device_name("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
    assert product_from_device_name("Tesla V100-SXM2-32GB") == "Tesla-V100-SXM2-32GB"


def test_capabilities() -> None:
    catalog = default_catalog()
    assert catalog["v100-32gb"].unsupported_precision("bf16")
    assert catalog["t4"].unsupported_precision("tf32")
    assert catalog["a100-40gb"].unsupported_precision("bf16") is None
    assert catalog["t4"].unsupported_precision("fp16") is None


def test_a_file_replaces_the_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text("gpus:\n  mi300x: {product: AMD-MI300X, memory_gib: 192, compute_capability: '9.4',"
                    " bf16: true, price_per_hour: 4.0}\n")
    monkeypatch.setenv("KUBESWEEP_GPU_CATALOG", str(path))
    assert load_catalog().names == ["mi300x"]


def test_a_catalog_file_is_read_once_and_again_once_it_changed(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    gpu = "{product: AMD-MI300X, memory_gib: 192, compute_capability: '9.4', bf16: true, price_per_hour: 4.0}"
    path.write_text(f"gpus:\n  mi300x: {gpu}\n")
    first = load_catalog(path)
    assert load_catalog(str(path)) is first and load_catalog() is default_catalog() is load_catalog()
    path.write_text(f"gpus:\n  mi300x: {gpu}\n  mi300x-b: {gpu.replace('AMD-MI300X', 'AMD-MI300X-B')}\n")
    assert load_catalog(path).names == ["mi300x", "mi300x-b"]
    path.unlink()
    with pytest.raises(CatalogError, match="cannot read GPU catalog"):
        load_catalog(path)


def test_bad_catalog_names_the_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text("gpus:\n  x: {product: X, memory_gib: -1, compute_capability: '8.0', bf16: true,"
                    " price_per_hour: 1}\n")
    with pytest.raises(CatalogError, match=r"gpus.yaml: gpus.x.memory_gib: Input should be greater than 0"):
        Catalog.from_file(path)


def test_duplicate_products_are_refused() -> None:
    gpu = {"product": "X", "memory_gib": 1, "compute_capability": "8.0", "bf16": True, "price_per_hour": 1}
    with pytest.raises(CatalogError, match="used twice"):
        Catalog.from_mapping({"gpus": {"a": gpu, "b": gpu}}, "inline")


def test_every_catalogued_peak_is_dense_and_names_its_data_sheet() -> None:
    """H100 SXM5's dense bf16 peak is 989.4 TFLOP/s (1,979 with sparsity); fp32 is the non-tensor 66.9."""
    catalog = default_catalog()
    h100 = catalog["h100-80gb"]
    assert h100.peak_tflops("bf16") == 989.4 and h100.peak_tflops("fp32") == 66.9 and h100.peak_tflops("tf32") == 494.7
    assert catalog["v100-32gb"].peak_tflops("bf16") is None  # no bf16 on a V100: no peak, no MFU
    assert catalog["a10g"].peak_tflops("bf16") is None and catalog["a10g"].dense_tflops_source is None
    for name in catalog.names:
        gpu = catalog[name]
        assert not gpu.dense_tflops or gpu.dense_tflops_source, name
        assert all(gpu.unsupported_precision(p) is None for p in gpu.dense_tflops), name


def test_a_peak_without_its_source_or_not_positive_is_refused() -> None:
    gpu = {"product": "X", "memory_gib": 1, "compute_capability": "8.0", "bf16": True, "price_per_hour": 1,
           "dense_tflops": {"bf16": 100}}
    with pytest.raises(CatalogError, match=r"inline: gpus.x: .*dense_tflops needs dense_tflops_source"):
        Catalog.from_mapping({"gpus": {"x": gpu}}, "inline")
    with pytest.raises(CatalogError, match="greater than 0"):
        Catalog.from_mapping({"gpus": {"x": {**gpu, "dense_tflops": {"bf16": 0}, "dense_tflops_source": "s"}}}, "x")
    with pytest.raises(CatalogError, match=r"dense_tflops\.fp8"):
        Catalog.from_mapping({"gpus": {"x": {**gpu, "dense_tflops": {"fp8": 1}, "dense_tflops_source": "s"}}}, "x")
