"""Backends run a plan's trials: `local` (processes) and `kubernetes` (Jobs). See `base.Backend`; a backend by
name comes from `kubesweep.backend_factory.make_backend`."""

from __future__ import annotations

from kubesweep.backends.base import (
    AmbiguousTrial,
    Backend,
    BackendError,
    Phase,
    SweepConflict,
    SweepNotFound,
    SweepStatus,
    TrialStatus,
)

__all__ = [
    "AmbiguousTrial",
    "Backend",
    "BackendError",
    "Phase",
    "SweepConflict",
    "SweepNotFound",
    "SweepStatus",
    "TrialStatus",
]
