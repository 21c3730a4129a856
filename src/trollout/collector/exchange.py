"""One HTTP/1.1 exchange on a connection the pool lent: send, read, time out.

Also the vocabulary the transport's callers see: `RawResponse`, and the `ResponseBegan`
failures that came after a status line arrived.

Design note. Each exchange does one ``send`` of its request, then waits for readability and
``recv``s (a response is rarely there before the first wait, so trying ``recv`` first would
mostly fail), all on the plain non-blocking socket: Trio's socket methods add a scheduler round
trip per call, and `trio.SocketStream` a conflict detector besides. The read timeout is not a
cancel scope per exchange (measured: 8-10 us of CPU to open and close one around a checkpoint,
a quarter of the transport's cost per request at 64 in flight) but one `Deadlines` queue per
transport, enforced by one Trio system task; see that class. A system task rather than a task in
a caller's nursery because the transport has no nursery of its own: callers make it as
``H11Transport(...)`` and may never enter it. Rejected alternative: a ``trio.move_on_after``
scope per exchange, as before.
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, TypeVar

import attrs
import httpx
import trio
from attrs import frozen

from ..records import Delivery
from .http11 import FramingError, IncompleteResponseError, ResponseParser

__all__ = [
    "BodyProtocolError",
    "BodyReadError",
    "BodyReadTimeout",
    "Deadlines",
    "Exchange",
    "RawResponse",
    "ResponseBegan",
    "delivery_of",
    "response_began",
]

_RECEIVE_BYTES: Final = 65536
_Headers = Sequence[tuple[bytes, bytes]]
_wait_readable = trio.lowlevel.wait_readable
_wait_writable = trio.lowlevel.wait_writable


@frozen
class RawResponse:
    """A response as the hot path sees it: status, raw headers, bytes.

    Attributes:
        status: the HTTP status code.
        headers: the header pairs as received, names lower-cased.
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
    if isinstance(
        exc,
        httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout | httpx.LocalProtocolError,
    ):
        return Delivery.NOT_SENT
    if isinstance(exc, ResponseBegan):
        return Delivery.DELIVERED
    return Delivery.POSSIBLY_DELIVERED


_Began = TypeVar("_Began", bound=ResponseBegan)


def _began(cls: type[_Began], message: str, status: int) -> _Began:
    exc = cls(message)
    exc.status_code = status
    return exc


class Expired(Exception):
    """An exchange's read timeout ran out (raised inside the exchange, never outside)."""


class Deadlines:
    """The read-timeout deadlines of the exchanges in flight, and one task that enforces them.

    Every deadline is "now + timeout" when set, so insertion order is deadline order and a dict
    (insertion-ordered, O(1) insert and delete) is the whole queue: the first entry is the
    earliest. The watcher sleeps until the first deadline, or one timeout ahead when there is
    none; an entry added later can only be due later, so the watcher never needs waking early.
    A due exchange is marked expired and its socket's waiters are woken with
    `trio.ClosedResourceError` (`trio.lowlevel.notify_closing`); the exchange then raises its
    phase's timeout. An exchange that is running rather than waiting when it expires finds the
    mark before its next wait, just as a cancel scope would cancel it at its next checkpoint.
    """

    __slots__ = ("_due", "_watching", "timeout_s")

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._due: dict[Exchange, float] = {}
        self._watching = False

    def start(self, exchange: Exchange) -> None:
        """Start `exchange`'s timer (and the watcher, if it is not running)."""
        self._due[exchange] = trio.current_time() + self.timeout_s
        if not self._watching:
            self._watching = True
            trio.lowlevel.spawn_system_task(self._watch, name="H11Transport read timeouts")

    def push(self, exchange: Exchange) -> None:
        """Restart `exchange`'s timer: the silence it measures starts again now."""
        del self._due[exchange]
        self._due[exchange] = trio.current_time() + self.timeout_s

    def stop(self, exchange: Exchange) -> None:
        """Forget `exchange` (done, failed or cancelled)."""
        self._due.pop(exchange, None)

    async def _watch(self) -> None:
        # A system task: it must never raise. Trio cancels it when the run's main task ends.
        due = self._due
        try:
            while True:
                now = trio.current_time()
                wake = now + self.timeout_s
                while due:
                    exchange = next(iter(due))
                    if due[exchange] > now:
                        wake = due[exchange]
                        break
                    del due[exchange]
                    exchange.expire()
                await trio.sleep_until(wake)
        finally:
            self._watching = False


class Exchange:
    """One request and its response on one connection, under one silence timer.

    The transport's `Deadlines` times it: each receive restarts the timer, so it measures
    silence, not the whole exchange. When it runs out, `expire` marks the exchange and wakes its
    wait; the exchange then raises the timeout of the phase it was in.
    """

    __slots__ = ("deadlines", "expired", "parser", "sent", "sock", "url")

    def __init__(
        self, sock: socket.socket, url: str, deadlines: Deadlines, *, no_body: bool
    ) -> None:
        self.sock = sock
        self.url = url
        self.deadlines = deadlines
        self.expired = False
        self.sent = False
        self.parser = ResponseParser(no_body=no_body)

    def expire(self) -> None:
        """Mark the read timeout as run out and wake the exchange if it is waiting."""
        self.expired = True
        trio.lowlevel.notify_closing(self.sock)

    async def run(self, data: bytes, body: bytes, limit: int | None) -> None:
        """Send `data` and `body`, then read the response (error bodies up to `limit` bytes).

        Raises:
            httpx.TransportError: as `H11Transport.post` documents.

        Cancellation: a checkpoint; nothing is sent if the caller is already cancelled. A
        cancellation leaves the connection in an unknown state: the caller closes it.
        """
        await trio.lowlevel.checkpoint_if_cancelled()  # never send for a cancelled caller
        try:
            await self._send(data)
            if body:
                await self._send(body)
            self.sent = True
            await self._read(limit)
        except Expired:
            self._timed_out(limit)
        except httpx.TransportError:
            if not self._bounded(limit):
                raise
            # An error body is kept as far as it arrived.

    def response(self, limit: int | None) -> RawResponse:
        """Build the response read so far (cut to `limit` for error bodies)."""
        parser = self.parser
        body = parser.body()
        truncated = not parser.complete
        if limit is not None and len(body) > limit and self._bounded(limit):
            body = body[:limit]
            truncated = True
        return RawResponse(parser.status, parser.headers, body, truncated, self.url)

    def _timed_out(self, limit: int | None) -> None:
        """Raise the timeout of the phase that stalled, unless an error body can be returned."""
        if self._bounded(limit):
            return
        timeout_s = self.deadlines.timeout_s
        message = f"{self.url} sent nothing for read_timeout_s={timeout_s}"
        if not self.sent:
            message = f"sending the request to {self.url} stalled for {timeout_s}s"
            raise httpx.WriteTimeout(message)
        status = self.parser.status
        if not status:
            raise httpx.ReadTimeout(message)
        raise _began(BodyReadTimeout, f"{message} (HTTP {status} began)", status)

    def _cut(self, limit: int | None) -> bool:
        """Return whether an error body has grown past `limit` (read no further)."""
        return limit is not None and self.parser.size > limit and self._bounded(limit)

    def _bounded(self, limit: int | None) -> bool:
        """Return whether a non-2xx response began and its body is read only up to `limit`."""
        status = self.parser.status
        return limit is not None and status != 0 and not 200 <= status < 300

    async def _send(self, data: bytes) -> None:
        sock = self.sock
        sent = 0
        while True:
            try:
                sent += sock.send(memoryview(data)[sent:] if sent else data)
            except BlockingIOError:
                pass
            except OSError as exc:
                message = f"sending the request to {self.url} failed: {exc}"
                raise httpx.WriteError(message) from exc
            if sent >= len(data):
                return
            await self._wait(_wait_writable)

    async def _read(self, limit: int | None) -> None:
        # One flat loop: this is the hot path, and every coroutine layer between here and the
        # socket is paid again at each suspension.
        sock = self.sock
        parser = self.parser
        while True:
            if self.expired:
                raise Expired
            try:
                await _wait_readable(sock)
                data = sock.recv(_RECEIVE_BYTES)
            except BlockingIOError:
                continue
            except trio.ClosedResourceError:
                raise Expired from None  # only `expire` wakes a wait on our own socket
            except OSError as exc:
                raise self._broken(exc) from exc
            try:
                if data:
                    parser.feed(data)
                else:
                    parser.feed_eof()
            except FramingError as exc:
                raise self._framing_error(exc) from exc
            if parser.complete or self._cut(limit):
                return
            self.deadlines.push(self)

    async def _wait(self, wait: Callable[[socket.socket], Awaitable[None]]) -> None:
        if not self.expired:
            try:
                await wait(self.sock)
                return
            except trio.ClosedResourceError:
                pass  # only `expire` wakes a wait on our own socket
        raise Expired

    def _broken(self, exc: OSError) -> httpx.ReadError:
        message = f"the connection to {self.url} broke: {exc}"
        status = self.parser.status
        if not status:
            return httpx.ReadError(message)
        return _began(BodyReadError, f"{message} (HTTP {status} began)", status)

    def _framing_error(self, exc: FramingError) -> httpx.TransportError:
        status = self.parser.status
        if isinstance(exc, IncompleteResponseError):
            if not status:
                return httpx.ReadError(f"{self.url} closed the connection before responding")
            message = f"{self.url} closed the connection mid-body (HTTP {status} began)"
            return _began(BodyReadError, message, status)
        if not status:
            return httpx.RemoteProtocolError(f"{self.url} broke HTTP/1.1 framing: {exc}")
        message = f"{self.url} broke HTTP/1.1 framing: {exc} (HTTP {status} began)"
        return _began(BodyProtocolError, message, status)
