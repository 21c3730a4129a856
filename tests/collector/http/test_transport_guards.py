"""Tests of the transport's guards on real sockets: reply size, reply deadline, early replies,
stray bytes, content decoding."""

from __future__ import annotations

import gzip
import select

import httpx
import pytest
import trio
import trio.testing
from test_transport import echo, paired, read_request, replying, response, serving

from builders import network_descriptors
from trollout.collector.classify.outcomes import error_kind
from trollout.collector.http.transport import (
    BodyReplyTimeout,
    ContentDecodingError,
    Http11Transport,
    ReplyTimeout,
    ReplyTooLargeError,
    delivery_of,
)
from trollout.records import Delivery

URL = "http://agent:8000/run"
MIB = 1024 * 1024


# --- reply size --------------------------------------------------------------------------------


async def test_guard_declared_length_over_the_limit_fails_at_once() -> None:
    """A 10 GB Content-Length fails before any body byte is read; the connection is closed."""
    sent = trio.Event()

    async def huge(stream: trio.SocketStream) -> None:
        await read_request(stream, bytearray())
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 10000000000\r\n\r\n")
        sent.set()
        await trio.sleep_forever()

    async with (
        serving(huge) as server,
        Http11Transport(connect_timeout_s=10, read_timeout_s=10, max_body_bytes=MIB) as transport,
    ):
        with pytest.raises(ReplyTooLargeError) as caught:
            await transport.post(server.url, b"{}")
        assert transport.idle_connections() == 0
    message = str(caught.value)
    assert "10000000000 body bytes declared" in message
    assert f"max_reply_bytes={MIB}" in message
    assert "--max-reply-bytes" in message
    assert (caught.value.status_code, error_kind(caught.value)) == (200, "reply_too_large")
    assert delivery_of(caught.value) is Delivery.DELIVERED


@pytest.mark.parametrize("chunked", [False, True])
async def test_guard_endless_body_fails_past_the_limit(chunked: bool) -> None:
    """A body that never ends (chunked or until EOF) fails once it passes the limit."""
    piece = b"x" * 65536
    frame = b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece
    head = b"transfer-encoding: chunked\r\n" if chunked else b"connection: close\r\n"

    async def endless(stream: trio.SocketStream) -> None:
        await read_request(stream, bytearray())
        await stream.send_all(b"HTTP/1.1 200 OK\r\n" + head + b"\r\n")
        while True:
            await stream.send_all(frame)

    async with (
        serving(endless) as server,
        Http11Transport(
            connect_timeout_s=10, read_timeout_s=10, max_body_bytes=4 * MIB
        ) as transport,
    ):
        with pytest.raises(
            ReplyTooLargeError, match=r"\d+ body bytes received, over max_reply_bytes=4194304"
        ):
            await transport.post(server.url, b"{}")
        assert transport.idle_connections() == 0


async def test_guard_gzip_reply_is_decoded_on_both_paths() -> None:
    """A gzip reply reaches post() decoded, and httpx decoded once, with no encoding left."""
    body = b'{"reward": 1.0}' * 100
    encoded = gzip.compress(body)

    async def gzipped(stream: trio.SocketStream) -> None:
        buffer = bytearray()
        while await read_request(stream, buffer) is not None:
            await stream.send_all(response(200, encoded, headers=b"content-encoding: gzip\r\n"))

    async with (
        serving(gzipped) as server,
        Http11Transport(connect_timeout_s=10, read_timeout_s=10) as transport,
    ):
        assert (await transport.post(server.url, b"{}")).body == body
        async with httpx.AsyncClient(transport=transport) as client:
            reply = await client.get(server.url)
    assert reply.content == body
    assert "content-encoding" not in reply.headers


async def test_guard_unknown_content_encoding_is_a_typed_failure() -> None:
    """A reply in an encoding nobody decodes fails as content_encoding, delivered."""
    data = response(200, b"\x0b\x02\x80{}\x03", headers=b"content-encoding: br\r\n")
    async with paired(replying(data)) as transport:
        with pytest.raises(ContentDecodingError, match="'br' is not supported") as caught:
            await transport.post(URL, b"{}")
    assert error_kind(caught.value) == "content_encoding"
    assert delivery_of(caught.value) is Delivery.DELIVERED


# --- the reply deadline (fake clock, socket pairs) ----------------------------------------------


def trickling(head: bytes) -> object:
    """Return a server that sends `head` at once, then one more byte every second, forever."""

    async def handler(stream: trio.SocketStream) -> None:
        await read_request(stream, bytearray())
        await stream.send_all(head)
        while True:
            await trio.sleep(1)
            await stream.send_all(b"x")

    return handler


async def test_guard_slow_body_ends_at_the_reply_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A byte a second never trips the 10 s silence timer; the reply deadline ends it at 25 s."""
    head = b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n"
    async with paired(trickling(head), reply_timeout_s=25.0) as transport:  # type: ignore[arg-type]
        with pytest.raises(BodyReplyTimeout, match=r"reply_timeout_s=25\.0") as caught:
            await transport.post(URL, b"{}")
        assert transport.idle_connections() == 0
    assert trio.current_time() == 25.0
    assert (error_kind(caught.value), caught.value.status_code) == ("reply_timeout", 200)
    assert delivery_of(caught.value) is Delivery.DELIVERED


async def test_guard_slow_head_ends_at_the_default_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A head trickled byte by byte fails at twice read_timeout_s: possibly delivered."""
    async with paired(trickling(b"HTTP/1.1 200 OK\r\n")) as transport:  # type: ignore[arg-type]
        with pytest.raises(ReplyTimeout) as caught:
            await transport.post(URL, b"{}")
    assert trio.current_time() == 20.0
    assert error_kind(caught.value) == "reply_timeout"
    assert delivery_of(caught.value) is Delivery.POSSIBLY_DELIVERED


async def test_guard_deadlines_of_many_exchanges_are_exact(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Trickled exchanges started at different times each end reply_timeout_s after starting;
    a silent one still ends at its silence timer, the shorter of the two."""
    failed: dict[int, tuple[float, str]] = {}

    async def post_at(transport: Http11Transport, start: int) -> None:
        await trio.sleep_until(start)
        with pytest.raises(httpx.ReadTimeout) as caught:
            await transport.post(URL, b"{}")
        failed[start] = (trio.current_time(), error_kind(caught.value))

    head = b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n"
    async with paired(trickling(head), read_timeout_s=4.0, reply_timeout_s=30.0) as transport:  # type: ignore[arg-type]
        async with trio.open_nursery() as nursery:
            for start in (0, 3, 7, 25):
                nursery.start_soon(post_at, transport, start)
        transport.serve = replying(b"")  # silent from here on
        await post_at(transport, 100)
        assert not transport._deadlines._due
        assert not transport._deadlines._ends
    assert failed == {
        0: (30.0, "reply_timeout"),
        3: (33.0, "reply_timeout"),
        7: (37.0, "reply_timeout"),
        25: (55.0, "reply_timeout"),
        100: (104.0, "read_timeout"),
    }


async def test_guard_cancelled_exchange_leaves_no_timer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Cancelling a trickled exchange closes its connection and forgets both of its timers."""
    head = b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n"
    async with paired(trickling(head)) as transport:  # type: ignore[arg-type]
        with trio.move_on_after(5):
            await transport.post(URL, b"{}")
        assert trio.current_time() == 5.0
        assert transport.idle_connections() == 0
        assert not transport._deadlines._due
        assert not transport._deadlines._ends


# --- early responses --------------------------------------------------------------------------


async def test_guard_early_413_then_close_is_returned() -> None:
    """A 413 sent before a 50 MB body was read, then a close (a reset), is the reply."""

    async def refuse(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)
        await stream.send_all(response(413, b"too big", headers=b"connection: close\r\n"))

    async with (
        serving(refuse) as server,
        Http11Transport(connect_timeout_s=10, read_timeout_s=10) as transport,
    ):
        raw = await transport.post(server.url, b"x" * 50_000_000)
        assert (raw.status, raw.body, raw.truncated) == (413, b"too big", False)
        assert transport.idle_connections() == 0


async def test_guard_early_200_then_stop_reading_fails_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A 200 sent before the body was read, by a server that then stops reading, fails at
    once (not at the write timeout) as a protocol error, never as this request's success: a
    success cannot precede its request. The half-sent connection is closed."""

    async def early(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)
        await stream.send_all(response(200, b'{"early": true}'))
        await trio.sleep_forever()

    epolls = network_descriptors()
    async with paired(early) as transport:
        with pytest.raises(httpx.RemoteProtocolError, match="HTTP 200 before") as caught:
            await transport.post(URL, b"x" * 50_000_000)
        assert trio.current_time() == 0.0
        assert transport.idle_connections() == 0
    assert transport.inodes
    assert network_descriptors(inodes=transport.inodes) <= epolls
    assert delivery_of(caught.value) is Delivery.POSSIBLY_DELIVERED


async def test_guard_interim_response_during_the_upload_keeps_sending() -> None:
    """A 100 Continue while the body goes out does not stop it: the final reply sees it all."""

    async def continuing(stream: trio.SocketStream) -> None:
        buffer = bytearray(await stream.receive_some(65536))
        await stream.send_all(b"HTTP/1.1 100 Continue\r\n\r\n")
        request = await read_request(stream, buffer)
        assert request is not None
        await stream.send_all(response(200, b"%d" % len(request[1])))

    async with paired(continuing) as transport:
        raw = await transport.post(URL, b"x" * 20_000_000)
        assert (raw.status, raw.body) == (200, b"20000000")
        assert transport.idle_connections() == 1


async def test_guard_cancelled_while_blocked_sending_closes_everything(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Cancelling a send blocked on a deaf server closes the connection and its epoll."""

    async def deaf(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    epolls = network_descriptors()
    async with paired(deaf) as transport:
        with trio.move_on_after(5):
            await transport.post(URL, b"x" * 50_000_000)
        assert (trio.current_time(), transport.idle_connections()) == (5.0, 0)
    assert transport.inodes
    assert network_descriptors(inodes=transport.inodes) <= epolls


# --- bytes nobody asked for (loopback) ----------------------------------------------------------


async def test_guard_stray_bytes_after_a_response_end_its_connection() -> None:
    """Bytes right after a complete response close the connection; the next request opens
    another and gets its own reply, never the stray one."""

    async def stray(stream: trio.SocketStream) -> None:
        request = await read_request(stream, bytearray())
        assert request is not None
        await stream.send_all(response(200, request[1]) + response(200, b"stray"))
        await trio.sleep_forever()

    async with (
        serving(stray) as server,
        Http11Transport(connect_timeout_s=10, read_timeout_s=10) as transport,
    ):
        assert (await transport.post(server.url, b"one")).body == b"one"
        assert transport.idle_connections() == 0
        assert (await transport.post(server.url, b"two")).body == b"two"
    assert server.connections == 2


async def test_guard_stray_bytes_while_idle_discard_the_connection() -> None:
    """A reply that arrives while the connection is idle in the pool is never read as the next
    request's reply: that connection is discarded at checkout."""
    strayed = trio.Event()

    async def stray_later(stream: trio.SocketStream) -> None:
        buffer = bytearray()
        request = await read_request(stream, buffer)
        assert request is not None
        await stream.send_all(response(200, request[1]))
        await trio.sleep(0.01)
        await stream.send_all(response(200, b"stray"))
        strayed.set()  # on loopback the bytes are in the client's socket once send returns
        while (request := await read_request(stream, buffer)) is not None:
            await stream.send_all(response(200, request[1]))

    async with (
        serving(stray_later) as server,
        Http11Transport(connect_timeout_s=10, read_timeout_s=10) as transport,
    ):
        assert (await transport.post(server.url, b"one")).body == b"one"
        assert transport.idle_connections() == 1
        await strayed.wait()
        assert (await transport.post(server.url, b"two")).body == b"two"
    assert server.connections == 2


async def test_guard_discard_connection_spares_a_reused_one() -> None:
    """discard_connection() closes the idle connection, but not one already lent again."""
    async with (
        serving(echo) as server,
        Http11Transport(connect_timeout_s=10, read_timeout_s=10) as transport,
    ):
        first = await transport.post(server.url, b"1")
        assert first.discard_connection is not None
        first.discard_connection()
        second = await transport.post(server.url, b"2")
        assert (second.body, server.connections) == (b"2", 2)
        await transport.post(server.url, b"3")  # reuses the second connection
        assert second.discard_connection is not None
        second.discard_connection()  # too late: that connection has served another request
        assert (await transport.post(server.url, b"4")).body == b"4"
    assert server.connections == 2


async def test_guard_without_epoll_a_blocked_send_still_completes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Out of descriptors for the epoll, a send waits for room only: uploads still complete,
    and an early reply is still returned when the server closes."""

    def no_fds() -> None:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(select, "epoll", no_fds)

    async def refuse(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)
        await stream.send_all(response(413, b"too big", headers=b"connection: close\r\n"))

    async with paired(echo) as transport:
        assert len((await transport.post(URL, b"x" * 20_000_000)).body) == 20_000_000
        transport.serve = refuse
        await transport.aclose()
        assert (await transport.post(URL, b"x" * 50_000_000)).status == 413
