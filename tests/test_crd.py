"""The Sweep CRD: generated from the spec model, checked in, structural; a resource round-trips to the same plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kubesweep.crd import CHECKED_IN, IMMUTABLE_FIELDS, SweepStatusBody, crd, crd_yaml
from kubesweep.operator.store import resource_body, sweep_from_resource
from kubesweep.plan import plan
from kubesweep.sweep_spec import SweepSpec, load_sweep_file

ROOT = Path(__file__).resolve().parents[1]
SWEEPS = sorted((ROOT / "sweeps").glob("*.yaml"))


@pytest.mark.parametrize("path", CHECKED_IN)
def test_checked_in_crd_matches_the_generator(path: str) -> None:
    checked_in = (ROOT / path).read_text()
    assert checked_in == crd_yaml(), f"{path} is stale: run `python -m kubesweep.crd > {path}`"


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = []
    if isinstance(node, dict):
        out.append((path, node))
        for key in ("properties", "additionalProperties", "items"):
            child = node.get(key)
            if key == "properties" and isinstance(child, dict):
                for name, sub in child.items():
                    out += _walk(sub, f"{path}.{name}")
            elif isinstance(child, dict):
                out += _walk(child, f"{path}[{key}]")
    return out


def test_schema_is_structural() -> None:
    root = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    loose = []
    for path, node in _walk(root):
        assert not {"$ref", "anyOf", "oneOf", "default", "const", "title"} & set(node), path
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), f"{path} has no type"
        assert not ("properties" in node and "additionalProperties" in node), path
        assert node.get("additionalProperties") is not False, path
        if node.get("x-kubernetes-preserve-unknown-fields"):
            loose.append(path)
    # Only values that take more than one JSON type are left open.
    assert sorted(p.rsplit(".", 1)[-1].split("[")[0] for p in loose) == sorted(
        ["compile", "compile", "compile", "compile", "metric", "mode", "values"]
        + ["model_overrides"] * 4)  # job, matrix, include, exclude: values of several types


def test_spec_properties_cover_the_model_and_immutability_rules_name_real_fields() -> None:
    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert set(spec["properties"]) == set(SweepSpec.model_fields)
    assert set(IMMUTABLE_FIELDS) <= set(SweepSpec.model_fields)
    assert {"suspend", "concurrency"}.isdisjoint(IMMUTABLE_FIELDS)
    rules = [r["rule"] for r in spec["x-kubernetes-validations"]]
    assert any("self.matrix == oldSelf.matrix" in r for r in rules)


def test_printer_columns_and_names() -> None:
    version = crd()["spec"]["versions"][0]
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Phase", "Done", "Failed", "Running", "Suspended", "Age"]
    assert version["subresources"] == {"status": {}}
    assert crd()["spec"]["names"]["shortNames"] == ["ksw"]


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_a_resource_round_trips_to_the_same_plan(path: Path) -> None:
    sweep = load_sweep_file(path, allow_unpinned=True)
    body = resource_body(sweep, "team-a")
    again = sweep_from_resource(yaml.safe_load(yaml.safe_dump(body)), allow_unpinned=True)
    assert again.to_document()["spec"] == sweep.to_document()["spec"]
    assert [t.id for t in plan(again).trials] == [t.id for t in plan(sweep).trials]


def test_a_status_reads_back_typed_whatever_wrote_it() -> None:
    """The operator reads a Sweep's status back typed: none yet is the defaults; a field an older operator wrote
    that this version does not know, or one it cannot read, is left out as if unwritten, the rest kept."""
    assert SweepStatusBody.read(None) == SweepStatusBody() and SweepStatusBody.read({}).phase == "Pending"
    written = {"phase": "Running", "cancelled": True, "resumeHandled": "r2", "mlflowParentRunId": "run1",
               "searchFinished": True, "retiredField": {"x": 1}, "counts": {"total": "many"}}
    status = SweepStatusBody.read(written)
    assert (status.phase, status.cancelled, status.resumeHandled, status.mlflowParentRunId, status.searchFinished) == (
        "Running", True, "r2", "run1", True)
    assert status.counts == SweepStatusBody().counts  # unreadable: left out
    assert SweepStatusBody.read({"phase": "NoSuchPhase", "message": "m"}) == SweepStatusBody(message="m")
