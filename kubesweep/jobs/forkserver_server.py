"""The fork server itself (kubesweep/jobs/forkserver.py): `python -m kubesweep.jobs.forkserver serve SOCKET`.

It binds its socket, imports the job (kubesweep/jobs/forkserver_warm.py), keeps one spare forked ahead
(kubesweep/jobs/forkserver_child.py) and hands each request to it: the trial's pid goes back to the client, and
its exit once it has ended. A client that goes away takes its trial with it. The server stops taking trials when
its standard input closes and ends once its trials have; SIGTERM ends it at once, with its spare and trials.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import sys
import warnings
from typing import Any, NamedTuple, NoReturn

from kubesweep.jobs.forkserver_child import run_spare
from kubesweep.jobs.forkserver_protocol import cuda_env, import_env, kill_group, recv, send, send_quietly, show_cuda
from kubesweep.jobs.forkserver_warm import preload, warm_wanted


class _Terminated(BaseException):
    """SIGTERM reached the server (a BaseException: the preload's `except Exception` does not swallow it)."""


def _raise_terminated(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the server is ending
    raise _Terminated()


class Spare(NamedTuple):
    pid: int
    sock: socket.socket  # the server's end of their socket pair
    pidfd: int
    cuda: dict[str, str] | None  # the CUDA environment it prepares for; None: it prepares nothing


class Server:
    """The server at `path`: one selector loop over its listener, its standard input, each trial's client
    connection and pidfd, and its spare's pidfd."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)  # bound before the imports: clients queue while the server warms up
        self.listener.listen(64)
        self.start_env = import_env(dict(os.environ))  # what the modules it preloads are imported with
        self.selector = selectors.DefaultSelector()
        self.children: dict[int, tuple[socket.socket, int]] = {}  # pid -> (client connection, pidfd)
        self.spare: Spare | None = None
        self.warm = warm_wanted()
        self.expected_cuda = cuda_env(dict(os.environ))  # what the next spare prepares for: the last trial's
        self.accepting = True

    def serve(self) -> int:
        # Python warns at each fork once the process has threads. The server's are native helpers started by
        # the imports (torch's, and jemalloc's background thread); they run no Python, and the allocator handles
        # fork. The server forks from its only Python thread.
        warnings.filterwarnings("ignore", message=r"This process .* is multi-threaded", category=DeprecationWarning)
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "stdin")
        self._fork_spare()
        print(f"forkserver {os.getpid()} ready on {self.path}", file=sys.stderr, flush=True)
        while self.accepting or self.children:
            for key, _ in self.selector.select():
                tag = key.data
                if tag == "accept":
                    self._accept()
                elif tag == "stdin":
                    if not os.read(key.fd, 4096):
                        self._stop_accepting()
                elif tag[0] == "client":
                    self._client_event(tag[1])
                elif tag[0] == "child":
                    self._reap(tag[1])
                elif tag[0] == "spare":
                    self._lost_spare()
        return 0

    def terminate(self) -> None:
        """On SIGTERM: kill the spare and every trial this server forked (each its whole process group), reap
        them, and remove the socket."""
        if self.spare is not None:
            self._end_spare()
        for pid, (conn, pidfd) in list(self.children.items()):
            kill_group(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
            os.close(pidfd)
            conn.close()
        self.children.clear()
        if self.accepting:
            self.accepting = False
            self.listener.close()
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(self.path))
        print(f"forkserver {os.getpid()} terminated", file=sys.stderr, flush=True)

    def _stop_accepting(self) -> None:
        self.accepting = False
        if self.spare is not None:
            self._end_spare()
        self.selector.unregister(self.listener)
        self.selector.unregister(sys.stdin.fileno())
        self.listener.close()
        os.unlink(self.path)
        with contextlib.suppress(OSError):  # the private directory the backend made for it
            os.rmdir(os.path.dirname(self.path))

    def _accept(self) -> None:
        try:
            self._take_request()
        finally:  # forked after the request is settled: the next spare inherits none of its descriptors
            if self.spare is None:
                self._fork_spare()

    def _take_request(self) -> None:
        conn, _ = self.listener.accept()
        conn.settimeout(30)
        fds: list[int] = []
        try:
            request, fds = recv(conn, want_fds=3)
            if request is None or len(fds) != 3:
                raise ValueError("incomplete request")
            env = {str(k): str(v) for k, v in request["env"].items()}
            differs = sorted(k for k in set(import_env(env)) | set(self.start_env)
                             if import_env(env).get(k) != self.start_env.get(k))
            if differs:
                send(conn, {"refused": f"environment read at import differs from the server's: {', '.join(differs)}"})
                conn.close()
                return
            trial = {"argv": [str(a) for a in request["argv"]], "cwd": str(request["cwd"]), "env": env}
            pid, pidfd = self._hand_to_spare(trial, fds)
        except (OSError, ValueError, KeyError, TypeError) as err:
            conn.close()
            print(f"forkserver: bad request: {err}", file=sys.stderr, flush=True)
            return
        finally:
            for fd in fds:
                os.close(fd)
        print(f"forkserver: trial {pid}: {' '.join(request['argv'])}", file=sys.stderr, flush=True)
        self.children[pid] = (conn, pidfd)
        conn.setblocking(False)
        self.selector.register(conn, selectors.EVENT_READ, ("client", pid))
        self.selector.register(pidfd, selectors.EVENT_READ, ("child", pid))
        send_quietly(conn, {"pid": pid})

    def _hand_to_spare(self, trial: dict[str, Any], fds: list[int]) -> tuple[int, int]:
        """The waiting spare takes the trial (its request and standard streams). Returns its pid and pidfd."""
        wanted = cuda_env(trial["env"])
        if self.spare is not None and self.spare.cuda not in (None, wanted):
            print(f"forkserver: spare {self.spare.pid} prepared for {show_cuda(self.spare.cuda)}; the trial has "
                  f"{show_cuda(wanted)}: a spare is forked for it", file=sys.stderr, flush=True)
            self._end_spare()
        if self.spare is None:  # the last one died, or prepared for another CUDA environment
            self._fork_spare(prepare=False)
        self.expected_cuda = wanted
        assert self.spare is not None
        pid, sock, pidfd, _ = self.spare
        self.spare = None
        self.selector.unregister(pidfd)
        try:
            send(sock, trial, fds=fds)
        except OSError:
            kill_group(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(pidfd)
            raise
        finally:
            sock.close()
        return pid, pidfd

    def _fork_spare(self, *, prepare: bool = True) -> None:
        cuda = dict(self.expected_cuda) if prepare and self.warm else None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            ours.close()
            self._close_inherited()
            run_spare(theirs, cuda)  # never returns
        theirs.close()
        pidfd = os.pidfd_open(pid)
        self.spare = Spare(pid, ours, pidfd, cuda)
        self.selector.register(pidfd, selectors.EVENT_READ, ("spare", pid))

    def _close_inherited(self) -> None:
        """In a spare: the server's descriptors are not the trial's."""
        others = [self.listener.fileno(), self.selector.fileno(),
                  *(c.fileno() for c, _ in self.children.values()), *(p for _, p in self.children.values())]
        for fd in others:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _end_spare(self) -> int:
        """Ends the waiting spare (it has no trial to lose) with what it started, its compile workers, and reaps
        it. Returns its wait status."""
        assert self.spare is not None
        pid, sock, pidfd, _ = self.spare
        self.spare = None
        self.selector.unregister(pidfd)
        sock.close()
        kill_group(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        os.close(pidfd)
        return status

    def _lost_spare(self) -> None:
        """The spare died before it had a trial (killed from outside): the next request forks another."""
        assert self.spare is not None
        pid = self.spare.pid
        status = self._end_spare()
        print(f"forkserver: spare {pid} ended without a trial ({os.waitstatus_to_exitcode(status)})",
              file=sys.stderr, flush=True)

    def _client_event(self, pid: int) -> None:
        """The only thing a client says after its request is goodbye: it is gone, so its trial goes too."""
        conn, _ = self.children[pid]
        try:
            data = conn.recv(64)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.selector.unregister(conn)
            kill_group(pid, signal.SIGKILL)

    def _reap(self, pid: int) -> None:
        conn, pidfd = self.children.pop(pid)
        _, status = os.waitpid(pid, 0)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        with contextlib.suppress(KeyError):  # unless the client had already gone
            self.selector.unregister(conn)
        exit_code = os.waitstatus_to_exitcode(status)
        conn.setblocking(True)
        send_quietly(conn, {"exit": exit_code})
        conn.close()


def serve(path: str) -> NoReturn:
    """Serve at `path` until standard input closes and the trials have ended, or SIGTERM. Ends the process
    without the interpreter's shutdown: tearing down what the preload imported takes seconds (4.5 s measured on
    a 2-core machine), and nothing is left to flush or close."""
    signal.signal(signal.SIGTERM, _raise_terminated)
    server = Server(path)
    try:
        try:
            preload()
        except RuntimeError as err:  # clients find no server and run their trials themselves
            print(f"forkserver: {err}; not serving", file=sys.stderr, flush=True)
            server.listener.close()
            os.unlink(path)
            code = 1
        else:
            code = server.serve()
    except _Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        server.terminate()
        code = 0
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

