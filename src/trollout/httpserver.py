"""A minimal HTTP/1.1 server on Trio, built to script faults and to be fast.

Two users: the fake deployment (`trollout.testing`), which scripts faults with it, and
`trollout view`, which serves a run folder's JSON API and page on loopback. It is a leaf (it
imports nothing of ours), so the view does not load the test kit to serve a page.

Design note: each connection is one Trio task that owns a non-blocking stdlib socket. It reads
a request head up to its blank line, reads a ``Content-Length`` body, awaits the handler and
writes the whole reply at once. Keep-alive and pipelining come free from the loop (the buffer
may already hold the next request). Chunked request bodies are refused (501): every client we
serve sends a length. The socket is driven with ``trio.lowlevel.wait_readable`` and
``wait_writable``: that gives direct control over resets (``SO_LINGER``) and one checkpoint per
request that did not block. It is about control, not speed: a ``trio.SocketStream`` loop
measured the same, because the kernel's loopback ``send`` is most of a request's server CPU on
this machine (profiled under load: ~0.07 of ~0.1 ms).

Rejected alternatives: h11 (correct and general, but it doubled the server's CPU per request:
bench/fake_server_ceiling.py keeps an h11 variant and measures both), and hypercorn or uvicorn
(a framework between us and the socket, 1.2-18k requests/s here, and no way to reset a
connection mid-body on purpose).

A handler returns a `Reply`. Its `action` scripts what the connection does instead of a plain
answer: reset before any reply byte, reset after half the body, hang until the peer leaves, or
stream: write the head, then bytes as an async iterator yields them (a body generated while it is
sent, so a 2 GB reply never exists in memory; a trickle; bytes after the reply that nobody asked
for). A reset is a real TCP RST (``SO_LINGER`` 0), what a crashed worker looks like to a client.
"""

from __future__ import annotations

import enum
import errno
import socket
import struct
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing

import trio
from attrs import field, frozen

__all__ = [
    "Action",
    "Handler",
    "Reply",
    "Request",
    "listen",
    "send_all",
    "serve_connection",
    "serve_listener",
]

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 256 * 1024 * 1024
_RECEIVE_BYTES = 64 * 1024

_REASONS = {
    200: "OK",
    304: "Not Modified",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Content Too Large",
    422: "Unprocessable Entity",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


class Action(enum.Enum):
    """What the connection does with a reply."""

    SEND = "send"  # write the reply; keep the connection if the client wants it
    RESET = "reset"  # write nothing; abort the connection with a TCP RST
    CLOSE = "close"  # write nothing; close the connection cleanly (FIN)
    RESET_MID_BODY = "reset_mid_body"  # write the head and half the body, then RST
    HANG = "hang"  # write nothing; wait until the peer closes (or the server stops)
    STREAM = "stream"  # write the head, then what `stream` yields, as it yields it


@frozen
class Request:
    """One parsed HTTP request.

    Attributes:
        method: ``GET``, ``POST``, ...
        path: the target without its query string.
        headers: header names lowercased; a repeated header keeps its last value.
        body: the raw body (empty without ``Content-Length``).
        query: the target's query string, without the ``?`` (still percent-encoded).
    """

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    query: str = ""


@frozen
class Reply:
    """One HTTP reply, or a scripted misbehaviour (see `Action`).

    ``on_done`` is called once the connection is finished with the reply (sent, reset, or
    abandoned), so a handler can count a request as in flight until its bytes are out.

    A STREAM reply declares ``length`` as its Content-Length (None: no length, the body runs
    until the connection closes) and then writes whatever ``stream()`` yields, body bytes or
    anything else; ``body`` is not sent.
    """

    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = field(default=())
    action: Action = Action.SEND
    on_done: Callable[[], None] | None = field(default=None, eq=False, repr=False)
    stream: Callable[[], AsyncGenerator[bytes]] | None = field(default=None, eq=False, repr=False)
    length: int | None = None


Handler = Callable[[Request], Awaitable[Reply]]


class _BadRequestError(Exception):
    """The peer sent something that is not an HTTP/1.1 request we serve."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Reader:
    """Reads requests off one socket, keeping unread bytes for the next one."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buf = bytearray()
        self.waited = False  # whether this request blocked (so it already checkpointed)

    async def _fill(self) -> bool:
        while True:
            try:
                data = self._sock.recv(_RECEIVE_BYTES)
            except BlockingIOError:
                self.waited = True
                await trio.lowlevel.wait_readable(self._sock)
                continue
            if not data:
                return False
            self._buf += data
            return True

    async def next_request(self) -> tuple[Request, bool] | None:
        """Return the next request and whether the client keeps the connection alive.

        Returns None when the peer closed cleanly between requests.
        """
        end = self._buf.find(b"\r\n\r\n")
        while end < 0:
            if len(self._buf) > MAX_HEAD_BYTES:
                raise _BadRequestError(431, "request head too large")
            if not await self._fill():
                if self._buf:
                    raise _BadRequestError(400, "connection closed inside a request head")
                return None
            end = self._buf.find(b"\r\n\r\n")
        head = bytes(self._buf[:end])
        del self._buf[: end + 4]
        method, target, keep_alive, headers = _parse_head(head)
        body = await self._read_body(_content_length(headers))
        path, _, query = target.partition("?")
        return Request(method, path, headers, body, query), keep_alive

    async def _read_body(self, length: int) -> bytes:
        while len(self._buf) < length:
            if not await self._fill():
                raise _BadRequestError(400, "connection closed inside a request body")
        body = bytes(self._buf[:length])
        del self._buf[:length]
        return body

    async def wait_closed(self) -> None:
        """Discard input until the peer closes its side."""
        self._buf.clear()
        while await self._fill():
            self._buf.clear()


def _parse_head(head: bytes) -> tuple[str, str, bool, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    try:
        method, target, version = lines[0].split(" ")
    except ValueError:
        raise _BadRequestError(400, f"bad request line {lines[0][:80]!r}") from None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise _BadRequestError(400, f"bad header line {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    connection = headers.get("connection", "").lower()
    keep_alive = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
    return method, target, keep_alive, headers


def _content_length(headers: dict[str, str]) -> int:
    if "transfer-encoding" in headers:
        raise _BadRequestError(501, "chunked request bodies are not supported; send Content-Length")
    raw = headers.get("content-length", "0")
    if not raw.isdigit():
        raise _BadRequestError(400, f"bad Content-Length {raw!r}")
    length = int(raw)
    if length > MAX_BODY_BYTES:
        raise _BadRequestError(413, f"body of {length} bytes is too large")
    return length


def encode_head(reply: Reply, *, keep_alive: bool, length: int | None = None) -> bytes:
    """Return the status line and headers of ``reply``, blank line included.

    The Content-Length is `length`, else ``len(reply.body)``; a STREAM reply declares its own
    ``length`` (None: none at all, and the connection closes after the body).
    """
    reason = _REASONS.get(reply.status, "Unknown")
    streamed = reply.action is Action.STREAM
    size = (reply.length if streamed else len(reply.body)) if length is None else length
    lines = [f"HTTP/1.1 {reply.status} {reason}", f"content-type: {reply.content_type}"]
    if size is not None:
        lines.append(f"content-length: {size}")
    lines.extend(f"{name}: {value}" for name, value in reply.headers)
    if not keep_alive:
        lines.append("connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def send_all(sock: socket.socket, data: bytes) -> None:
    """Write all of ``data`` to the non-blocking ``sock``, waiting when its buffer is full.

    Cancellation:
        A checkpoint only when the socket's buffer is full; a cancellation then leaves part
        of ``data`` written (the connection is unusable and gets closed).
    """
    view = memoryview(data)
    while view:
        try:
            sent = sock.send(view)
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)
            continue
        view = view[sent:]


def _abort(sock: socket.socket) -> None:
    # SO_LINGER with a zero timeout makes close() send RST instead of FIN.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def _close(sock: socket.socket) -> None:
    trio.lowlevel.notify_closing(sock)
    sock.close()


async def serve_connection(sock: socket.socket, handler: Handler) -> None:
    """Serve HTTP/1.1 requests on the connected ``sock`` until either side closes it.

    Peer errors (resets, broken pipes, malformed requests) end the connection quietly; a
    malformed request gets a 4xx/5xx reply first. The socket is always closed on return.

    Cancellation:
        A checkpoint. Cancelling abandons the request in progress (the peer sees the
        connection close) and closes the socket; nothing else is left behind.
    """
    sock.setblocking(False)
    try:
        await _serve_requests(sock, _Reader(sock), handler)
    except OSError:
        return
    finally:
        _close(sock)


async def _serve_requests(sock: socket.socket, reader: _Reader, handler: Handler) -> None:
    while True:
        reader.waited = False
        try:
            parsed = await reader.next_request()
        except _BadRequestError as exc:
            body = b'{"detail":"' + str(exc).replace('"', "'").encode() + b'"}'
            reply = Reply(status=exc.status, body=body)
            await send_all(sock, encode_head(reply, keep_alive=False) + reply.body)
            return
        if parsed is None:
            return
        request, keep_alive = parsed
        reply = await handler(request)
        try:
            if not await _deliver(sock, reader, reply, keep_alive=keep_alive):
                return
        finally:
            if reply.on_done is not None:
                reply.on_done()
        if not reader.waited:
            await trio.lowlevel.checkpoint()


async def _deliver(sock: socket.socket, reader: _Reader, reply: Reply, *, keep_alive: bool) -> bool:
    """Carry out ``reply``; return whether the connection stays open."""
    if reply.action is Action.SEND:
        await send_all(sock, encode_head(reply, keep_alive=keep_alive) + reply.body)
        return keep_alive
    if reply.action is Action.STREAM:
        return await _stream(sock, reply, keep_alive=keep_alive and reply.length is not None)
    if reply.action is Action.HANG:
        await reader.wait_closed()
        return False
    if reply.action is Action.CLOSE:
        return False
    if reply.action is Action.RESET_MID_BODY:
        half = reply.body[: len(reply.body) // 2]
        await send_all(sock, encode_head(reply, keep_alive=keep_alive) + half)
    _abort(sock)
    return False


async def _stream(sock: socket.socket, reply: Reply, *, keep_alive: bool) -> bool:
    assert reply.stream is not None  # a STREAM reply without a stream is a handler's bug
    await send_all(sock, encode_head(reply, keep_alive=keep_alive))
    async with aclosing(reply.stream()) as pieces:
        async for piece in pieces:
            await send_all(sock, piece)
    return keep_alive


def listen(port: int, *, host: str = "127.0.0.1", backlog: int = 4096) -> socket.socket:
    """Return a non-blocking listening TCP socket bound to ``host:port`` (0: any free port)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


_ACCEPT_RETRY = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
Connection = Callable[[socket.socket, Handler], Awaitable[None]]


async def serve_listener(
    listener: socket.socket,
    handler: Handler,
    *,
    connection: Connection = serve_connection,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept connections on ``listener`` forever, serving each in its own task.

    Cancellation:
        Runs until cancelled; then every connection task is cancelled and the listening
        socket closed.
    """
    try:
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                await trio.lowlevel.wait_readable(listener)
                await _accept_pending(listener, nursery, handler, connection)
    finally:
        _close(listener)


async def _accept_pending(
    listener: socket.socket, nursery: trio.Nursery, handler: Handler, connection: Connection
) -> None:
    while True:
        try:
            sock, _ = listener.accept()
        except BlockingIOError:
            return
        except OSError as exc:
            if exc.errno in _ACCEPT_RETRY:  # out of descriptors: let connections finish
                await trio.sleep(0.1)
                return
            if exc.errno == errno.ECONNABORTED:
                continue
            raise
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        nursery.start_soon(connection, sock, handler)
