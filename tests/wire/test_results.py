"""results.json's schema: the published JSON Schema is the pydantic models' and the job's output validates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kubesweep.wire.results import json_schema
from tests.support.job_fixtures import JobRun


def test_results_match_the_published_json_schema(full_run: JobRun) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((Path(__file__).parents[2] / "docs" / "results.schema.json").read_text())
    assert schema == json.loads(json.dumps(json_schema())), "regenerate: python -m kubesweep.wire.results"
    jsonschema.validate(full_run.results, schema)
