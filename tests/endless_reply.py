"""A loopback HTTP server whose every reply is a 200 streamed far past any sane size.

Each request (any method, any path) is answered with a chunked body of `total` bytes, sent in
64 KiB chunks as the client reads them; the server records, per reply, how many bytes went out
and whether the client left before the end. A client that bounds what it reads leaves early,
and `wait_for_replies` says so without any clock: it waits for the handlers to finish.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from attrs import define, field

CHUNK = b"x" * 65536
HANG_GUARD_S = 120.0  # a wait this long is a hung test, not a slow machine


@define
class Replies:
    """What the server sent: per reply, (bytes sent, whether the client left before the end)."""

    total: int
    lock: threading.Lock = field(factory=threading.Lock)
    ended: list[tuple[int, bool]] = field(factory=list)
    paths: list[str] = field(factory=list)
    changed: threading.Condition = field(init=False)

    def __attrs_post_init__(self) -> None:
        self.changed = threading.Condition(self.lock)

    def record(self, sent: int, left: bool) -> None:
        with self.changed:
            self.ended.append((sent, left))
            self.changed.notify_all()

    def wait_for_replies(self, count: int = 1) -> list[tuple[int, bool]]:
        """Return the first `count` replies' records once that many have ended."""
        with self.changed:
            if not self.changed.wait_for(lambda: len(self.ended) >= count, HANG_GUARD_S):
                raise AssertionError(f"only {len(self.ended)} of {count} replies ended")
            return list(self.ended[:count])


def _handler(replies: Replies) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self._stream()

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", "0")))
            self._stream()

        def _stream(self) -> None:
            with replies.lock:
                replies.paths.append(self.path)
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            sent = 0
            try:
                self.wfile.write(b'%x\r\n"\r\n' % 1)
                while sent < replies.total:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK))
                    sent += len(CHUNK)
                self.wfile.write(b'1\r\n"\r\n0\r\n\r\n')
                self.wfile.flush()
            except OSError:  # the client closed the connection: it stopped reading
                self.close_connection = True
                replies.record(sent, True)
                return
            replies.record(sent, False)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def endless_reply_server(total: int) -> Iterator[tuple[str, Replies]]:
    """Serve on 127.0.0.1 (a free port); yield the base URL and the record of replies."""
    replies = Replies(total)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(replies))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", replies
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
