"""Errors the job maps to outcomes and exit codes."""

from __future__ import annotations


class UsageError(Exception):
    """A setting the job cannot act on (bad model path, unknown dataset, bad override): exit code 2."""
