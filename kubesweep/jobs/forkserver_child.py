"""A spare: the fork server's child that waits for a trial and becomes it (kubesweep/jobs/forkserver.py).

Forked from the pristine server ahead of the request, it first makes itself a process of its own (its session
and process group, which the client's signals address; killed with the server), prepares for its trial when
asked to (kubesweep/jobs/forkserver_warm.py), then takes the trial's standard streams, working directory,
environment and argv, reseeds what a fresh interpreter would seed, and runs the job's command line.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import traceback

from kubesweep.jobs.command import JOB_MODULE
from kubesweep.jobs.forkserver_protocol import RELAYED, recv
from kubesweep.jobs.forkserver_warm import prepare


def run_spare(sock: socket.socket, cuda: dict[str, str] | None) -> None:
    """Wait on `sock` (the server's socket pair) for a trial and become it; exits when the server closes the
    pair, and never returns. With `cuda`, it first prepares for a trial with that CUDA environment."""
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the server's handler is the server's
        os.setsid()  # a session and process group of its own, which the client's signals address
        _die_with_parent()
        if cuda is not None:
            prepare(cuda)
        trial, fds = recv(sock, want_fds=3)
        sock.close()
        if trial is None or len(fds) != 3:
            os._exit(0)
        for sig in (*RELAYED, signal.SIGCHLD):  # as a fresh interpreter has them (SIGPIPE stays ignored)
            signal.signal(sig, signal.SIG_DFL if sig != signal.SIGINT else signal.default_int_handler)
        for fd, target in zip(fds, (0, 1, 2), strict=True):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(trial["cwd"])
        os.environ.clear()
        os.environ.update(trial["env"])
        sys.argv = ["python -m " + JOB_MODULE, *trial["argv"]]
        _reseed()
        from kubesweep.jobs.cli import main

        code = main(trial["argv"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _die_with_parent() -> None:
    """A trial outlives neither its server nor, through the server, its client (PR_SET_PDEATHSIG)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(1, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() == 1:  # the server died before the call
        os._exit(1)


def _reseed() -> None:
    """The random states a fresh interpreter seeds from the OS would otherwise be the server's, in every child."""
    import random

    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
