"""The base every kubesweep document model derives from: the spec, the job settings, the GPU catalog, the image lock.

Depends on pydantic only, so `kubesweep.wire.config`, which builds on it and runs inside trial pods, stays light.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

MAX_STRING = 4096  # any one string of a document: a model id, a path, a reference (the CRD's maxLength too)


class StrictModel(BaseModel):
    """Base for every spec model: unknown keys are errors, values are validated on assignment, no string is
    longer than MAX_STRING (a Job's annotations, which carry a trial's settings, hold 256 KiB in all), no number
    is infinite or NaN (each numeric field has its own bounds besides)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True,
                              str_max_length=MAX_STRING, allow_inf_nan=False)
