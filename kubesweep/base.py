"""The base every kubesweep document model derives from: the spec, the job settings, the GPU catalog, the image lock.

Depends on pydantic only, so `kubesweep.jobs.config`, which builds on it and runs inside trial pods, stays light.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """Base for every spec model: unknown keys are errors, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)
