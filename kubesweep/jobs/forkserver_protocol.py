"""What the fork server and its clients say to each other (kubesweep/jobs/forkserver.py), and the rules both keep.

A message is a 4-byte length and a JSON object; a request carries the client's standard streams (SCM_RIGHTS) with
its first byte. The client asks `{"argv", "cwd", "env"}`; the server answers `{"pid"}` (the trial started) or
`{"refused"}` (the client runs the job itself), and `{"exit"}` once the trial has ended. Each trial is a process
group of its own, which the client signals (`RELAYED`).
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import signal
import socket
import struct
from typing import Any

# Environment read by torch, transformers, tokenizers or the interpreter when they are imported: a trial whose
# environment differs from the server's in one of these runs in a fresh interpreter instead.
IMPORT_ENV_PREFIXES = ("TORCH", "PYTORCH_", "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_", "TRITON_",
                       "OMP_", "MKL_", "PYTHON", "LD_", "MPLBACKEND")
# What CUDA reads when a process first asks it for devices: which ones, in which order, how it loads kernels.
CUDA_ENV_PREFIX = "CUDA_"
RELAYED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # what the client passes on to its trial
_HEADER = struct.Struct("!I")
_MAX_REQUEST = 1 << 22


def cuda_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(CUDA_ENV_PREFIX)}


def import_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_ENV_PREFIXES)}


def show_cuda(cuda: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(cuda.items())) or "no CUDA_* variables"


def send(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    body = json.dumps(message).encode()
    data = _HEADER.pack(len(body)) + body
    if fds:
        sock.sendmsg([data[:1]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        data = data[1:]
    sock.sendall(data)


def send_quietly(conn: socket.socket, message: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # the client may be gone
        send(conn, message)


def recv(sock: socket.socket, want_fds: int = 0) -> tuple[dict[str, Any] | None, list[int]]:
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


def kill_group(pid: int, sig: int) -> None:
    """Signal the process group `pid` leads (a trial, its spare, with what they started)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
