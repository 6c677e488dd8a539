"""How the local backend starts a trial's process: its environment (tracking, GPUs and their lease, the shared
compile caches), its command line, its log, and the sweep's fork server it is forked from.

- Single-process trials of the job start from a fork server (kubesweep/jobs/forkserver.py) that imported torch,
  transformers and the job once: a trial's process is forked, fresh, with nothing to import
  (`KUBESWEEP_LOCAL_FORKSERVER=0` starts each as a new interpreter instead; torchrun's trials always are).
- Compiled trials share one torch.compile cache (`<home>/cache/inductor`, Triton's in `<home>/cache/triton`).
- A trial started early behind another (prestart) is given its GPUs' lease files (`KUBESWEEP_GPU_LEASE`).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from kubesweep.backends._local_driver import process_start
from kubesweep.backends._local_files import (
    FORKSERVER_RECORD,
    LOG_FILE,
    RESULTS_FILE,
    recorded_tracking,
    write_trial_file,
)
from kubesweep.backends._local_store import Store, TrialRow
from kubesweep.backends._local_trials import Running
from kubesweep.backends.base import Phase
from kubesweep.jobs.command import JOB_MODULE, job_argv
from kubesweep.jobs.forkserver_handle import Handle, end_recorded
from kubesweep.jobs.forkserver_protocol import cuda_env
from kubesweep.wire.outcomes import Outcome
from kubesweep.wire.progress import ATTEMPT_HEADER, attempt_header


class Launcher:
    """Starts the trials of the sweeps in `store`, and keeps the fork server of each sweep this process drives.

    `prestart`: trials may start before their GPUs are free (each is given its GPUs' lease); `forkserver`:
    single-process trials of the job are forked from the sweep's fork server."""

    def __init__(self, store: Store, *, prestart: int, forkserver: bool) -> None:
        self.store = store
        self.prestart = prestart
        self.forkserver = forkserver
        self._servers: dict[str, Handle] = {}  # per sweep this process drives

    def start(self, sweep: str, row: TrialRow, devices: list[int], command: list[str], *,
              after: Running | None = None) -> Running | None:
        """Start the trial's process on `devices` with the sweep's job `command` and record it Running (staged
        behind `after`, when given). None when the process cannot start: the trial is recorded Failed."""
        trial_dir = self.store.trial_dir(sweep, row.name)
        config_path = write_trial_file(trial_dir, row.config)
        (trial_dir / RESULTS_FILE).unlink(missing_ok=True)
        env = {**os.environ, **recorded_tracking(self.store.sweep_dir(sweep)), "KUBESWEEP_SWEEP": sweep,
               "KUBESWEEP_TRIAL_ID": row.trial_id, "PYTHONUNBUFFERED": "1",
               "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in devices), **self._compile_cache_env()}
        if devices and self.prestart:
            env["KUBESWEEP_GPU_LEASE"] = self._lease_paths(devices)
        if command == [command[0], "-m", JOB_MODULE]:
            argv = job_argv(str(config_path), str(trial_dir), python=command[0], gpus=len(devices) or 1)
            if self.forkserver and argv[1:3] == ["-m", JOB_MODULE]:  # one process (torchrun's are not forked)
                argv = self._server(sweep, command[0], env).argv(argv[3:])
        else:
            argv = [*command, "--config", str(config_path), "--output-dir", str(trial_dir)]
        tries = earlier_attempts(trial_dir / LOG_FILE) + 1  # across resumes, which count retries anew
        log = (trial_dir / LOG_FILE).open("ab")
        log.write(attempt_header(tries, argv).encode())
        log.flush()
        try:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=trial_dir,
                                    start_new_session=True)
        except OSError as exc:
            log.close()
            self.store.update(sweep, row.trial_id, phase=Phase.FAILED, outcome=Outcome.FAILED,
                              reason=f"cannot start the job: {exc}", finished=time.time())
            return None
        reason = f"started early: waits for GPU {','.join(map(str, devices))} ({after.row.name})" if after else ""
        self.store.update(sweep, row.trial_id, phase=Phase.RUNNING, pid=proc.pid, pid_start=process_start(proc.pid),
                          attempts=row.attempts + 1,
                          started=time.time(), finished=None, outcome=None, reason=reason, exit_code=None)
        row.attempts += 1
        return Running(row, proc, devices, log, staged=after is not None)

    def _lease_paths(self, devices: list[int]) -> str:
        return os.pathsep.join(str(self.store.home / "gpus" / f"gpu-{i}.lock") for i in devices)

    def _compile_cache_env(self) -> dict[str, str]:
        cache = self.store.home / "cache"
        env = {}
        if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
            env["TORCHINDUCTOR_CACHE_DIR"] = str(cache / "inductor")
        if "TRITON_CACHE_DIR" not in os.environ:
            env["TRITON_CACHE_DIR"] = str(cache / "triton")
        return env

    # -- the sweeps' fork servers --------------------------------------------------------------------

    def _server(self, sweep: str, python: str, trial_env: dict[str, str]) -> Handle:
        """The sweep's fork server in this driver, for `python`: started on first use (again if it died), with
        the CUDA environment of the trial that starts it (what its first spare prepares for). Its pid is kept in
        `<home>/sweeps/<sweep>/forkserver.json`, so that `sweep cancel` in another process ends it."""
        server = self._servers.get(sweep)
        if server is None or not server.alive() or server.python != python:
            if server is not None:
                server.terminate()
            env = {**os.environ, **self._compile_cache_env(), **cuda_env(trial_env)}
            server = Handle(python, env, self.store.home / "forkserver.log",
                            record=self.store.sweep_dir(sweep) / FORKSERVER_RECORD)
            self._servers[sweep] = server
        return server

    def serves(self, sweep: str) -> bool:
        """This process started a fork server for the sweep."""
        return sweep in self._servers

    def let_go(self, sweep: str) -> None:
        """Let the sweep's fork server end once the trials it runs have (this driver stops before its sweep ends)."""
        server = self._servers.pop(sweep, None)
        if server is not None:
            server.stop()

    def end_servers(self, sweep: str) -> None:
        """End the sweep's fork server now (it holds the job's imports, about 1 GB): this process's, or the one
        another process started for it (its record)."""
        server = self._servers.pop(sweep, None)
        if server is not None:
            server.terminate()
        end_recorded(self.store.sweep_dir(sweep) / FORKSERVER_RECORD)

    def close(self) -> None:
        """End the fork servers this process started."""
        for sweep in list(self._servers):
            self.end_servers(sweep)


def earlier_attempts(log: Path) -> int:
    """How many attempts a trial's log already holds (its attempt headers)."""
    header = ATTEMPT_HEADER.encode()
    try:
        with log.open("rb") as f:
            return sum(1 for line in f if line.startswith(header))
    except OSError:
        return 0
