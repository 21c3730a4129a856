"""Tests of the transport's wire behaviour: turn-taking, pooling rules, timers, cold path."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import httpx
import pytest
import trio
import trio.testing
from test_transport import (
    echo,
    new_transport,
    paired,
    read_request,
    replying,
    response,
    serving,
)

from trollout.collector.http.exchange import Deadlines, Exchange
from trollout.collector.http.transport import BodyReadTimeout, Http11Transport, delivery_of
from trollout.records import Delivery

URL = "http://agent:8000/run"


async def test_transport_never_pipelines(autojump_clock: trio.testing.MockClock) -> None:
    """No connection ever carries a second request before its first response has gone out."""
    overlaps: list[bytes] = []

    async def slow_echo(stream: trio.SocketStream) -> None:
        buffer = bytearray()
        while (request := await read_request(stream, buffer)) is not None:
            with trio.move_on_after(1):
                overlaps.append(await stream.receive_some(65536))  # anything here overlaps
            overlaps.extend([bytes(buffer)] if buffer else [])
            await stream.send_all(response(200, request[1]))

    async def three_posts(transport: Http11Transport, index: int) -> None:
        for attempt in range(3):
            body = b"%d-%d" % (index, attempt)
            assert (await transport.post(URL, body)).body == body

    async with paired(slow_echo) as transport:
        async with trio.open_nursery() as nursery:
            for index in range(40):
                nursery.start_soon(three_posts, transport, index)
        assert transport.idle_connections() == 40
    assert overlaps == []
    assert transport.opened == 40


async def test_transport_bytes_after_a_response_close_the_connection() -> None:
    """A server that sends more than one response's bytes does not get the connection back."""
    async with paired(replying(response(200, b"ok") + b"HTTP/1.1 200 OK\r\n")) as transport:
        assert (await transport.post(URL, b"{}")).body == b"ok"
        assert transport.idle_connections() == 0


async def test_transport_connection_close_is_not_pooled() -> None:
    """A response saying Connection: close ends its connection; the next request opens anew."""

    async def closing(stream: trio.SocketStream) -> None:
        await read_request(stream, bytearray())
        await stream.send_all(response(200, b"bye", headers=b"Connection: close\r\n"))

    async with paired(closing) as transport:
        for _ in range(2):
            assert (await transport.post(URL, b"{}")).body == b"bye"
            assert transport.idle_connections() == 0
    assert transport.opened == 2


async def test_transport_large_bodies_both_ways() -> None:
    """A 3 MB request body goes out whole and a 3 MB response body comes back whole."""
    body = bytes(range(256)) * 12_000
    async with serving(echo) as server, new_transport() as transport:
        raw = await transport.post(server.url, body)
    assert (raw.status, raw.body == body, raw.truncated) == (200, True, False)


async def test_transport_rejects_bad_content_type_before_connecting() -> None:
    """A content type that would break the head raises LocalProtocolError; nothing is sent."""
    async with paired(echo) as transport:
        with pytest.raises(httpx.LocalProtocolError, match="content_type") as caught:
            await transport.post(URL, b"{}", content_type=b"text/plain\r\nx-injected: 1")
        assert transport.opened == 0
        assert (await transport.post(URL, b"{}", content_type=b"text/plain")).body == b"{}"
    assert delivery_of(caught.value) is Delivery.NOT_SENT


async def test_transport_timeouts_of_many_exchanges_are_exact(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Exchanges started at different times each time out read_timeout_s after they began."""
    failed: dict[int, float] = {}

    async def silent(stream: trio.SocketStream) -> None:
        await read_request(stream, bytearray())
        await trio.sleep_forever()

    async def post_at(transport: Http11Transport, start: int) -> None:
        await trio.sleep(start)
        with pytest.raises(httpx.ReadTimeout):
            await transport.post(URL, b"{}")
        failed[start] = trio.current_time()

    async with paired(silent) as transport, trio.open_nursery() as nursery:
        for start in (0, 3, 7, 25):
            nursery.start_soon(post_at, transport, start)
    assert failed == {0: 10.0, 3: 13.0, 7: 17.0, 25: 35.0}


async def test_transport_timer_restarts_after_a_quiet_spell(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """After fast exchanges and a long idle time, a stalled body still fails on the dot."""

    async def fast_then_stall(stream: trio.SocketStream) -> None:
        buffer = bytearray()
        for _ in range(3):
            await read_request(stream, buffer)
            await stream.send_all(response(200, b"ok"))
        await read_request(stream, buffer)
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\npart")
        await trio.sleep_forever()

    async with paired(fast_then_stall) as transport:
        for _ in range(3):
            assert (await transport.post(URL, b"{}")).body == b"ok"
        await trio.sleep(123.5)
        with pytest.raises(BodyReadTimeout):
            await transport.post(URL, b"{}")
    assert trio.current_time() == 133.5


async def test_transport_httpx_head_and_streamed_body() -> None:
    """Through httpx: HEAD replies have no body, streamed uploads go out chunked."""
    seen: list[bytes] = []

    async def server(stream: trio.SocketStream) -> None:
        buffer = bytearray()
        request = await read_request(stream, buffer)
        assert request is not None
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\n")
        while not buffer.endswith(b"0\r\n\r\n"):
            buffer += await stream.receive_some(65536)
        seen.append(bytes(buffer))
        await stream.send_all(response(201, b"stored"))

    async def upload() -> AsyncIterator[bytes]:
        yield b"hello "
        yield b"world"

    async with serving(server) as base, httpx.AsyncClient(transport=new_transport()) as client:
        head = await client.head(base.url)
        posted = await client.post(base.url, content=upload())
    assert (head.status_code, head.content, head.headers["content-length"]) == (200, b"", "50")
    assert (posted.status_code, posted.content) == (201, b"stored")
    assert b"transfer-encoding: chunked\r\n" in seen[0].lower()
    assert seen[0].endswith(b"\r\n\r\nb\r\nhello world\r\n0\r\n\r\n")
    assert base.connections == 1


async def test_transport_connects_to_host_names_too() -> None:
    """A host name (not an IP literal) is resolved and connected; the pool keys it by name."""
    async with serving(echo) as server, new_transport() as transport:
        url = server.url.replace("127.0.0.1", "localhost")
        for _ in range(2):
            assert (await transport.post(url, b"named")).body == b"named"
        assert server.connections == 1


@pytest.mark.parametrize("url", ["http://agent:8000/a b", "http://agent:8000/caf\u00e9"])
async def test_transport_rejects_paths_that_need_encoding(url: str) -> None:
    """A raw space or non-ASCII character in a POST URL raises httpx.InvalidURL naming it."""
    async with new_transport() as transport:
        with pytest.raises(httpx.InvalidURL, match="percent-encode"):
            await transport.post(url, b"{}")


async def test_transport_httpx_bad_header_is_local_protocol_error() -> None:
    """An httpx request whose header would break the head is refused before any connection."""
    async with paired(echo) as transport, httpx.AsyncClient(transport=transport) as client:
        with pytest.raises(httpx.LocalProtocolError, match="header value"):
            await client.get(URL, headers={"x-bad": "a\r\nx-injected: 1"})
        with pytest.raises(httpx.UnsupportedProtocol, match="https"):
            await client.get("https://agent:8000/")
    assert transport.opened == 0


@pytest.mark.parametrize(
    ("request_bytes", "timeout"),
    [(b"GET / HTTP/1.1\r\n\r\n", httpx.ReadTimeout), (b"x" * 50_000_000, httpx.WriteTimeout)],
)
async def test_exchange_expired_while_running_fails_before_waiting(
    request_bytes: bytes, timeout: type[httpx.TimeoutException]
) -> None:
    """An exchange whose timer ran out while it was not waiting fails at its next wait."""
    client, server = socket.socketpair()
    with client, server:
        client.setblocking(False)
        exchange = Exchange(client, URL, Deadlines(10.0), no_body=False)
        exchange.expire()  # as the watcher does when the deadline passes between two waits
        with pytest.raises(timeout, match=r"10\.0"):
            await exchange.run(request_bytes, b"", None)
        assert server.recv(4) in (b"GET ", b"xxxx")  # what fit was sent; no wait followed
