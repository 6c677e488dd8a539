"""A trial process without the import bill: a fork server for the local backend.

A trial's process spends seconds importing torch, transformers, MLflow and the job before it does anything
(8-15 s on the H100 host of docs/benchmarks.md, bytecode compiled). The server pays that once per sweep
driver: it imports the job's modules, never touches CUDA, and forks one fresh child per trial. Each child is a
process of its own (its own CUDA context, memory, signal handlers, session, exit code), started from the same
pristine parent, so a trial's figures cannot depend on the trial before it (`tests/jobs/test_forkserver.py`
compares a trial run after another through the server with the same trial in a fresh interpreter).

    python -m kubesweep.jobs.forkserver serve SOCKET        # the server (the local backend starts it)
    python -m kubesweep.jobs.forkserver run SOCKET -- ARGS  # one trial: `python -m kubesweep.jobs ARGS`

`run` is the trial's process as the backend sees it: a small client that imports nothing heavy, hands the
server its standard streams, working directory and environment, relays SIGTERM/SIGINT/SIGHUP to the trial and
exits as the trial did (its exit code, or the signal that killed it). When the client is killed outright the
server kills the trial. When the server cannot take the trial — it is not there, or the trial's environment
differs from the server's in a variable read at import time (`IMPORT_ENV_PREFIXES`) — the client runs the
job itself, in place (exec), and says so on its standard error.

A trial is taken by a *spare*: a child forked from the server ahead of the request, which waits for it. It is
forked from the same pristine server as the trial before it; once it takes a trial the server forks the next one.

On a machine with an NVIDIA GPU the spare also prepares for its trial while the trial before it runs: it starts
Inductor's compile workers (at a lower CPU priority than the running trial) and imports the compiler's modules
that a trial's first compilation would import (`WARM_IMPORTS`). Importing those asks CUDA for its devices, which
fixes the devices the process sees, so the spare prepares for one CUDA environment (`CUDA_*`: the last trial's;
at first the server's) and takes only a trial with that environment; any other trial is taken by a spare forked
for it on the spot, which prepares nothing. Whichever spare takes it, a trial starts from the same state for the
same request. On the H100 of docs/benchmarks.md this took a
bert-base trial from 18.3 s to 14.6 s and its warm-up from an empty compile cache from 16.8 s to 12.5-15.0 s.
`KUBESWEEP_FORKSERVER_WARM=0` turns it off.

The server stops when its standard input closes (the backend that started it has exited) once the trials it
forked have ended; it takes no new ones meanwhile. SIGTERM ends it at once, also while it imports: its spare and
any trial it forked are killed, its socket removed. The backend sends it when the sweep ends or is cancelled
(`Handle.terminate`, or `end_recorded` from another process, which finds the server in the record file the
handle keeps).
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import importlib
import json
import os
import random
import selectors
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

from kubesweep.jobs.command import LAUNCHED_ENV

JOB_MODULE = "kubesweep.jobs"
DIR_PREFIX = "kubesweep-fs-"  # the directory a Handle makes for its server's socket
DIR_MARKER = "kubesweep-forkserver"  # and marks as its own
# Environment read by torch, transformers, tokenizers or the interpreter when they are imported: a trial whose
# environment differs from the server's in one of these runs in a fresh interpreter instead.
IMPORT_ENV_PREFIXES = ("TORCH", "PYTORCH_", "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_", "TRITON_",
                       "OMP_", "MKL_", "PYTHON", "LD_", "MPLBACKEND")
# What CUDA reads when a process first asks it for devices: which ones, in which order, how it loads kernels.
CUDA_ENV_PREFIX = "CUDA_"
# Imported once by the server: what every trial of the job imports. Best effort (the extras and Triton may be
# absent). Importing starts nothing: Inductor's compile workers start in a child (a spare preparing, or a trial).
PRELOAD = ("torch", "transformers", "transformers.models.bert.modeling_bert", "kubesweep.jobs.cli",
           "kubesweep.jobs.runner", "kubesweep.jobs.hf_trainer", "mlflow", "matplotlib.pyplot",
           # what torch.compile imports when a trial first compiles (the partitioner's networkx among them);
           # not torch._inductor.compile_fx nor its Triton heuristics: importing those asks CUDA for its devices,
           # after which a forked child cannot use CUDA (checked on an H100; `fork_safe` checks every start)
           "torch._inductor.codecache", "torch._functorch.aot_autograd", "torch._functorch.partitioners",
           "networkx", "triton")
# "0": the spare does not prepare for its trial while it waits (see above); default "1".
WARM_ENV = "KUBESWEEP_FORKSERVER_WARM"
# The device node that says this host has an NVIDIA GPU (tests point it at another file).
GPU_NODE_ENV = "KUBESWEEP_TEST_GPU_NODE"
# What a trial's first compilation imports beyond PRELOAD (read on an H100: 257 modules, 4.0 s): Inductor's
# compile path, its code generators, pattern passes and Dynamo's backends, each pulling in the rest.
WARM_IMPORTS = ("torch._inductor.compile_fx", "torch._inductor.codegen.triton",
                "torch._inductor.codegen.cuda_combined_scheduling", "torch._inductor.codegen.cpp_wrapper_gpu",
                "torch._inductor.codegen.memory_planning", "torch._inductor.codegen.wrapper_fxir",
                "torch._inductor.codegen.halide", "torch._inductor.codegen.mps", "torch._inductor.codegen.pallas",
                "torch._inductor.codegen.python_wrapper_mtia", "torch._inductor.codegen.cutlass.scheduling",
                "torch._inductor.codegen.cutedsl.cutedsl_scheduling", "torch._inductor.codegen.nv_universal_gemm",
                "torch._inductor.codegen.rocm.rocm_cpp_scheduling", "torch._inductor.runtime.triton_heuristics",
                "torch._inductor.fx_passes.pre_grad", "torch._inductor.fx_passes.joint_graph",
                "torch._inductor.fx_passes.post_grad", "torch._inductor.fx_passes.quantization",
                "torch._inductor.fx_passes.freezing_patterns", "torch._inductor.fx_passes.efficient_conv_bn_eval",
                "torch._inductor.fx_passes.apply_gumbel_max_trick", "torch._dynamo.backends.inductor",
                "torch._dynamo.backends.cudagraphs", "torch._dynamo.backends.distributed",
                "torch._dynamo.repro.after_dynamo", "torch._dynamo.repro.after_aot",
                "torch.distributed.tensor.experimental", "torch.export._trace", "torch.fx.experimental.validator",
                "sympy.tensor.tensor", "sympy.physics.units")
# How long a server has to end after SIGTERM before it is killed (it kills its spare and trials, then exits).
TERMINATE_GRACE_S = 5.0
RELAYED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_HEADER = struct.Struct("!I")
_MAX_REQUEST = 1 << 22


class Unavailable(Exception):
    """The server cannot run this trial; the client runs it itself."""


class _Terminated(BaseException):
    """SIGTERM reached the server (a BaseException: the preload's `except Exception` does not swallow it)."""


def _raise_terminated(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the server is ending
    raise _Terminated()


def cuda_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(CUDA_ENV_PREFIX)}


def warm_wanted() -> bool:
    """A host with an NVIDIA GPU (what the compile workers and the imports are for), unless WARM_ENV=0."""
    return os.environ.get(WARM_ENV, "1") != "0" and os.path.exists(os.environ.get(GPU_NODE_ENV, "/dev/nvidia0"))


def import_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_ENV_PREFIXES)}


# --------------------------------------------------------------------------------------------------- framing

def _send(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    body = json.dumps(message).encode()
    data = _HEADER.pack(len(body)) + body
    if fds:
        sock.sendmsg([data[:1]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        data = data[1:]
    sock.sendall(data)


def _recv(sock: socket.socket, want_fds: int = 0) -> tuple[dict[str, Any] | None, list[int]]:
    """One message (None at end of stream) and the descriptors that came with its first byte."""
    fds: list[int] = []
    buf = b""
    if want_fds:
        size = array.array("i").itemsize * want_fds
        first, ancillary, _, _ = sock.recvmsg(1, socket.CMSG_SPACE(size))
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                got = array.array("i")
                got.frombytes(payload[: len(payload) - len(payload) % got.itemsize])
                fds.extend(got)
        if not first:
            return None, fds
        buf = first
    while len(buf) < _HEADER.size:
        chunk = sock.recv(_HEADER.size - len(buf))
        if not chunk:
            return None, fds
        buf += chunk
    (length,) = _HEADER.unpack(buf[: _HEADER.size])
    if length > _MAX_REQUEST:
        raise ValueError(f"message of {length} bytes")
    body = buf[_HEADER.size:]
    while len(body) < length:
        chunk = sock.recv(length - len(body))
        if not chunk:
            return None, fds
        body += chunk
    return json.loads(body), fds


# ---------------------------------------------------------------------------------------------------- server

class Spare(NamedTuple):
    pid: int
    sock: socket.socket  # the server's end of their socket pair
    pidfd: int
    cuda: dict[str, str] | None  # the CUDA environment it prepares for; None: it prepares nothing


class Server:
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

    def preload(self) -> None:
        for name in PRELOAD:
            try:
                importlib.import_module(name)
            except Exception as err:  # an optional extra that is not installed, or broken: children import it
                print(f"forkserver: preload {name}: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        if not fork_safe():
            raise RuntimeError("preloading left CUDA unusable in a forked child")

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
            _kill_group(pid, signal.SIGKILL)
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
            request, fds = _recv(conn, want_fds=3)
            if request is None or len(fds) != 3:
                raise ValueError("incomplete request")
            env = {str(k): str(v) for k, v in request["env"].items()}
            differs = sorted(k for k in set(import_env(env)) | set(self.start_env)
                             if import_env(env).get(k) != self.start_env.get(k))
            if differs:
                _send(conn, {"refused": f"environment read at import differs from the server's: {', '.join(differs)}"})
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
        _send_quietly(conn, {"pid": pid})

    def _hand_to_spare(self, trial: dict[str, Any], fds: list[int]) -> tuple[int, int]:
        """The waiting spare takes the trial (its request and standard streams). Returns its pid and pidfd."""
        wanted = cuda_env(trial["env"])
        if self.spare is not None and self.spare.cuda not in (None, wanted):
            print(f"forkserver: spare {self.spare.pid} prepared for {_show(self.spare.cuda)}; the trial has "
                  f"{_show(wanted)}: a spare is forked for it", file=sys.stderr, flush=True)
            self._end_spare()
        if self.spare is None:  # the last one died, or prepared for another CUDA environment
            self._fork_spare(prepare=False)
        self.expected_cuda = wanted
        assert self.spare is not None
        pid, sock, pidfd, _ = self.spare
        self.spare = None
        self.selector.unregister(pidfd)
        try:
            _send(sock, trial, fds=fds)
        except OSError:
            _kill_group(pid, signal.SIGKILL)
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
            _spare(theirs, cuda)  # never returns
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
        _kill_group(pid, signal.SIGKILL)
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
            _kill_group(pid, signal.SIGKILL)

    def _reap(self, pid: int) -> None:
        conn, pidfd = self.children.pop(pid)
        _, status = os.waitpid(pid, 0)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        with contextlib.suppress(KeyError):  # unless the client had already gone
            self.selector.unregister(conn)
        exit_code = os.waitstatus_to_exitcode(status)
        conn.setblocking(True)
        _send_quietly(conn, {"exit": exit_code})
        conn.close()


def _spare(sock: socket.socket, cuda: dict[str, str] | None) -> None:
    """A child of the server that waits for a trial and becomes it; exits when the server closes the pair. With
    `cuda`, it first prepares for a trial with that CUDA environment."""
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the server's handler is the server's
        os.setsid()  # a session and process group of its own, which the client's signals address
        _die_with_parent()
        if cuda is not None:
            _prepare(cuda)
        trial, fds = _recv(sock, want_fds=3)
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


def _prepare(cuda: dict[str, str]) -> None:
    """What a trial would do first, done while the trial before it runs: with the CUDA environment `cuda` in
    place, start Inductor's compile workers and import `WARM_IMPORTS`. Says what it did on standard error."""
    start = time.monotonic()
    for key in [k for k in os.environ if k.startswith(CUDA_ENV_PREFIX)]:
        del os.environ[key]
    os.environ.update(cuda)
    workers = _start_compile_workers()
    failed = []
    for name in WARM_IMPORTS:
        try:
            importlib.import_module(name)
        except Exception:  # another torch: the trial imports what it needs itself
            failed.append(name)
    print(f"forkserver: spare {os.getpid()} prepared for {_show(cuda)} in {time.monotonic() - start:.1f}s: "
          f"compile workers {'starting' if workers else 'not started'}, "
          f"{len(WARM_IMPORTS) - len(failed)} of {len(WARM_IMPORTS)} modules imported"
          + (f" (not {', '.join(failed)})" if failed else ""), file=sys.stderr, flush=True)


def _start_compile_workers() -> bool:
    """Starts Inductor's compile workers (a sidecar process and its pool) without waiting for them: a trial
    that compiles kernels uses them once they answer and compiles in its own process until then. The sidecar,
    and the workers it starts, run at niceness 10: they take the cores the running trial leaves. False where
    Triton or the pool is missing."""
    try:
        from torch._inductor.async_compile import AsyncCompile
        from torch.utils._triton import has_triton_package

        if not has_triton_package():
            return False
        AsyncCompile.warm_pool()
        sidecar = getattr(AsyncCompile.process_pool(), "process", None)
        if sidecar is not None:  # before its workers start: they inherit it
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, sidecar.pid, 10)
        AsyncCompile.use_process_pool()  # type: ignore[no-untyped-call]  # its first job starts the workers
        return True
    except Exception as err:  # a torch without Inductor's pool: the trial compiles as it would anyway
        print(f"forkserver: compile workers not started: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        return False


def _show(cuda: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(cuda.items())) or "no CUDA_* variables"


def fork_safe() -> bool:
    """Whether a child forked now could use CUDA: torch refuses it in a child once the parent has asked the
    driver anything (a device count is enough), which some modules do when imported."""
    torch = sys.modules.get("torch")
    if torch is None:
        return True
    if torch.cuda.is_initialized():
        return False
    pid = os.fork()
    if pid == 0:
        os._exit(3 if torch.cuda._is_in_bad_fork() else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def _die_with_parent() -> None:
    """A trial outlives neither its server nor, through the server, its client (PR_SET_PDEATHSIG)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(1, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() == 1:  # the server died before the call
        os._exit(1)


def _reseed() -> None:
    """The random states a fresh interpreter seeds from the OS would otherwise be the server's, in every child."""
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _send_quietly(conn: socket.socket, message: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # the client may be gone
        _send(conn, message)


def _kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


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
            self.proc = subprocess.Popen([python, "-m", __name__, "serve", self.socket], stdin=subprocess.PIPE,
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
        return [self.python, "-m", __name__, "run", self.socket, "--", *job_args]

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
    return _running(pid) and b"kubesweep.jobs.forkserver" in argv and b"serve" in argv and path.encode() in argv


def _running(pid: int) -> bool:
    """`pid` exists and has not exited (a zombie, waiting for its parent to reap it, has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def serve(path: str) -> NoReturn:
    """Serve at `path` until standard input closes and the trials have ended, or SIGTERM. Ends the process
    without the interpreter's shutdown: tearing down what the preload imported takes seconds (4.5 s measured on
    a 2-core machine), and nothing is left to flush or close."""
    signal.signal(signal.SIGTERM, _raise_terminated)
    server = Server(path)
    try:
        try:
            server.preload()
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


# ---------------------------------------------------------------------------------------------------- client

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
        _send(sock, request, fds=[0, 1, 2])
        reply, _ = _recv(sock)
    except OSError as err:
        sock.close()
        raise Unavailable(f"cannot reach {path}: {err}") from None
    if reply is None or "refused" in reply:
        sock.close()
        raise Unavailable(reply["refused"] if reply else "the server closed the connection")
    return sock, int(reply["pid"])


def run(path: str, argv: list[str]) -> int:
    try:
        sock, pid = _connect(path, argv)
    except Unavailable as why:
        print(f"forkserver: {why}; running the job in this process", file=sys.stderr, flush=True)
        os.execv(sys.executable, [sys.executable, "-m", JOB_MODULE, *argv])
    for sig in RELAYED:
        signal.signal(sig, lambda signum, _frame: _kill_group(pid, signum))
    reply, _ = _recv(sock)
    if reply is None or "exit" not in reply:
        print("forkserver: the server went away before the trial ended", file=sys.stderr, flush=True)
        return 1
    code = int(reply["exit"])
    if code < 0:  # killed by a signal: end the same way, so the backend reads what happened
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def main(args: list[str] | None = None) -> int:
    args = sys.argv[1:] if args is None else args
    if len(args) == 2 and args[0] == "serve":
        return serve(args[1])
    if len(args) >= 3 and args[0] == "run" and args[2] == "--":
        return run(args[1], args[3:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
