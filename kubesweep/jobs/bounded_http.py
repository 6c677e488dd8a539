"""One HTTP request bounded in bytes and in seconds, with the standard library alone: what a trial's MLflow client
(`mlflow_client.RestClient`) and the operator's (`kubesweep.operator.mlflow_rest`) send their credentials through.

urllib's `timeout` bounds each socket operation, not a request: a server that answers a byte at a time, each
within the timeout, holds the caller as long as it likes, and `read()` takes a body of any size into memory. Here a
request has a deadline: connecting, sending and every read of the answer (status line, headers, body) wait only
for the time left until it, so the whole request takes at most `seconds` (plus `len(data) / MIN_SEND_RATE` for
what it sends: an artifact's upload), and a read past the deadline raises `TimeoutError`, an `OSError` like any
outage. The body is read in chunks up to `max_bytes` (a `Content-Length` above it is refused before reading):
past it, `BodyTooLarge`. No redirect is followed (urllib would repeat the request, Authorization header included,
to wherever a 3xx points): a 3xx is an answer like any other. HTTP(S) proxies are used as urllib uses them
(`HTTPS_PROXY`, `NO_PROXY`, ...).
"""

from __future__ import annotations

import functools
import http.client
import io
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from email.message import Message
from typing import Any

MAX_BODY_BYTES = 16 * 1024 * 1024  # an answer of MLflow's REST API is far smaller (a run with its params and tags)
MIN_SEND_RATE = 1024 * 1024  # bytes/s: what a request's deadline allows for sending its body, beyond `seconds`
_CHUNK = 64 * 1024


class BodyTooLarge(Exception):
    """The answer's body is larger than the caller takes."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the answer is larger than {limit:,} bytes; not read")
        self.limit = limit


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Message
    body: bytes


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the request took longer than its deadline")
    return left


class _DeadlineSocket:
    """A connected socket whose every send and read waits only for the time left until the deadline. Closed, it
    stays open for the readers `makefile` gave until they are closed too, as a socket does (urllib closes the
    connection's socket as soon as it has the answer's headers, and reads the body through such a reader)."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock, self._deadline = sock, deadline
        self._readers, self._closed = 0, False

    def sendall(self, data: Any) -> None:
        self._sock.settimeout(_left(self._deadline))
        self._sock.sendall(data)

    def recv_into(self, buffer: Any) -> int:
        self._sock.settimeout(_left(self._deadline))
        return self._sock.recv_into(buffer)

    def makefile(self, mode: str = "rb", *args: Any, **kwargs: Any) -> io.BufferedReader:
        if mode != "rb":
            raise ValueError(f"only reading is bounded, not mode {mode!r}")
        self._readers += 1
        return io.BufferedReader(_DeadlineReader(self))

    def reader_closed(self) -> None:
        self._readers -= 1
        if self._closed and self._readers <= 0:
            self._sock.close()

    def close(self) -> None:
        self._closed = True
        if self._readers <= 0:
            self._sock.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class _DeadlineReader(io.RawIOBase):
    def __init__(self, sock: _DeadlineSocket) -> None:
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self._sock.recv_into(buffer)

    def close(self) -> None:
        if not self.closed:
            self._sock.reader_closed()
        super().close()


class _DeadlineConnection:
    """Mixed into http.client's connections: connecting waits for the time left, and the socket it leaves is a
    `_DeadlineSocket` (TLS, where there is, set up first)."""

    _deadline: float
    timeout: float | None
    sock: Any

    def connect(self) -> None:
        self.timeout = _left(self._deadline)
        super().connect()  # type: ignore[misc]
        self.sock = _DeadlineSocket(self.sock, self._deadline)


class _HTTPConnection(_DeadlineConnection, http.client.HTTPConnection):
    def __init__(self, *args: Any, deadline: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline = deadline


class _HTTPSConnection(_DeadlineConnection, http.client.HTTPSConnection):
    def __init__(self, *args: Any, deadline: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline = deadline


class _Request(urllib.request.Request):
    deadline: float = 0.0


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(functools.partial(_HTTPConnection, deadline=_deadline_of(req)), req)  # type: ignore[arg-type]


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, context: ssl.SSLContext | None) -> None:
        super().__init__(context=context)
        self._bounded_context = context

    def https_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(functools.partial(_HTTPSConnection, deadline=_deadline_of(req)), req,  # type: ignore[arg-type]
                            context=self._bounded_context)


def _deadline_of(req: urllib.request.Request) -> float:
    if not isinstance(req, _Request):
        raise TypeError("bounded_http opens its own requests only")
    return req.deadline


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def opener(context: ssl.SSLContext | None = None) -> urllib.request.OpenerDirector:
    """An opener for `request`: bounded connections, no redirect followed, `context` for https."""
    return urllib.request.build_opener(_NoRedirect, _HTTPHandler, _HTTPSHandler(context))


def read_capped(response: Any, max_bytes: int) -> bytes:
    """The body of `response`, read in chunks; BodyTooLarge past `max_bytes` (before reading it, when the
    answer's Content-Length says so)."""
    length = response.headers.get("Content-Length") if response.headers is not None else None
    if length is not None and length.strip().isdigit() and int(length) > max_bytes:
        raise BodyTooLarge(max_bytes)
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = response.read(min(_CHUNK, max_bytes + 1 - size))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > max_bytes:
            raise BodyTooLarge(max_bytes)


def request(director: urllib.request.OpenerDirector, url: str, *, method: str, data: bytes | None,
            headers: Mapping[str, str], seconds: float, max_bytes: int = MAX_BODY_BYTES) -> Answer:
    """Send one request through `director` (an `opener()`) and read its answer, whatever its status, within
    `seconds` (plus `len(data) / MIN_SEND_RATE`) and `max_bytes`. Raises TimeoutError past the deadline,
    BodyTooLarge past the cap, OSError (urllib's URLError included) when the server cannot be reached."""
    deadline = time.monotonic() + seconds + len(data or b"") / MIN_SEND_RATE
    req = _Request(url, data=data, method=method, headers=dict(headers))
    req.deadline = deadline
    try:
        response = director.open(req, timeout=_left(deadline))
    except urllib.error.HTTPError as err:  # a status urllib calls an error (4xx, 5xx, an unfollowed 3xx)
        with err:
            body = read_capped(err, max_bytes) if err.fp is not None else b""
        return Answer(err.code, err.headers, body)
    with response:
        return Answer(response.status, response.headers, read_capped(response, max_bytes))
