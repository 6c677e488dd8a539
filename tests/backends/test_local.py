"""The backend contract on the local backend. The workload is `tests/support/stand_in_job.py`, which honours
the job's command line, results file and exit codes without training (the real job runs in tests/jobs and in
the smoke sweep test)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kubesweep.backends.local import LocalBackend, _alive
from tests.backends.contract import BackendContract, Harness

STAND_IN = Path(__file__).parents[1] / "support" / "stand_in_job.py"


def count_starts(home: Path) -> object:
    def starts(sweep: str, trial_id: str) -> int:
        log = home / "sweeps" / sweep / "starts.log"
        if not log.exists():
            return 0
        return sum(1 for line in log.read_text().splitlines() if line.split()[0] == trial_id)

    return starts


def processes_gone(home: Path) -> object:
    """Every process a trial started (pids in starts.log) has ended."""

    def gone(sweep: str, trial_id: str) -> bool:
        log = home / "sweeps" / sweep / "starts.log"
        pids = [int(line.split()[1]) for line in log.read_text().splitlines() if line.split()[0] == trial_id]
        return bool(pids) and not any(_alive(pid) for pid in pids)

    return gone


@pytest.fixture
def harness(tmp_path: Path) -> Harness:
    backend = LocalBackend(tmp_path, job_command=[sys.executable, str(STAND_IN)], cpu_slots=4, devices=[])
    return Harness(backend=backend, starts=count_starts(tmp_path),  # type: ignore[arg-type]
                   gone=processes_gone(tmp_path))  # type: ignore[arg-type]


class TestLocalBackend(BackendContract):
    pass
