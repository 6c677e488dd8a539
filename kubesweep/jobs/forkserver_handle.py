"""A fork server as the local backend holds it (kubesweep/jobs/forkserver.py): `Handle` starts one
(`python -m kubesweep.jobs.forkserver serve SOCKET`, its socket in a private directory), gives a trial's command
through it, and lets it end (`stop`) or ends it now (`terminate`). With a record file, another process can end
it too (`end_recorded`: `sweep cancel` from another shell), signalling only that fork server and removing only
what a handle made.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path

SERVER_MODULE = "kubesweep.jobs.forkserver"  # `python -m` runs the server and its client
DIR_PREFIX = "kubesweep-fs-"  # the directory a Handle makes for its server's socket
DIR_MARKER = "kubesweep-forkserver"  # and marks as its own
# How long a server has to end after SIGTERM before it is killed (it kills its spare and trials, then exits).
TERMINATE_GRACE_S = 5.0


class Handle:
    """A server started for a backend: `argv(job_args)` is a trial's command through it; `stop()` lets it end
    once its trials have (closing its standard input, as the backend's exit would); `terminate()` ends it now.

    With `record`, the server's pid and socket are kept in that file while it runs, so that another process can
    end it (`end_recorded`)."""

    def __init__(self, python: str, env: dict[str, str], log: Path, record: Path | None = None) -> None:
        self.python = python
        self.env = env
        self.log = log
        self.record = record
        self.dir = tempfile.mkdtemp(prefix=DIR_PREFIX)  # mode 0700: only this user reaches the socket
        Path(self.dir, DIR_MARKER).touch()  # what `end_recorded` checks before it removes anything
        self.socket = os.path.join(self.dir, "socket")
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            self.proc = subprocess.Popen([python, "-m", SERVER_MODULE, "serve", self.socket], stdin=subprocess.PIPE,
                                         stdout=out, stderr=subprocess.STDOUT, env={**env, "PYTHONUNBUFFERED": "1"},
                                         start_new_session=True)
        if record is not None:
            record.parent.mkdir(parents=True, exist_ok=True)
            partial = record.with_name(record.name + ".tmp")
            partial.write_text(json.dumps({"pid": self.proc.pid, "start": _start_time(self.proc.pid),
                                           "socket": self.socket}) + "\n")
            partial.replace(record)
        deadline = time.monotonic() + 30  # the socket is bound before the imports
        while not os.path.exists(self.socket) and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)

    def wait_ready(self, timeout: float = 600) -> float:
        """Seconds until the server has imported the job and serves (its log says so)."""
        start = time.monotonic()
        while time.monotonic() - start < timeout and self.alive():
            if b"ready on " + self.socket.encode() in self.log.read_bytes():
                return time.monotonic() - start
            time.sleep(0.05)
        raise RuntimeError(f"the fork server did not come up; see {self.log}")

    def argv(self, job_args: list[str]) -> list[str]:
        return [self.python, "-m", SERVER_MODULE, "run", self.socket, "--", *job_args]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()

    def terminate(self, grace: float = TERMINATE_GRACE_S) -> None:
        """End the server now, with its spare and any trial it runs (SIGTERM; SIGKILL after `grace` seconds),
        and forget its record."""
        self.stop()
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
        if self.record is not None:
            with contextlib.suppress(OSError, ValueError):
                if json.loads(self.record.read_text()).get("pid") == self.proc.pid:
                    self.record.unlink()


def end_recorded(record: Path, grace: float = TERMINATE_GRACE_S) -> bool:
    """End the server named in `record` (a `Handle`'s record file, written by another process): SIGTERM, and
    SIGKILL after `grace` seconds; the record is removed. False when it names no running fork server (gone
    already, or its pid now belongs to another process). A process is signalled only when it is the recorded
    server: a fork server serving the recorded socket, started when the record says; of the files, only the
    socket and the marker of a directory a `Handle` made are removed, and that directory once it is empty."""
    try:
        data = json.loads(record.read_text())
        pid, path = int(data["pid"]), str(data["socket"])
        start = None if data.get("start") is None else int(data["start"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    ended = False
    if _serves(pid, path, start):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        if _serves(pid, path, start):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        ended = True
    _remove_socket_dir(path)
    with contextlib.suppress(OSError):
        record.unlink()
    return ended


def _remove_socket_dir(path: str) -> None:
    """Remove what a `Handle` made for the socket `path`: the socket and the marker in a directory of its
    making (named `kubesweep-fs-*`, owned by this user, holding the marker), then the directory if that left it
    empty. Anything else a record names stays as it is."""
    folder = Path(path).parent
    try:
        info = folder.lstat()
    except OSError:
        return
    if Path(path).name != "socket" or not folder.name.startswith(DIR_PREFIX) or not stat.S_ISDIR(info.st_mode) \
            or info.st_uid != os.getuid() or not (folder / DIR_MARKER).is_file():
        return
    with contextlib.suppress(OSError):
        if stat.S_ISSOCK((folder / "socket").lstat().st_mode):
            (folder / "socket").unlink()
    with contextlib.suppress(OSError):
        (folder / DIR_MARKER).unlink()
        folder.rmdir()  # only when nothing else is in it


def _start_time(pid: int) -> int | None:
    """When the process started (clock ticks after boot, /proc/<pid>/stat field 22); None when it is gone."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _serves(pid: int, path: str, start: int | None = None) -> bool:
    """`pid` is a live fork server serving `path` (not another process that got its pid since), started at
    `start` when that is given."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if start is not None and _start_time(pid) != start:
        return False
    return _running(pid) and SERVER_MODULE.encode() in argv and b"serve" in argv and path.encode() in argv


def _running(pid: int) -> bool:
    """`pid` exists and has not exited (a zombie, waiting for its parent to reap it, has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


