"""A tiny HTTP server on 127.0.0.1 that answers as a hostile or broken tracking server does, and records what reached
it: the Authorization header of every request (`seen`), and how many body bytes it got out (`sent`).

Modes: `collect` answers 200 `{}` (a host that should never hear from a client); `huge` streams `HUGE_BYTES` of
JSON-looking body with no Content-Length; `drip` sends its status line and headers, then its body a byte every
`DRIP_EVERY_S`; `drip-headers` sends its headers that way. Every answer stops by itself (all sent, the client gone,
or `GIVE_UP_S` passed), so a client that keeps reading is caught by the test's clock, not left hanging.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HUGE_BYTES = 200 * 1024 * 1024
DRIP_EVERY_S = 0.2
GIVE_UP_S = 12.0


class HostileServer:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.seen: list[str | None] = []
        self.sent = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def _answer(self) -> None:
                owner.seen.append(self.headers.get("Authorization"))
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client hung up, as it should
                    owner._answer(self)

            do_GET = do_POST = do_PUT = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def _answer(self, handler: BaseHTTPRequestHandler) -> None:
        out, stop_at = handler.wfile, time.monotonic() + GIVE_UP_S
        if self.mode == "drip-headers":
            for byte in b'HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nX-Slow: ' + b"a" * 1000:
                out.write(bytes([byte]))
                out.flush()
                if time.monotonic() > stop_at:
                    return
                time.sleep(DRIP_EVERY_S)
            return
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        if self.mode == "collect":
            handler.send_header("Content-Length", "2")
        handler.end_headers()
        if self.mode == "collect":
            out.write(b"{}")
        elif self.mode == "huge":
            chunk = b'{"pad": "' + b"x" * (1024 * 1024 - 12) + b'"}\n'
            while self.sent < HUGE_BYTES and time.monotonic() < stop_at:
                out.write(chunk)
                self.sent += len(chunk)
        elif self.mode == "drip":
            out.write(b'{"run": ')
            while time.monotonic() < stop_at:
                out.write(b" ")
                out.flush()
                self.sent += 1
                time.sleep(DRIP_EVERY_S)


@contextlib.contextmanager
def hostile_server(mode: str) -> Iterator[HostileServer]:
    server = HostileServer(mode)
    threading.Thread(target=server.httpd.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()
