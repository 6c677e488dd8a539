"""The `sweeps.kubesweep.io` CustomResourceDefinition, generated from the `Sweep` model.

`spec` is the JSON schema of `kubesweep.sweep_spec.SweepSpec` turned into a structural OpenAPI v3 schema; `status` is
the schema of `SweepStatusBody` below, which the operator writes. So the file format, the CLI and the custom
resource share one schema. Conversion rules:

- `$ref`s are inlined; `X | None` becomes `nullable: true`; `const` becomes a one-value `enum`;
- the `search` union (grid | random | tune) becomes one object with every variant's fields and `strategy` as
  an enum: pydantic rejects a field that does not belong to the chosen strategy;
- values that take more than one JSON type (`compile: false | "max-autotune"`, a metric name or a list of them,
  `choice` values) carry `x-kubernetes-preserve-unknown-fields: true` and no type; nothing else does;
- no defaults (the API server would write them into stored objects, and a merged union's defaults would be
  wrong; pydantic applies the defaults), no `additionalProperties: false` (a structural schema prunes unknown
  fields; `sweep submit` and the operator reject them through the model first), no titles.

The matrix, everything that decides which trials exist and what they run, and what decides identity or
privilege (images, `service_account`, the tracking target) are immutable (CEL transition rules); `suspend`,
`concurrency` and `storage` can change while a sweep runs.

    python -m kubesweep.crd > manifests/crd/kubesweep.io.yaml     # or: sweep crd (both CRDs: Sweep, TrialSlice)
"""

from __future__ import annotations

import copy
import sys
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kubesweep.sweep_spec import SweepSpec

GROUP = "kubesweep.io"
VERSION = "v1alpha1"
KIND = "Sweep"
PLURAL = "sweeps"
SINGULAR = "sweep"
SHORT_NAMES = ["ksw"]
CRD_NAME = f"{PLURAL}.{GROUP}"
SLICE_KIND = "TrialSlice"
SLICE_PLURAL = "trialslices"
SLICE_CRD_NAME = f"{SLICE_PLURAL}.{GROUP}"
CHECKED_IN = ("manifests/crd/kubesweep.io.yaml", "charts/kubesweep/crds/kubesweep.io.yaml")

# Fields of spec that decide which trials exist, what each runs, and with which identity and privileges (images,
# the ServiceAccount, the tracking server, the claims its pods mount) and where they queue (the Kueue LocalQueue and
# priority: one sweep's trials are measured under one queue): fixed once the sweep exists.
IMMUTABLE_FIELDS = ("image", "images", "job", "matrix", "include", "exclude", "repeats", "repeat_until",
                    "resources", "search", "tracking", "service_account", "storage", "queue", "priority_class",
                    "warm_pods")

SweepPhase = Literal["Pending", "Running", "Suspended", "Succeeded", "Failed", "Cancelled", "Invalid", "Empty"]
TrialPhase = Literal["Pending", "Unschedulable", "Running", "Succeeded", "Failed", "Skipped", "Cancelled"]


class _StatusModel(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class TrialNote(_StatusModel):
    """A trial that needs a look (failed, OOM, GPU mismatch, unschedulable)."""

    name: str = Field(description="the trial's Job name")
    phase: TrialPhase
    outcome: str | None = None
    reason: str | None = Field(None, description="why it failed or waits (exit code, scheduler message)")


class Counts(_StatusModel):
    total: int = 0
    done: int = Field(0, description="trials in a terminal phase")
    succeeded: int = 0
    failed: int = Field(0, description="trials whose outcome is `failed` (OOM and GPU mismatch are results)")
    oom: int = 0
    gpuMismatch: int = 0
    cancelled: int = 0
    running: int = 0
    pending: int = 0
    unschedulable: int = Field(0, description="trials the scheduler cannot place: waiting (phase Unschedulable), "
                                              "or ended with outcome `unschedulable` (no node could take them)")


class SweepStatusBody(_StatusModel):
    """`.status` of a Sweep: written by the operator only."""

    phase: SweepPhase = "Pending"
    message: str = ""
    progress: str = Field("0/0", description="done/total, for `kubectl get sweeps`")
    counts: Counts = Field(default_factory=Counts)
    attention: list[TrialNote] = Field(default_factory=list, description="up to 10 trials that failed, ran out of "
                                       "memory, got the wrong GPU or cannot be scheduled, newest first")
    trialSlices: int = Field(0, description="TrialSlice resources (`<sweep>-<k>`) holding each trial's phase and "
                                            "outcome")
    observedGeneration: int | None = None
    cancelled: bool = Field(False, description="a cancel request was carried out")
    resumeHandled: str | None = Field(None, description="the last `kubesweep.io/resume` request carried out")
    searchFinished: bool = Field(False, description="a search sweep's tuner Job finished (it is never started again)")
    mlflowParentRunId: str | None = Field(None, description="the sweep's MLflow parent run")
    updatedAt: str | None = None

    @classmethod
    def read(cls, raw: object) -> SweepStatusBody:
        """A Sweep's `.status` as read back, typed: what the operator wrote (the API server holds it to the CRD's
        schema). A field this version does not know (an older operator's) or cannot read is left out, as if
        unwritten; nothing (no status yet) is the defaults."""
        known = {k: v for k, v in raw.items() if k in cls.model_fields} if isinstance(raw, dict) else {}
        try:
            return cls.model_validate(known)
        except ValidationError as exc:
            unread = {e["loc"][0] for e in exc.errors() if e["loc"]}
            return cls.model_validate({k: v for k, v in known.items() if k not in unread})


# ---------------------------------------------------------------------------------------------------------


def _resolve(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref:
        target = copy.deepcopy(defs[ref.rsplit("/", 1)[-1]])
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        return {**target, **rest}
    return schema


def _any_value(description: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"x-kubernetes-preserve-unknown-fields": True}
    if description:
        out["description"] = description
    return out


def _merge_objects(variants: list[dict[str, Any]], description: str | None) -> dict[str, Any]:
    """A union of object schemas (a discriminated union) → one object holding every variant's properties."""
    properties: dict[str, Any] = {}
    for variant in variants:
        for name, prop in variant.get("properties", {}).items():
            if name in properties and "enum" in properties[name] and "enum" in prop:
                merged = properties[name]["enum"] + [v for v in prop["enum"] if v not in properties[name]["enum"]]
                properties[name] = {**properties[name], "enum": merged}
            else:
                properties.setdefault(name, prop)
    out: dict[str, Any] = {"type": "object", "properties": properties}
    if description:
        out["description"] = description
    return out


def structural(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """A pydantic JSON schema node → a structural OpenAPI v3 schema node (see the module docstring)."""
    schema = _resolve(schema, defs)
    description = schema.get("description")
    variants = schema.get("anyOf") or schema.get("oneOf")
    if variants:
        nullable = any(v.get("type") == "null" for v in variants)
        kept = [structural(v, defs) for v in variants if v.get("type") != "null"]
        if len(kept) == 1:
            out = kept[0]
            if description:
                out["description"] = description
        elif all(k.get("type") == "object" for k in kept):
            out = _merge_objects(kept, description)
        else:
            return _any_value(description)
        if nullable:
            out["nullable"] = True
        return out
    if "const" in schema:
        value = schema["const"]
        kind = {bool: "boolean", int: "integer", float: "number"}.get(type(value), "string")
        out = {"type": kind, "enum": [value]}
        if description:
            out["description"] = description
        return out
    if not schema.get("type"):
        return _any_value(description)
    out = {}
    for key, value in schema.items():
        if key in ("title", "default", "discriminator", "$defs", "propertyNames"):
            continue  # propertyNames (a key's maxLength) is no part of a structural schema: the model checks it
        if key == "properties":
            out["properties"] = {name: structural(prop, defs) for name, prop in value.items()}
        elif key == "items":
            out["items"] = structural(value, defs) if value else _any_value(None)
        elif key == "additionalProperties":
            if isinstance(value, dict):
                out["additionalProperties"] = structural(value, defs) if value else _any_value(None)
            elif value is True:
                out["x-kubernetes-preserve-unknown-fields"] = True
            # False: unknown fields are pruned by the API server and rejected by the model
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            bound = "minimum" if key == "exclusiveMinimum" else "maximum"
            out[bound] = value
            out[key] = True
        else:
            out[key] = value
    return out


def _schema_of(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(mode="validation")
    return structural(raw, raw.get("$defs", {}))


def _immutability_rules() -> list[dict[str, str]]:
    rules = []
    for name in IMMUTABLE_FIELDS:
        rules.append({
            "rule": f"has(self.{name}) == has(oldSelf.{name}) && (!has(self.{name}) || self.{name} == oldSelf.{name})",
            "message": f"spec.{name} is immutable once the sweep exists (only suspend and concurrency can "
                       "change); delete the sweep and submit it again",
        })
    return rules


def spec_schema() -> dict[str, Any]:
    schema = _schema_of(SweepSpec)
    schema["description"] = "What to sweep: the same document as a sweep spec file's `spec` (docs/spec.md)."
    schema["x-kubernetes-validations"] = _immutability_rules()
    return schema


def status_schema() -> dict[str, Any]:
    schema = _schema_of(SweepStatusBody)
    schema["description"] = ("Written by the operator: phase, counts, the trials that need a look, the MLflow run. "
                             "Each trial's phase and outcome are in the sweep's TrialSlices.")
    return schema


def crd() -> dict[str, Any]:
    name_rule = {
        "rule": "self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",
        "message": "a sweep's name must be a DNS-1123 label of at most 63 characters (it prefixes its Jobs' names)",
    }
    root = {
        "type": "object",
        "description": "A benchmark sweep: a matrix of trials, each run as a Job (kubesweep.io).",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema(),
            "status": status_schema(),
        },
        "x-kubernetes-validations": [name_rule],
    }
    columns = [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Done", "type": "string", "jsonPath": ".status.progress", "description": "done/total trials"},
        {"name": "Failed", "type": "integer", "jsonPath": ".status.counts.failed"},
        {"name": "Running", "type": "integer", "jsonPath": ".status.counts.running"},
        {"name": "Suspended", "type": "boolean", "jsonPath": ".spec.suspend", "priority": 1},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": {"app.kubernetes.io/name": "kubesweep", "app.kubernetes.io/part-of": "kubesweep"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": KIND, "listKind": f"{KIND}List", "plural": PLURAL, "singular": SINGULAR,
                      "shortNames": SHORT_NAMES, "categories": ["kubesweep"]},
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": columns,
                "schema": {"openAPIV3Schema": root},
            }],
        },
    }


def slice_crd() -> dict[str, Any]:
    """TrialSlice: one slice of a sweep's per-trial records (at most 500 trials), written by the operator."""
    root = {
        "type": "object",
        "description": "Up to 500 trials of a Sweep: each trial's phase and outcome, as the operator last saw them "
                       "(kubesweep.io). Owned by the Sweep; written by the operator only.",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "sweep": {"type": "string", "description": "the Sweep these trials belong to"},
            "slice": {"type": "integer", "minimum": 0, "description": "the slice's index: trials at plan positions "
                                                                   "500*slice ... 500*slice+499"},
            "trials": {"type": "object", "maxProperties": 500, "additionalProperties": {"type": "string"},
                       "description": "trial id → `phase|outcome|started|finished|final|reason` (epoch seconds; "
                                      "final = 1 once the outcome is recorded)"},
        },
    }
    columns = [
        {"name": "Sweep", "type": "string", "jsonPath": ".sweep"},
        {"name": "Slice", "type": "integer", "jsonPath": ".slice"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": SLICE_CRD_NAME,
            "labels": {"app.kubernetes.io/name": "kubesweep", "app.kubernetes.io/part-of": "kubesweep"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": SLICE_KIND, "listKind": f"{SLICE_KIND}List", "plural": SLICE_PLURAL,
                      "singular": SLICE_KIND.lower(), "categories": ["kubesweep"]},
            "versions": [{"name": VERSION, "served": True, "storage": True, "additionalPrinterColumns": columns,
                          "schema": {"openAPIV3Schema": root}}],
        },
    }


HEADER = ("# Generated by `python -m kubesweep.crd` from kubesweep/sweep_spec/ and kubesweep/crd.py: do not edit.\n"
          "# A unit test fails when this file and the generator differ.\n")


def crds() -> list[dict[str, Any]]:
    """Every CustomResourceDefinition of kubesweep: Sweep and TrialSlice."""
    return [crd(), slice_crd()]


def crd_yaml() -> str:
    return HEADER + yaml.safe_dump_all(crds(), sort_keys=False, width=1000)


def main(argv: list[str] | None = None) -> int:
    sys.stdout.write(crd_yaml())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
