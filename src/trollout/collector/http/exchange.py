# Stays whole: an exchange and the `Deadlines` queue that times it call each other (start,
# push, stop; expire): one timing mechanism, no cancel scope per exchange.
"""One HTTP/1.1 exchange on a connection the pool lent: send, read, time out.

Design note. Each exchange does one ``send`` of its request, then waits for readability and
``recv``s (a response is rarely there before the first wait, so trying ``recv`` first would
mostly fail), all on the plain non-blocking socket: Trio's socket methods add a scheduler round
trip per call, and `trio.SocketStream` a conflict detector besides. The timers are not a cancel
scope per exchange (measured: 8-10 us of CPU to open and close one around a checkpoint, a
quarter of the transport's cost per request at 64 in flight) but one `Deadlines` queue per
transport, enforced by one Trio system task; see that class. A system task rather than a task in
a caller's nursery because the transport has no nursery of its own: callers make it as
``Http11Transport(...)`` and may never enter it. Rejected alternative: a ``trio.move_on_after``
scope per exchange, as before.

Two timers run per exchange: silence (``read_timeout_s``, restarted by every byte received and,
while the request goes out, by every send that made progress after waiting for room, the last one
included, so the server's time to answer counts from the end of the upload) and the whole
exchange (``reply_timeout_s``, from the first byte sent to the last byte received), so a server
that trickles a byte a second, or reads a request that slowly, cannot hold a rollout forever.

Early responses. A server may answer before it has read the whole request (a 413 to a large
POST, or a 200 from a server that does not need the rest) and then stop reading or close. While
a send waits for room, the exchange therefore waits for the socket to become writable *or*
readable, with one ``epoll`` descriptor watching both (Linux; one Trio task can wait on one
readiness at a time, and a second task would need a nursery, whose exception groups would wrap
a caller's `trio.Cancelled`); elsewhere it waits for writability only and sees the response when
the server closes. When a send fails, whatever the server already sent is read. Each wakeup
reads one piece and waits again, so a server that floods interim (1xx) heads while it reads
nothing never holds the Trio loop, and the timers end it. A final non-2xx response that began is
read to its end and returned instead of a write error, as httpx does (a 413 is a real answer);
its connection is closed, since the request was never completed. An early 2xx is a
`httpx.RemoteProtocolError` instead: a success that began before the server had the whole
request cannot be the result of running it (a stray or replayed reply would otherwise be
recorded as this request's). Sends that do not block, the hot path, pay nothing for this.
"""

from __future__ import annotations

import select
import socket
from collections.abc import Awaitable, Callable
from typing import Any, Final

import httpx
import trio

from ...text import public_url
from .http11 import (
    BodyTooLargeError,
    ContentEncodingError,
    FramingError,
    IncompleteResponseError,
    ResponseParser,
)
from .replies import (
    BodyProtocolError,
    BodyReadError,
    BodyReadTimeout,
    BodyReplyTimeout,
    ContentDecodingError,
    RawResponse,
    ReplyTimeout,
    ReplyTooLargeError,
    began,
)

__all__ = ["Deadlines", "Exchange", "ExpiredError"]

_RECEIVE_BYTES: Final = 65536
_wait_readable = trio.lowlevel.wait_readable
_wait_writable = trio.lowlevel.wait_writable
_EPOLL: Final = hasattr(select, "epoll")
_SILENCE: Final = 1  # why an exchange expired: the silence timer ...
_REPLY: Final = 2  # ... or the whole-exchange deadline


class ExpiredError(Exception):
    """An exchange's timer ran out (raised inside the exchange, never outside)."""


class Deadlines:
    """The timers of the exchanges in flight, and one task that enforces them.

    Each exchange has a silence deadline ("now + timeout_s", set again at every receive) and a
    whole-exchange deadline ("start + reply_timeout_s", fixed). Within each kind every deadline
    is "now + one fixed timeout" when set, so insertion order is deadline order and a dict
    (insertion-ordered, O(1) insert and delete) is the whole queue: the first entry is the
    earliest. The watcher sleeps until the first deadline of either queue, or one (shorter)
    timeout ahead when both are empty; an entry added later can only be due later, so the
    watcher never needs waking early. A due exchange is marked expired and its socket's waiters
    are woken with `trio.ClosedResourceError` (`trio.lowlevel.notify_closing`); the exchange then
    raises its phase's timeout. An exchange that is running rather than waiting when it expires
    finds the mark before its next wait, just as a cancel scope would cancel it at its next
    checkpoint.

    Args:
        timeout_s: the longest silence.
        reply_timeout_s: the longest whole exchange (None: twice `timeout_s`).
    """

    __slots__ = ("_closing", "_due", "_ends", "_nap", "_watching", "reply_timeout_s", "timeout_s")

    def __init__(self, timeout_s: float, reply_timeout_s: float | None = None) -> None:
        self.timeout_s = timeout_s
        self.reply_timeout_s = 2.0 * timeout_s if reply_timeout_s is None else reply_timeout_s
        self._due: dict[Exchange, float] = {}
        self._ends: dict[Exchange, float] = {}
        self._watching = False
        self._closing = False
        self._nap: trio.CancelScope | None = None  # the watcher's sleep, woken to end it

    def start(self, exchange: Exchange) -> None:
        """Start `exchange`'s timers (and the watcher, if it is not running)."""
        now = trio.current_time()
        self._due[exchange] = now + self.timeout_s
        self._ends[exchange] = now + self.reply_timeout_s
        if not self._watching:
            self._watching = True
            trio.lowlevel.spawn_system_task(self._watch, name="Http11Transport timeouts")

    def push(self, exchange: Exchange) -> None:
        """Restart `exchange`'s silence timer: the silence it measures starts again now."""
        del self._due[exchange]
        self._due[exchange] = trio.current_time() + self.timeout_s

    def stop(self, exchange: Exchange) -> None:
        """Forget `exchange` (done, failed or cancelled)."""
        self._due.pop(exchange, None)
        self._ends.pop(exchange, None)
        if self._closing:
            self._end_if_idle()

    def close(self) -> None:
        """End the watcher once no exchange is timed any more (at once if none is).

        The transport calls this from ``aclose``; an exchange started afterwards gets a watcher
        of its own again, which ends with the last such exchange.
        """
        self._closing = True
        self._end_if_idle()

    def _end_if_idle(self) -> None:
        if self._nap is not None and not self._due and not self._ends:
            self._nap.cancel()

    async def _watch(self) -> None:
        # A system task: it must never raise. Trio cancels it when the run's main task ends.
        # It ends when its transport is closed and no exchange is timed, so a driver that opens
        # a transport per step does not collect one idle task per step until `trio.run` ends.
        idle_s = min(self.timeout_s, self.reply_timeout_s)
        try:
            while not (self._closing and not self._due and not self._ends):
                now = trio.current_time()
                wake = min(
                    now + idle_s,
                    _expire_due(self._due, now, _SILENCE),
                    _expire_due(self._ends, now, _REPLY),
                )
                with trio.CancelScope() as self._nap:
                    await trio.sleep_until(wake)
        finally:
            self._watching = False
            self._nap = None


def _expire_due(queue: dict[Exchange, float], now: float, reason: int) -> float:
    """Expire the exchanges of `queue` that are due; return the next deadline (or inf)."""
    while queue:
        exchange = next(iter(queue))
        when = queue[exchange]
        if when > now:
            return when
        del queue[exchange]
        exchange.expire(reason)
    return float("inf")


def _watch_both(sock: socket.socket) -> select.epoll | None:
    """Return an epoll that is readable when `sock` is readable or writable (None: no fds)."""
    try:
        either = select.epoll()
    except OSError:
        return None  # out of descriptors: the send waits for room only
    either.register(sock.fileno(), select.EPOLLIN | select.EPOLLOUT)
    return either


class Exchange:
    """One request and its response on one connection, under the transport's two timers.

    The transport's `Deadlines` times it. When a timer runs out, `expire` marks the exchange and
    wakes its wait; the exchange then raises the timeout of the phase it was in.

    Attributes:
        parser: the response so far.
        sent: the whole request went out (False after an early response: never reuse then).
    """

    __slots__ = ("_either", "_peer_closed", "deadlines", "expired", "parser", "sent", "sock", "url")

    def __init__(
        self,
        sock: socket.socket,
        url: str,
        deadlines: Deadlines,
        *,
        no_body: bool,
        max_body_bytes: int | None = None,
        max_error_body_bytes: int | None = None,
    ) -> None:
        self.sock = sock
        self.url = url
        self.deadlines = deadlines
        self.expired = 0
        self.sent = False
        self.parser = ResponseParser(
            no_body=no_body,
            max_body_bytes=max_body_bytes,
            max_error_body_bytes=max_error_body_bytes,
        )
        self._either: select.epoll | None = None  # made when a send first has to wait
        self._peer_closed = False

    def expire(self, reason: int = _SILENCE) -> None:
        """Mark a timer as run out (the first reason wins) and wake a waiting exchange."""
        if self.expired:
            return
        self.expired = reason
        trio.lowlevel.notify_closing(self.sock)
        if self._either is not None:
            trio.lowlevel.notify_closing(self._either)

    async def run(self, data: bytes, body: bytes, limit: int | None) -> None:
        """Send `data` and `body`, then read the response (error bodies up to `limit` bytes).

        Raises:
            httpx.RemoteProtocolError: a 2xx began before the request was fully sent.
            httpx.TransportError: as `Http11Transport.post` documents.

        Cancellation: a checkpoint; nothing is sent if the caller is already cancelled. A
        cancellation leaves the connection in an unknown state: the caller closes it.
        """
        await trio.lowlevel.checkpoint_if_cancelled()  # never send for a cancelled caller
        try:
            if await self._send(data) and (not body or await self._send(body)):
                self.sent = True
            elif 200 <= self.parser.status < 300:
                raise self._early_success()
            if not self.parser.complete:
                await self._read(limit)
        except ExpiredError:
            self._timed_out(limit)
        except httpx.TransportError:
            if not self._bounded(limit):
                raise
            # An error body is kept as far as it arrived.
        finally:
            self._close_either()

    def response(self, limit: int | None, discard: Callable[[], None] | None = None) -> RawResponse:
        """Build the response read so far (cut to `limit` for error bodies)."""
        parser = self.parser
        body = parser.body()
        truncated = not parser.complete
        if limit is not None and len(body) > limit and self._bounded(limit):
            body = body[:limit]
            truncated = True
        return RawResponse(parser.status, parser.headers, body, truncated, self.url, discard)

    def _timed_out(self, limit: int | None) -> None:
        """Raise the timeout of the phase that stalled, unless an error body can be returned."""
        if self._bounded(limit):
            return
        status = self.parser.status
        if self.expired == _REPLY:
            message = (
                f"the exchange with {self.shown} did not finish within reply_timeout_s="
                f"{self.deadlines.reply_timeout_s} ({self.parser.size} body bytes received);"
                " raise --reply-timeout if replies legitimately take this long"
            )
            if not status:
                raise ReplyTimeout(message)
            raise began(BodyReplyTimeout, message, status)
        timeout_s = self.deadlines.timeout_s
        if not self.sent and not status:
            raise httpx.WriteTimeout(
                f"sending the request to {self.shown} stalled for {timeout_s}s"
            )
        message = f"{self.shown} sent nothing for read_timeout_s={timeout_s}"
        if not status:
            raise httpx.ReadTimeout(message)
        raise began(BodyReadTimeout, message, status)

    def _early_success(self) -> httpx.RemoteProtocolError:
        # Not a ResponseBeganError: the reply is not this request's, so nothing proves delivery.
        return httpx.RemoteProtocolError(
            f"{self.shown} answered HTTP {self.parser.status} before the whole request was sent;"
            " a success cannot precede its request (a stray or replayed reply), so it is not"
            " taken as this request's result"
        )

    def _cut(self, limit: int | None) -> bool:
        """Return whether an error body has grown past `limit` (read no further)."""
        return limit is not None and self.parser.size > limit and self._bounded(limit)

    def _bounded(self, limit: int | None) -> bool:
        """Return whether a non-2xx response began and its body is read only up to `limit`."""
        status = self.parser.status
        return limit is not None and status != 0 and not 200 <= status < 300

    async def _send(self, data: bytes) -> bool:
        """Send `data`; return False when a final response began first (send no more)."""
        sock = self.sock
        sent = 0
        waited = False
        while True:
            try:
                progress = sock.send(memoryview(data)[sent:] if sent else data)
            except BlockingIOError:
                progress = 0
            except OSError as exc:
                if self._read_early():
                    return False
                message = f"sending the request to {self.shown} failed: {exc}"
                raise httpx.WriteError(message) from exc
            if progress and waited:
                if self.expired:
                    raise ExpiredError  # expired while this task was running: no timer to restart
                self.deadlines.push(self)  # the server is reading: it is not silent
            sent += progress
            if sent >= len(data):
                return True
            waited = True
            if await self._wait_send() and self._read_early():
                return False

    async def _wait_send(self) -> bool:
        """Wait until the socket takes more bytes or has bytes to read; return the latter."""
        either = self._either
        if either is None and _EPOLL and not self._peer_closed:
            either = self._either = _watch_both(self.sock)
        if either is None or self._peer_closed:
            await self._wait(_wait_writable, self.sock)
            return False
        await self._wait(_wait_readable, either)
        return any(events & select.EPOLLIN for _, events in either.poll(0))

    def _read_early(self) -> bool:
        """Read one piece the server sent while the request went out; return if a reply began.

        One piece, not until the socket is empty: a server may send faster than this parses,
        and the caller waits (a checkpoint, where the timers fire) before reading again.
        """
        parser = self.parser
        try:
            data = self.sock.recv(_RECEIVE_BYTES)
        except OSError:
            return parser.status != 0  # nothing yet (or a reset): what arrived stays parsed
        try:
            if data:
                parser.feed(data)
            elif parser.status:
                parser.feed_eof()
            else:
                self._peer_closed = True  # the send will fail, or finish and read EOF
        except (FramingError, ContentEncodingError) as exc:
            raise self._framing_error(exc) from exc
        return parser.status != 0

    def _close_either(self) -> None:
        either = self._either
        if either is not None:
            self._either = None
            trio.lowlevel.notify_closing(either)
            either.close()

    async def _read(self, limit: int | None) -> None:
        # One flat loop: this is the hot path, and every coroutine layer between here and the
        # socket is paid again at each suspension.
        sock = self.sock
        parser = self.parser
        while True:
            if self.expired:
                raise ExpiredError
            try:
                await _wait_readable(sock)
                data = sock.recv(_RECEIVE_BYTES)
            except BlockingIOError:
                continue
            except trio.ClosedResourceError:
                raise ExpiredError from None  # only `expire` wakes a wait on our own socket
            except OSError as exc:
                raise self._broken(exc) from exc
            try:
                if data:
                    parser.feed(data)
                else:
                    parser.feed_eof()
            except (FramingError, ContentEncodingError) as exc:
                raise self._framing_error(exc) from exc
            if parser.complete or self._cut(limit):
                return
            if self.expired:
                raise ExpiredError  # expired while this task was running: no timer to restart
            self.deadlines.push(self)

    async def _wait(self, wait: Callable[[Any], Awaitable[None]], on: object) -> None:
        if not self.expired:
            try:
                await wait(on)
                return
            except trio.ClosedResourceError:
                pass  # only `expire` wakes a wait on our own socket or epoll
        raise ExpiredError

    @property
    def shown(self) -> str:
        """The URL as messages (and so failure rows) show it: no credentials, no query."""
        return public_url(self.url)

    def _broken(self, exc: OSError) -> httpx.ReadError:
        message = f"the connection to {self.shown} broke: {exc}"
        status = self.parser.status
        if not status:
            return httpx.ReadError(message)
        return began(BodyReadError, message, status)

    def _framing_error(self, exc: FramingError | ContentEncodingError) -> httpx.TransportError:
        status = self.parser.status
        url = self.shown
        if isinstance(exc, BodyTooLargeError):
            message = (
                f"the reply from {url} is too large: {exc.size} body bytes {exc.seen}, over"
                f" max_reply_bytes={exc.limit}; raise --max-reply-bytes if such replies are"
                " expected"
            )
            return began(ReplyTooLargeError, message, status)
        if isinstance(exc, ContentEncodingError):
            return began(ContentDecodingError, f"the reply from {url} is unreadable: {exc}", status)
        if isinstance(exc, IncompleteResponseError):
            if not status:
                return httpx.ReadError(f"{url} closed the connection before responding")
            return began(BodyReadError, f"{url} closed the connection mid-body", status)
        if not status:
            return httpx.RemoteProtocolError(f"{url} broke HTTP/1.1 framing: {exc}")
        return began(BodyProtocolError, f"{url} broke HTTP/1.1 framing: {exc}", status)
