"""The `/run` transport: h11 over Trio streams with an O(1) keep-alive pool.

`H11Transport` is the one HTTP client of the hot path. The engine calls `H11Transport.post`
directly (no httpx client layer: no URL objects, no header models, no event hooks), and every
other caller wraps it as ``httpx.AsyncClient(transport=H11Transport(...))``.

Design note. Idle connections live in one list per ``(scheme, host, port)``: a request pops the
most recently used one and a finished exchange appends it back, so checkout and checkin are O(1)
whatever the number of connections. A popped connection is polled without blocking first: if the
socket is readable while no request is outstanding, the server has closed it (EOF) or sent
garbage, so it is discarded and the next one (or a fresh connection) is taken; this keeps a
server's idle close from turning into a spurious possibly-delivered failure. A connection is
returned to the pool only after a complete, keep-alive exchange; any error or cancellation in
between closes it, so the pool never holds a connection in an unknown state. Non-2xx bodies are
read up to `max_error_body_bytes` and the connection is closed rather than drained beyond that.

Rejected alternative: httpx's own pool (httpcore) on Trio. It scans its connection list on every
request and wraps each exchange in several layers of locks and events; measured on this machine
it costs 0.43 ms of CPU per request at 1 in flight, 1.05 ms at 64 and 5.4 ms at 512, against about
0.1 ms for h11 over Trio. Concurrency is bounded by the engine's limiter, not by a pool, so this
pool has no capacity limit and no waiting.

Errors are httpx's exception types, so httpx callers and the hot path share one vocabulary:
`httpx.ConnectError` / `httpx.ConnectTimeout` mean the request never left (`Delivery.NOT_SENT`);
write and read failures mean it may have been delivered. Failures after the response's status
line arrived are the `ResponseBegan` subclasses: the server certainly got the request
(`Delivery.DELIVERED`) and a retry is never allowed.

The module runs past the house's ~400 lines on purpose: the pool, the exchange state machine and
the error vocabulary change together, and splitting them would spread the hot path's invariants
(who closes a connection, when it may be pooled) over several files.
"""

from __future__ import annotations

import select
from collections.abc import Sequence
from typing import Final, TypeVar
from urllib.parse import urlsplit

import attrs
import h11
import httpx
import trio
from attrs import frozen

from ..records import Delivery

__all__ = [
    "BodyProtocolError",
    "BodyReadError",
    "BodyReadTimeout",
    "H11Transport",
    "RawResponse",
    "ResponseBegan",
    "delivery_of",
    "response_began",
]

_RECEIVE_BYTES: Final = 65536
_DEFAULT_PORTS: Final = {"http": 80}
_MAX_CACHED_URLS: Final = 1024
_Headers = Sequence[tuple[bytes, bytes]]


@frozen
class RawResponse:
    """A response as the hot path sees it: status, raw headers, bytes.

    Attributes:
        status: the HTTP status code.
        headers: the header pairs as received, names lower-cased (h11's header sequence).
        body: the body; for non-2xx at most the transport's `max_error_body_bytes`.
        truncated: the body was cut (an oversized or interrupted error body).
        url: the URL that was requested, for messages.
    """

    status: int
    headers: _Headers = attrs.field(eq=False)
    body: bytes = attrs.field(repr=False)
    truncated: bool = False
    url: str = ""

    def header(self, name: str) -> str | None:
        """Return the first value of header `name` (any case), or None."""
        key = name.lower().encode("latin-1")
        for header_name, value in self.headers:
            if header_name == key:
                return value.decode("latin-1")
        return None


class ResponseBegan(httpx.TransportError):
    """Base mixin of failures that came after the response's status line arrived.

    Attributes:
        status_code: the status of the response that began.
    """

    status_code: int = 0


class BodyReadError(ResponseBegan, httpx.ReadError):
    """The connection broke while a 2xx body was being read."""


class BodyReadTimeout(ResponseBegan, httpx.ReadTimeout):
    """A 2xx body stopped arriving for longer than the read timeout."""


class BodyProtocolError(ResponseBegan, httpx.RemoteProtocolError):
    """A 2xx body broke HTTP/1.1 framing."""


def response_began(exc: BaseException) -> bool:
    """Return whether `exc` happened after a response began (never retry then)."""
    return isinstance(exc, ResponseBegan)


def delivery_of(exc: BaseException) -> Delivery:
    """Return how far a request that raised `exc` got."""
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        return Delivery.NOT_SENT
    if isinstance(exc, ResponseBegan):
        return Delivery.DELIVERED
    return Delivery.POSSIBLY_DELIVERED


_Began = TypeVar("_Began", bound=ResponseBegan)


def _began(cls: type[_Began], message: str, status: int) -> _Began:
    exc = cls(message)
    exc.status_code = status
    return exc


@frozen
class _Target:
    """A parsed URL: pool key, where to connect, what to send."""

    key: tuple[str, str, int]
    host: str
    port: int
    host_header: bytes
    path: bytes


def _parse_target(url: str) -> _Target:
    parts = urlsplit(url)
    if parts.scheme not in _DEFAULT_PORTS:
        raise httpx.UnsupportedProtocol(
            f"URL {url!r} uses scheme {parts.scheme!r}; H11Transport speaks plain http:// only"
        )
    if not parts.hostname:
        raise httpx.InvalidURL(f"URL {url!r} has no host; expected http://host:port/path")
    port = parts.port or _DEFAULT_PORTS[parts.scheme]
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return _Target(
        key=(parts.scheme, parts.hostname, port),
        host=parts.hostname,
        port=port,
        host_header=parts.netloc.rpartition("@")[2].encode("ascii"),
        path=path.encode("ascii"),
    )


def _target_of(request: httpx.Request) -> _Target:
    url = request.url
    if url.scheme not in _DEFAULT_PORTS:
        raise httpx.UnsupportedProtocol(
            f"URL {str(url)!r} uses scheme {url.scheme!r}; H11Transport speaks plain http:// only"
        )
    port = url.port or _DEFAULT_PORTS[url.scheme]
    return _Target((url.scheme, url.host, port), url.host, port, b"", url.raw_path)


if hasattr(select, "poll"):

    def _readable_now(fd: int) -> bool:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))

else:  # pragma: no cover - Windows has no poll()

    def _readable_now(fd: int) -> bool:
        return bool(select.select([fd], [], [], 0)[0])


class _Connection:
    """One HTTP/1.1 connection: a Trio socket stream and its h11 state machine."""

    __slots__ = ("h11", "stream")

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT)

    def is_idle_and_open(self) -> bool:
        """Return whether the idle connection can carry a request (no EOF, no stray bytes)."""
        fd = self.stream.socket.fileno()
        return fd >= 0 and not _readable_now(fd)

    def close(self) -> None:
        """Close the socket now (synchronous, so it is safe in any cleanup path)."""
        self.stream.socket.close()


class H11Transport(httpx.AsyncBaseTransport):
    """An HTTP/1.1 client transport: h11 over Trio with an O(1) keep-alive pool.

    Args:
        connect_timeout_s: the longest wait to establish a TCP connection.
        read_timeout_s: the longest silence while sending a request or awaiting response bytes.
        max_error_body_bytes: how much of a non-2xx body `post` reads before closing.
        max_idle_per_host: idle connections kept per host (None: no limit).
    """

    def __init__(
        self,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        max_error_body_bytes: int = 8192,
        max_idle_per_host: int | None = None,
    ) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._max_error_body_bytes = max_error_body_bytes
        self._max_idle_per_host = max_idle_per_host
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._targets: dict[str, _Target] = {}
        self._closed = False

    def idle_connections(self) -> int:
        """Return how many idle connections the pool holds (all hosts)."""
        return sum(len(idle) for idle in self._idle.values())

    async def post(
        self, url: str, body: bytes, *, content_type: bytes = b"application/json"
    ) -> RawResponse:
        """POST `body` to `url` and return the response (non-2xx bodies bounded).

        Raises:
            httpx.ConnectError, httpx.ConnectTimeout: the request was never sent.
            httpx.WriteError, httpx.WriteTimeout, httpx.ReadError, httpx.ReadTimeout,
            httpx.RemoteProtocolError: it may have been delivered (`ResponseBegan` subclasses:
                it was).

        Cancellation: a checkpoint. A cancelled request's connection is closed, never pooled;
        whether the server got the request is unknown, so a retry is not automatically safe.
        """
        target = self._targets.get(url)
        if target is None:
            target = self._remember(url)
        headers = [
            (b"host", target.host_header),
            (b"content-type", content_type),
            (b"content-length", str(len(body)).encode()),
        ]
        return await self._exchange(target, url, b"POST", headers, body, bounded=True)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send an httpx request on the pool and return the buffered response.

        Timeouts come from this transport's settings; httpx's per-request ``timeout`` is
        ignored. Bodies of every status are read whole.

        Cancellation: a checkpoint; as for `post`.
        """
        body = await request.aread()
        target = _target_of(request)
        url = str(request.url)
        raw = await self._exchange(
            target, url, request.method.encode(), request.headers.raw, body, bounded=False
        )
        return httpx.Response(
            raw.status,
            headers=raw.headers,
            stream=httpx.ByteStream(raw.body),
            request=request,
            extensions={"http_version": b"HTTP/1.1"},
        )

    async def aclose(self) -> None:
        """Close every idle connection; later exchanges close their connection when done.

        Cancellation: closes everything first, then checkpoints; no idle connection is left open.
        """
        self._closed = True
        idle, self._idle = self._idle, {}
        for connections in idle.values():
            for connection in connections:
                connection.close()
        await trio.lowlevel.checkpoint()

    async def _open_stream(self, host: str, port: int) -> trio.SocketStream:
        """Open a TCP stream (tests override this to script connections)."""
        return await trio.open_tcp_stream(host, port)

    def _remember(self, url: str) -> _Target:
        if len(self._targets) >= _MAX_CACHED_URLS:
            self._targets.clear()
        target = self._targets[url] = _parse_target(url)
        return target

    async def _exchange(
        self,
        target: _Target,
        url: str,
        method: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        *,
        bounded: bool,
    ) -> RawResponse:
        connection = await self._checkout(target, url)
        exchange = _Exchange(connection, url, self._read_timeout_s)
        limit = self._max_error_body_bytes if bounded else None
        try:
            data = exchange.encode(method, target.path, headers, body)
            with trio.move_on_after(self._read_timeout_s) as exchange.scope:
                response = await exchange.run(data, limit)
            if exchange.scope.cancelled_caught:
                response = exchange.timed_out()
        except BaseException:
            connection.close()
            raise
        if exchange.reusable():
            self._checkin(target.key, connection)
        else:
            connection.close()
        return response

    async def _checkout(self, target: _Target, url: str) -> _Connection:
        idle = self._idle.get(target.key)
        while idle:
            connection = idle.pop()
            if connection.is_idle_and_open():
                return connection
            connection.close()
        return await self._connect(target, url)

    def _checkin(self, key: tuple[str, str, int], connection: _Connection) -> None:
        idle = self._idle.setdefault(key, [])
        limit = self._max_idle_per_host
        if self._closed or (limit is not None and len(idle) >= limit):
            connection.close()
        else:
            idle.append(connection)

    async def _connect(self, target: _Target, url: str) -> _Connection:
        with trio.move_on_after(self._connect_timeout_s):
            try:
                return _Connection(await self._open_stream(target.host, target.port))
            except OSError as exc:
                raise httpx.ConnectError(f"cannot connect to {url}: {_reasons(exc)}") from exc
        raise httpx.ConnectTimeout(
            f"connecting to {url} took longer than connect_timeout_s={self._connect_timeout_s}"
        )


class _Exchange:
    """One request and its response on one connection, under one silence timer.

    The caller runs `run` inside a cancel scope whose deadline is the read timeout; each
    receive after the first pushes the deadline on, so the timer measures silence, not the
    whole exchange. After a timeout `timed_out` says what the phase was.
    """

    __slots__ = (
        "chunks",
        "complete",
        "connection",
        "head",
        "limit",
        "read_timeout_s",
        "receives",
        "scope",
        "sent",
        "size",
        "url",
    )

    def __init__(self, connection: _Connection, url: str, read_timeout_s: float) -> None:
        self.connection = connection
        self.url = url
        self.read_timeout_s = read_timeout_s
        self.scope: trio.CancelScope | None = None
        self.sent = False
        self.head: h11.Response | None = None
        self.limit: int | None = None
        self.chunks: list[bytes] = []
        self.size = 0
        self.receives = 0
        self.complete = False

    def encode(
        self, method: bytes, path: bytes, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> bytes:
        """Return the request's bytes (h11 checks the headers and tracks the state)."""
        state = self.connection.h11
        data = state.send(h11.Request(method=method, target=path, headers=headers)) or b""
        if body:
            data += state.send(h11.Data(data=body)) or b""
        return data + (state.send(h11.EndOfMessage()) or b"")

    async def run(self, data: bytes, limit: int | None) -> RawResponse:
        """Send `data`, then read the response (non-2xx bodies up to `limit` bytes)."""
        await self._send(data)
        self.sent = True
        try:
            await self._read(limit)
        except httpx.TransportError:
            if self.head is None or self.limit is None:
                raise
            # An error body is kept as far as it arrived.
        return self.response()

    def timed_out(self) -> RawResponse:
        """Return the partial error response, or raise the timeout of the phase that stalled."""
        if self.head is not None and self.limit is not None:
            return self.response()
        message = f"{self.url} sent nothing for read_timeout_s={self.read_timeout_s}"
        if not self.sent:
            message = f"sending the request to {self.url} stalled for {self.read_timeout_s}s"
            raise httpx.WriteTimeout(message)
        if self.head is None:
            raise httpx.ReadTimeout(message)
        status = self.head.status_code
        raise _began(BodyReadTimeout, f"{message} (HTTP {status} began)", status)

    def reusable(self) -> bool:
        """Return whether the connection may serve another request; prepare it if so."""
        state = self.connection.h11
        if self.complete and state.our_state is h11.DONE and state.their_state is h11.DONE:
            state.start_next_cycle()
            return True
        return False

    def response(self) -> RawResponse:
        """Build the response read so far (cut to `limit` for error bodies)."""
        assert self.head is not None
        body = b"".join(self.chunks)
        if self.limit is not None and len(body) > self.limit:
            body = body[: self.limit]
        head = self.head
        return RawResponse(head.status_code, head.headers, body, not self.complete, self.url)

    async def _send(self, data: bytes) -> None:
        # The Trio socket rather than SocketStream.send_all: the stream's conflict detector and
        # error-translating context managers cost more than the rest of this function.
        socket = self.connection.stream.socket
        view = memoryview(data)
        try:
            while view:
                view = view[await socket.send(view) :]
        except OSError as exc:
            raise httpx.WriteError(f"sending the request to {self.url} failed: {exc}") from exc

    async def _read(self, limit: int | None) -> None:
        # One flat loop over h11's events: this is the hot path, and every coroutine layer
        # between here and the socket is paid again at each suspension.
        state = self.connection.h11
        eof = False
        while True:
            try:
                event = state.next_event()
            except h11.RemoteProtocolError as exc:
                raise self._framing_error(exc, eof=eof) from exc
            if event is h11.NEED_DATA:
                data = await self._receive()
                eof = not data
                state.receive_data(data)
            elif isinstance(event, h11.Data):
                self.chunks.append(event.data)
                self.size += len(event.data)
                if self.limit is not None and self.size > self.limit:
                    return  # cut: the connection is closed, not drained
            elif isinstance(event, h11.Response):
                self.head = event
                if not 200 <= event.status_code < 300:
                    self.limit = limit
            elif isinstance(event, h11.EndOfMessage):
                self.complete = True
                return
            elif not isinstance(event, h11.InformationalResponse):
                raise httpx.RemoteProtocolError(f"{self.url} sent {event!r} instead of a response")

    async def _receive(self) -> bytes:
        if self.receives and self.scope is not None:
            self.scope.deadline = trio.current_time() + self.read_timeout_s
        self.receives += 1
        try:
            data = await self.connection.stream.socket.recv(_RECEIVE_BYTES)
        except OSError as exc:
            message = f"the connection to {self.url} broke: {exc}"
            if self.head is None:
                raise httpx.ReadError(message) from exc
            status = self.head.status_code
            raise _began(BodyReadError, f"{message} (HTTP {status} began)", status) from exc
        if not data and self.head is None:
            raise httpx.ReadError(f"{self.url} closed the connection before responding")
        return data

    def _framing_error(self, exc: h11.RemoteProtocolError, *, eof: bool) -> httpx.TransportError:
        if self.head is None:
            return httpx.RemoteProtocolError(f"{self.url} broke HTTP/1.1 framing: {exc}")
        status = self.head.status_code
        if eof:
            message = f"{self.url} closed the connection mid-body (HTTP {status} began)"
            return _began(BodyReadError, message, status)
        message = f"{self.url} broke HTTP/1.1 framing: {exc} (HTTP {status} began)"
        return _began(BodyProtocolError, message, status)


def _reasons(exc: OSError) -> str:
    """Name why a connect failed: trio chains each address's error under a summary."""
    cause = exc.__cause__
    if isinstance(cause, BaseExceptionGroup):
        return "; ".join(str(error) for error in cause.exceptions)
    return str(cause if isinstance(cause, OSError) else exc)
