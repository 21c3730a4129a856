# Stays whole: the keep-alive pool (checkout, peek, checkin, connect) is one O(1) structure
# over one set of connections; the exchange is `exchange`, the wire format `http11`.
"""The `/run` transport: HTTP/1.1 over Trio sockets with an O(1) keep-alive pool.

`Http11Transport` is the one HTTP client of the hot path. The engine calls its `post` directly
(no httpx client layer: no URL objects, no header models, no event hooks), and every other
caller wraps it as ``httpx.AsyncClient(transport=Http11Transport(...))``. The wire format is
`http11`'s codec, our own strict HTTP/1.1 (http11.py says why it is not h11).

Design note. Idle connections live in one list per ``(scheme, host, port)``: a request pops the
most recently used one and a finished exchange appends it back, so checkout and checkin are O(1)
whatever the number of connections. A popped connection is peeked at without blocking first: if
the socket is readable while no request is outstanding, the server has closed it (EOF) or sent
bytes nobody asked for, so it is discarded and the next one (or a fresh connection) is taken;
this keeps a server's idle close from turning into a spurious possibly-delivered failure, and a
stray reply from being read as the next request's. The peek is one ``poll`` right before the
request is written, with no checkpoint in between. A connection is returned to the pool only
after a complete, keep-alive exchange that sent its whole request and saw no byte past its
response; any error or cancellation in between closes it, so the pool never holds a connection
in an unknown state. A caller that finds a reply was not its own (classify.py's identity check)
closes its connection through `RawResponse.discard_connection`. What no transport can tell
apart, a stray reply that arrives after the next request was written, is in classify.py's design
note. Non-2xx bodies are read up to `max_error_body_bytes` and the connection is closed rather
than drained beyond that; every body is bounded by `max_body_bytes` (after decoding), and every
exchange by `reply_timeout_s` as well as by the silence timer (exchange.py).

Each request is one `exchange.Exchange` on the plain socket taken out of the Trio stream, timed
by the transport's one `exchange.Deadlines` queue rather than a cancel scope per request;
exchange.py says why. Measured with bench/transport_cpu.py on this machine (client CPU per
request at 1 / 64 / 512 in flight): 0.152 / 0.117 / 0.172 ms with h11 and a cancel scope per
request, 0.071-0.076 / 0.038-0.048 / 0.039-0.062 ms now; a raw Trio loop that sends fixed bytes
and reads without parsing or timeouts costs 0.02-0.06 / 0.013-0.016 / 0.03-0.04 ms. End to end
(bench/throughput.py, 20,000 rollouts, client CPU ms per rollout at 1 / 64 / 512 / 4096 in
flight, two runs each): 0.33 / 0.27-0.38 / 0.29-0.32 / 0.31-0.34 with h11, 0.24-0.26 /
0.13-0.19 / 0.16-0.19 / 0.17-0.19 now, against 0.25-0.32 / 0.14-0.27 / 0.24-0.32 / 0.38-0.45
for the aiohttp baseline. Connections to IP literals skip `trio.open_tcp_stream` (195 us of CPU
per connection against 67 us), which kept the figure at 4096 in flight from rising.

Rejected alternative: httpx's own pool (httpcore) on Trio. It scans its connection list on every
request and wraps each exchange in several layers of locks and events; measured on this machine
it costs 0.43 ms of CPU per request at 1 in flight, 1.05 ms at 64 and 5.4 ms at 512, against about
0.1 ms for h11 over Trio (and less now). Concurrency is bounded by the engine's
limiter, not by a pool, so this pool has no capacity limit and no waiting.

Every other reply trollout reads (the head server's config, liveness probes, ``/aggregate_metrics``,
vLLM's ``/metrics``) goes through `read_bounded`, with a bound of its own named where it is used
(`MAX_HEAD_CONFIG_BYTES`, ...), not the ``/run`` limit: those replies are small, and the run's
``max_reply_bytes`` (256 MiB by default) would let a hostile server hold that much per read.
The bound reaches this transport as a request extension (`MAX_BODY_EXTENSION`), so the body is
never read past it; on any other httpx transport (an embedding caller's client) `read_bounded`
reads the reply as a stream and closes it at the bound. Either way a reply past its bound is one
`ReplyTooLargeError` naming the URL (without credentials) and the bound. Rejected alternative: a
transport per bound (one per caller, each with its own pool and deadline queue), when the bound
is a property of the request.

Errors are httpx's exception types, so httpx callers and the hot path share one vocabulary:
`httpx.ConnectError` / `httpx.ConnectTimeout` mean the request never left (`Delivery.NOT_SENT`),
as does `httpx.LocalProtocolError` (a request that cannot be encoded is never sent); write and
read failures mean it may have been delivered. Failures after the response's status line arrived
are the `ResponseBeganError` subclasses: the server certainly got the request (`Delivery.DELIVERED`)
and a retry is never allowed.
"""

from __future__ import annotations

import select
import socket
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from functools import partial
from typing import Any, Final, Protocol, cast
from urllib.parse import urlsplit

import httpx
import trio
from attrs import field, frozen

from ...text import concealed, public_url
from .exchange import Deadlines, Exchange
from .http11 import FramingError, check_field_value, encode_request, post_prefix
from .replies import (
    BodyProtocolError,
    BodyReadError,
    BodyReadTimeout,
    BodyReplyTimeout,
    ContentDecodingError,
    RawResponse,
    ReplyTimeout,
    ReplyTooLargeError,
    ResponseBeganError,
    began,
    delivery_of,
    response_began,
)

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "MAX_BODY_EXTENSION",
    "BodyProtocolError",
    "BodyReadError",
    "BodyReadTimeout",
    "BodyReplyTimeout",
    "BoundedReply",
    "ContentDecodingError",
    "Http11Transport",
    "PostTransport",
    "RawResponse",
    "ReplyTimeout",
    "ReplyTooLargeError",
    "ResponseBeganError",
    "delivery_of",
    "read_bounded",
    "response_began",
]

DEFAULT_MAX_BODY_BYTES: Final = 256 * 1024 * 1024
"""The longest reply body a transport reads by default (RunConfig.max_reply_bytes's default)."""
MAX_BODY_EXTENSION: Final = "trollout.max_body_bytes"
"""An httpx request extension: the longest body `Http11Transport` reads for that request."""

_COALESCE_BYTES: Final = 65536  # larger bodies go out after the head instead of being copied
_DEFAULT_PORTS: Final = {"http": 80}
_MAX_CACHED_URLS: Final = 1024
_JSON: Final = b"application/json"


@frozen
class _Target:
    """A parsed URL: pool key, where to connect, and the POST head up to the Content-Type."""

    key: tuple[str, str, int]
    host: str
    port: int
    path: bytes
    prefix: bytes = b""


def _parse_target(url: str) -> _Target:
    parts = urlsplit(url)
    if parts.scheme not in _DEFAULT_PORTS:
        raise httpx.UnsupportedProtocol(
            f"URL {public_url(url)!r} uses scheme {parts.scheme!r}; Http11Transport speaks "
            "plain http:// only"
        )
    if not parts.hostname:
        raise httpx.InvalidURL(
            f"URL {public_url(url)!r} has no host; expected http://host:port/path"
        )
    port = parts.port or _DEFAULT_PORTS[parts.scheme]
    try:
        path = ((parts.path or "/") + (f"?{parts.query}" if parts.query else "")).encode("ascii")
        prefix = post_prefix(path, parts.netloc.rpartition("@")[2].encode("ascii"))
    except (FramingError, UnicodeEncodeError) as exc:
        raise httpx.InvalidURL(
            f"URL {public_url(url)!r} cannot be sent: {exc}; percent-encode its path and query"
        ) from exc
    return _Target((parts.scheme, parts.hostname, port), parts.hostname, port, path, prefix)


def _target_of(request: httpx.Request) -> _Target:
    url = request.url
    if url.scheme not in _DEFAULT_PORTS:
        raise httpx.UnsupportedProtocol(
            f"URL {public_url(str(url))!r} uses scheme {url.scheme!r}; Http11Transport "
            "speaks plain http:// only"
        )
    port = url.port or _DEFAULT_PORTS[url.scheme]
    return _Target((url.scheme, url.host, port), url.host, port, url.raw_path)


if hasattr(select, "poll"):

    def _readable_check(sock: socket.socket) -> Callable[[], object]:
        """Return a check of whether ``sock`` is readable now (its result is truthy if so)."""
        poller = select.poll()  # one per connection: a check is then one call, one syscall
        poller.register(sock, select.POLLIN)
        return partial(poller.poll, 0)  # no Python frame per check: it runs once per request

else:  # pragma: no cover - Windows has no poll()

    def _readable_check(sock: socket.socket) -> Callable[[], object]:
        """Return a check of whether ``sock`` is readable now (its result is truthy if so)."""
        return lambda: select.select([sock], [], [], 0)[0]


class _Connection:
    """One HTTP/1.1 connection: a non-blocking socket that this transport owns.

    Attributes:
        uses: how many exchanges have checked it out, so a late `discard` spares a later one.
    """

    __slots__ = ("readable", "sock", "uses")

    def __init__(self, stream: trio.SocketStream) -> None:
        # Taken out of the stream: the plain socket's calls skip Trio's per-call checkpoints.
        self.sock = socket.socket(fileno=stream.socket.detach())
        self.sock.setblocking(False)
        self.readable = _readable_check(self.sock)
        self.uses = 0

    def is_idle_and_open(self) -> bool:
        """Return whether the idle connection can carry a request (no EOF, no stray bytes)."""
        return self.sock.fileno() >= 0 and not self.readable()

    def close(self) -> None:
        """Close the socket now (synchronous, so it is safe in any cleanup path)."""
        if self.sock.fileno() >= 0:
            trio.lowlevel.notify_closing(self.sock)
            self.sock.close()


class PostTransport(Protocol):
    """What the engine needs of a ``/run`` transport: `Http11Transport`, or a driver's own.

    A test or an embedding driver may pass any object with these two methods (a scripted
    stand-in, a transport with its own TLS or proxying) to `open_collector`.
    """

    async def post(self, url: str, body: bytes, *, headers: bytes = b"") -> RawResponse:
        """POST ``body`` (JSON bytes) to ``url``; raise httpx transport errors on failure.

        ``headers`` are extra header lines, each ending in CRLF (telemetry's ``traceparent``).
        """
        ...

    async def aclose(self) -> None:
        """Close idle connections."""
        ...


class Http11Transport(httpx.AsyncBaseTransport):
    """An HTTP/1.1 client transport over Trio with an O(1) keep-alive pool.

    Args:
        connect_timeout_s: the longest wait to establish a TCP connection.
        read_timeout_s: the longest silence while sending a request or awaiting response bytes.
        reply_timeout_s: the longest whole exchange, from sending the request to the last body
            byte (None: twice `read_timeout_s`).
        max_body_bytes: the longest response body read, after decoding; a longer one fails
            with `ReplyTooLargeError` and its connection is closed.
        max_error_body_bytes: how much of a non-2xx body `post` reads before closing.
        max_idle_per_host: idle connections kept per host (None: no limit).
    """

    def __init__(
        self,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        reply_timeout_s: float | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_error_body_bytes: int = 8192,
        max_idle_per_host: int | None = None,
    ) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._max_body_bytes = max_body_bytes
        self._max_error_body_bytes = max_error_body_bytes
        self._max_idle_per_host = max_idle_per_host
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._targets: dict[str, _Target] = {}
        self._content_types = {_JSON}
        self._deadlines = Deadlines(read_timeout_s, reply_timeout_s)
        self._closed = False

    def idle_connections(self) -> int:
        """Return how many idle connections the pool holds (all hosts)."""
        return sum(len(idle) for idle in self._idle.values())

    async def post(
        self, url: str, body: bytes, *, content_type: bytes = _JSON, headers: bytes = b""
    ) -> RawResponse:
        """POST `body` to `url` and return the response (non-2xx bodies bounded).

        A non-2xx response that arrives before the request was fully sent is returned (its
        connection is closed); a 2xx then is a `httpx.RemoteProtocolError` (a success cannot
        precede its request). `headers` are extra header lines, each ending in CRLF, sent as
        given: the caller checks them (telemetry's ``traceparent`` and ``tracestate``).

        Raises:
            httpx.ConnectError, httpx.ConnectTimeout: the request was never sent.
            httpx.LocalProtocolError: `content_type` cannot be a header value (never sent).
            httpx.WriteError, httpx.WriteTimeout, httpx.ReadError, httpx.ReadTimeout,
            httpx.RemoteProtocolError: it may have been delivered (`ResponseBeganError` subclasses:
                it was). `ReplyTimeout` is a ReadTimeout (the whole exchange took too long);
                `ReplyTooLargeError` and `ContentDecodingError` are RemoteProtocolErrors.

        Cancellation: a checkpoint. A cancelled request's connection is closed, never pooled;
        whether the server got the request is unknown, so a retry is not automatically safe.
        """
        target = self._targets.get(url)
        if target is None:
            target = self._remember(url)
        if content_type not in self._content_types:
            self._check_content_type(content_type)
        head = b"%s%s\r\ncontent-length: %d\r\n%s\r\n" % (
            target.prefix,
            content_type,
            len(body),
            headers,
        )
        if len(body) <= _COALESCE_BYTES:
            return await self._exchange(target, url, head + body, limit=self._max_error_body_bytes)
        return await self._exchange(target, url, head, body, limit=self._max_error_body_bytes)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send an httpx request on the pool and return the buffered response.

        Timeouts come from this transport's settings; httpx's per-request ``timeout`` is
        ignored. Bodies of every status are read whole (up to ``max_body_bytes``, or the
        request's `MAX_BODY_EXTENSION` if smaller) and decoded, so the response handed to httpx
        has no Content-Encoding header left to decode again.

        Cancellation: a checkpoint; as for `post`.
        """
        body = await request.aread()
        target = _target_of(request)
        method = request.method.encode("ascii")
        try:
            data, close = encode_request(method, target.path, request.headers.raw, body)
        except FramingError as exc:
            raise httpx.LocalProtocolError(
                f"cannot send {public_url(str(request.url))}: {exc}"
            ) from exc
        raw = await self._exchange(
            target,
            str(request.url),
            data,
            no_body=method == b"HEAD",
            close=close,
            max_body=request.extensions.get(MAX_BODY_EXTENSION),
        )
        return httpx.Response(
            raw.status,
            headers=[pair for pair in raw.headers if pair[0] != b"content-encoding"],
            stream=httpx.ByteStream(raw.body),
            request=request,
            extensions={"http_version": b"HTTP/1.1"},
        )

    async def aclose(self) -> None:
        """Close every idle connection; later exchanges close their connection when done.

        The timeout watcher (a system task) ends with the last exchange still in flight.

        Cancellation: closes everything first, then checkpoints; no idle connection is left open.
        """
        self._closed = True
        self._deadlines.close()
        idle, self._idle = self._idle, {}
        for connections in idle.values():
            for connection in connections:
                connection.close()
        await trio.lowlevel.checkpoint()

    async def _open_stream(self, host: str, port: int) -> trio.SocketStream:
        """Open a TCP stream (tests override this to script connections)."""
        family = _literal_family(host)
        if family is None:
            return await trio.open_tcp_stream(host, port)  # a name: happy eyeballs over its IPs
        # An IP literal has one address, so open_tcp_stream's machinery (a nursery and a task
        # per attempt) is pure cost: 195 us of CPU per connection against 67 us for this.
        sock = trio.socket.socket(family, socket.SOCK_STREAM)
        try:
            await sock.connect((host, port))
        except BaseException:
            sock.close()
            raise
        return trio.SocketStream(sock)

    def _remember(self, url: str) -> _Target:
        if len(self._targets) >= _MAX_CACHED_URLS:
            self._targets.clear()
        target = self._targets[url] = _parse_target(url)
        return target

    def _check_content_type(self, content_type: bytes) -> None:
        try:
            check_field_value(content_type)
        except FramingError as exc:
            raise httpx.LocalProtocolError(f"content_type {content_type!r}: {exc}") from exc
        if len(self._content_types) < _MAX_CACHED_URLS:
            self._content_types.add(content_type)

    async def _exchange(
        self,
        target: _Target,
        url: str,
        data: bytes,
        body: bytes = b"",
        *,
        limit: int | None = None,
        no_body: bool = False,
        close: bool = False,
        max_body: int | None = None,
    ) -> RawResponse:
        """Send `data` then `body` on a pooled connection and read the response."""
        connection = await self._checkout(target, url)
        exchange = Exchange(
            connection.sock,
            url,
            self._deadlines,
            no_body=no_body,
            max_body_bytes=(
                self._max_body_bytes if max_body is None else min(max_body, self._max_body_bytes)
            ),
            max_error_body_bytes=limit,
        )
        self._deadlines.start(exchange)
        try:
            await exchange.run(data, body, limit)
        except BaseException:
            connection.close()
            raise
        finally:
            self._deadlines.stop(exchange)
        parser = exchange.parser
        if parser.complete and parser.keep_alive and exchange.sent and not close:
            self._checkin(target.key, connection)
            discard = partial(self._discard, target.key, connection, connection.uses)
            return exchange.response(limit, discard)
        connection.close()
        return exchange.response(limit)

    async def _checkout(self, target: _Target, url: str) -> _Connection:
        idle = self._idle.get(target.key)
        while idle:
            connection = idle.pop()
            if connection.is_idle_and_open():
                connection.uses += 1
                return connection
            connection.close()  # closed by the server, or it sent bytes nobody asked for
        return await self._connect(target, url)

    def _discard(self, key: tuple[str, str, int], connection: _Connection, uses: int) -> None:
        """Close an idle connection, unless it has been lent again since its use `uses`."""
        idle = self._idle.get(key, [])
        if connection.uses == uses and connection in idle:
            idle.remove(connection)  # O(n), but only for a reply that was not its request's
            connection.close()

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
                raise httpx.ConnectError(
                    concealed(f"cannot connect to {public_url(url)}: {_reasons(exc)}")
                ) from exc
        raise httpx.ConnectTimeout(
            f"connecting to {public_url(url)} took longer than "
            f"connect_timeout_s={self._connect_timeout_s}"
        )


@frozen
class BoundedReply:
    """A reply read whole within its bound (`read_bounded`).

    Attributes:
        status_code: the HTTP status.
        content: the body, decoded from any Content-Encoding.
    """

    status_code: int
    content: bytes = field(repr=False)

    @property
    def text(self) -> str:
        """The body as UTF-8 (undecodable bytes replaced)."""
        return self.content.decode("utf-8", errors="replace")


async def read_bounded(
    client: httpx.AsyncClient, method: str, url: str, *, limit: int, bound: str, **kwargs: Any
) -> BoundedReply:
    """Send a request on `client` and read its reply, at most `limit` body bytes (decoded).

    Args:
        client: any httpx client (`Http11Transport` stops reading at `limit` itself).
        method: the HTTP method.
        url: the URL.
        limit: the longest body read, of any status.
        bound: the name of the bound, for the error (a constant or a setting).
        kwargs: further arguments of `httpx.AsyncClient.stream` (``content``, ``headers``).

    Raises:
        ReplyTooLargeError: the body is longer than `limit`; one line naming the URL (without
            credentials), the limit and `bound`. Its connection is closed, not read further.
        httpx.HTTPError: what the client raises otherwise.

    Cancellation: a checkpoint; the reply's connection is closed.
    """
    extensions = {MAX_BODY_EXTENSION: limit}
    try:
        async with (
            client.stream(method, url, extensions=extensions, **kwargs) as response,
            aclosing(cast(AsyncGenerator[bytes], response.aiter_bytes())) as chunks,
        ):
            body = bytearray()
            async for chunk in chunks:
                body += chunk
                if len(body) > limit:
                    raise began(ReplyTooLargeError, "", response.status_code)
    except ReplyTooLargeError as exc:  # the transport's names --max-reply-bytes: not this bound
        error = ReplyTooLargeError(
            f"the reply to {method} {public_url(url)} is larger than {limit} bytes ({bound}), "
            "so it was not read; check that the URL is the server you meant"
        )
        error.status_code = exc.status_code
        raise error from None
    return BoundedReply(response.status_code, bytes(body))


def _literal_family(host: str) -> socket.AddressFamily | None:
    """Return the address family of an IP literal `host`, or None for a name."""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
        except OSError:
            continue
        return family
    return None


def _reasons(exc: OSError) -> str:
    """Name why a connect failed: trio chains each address's error under a summary."""
    cause = exc.__cause__
    if isinstance(cause, BaseExceptionGroup):
        return "; ".join(str(error) for error in cause.exceptions)
    return str(cause if isinstance(cause, OSError) else exc)
