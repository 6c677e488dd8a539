"""Fixtures of the job's tests beyond the shared ones: `full_run`, one uninterrupted run of the job command,
shared by tests/jobs/test_train.py and tests/wire/test_results.py."""

from tests.support.job_fixtures import full_run

__all__ = ["full_run"]
