"""The fork server's client: `python -m kubesweep.jobs.forkserver run SOCKET -- ARGS`, the trial's process as the
local backend sees it (kubesweep/jobs/forkserver.py). It imports nothing heavy: it hands the server its standard
streams, working directory and environment, relays SIGTERM/SIGINT/SIGHUP to the trial and exits as the trial did
(its exit code, or the signal that killed it). When the server cannot take the trial, it runs the job itself, in
place (exec), and says so on its standard error.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time

from kubesweep.jobs.command import JOB_MODULE, LAUNCHED_ENV
from kubesweep.jobs.forkserver_protocol import RELAYED, kill_group, recv, send


class Unavailable(Exception):
    """The server cannot run this trial; the client runs it itself."""


def _launched() -> float:
    """This process's start (the trial's launch), from /proc; now when that cannot be read."""
    try:
        with open(f"/proc/{os.getpid()}/stat") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as uptime:
            up = float(uptime.read().split()[0])
        return time.time() - up + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()


def _connect(path: str, argv: list[str]) -> tuple[socket.socket, int]:
    """Hand the trial to the server; returns the connection and the trial's pid."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        env = {**os.environ, LAUNCHED_ENV: str(_launched())}
        request = {"argv": argv, "cwd": os.getcwd(), "env": env}
        send(sock, request, fds=[0, 1, 2])
        reply, _ = recv(sock)
    except OSError as err:
        sock.close()
        raise Unavailable(f"cannot reach {path}: {err}") from None
    if reply is None or "refused" in reply:
        sock.close()
        raise Unavailable(reply["refused"] if reply else "the server closed the connection")
    return sock, int(reply["pid"])


def run(path: str, argv: list[str]) -> int:
    """Run `python -m kubesweep.jobs ARGV` through the server at `path` (or in this process when it cannot)."""
    try:
        sock, pid = _connect(path, argv)
    except Unavailable as why:
        print(f"forkserver: {why}; running the job in this process", file=sys.stderr, flush=True)
        os.execv(sys.executable, [sys.executable, "-m", JOB_MODULE, *argv])
    for sig in RELAYED:
        signal.signal(sig, lambda signum, _frame: kill_group(pid, signum))
    reply, _ = recv(sock)
    if reply is None or "exit" not in reply:
        print("forkserver: the server went away before the trial ended", file=sys.stderr, flush=True)
        return 1
    code = int(reply["exit"])
    if code < 0:  # killed by a signal: end the same way, so the backend reads what happened
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code
