"""Fixtures of the contract's tests beyond the shared ones: `full_run`, one uninterrupted run of the job command,
shared with tests/jobs (tests/wire/test_results.py checks the file it wrote against the published schema)."""

from tests.support.job_fixtures import full_run

__all__ = ["full_run"]
