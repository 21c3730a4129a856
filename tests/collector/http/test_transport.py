"""Tests of the h11-over-Trio transport: pool, timeouts, errors, cancellation, loopback."""

from __future__ import annotations

import os
import resource
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress

import attrs
import httpx
import pytest
import trio
import trio.testing

from builders import HANG_GUARD_S
from trollout.collector.http.transport import (
    BodyProtocolError,
    BodyReadError,
    BodyReadTimeout,
    Http11Transport,
    RawResponse,
    delivery_of,
    response_began,
)
from trollout.records import Delivery

Handler = Callable[[trio.SocketStream], Awaitable[None]]
SETTINGS: dict[str, float] = {"connect_timeout_s": 10.0, "read_timeout_s": 10.0}


def new_transport(**settings: float) -> Http11Transport:
    """Return an Http11Transport with 10 s timeouts unless `settings` say otherwise."""
    return Http11Transport(**(SETTINGS | settings))  # type: ignore[arg-type]


# --- tiny HTTP/1.1 servers -------------------------------------------------------------------


async def read_request(stream: trio.SocketStream, buffer: bytearray) -> tuple[bytes, bytes] | None:
    """Read one request from `stream`; return (head, body), or None at EOF."""
    while b"\r\n\r\n" not in buffer:
        data = await stream.receive_some(65536)
        if not data:
            return None
        buffer += data
    end = buffer.index(b"\r\n\r\n")
    head = bytes(buffer[:end])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(buffer) < end + 4 + length:
        buffer += await stream.receive_some(65536)
    body = bytes(buffer[end + 4 : end + 4 + length])
    del buffer[: end + 4 + length]
    return head, body


def response(status: int, body: bytes, *, headers: bytes = b"") -> bytes:
    """Return a complete HTTP/1.1 response with a content-length."""
    head = f"HTTP/1.1 {status} X\r\ncontent-length: {len(body)}\r\n".encode()
    return head + headers + b"\r\n" + body


async def echo(stream: trio.SocketStream) -> None:
    """Answer every request on the connection with 200 and the request's body."""
    buffer = bytearray()
    with trio.move_on_after(30):
        while (request := await read_request(stream, buffer)) is not None:
            await stream.send_all(response(200, request[1]))


def reset(stream: trio.SocketStream) -> None:
    """Close `stream` with a TCP reset (SO_LINGER 0)."""
    stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    stream.socket.close()


@attrs.define
class Server:
    """A loopback server: its `/run` URL and how many connections it accepted."""

    url: str
    connections: int = 0


@asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[Server]:
    """Serve `handler` on 127.0.0.1 until the block ends."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1", backlog=1024)
    port = listeners[0].socket.getsockname()[1]
    server = Server(f"http://127.0.0.1:{port}/run")

    async def counted(stream: trio.SocketStream) -> None:
        server.connections += 1
        async with stream:
            with suppress(trio.BrokenResourceError):  # some tests close on the server
                await handler(stream)

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, counted, listeners)
        yield server
        nursery.cancel_scope.cancel(reason="test over")


class PairTransport(Http11Transport):
    """A transport whose connections are socket pairs served in-process (fake-clock safe)."""

    def __init__(self, nursery: trio.Nursery, serve: Handler | None, **settings: float) -> None:
        super().__init__(**settings)  # type: ignore[arg-type]
        self.nursery = nursery
        self.serve = serve
        self.opened = 0
        self.inodes: list[int] = []  # of every socket it made, both ends

    async def _open_stream(self, host: str, port: int) -> trio.SocketStream:
        self.opened += 1
        if self.serve is None:
            await trio.sleep_forever()  # a SYN nobody answers
        client, server = trio.socket.socketpair()
        self.inodes += [os.fstat(client.fileno()).st_ino, os.fstat(server.fileno()).st_ino]
        self.nursery.start_soon(self._serve_one, self.serve, trio.SocketStream(server))
        return trio.SocketStream(client)

    async def _serve_one(self, serve: Handler, stream: trio.SocketStream) -> None:
        async with stream:
            with suppress(trio.BrokenResourceError):  # some tests close on the server
                await serve(stream)


@asynccontextmanager
async def paired(serve: Handler | None, **settings: float) -> AsyncIterator[PairTransport]:
    """Open a PairTransport whose servers stop when the block ends."""
    async with trio.open_nursery() as nursery:
        async with PairTransport(nursery, serve, **(SETTINGS | settings)) as transport:
            yield transport
        nursery.cancel_scope.cancel(reason="test over")


# --- RawResponse and error vocabulary ----------------------------------------------------------


def test_raw_response_header_ignores_case() -> None:
    """header() finds a header whatever the case of the name asked for."""
    raw = RawResponse(503, [(b"retry-after", b"7")], b"", False)
    assert raw.header("Retry-After") == "7"
    assert raw.header("content-type") is None


def test_delivery_of_connect_family_is_not_sent() -> None:
    """Connect errors never sent anything; read errors may have; begun responses did."""
    assert delivery_of(httpx.ConnectError("x")) is Delivery.NOT_SENT
    assert delivery_of(httpx.ConnectTimeout("x")) is Delivery.NOT_SENT
    assert delivery_of(httpx.ReadError("x")) is Delivery.POSSIBLY_DELIVERED
    assert delivery_of(httpx.WriteTimeout("x")) is Delivery.POSSIBLY_DELIVERED
    assert delivery_of(BodyReadError("x")) is Delivery.DELIVERED
    assert response_began(BodyReadTimeout("x"))
    assert not response_began(httpx.ReadTimeout("x"))


async def test_transport_post_rejects_https() -> None:
    """Only plain http:// URLs are spoken; others raise httpx.UnsupportedProtocol."""
    async with new_transport() as transport:
        with pytest.raises(httpx.UnsupportedProtocol, match="https"):
            await transport.post("https://127.0.0.1:1/run", b"{}")


async def test_transport_post_rejects_url_without_host() -> None:
    """A URL with no host raises httpx.InvalidURL naming it."""
    async with new_transport() as transport:
        with pytest.raises(httpx.InvalidURL, match="has no host"):
            await transport.post("http:///run", b"{}")


# --- framing and errors on socket pairs ---------------------------------------------------------


def replying(data: bytes) -> Handler:
    """Return a server that reads one request and sends `data` verbatim."""

    async def handler(stream: trio.SocketStream) -> None:
        await read_request(stream, bytearray())
        await stream.send_all(data)
        await trio.sleep_forever()

    return handler


async def test_transport_garbage_reply_is_protocol_error() -> None:
    """A reply that is not HTTP raises RemoteProtocolError before any response began."""
    async with paired(replying(b"NOT HTTP AT ALL\r\n\r\n")) as transport:
        with pytest.raises(httpx.RemoteProtocolError) as caught:
            await transport.post("http://agent:8000/run", b"{}")
    assert not response_began(caught.value)


async def test_transport_broken_chunk_is_body_protocol_error() -> None:
    """Bad chunk framing after a 200 head raises BodyProtocolError with the status."""
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    async with paired(replying(head + b"zz\r\n")) as transport:
        with pytest.raises(BodyProtocolError) as caught:
            await transport.post("http://agent:8000/run", b"{}")
    assert caught.value.status_code == 200
    assert isinstance(caught.value, httpx.RemoteProtocolError)


async def test_transport_skips_informational_responses() -> None:
    """A 100 Continue before the real response is skipped."""
    data = b"HTTP/1.1 100 Continue\r\n\r\n" + response(200, b"done")
    async with paired(replying(data)) as transport:
        assert (await transport.post("http://agent:8000/run", b"{}")).body == b"done"


async def test_transport_peer_gone_while_sending_is_write_error() -> None:
    """A server that closes while the body is still going out raises WriteError."""

    async def slam(stream: trio.SocketStream) -> None:
        pass  # the pair helper closes the stream on return

    async with paired(slam) as transport:
        with pytest.raises(httpx.WriteError) as caught:
            await transport.post("http://agent:8000/run", b"x" * 50_000_000)
    assert delivery_of(caught.value) is Delivery.POSSIBLY_DELIVERED


# --- timeouts on the fake clock (socket pairs) ---------------------------------------------------


async def test_transport_connect_timeout_at_exact_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A connection that never establishes fails with ConnectTimeout after connect_timeout_s."""
    async with paired(None, connect_timeout_s=3.0) as transport:
        with pytest.raises(httpx.ConnectTimeout, match=r"connect_timeout_s=3\.0"):
            await transport.post("http://agent:8000/run", b"{}")
    assert trio.current_time() == 3.0


async def test_transport_read_timeout_at_exact_time(autojump_clock: trio.testing.MockClock) -> None:
    """A server that never answers fails the request with ReadTimeout after read_timeout_s."""

    async def silent(stream: trio.SocketStream) -> None:
        await read_request(stream, bytearray())
        await trio.sleep_forever()

    async with paired(silent) as transport:
        with pytest.raises(httpx.ReadTimeout) as caught:
            await transport.post("http://agent:8000/run", b"{}")
    assert trio.current_time() == 10.0
    assert not response_began(caught.value)
    assert delivery_of(caught.value) is Delivery.POSSIBLY_DELIVERED


async def test_transport_read_timeout_measures_silence(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A slow body that never pauses for read_timeout_s completes; one longer pause fails."""
    scripts = [[9, 9, 9], [9, 11]]  # per connection: waits before the head, then each byte

    async def trickle(stream: trio.SocketStream) -> None:
        gaps = scripts.pop(0)
        await read_request(stream, bytearray())
        await trio.sleep(gaps[0])
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\na")
        for gap in gaps[1:]:
            await trio.sleep(gap)
            await stream.send_all(b"b")

    async with paired(trickle, reply_timeout_s=100.0) as transport:
        raw = await transport.post("http://agent:8000/run", b"{}")
        assert (raw.body, trio.current_time()) == (b"abb", 27.0)
        await transport.aclose()  # the next request gets a fresh scripted connection
        with pytest.raises(BodyReadTimeout) as caught:
            await transport.post("http://agent:8000/run", b"{}")
    assert trio.current_time() == 27.0 + 9 + 10
    assert caught.value.status_code == 200
    assert delivery_of(caught.value) is Delivery.DELIVERED


async def test_transport_write_timeout_when_server_stops_reading(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A body the server never reads stalls the send: WriteTimeout after read_timeout_s."""

    async def deaf(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    async with paired(deaf) as transport:
        with pytest.raises(httpx.WriteTimeout):
            await transport.post("http://agent:8000/run", b"x" * 50_000_000)
    assert trio.current_time() == 10.0
    assert transport.idle_connections() == 0


async def test_transport_error_body_timeout_keeps_partial_body(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A stalled non-2xx body is returned as far as it arrived, marked truncated."""

    async def stall(stream: trio.SocketStream) -> None:
        await read_request(stream, bytearray())
        await stream.send_all(b"HTTP/1.1 500 X\r\ncontent-length: 100\r\n\r\npartial")
        await trio.sleep_forever()

    async with paired(stall) as transport:
        raw = await transport.post("http://agent:8000/run", b"{}")
    assert (raw.status, raw.body, raw.truncated) == (500, b"partial", True)
    assert transport.idle_connections() == 0


async def test_transport_cancelled_mid_body_closes_connection(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Cancelling while a body arrives closes that connection; the next request opens anew."""
    eofs: list[float] = []

    async def half_then_wait(stream: trio.SocketStream) -> None:
        buffer = bytearray()
        await read_request(stream, buffer)
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc")
        assert await stream.receive_some(10) == b""  # the client closed its end
        eofs.append(trio.current_time())

    async with paired(half_then_wait) as transport:
        with trio.move_on_after(5):
            await transport.post("http://agent:8000/run", b"{}")
        assert transport.idle_connections() == 0
        await trio.testing.wait_all_tasks_blocked()
        assert eofs == [5.0]
        transport.serve = echo
        assert (await transport.post("http://agent:8000/run", b"again")).body == b"again"
        assert transport.opened == 2


# --- loopback ---------------------------------------------------------------------------------


async def test_transport_keep_alive_reuses_one_connection() -> None:
    """Sequential posts to one host share a single TCP connection."""
    async with serving(echo) as server, new_transport() as transport:
        for index in range(20):
            raw = await transport.post(server.url, b'{"n": %d}' % index)
            assert (raw.status, raw.body, raw.truncated) == (200, b'{"n": %d}' % index, False)
        assert server.connections == 1
        assert transport.idle_connections() == 1


async def test_transport_survives_server_idle_close() -> None:
    """A pooled connection the server closed is discarded, not used for a doomed request."""
    closed = trio.Event()

    async def one_then_close(stream: trio.SocketStream) -> None:
        request = await read_request(stream, bytearray())
        assert request is not None
        await stream.send_all(response(200, b"ok"))
        await stream.aclose()
        closed.set()

    async with serving(one_then_close) as server, new_transport() as transport:
        assert (await transport.post(server.url, b"{}")).body == b"ok"
        await closed.wait()
        await trio.sleep(0.01)  # let the FIN arrive
        assert (await transport.post(server.url, b"{}")).body == b"ok"
        assert server.connections == 2


async def test_transport_reset_mid_response_is_response_began() -> None:
    """A reset after the status line raises BodyReadError: delivered, never retried."""

    async def cut(stream: trio.SocketStream) -> None:
        await read_request(stream, bytearray())
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n0123456789")
        await trio.testing.wait_all_tasks_blocked(0.05)  # the client read the head and waits
        reset(stream)

    async with serving(cut) as server, new_transport() as transport:
        with pytest.raises(httpx.ReadError) as caught:
            await transport.post(server.url, b"{}")
        assert transport.idle_connections() == 0
    assert response_began(caught.value)
    assert delivery_of(caught.value) is Delivery.DELIVERED
    assert str(server.url) in str(caught.value)


async def test_transport_reset_before_response_is_possibly_delivered() -> None:
    """A reset after the request went out, before any reply, may have been delivered."""

    async def drop(stream: trio.SocketStream) -> None:
        await read_request(stream, bytearray())
        reset(stream)

    async with serving(drop) as server, new_transport() as transport:
        with pytest.raises(httpx.ReadError) as caught:
            await transport.post(server.url, b"{}")
    assert not response_began(caught.value)
    assert delivery_of(caught.value) is Delivery.POSSIBLY_DELIVERED


async def test_transport_hang_raises_read_timeout() -> None:
    """A server that accepts the request and hangs fails it with ReadTimeout."""

    async def hang(stream: trio.SocketStream) -> None:
        await read_request(stream, bytearray())
        await trio.sleep_forever()

    async with serving(hang) as server, new_transport(read_timeout_s=0.2) as transport:
        with pytest.raises(httpx.ReadTimeout):
            await transport.post(server.url, b"{}")


async def test_transport_refused_port_is_connect_error() -> None:
    """A closed port raises ConnectError, which never sent anything."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with new_transport() as transport:
        with pytest.raises(httpx.ConnectError, match=f"127.0.0.1:{port}") as caught:
            await transport.post(f"http://127.0.0.1:{port}/run", b"{}")
    assert "Connection refused" in str(caught.value)
    assert delivery_of(caught.value) is Delivery.NOT_SENT


async def test_transport_oversized_error_body_is_cut_and_closed() -> None:
    """A huge non-2xx body is read to max_error_body_bytes and its connection closed."""

    async def flood(stream: trio.SocketStream) -> None:
        await read_request(stream, bytearray())
        await stream.send_all(response(500, b"e" * 1_000_000))

    async with serving(flood) as server, new_transport() as transport:
        raw = await transport.post(server.url, b"{}")
        assert transport.idle_connections() == 0
    assert (raw.status, len(raw.body), raw.truncated) == (500, 8192, True)


async def test_transport_small_error_body_keeps_connection() -> None:
    """A complete non-2xx body within the bound leaves the connection reusable."""

    async def busy(stream: trio.SocketStream) -> None:
        buffer = bytearray()
        while await read_request(stream, buffer) is not None:
            await stream.send_all(response(503, b"busy", headers=b"retry-after: 2\r\n"))

    async with serving(busy) as server, new_transport() as transport:
        for _ in range(3):
            raw = await transport.post(server.url, b"{}")
            assert (raw.status, raw.body, raw.truncated) == (503, b"busy", False)
            assert raw.header("retry-after") == "2"
        assert server.connections == 1


async def test_transport_reads_chunked_and_close_delimited_bodies() -> None:
    """Chunked bodies keep the connection; an EOF-delimited body closes it."""

    async def framings(stream: trio.SocketStream) -> None:
        buffer = bytearray()
        await read_request(stream, buffer)
        chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
        await stream.send_all(chunked)
        await read_request(stream, buffer)
        await stream.send_all(b"HTTP/1.0 200 OK\r\n\r\nuntil-eof")
        await stream.aclose()

    async with serving(framings) as server, new_transport() as transport:
        assert (await transport.post(server.url, b"{}")).body == b"abc"
        assert transport.idle_connections() == 1
        assert (await transport.post(server.url, b"{}")).body == b"until-eof"
        assert transport.idle_connections() == 0


async def test_transport_cancelled_request_is_not_pooled() -> None:
    """A request cancelled while waiting closes its connection (the server sees EOF)."""
    server_saw_eof = trio.Event()

    async def wait_for_close(stream: trio.SocketStream) -> None:
        buffer = bytearray()
        await read_request(stream, buffer)
        if await stream.receive_some(10) == b"":
            server_saw_eof.set()

    async with serving(wait_for_close) as server, new_transport() as transport:
        with trio.move_on_after(0.05) as scope:
            await transport.post(server.url, b"{}")
        assert scope.cancelled_caught
        assert transport.idle_connections() == 0
        with trio.fail_after(HANG_GUARD_S):
            await server_saw_eof.wait()


async def test_transport_max_idle_per_host_closes_extras() -> None:
    """Connections beyond max_idle_per_host are closed when they come back."""
    async with serving(echo) as server:
        async with Http11Transport(
            connect_timeout_s=10.0, read_timeout_s=10.0, max_idle_per_host=2
        ) as transport:
            async with trio.open_nursery() as nursery:
                for _ in range(5):
                    nursery.start_soon(transport.post, server.url, b"{}")
            assert server.connections == 5
            assert transport.idle_connections() == 2
        assert transport.idle_connections() == 0


async def test_transport_512_concurrent_posts_succeed() -> None:
    """512 posts in flight at once over loopback all land, each with its own body."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2048:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
    bodies: dict[int, bytes] = {}
    async with serving(echo) as server, new_transport() as transport:

        async def post(index: int) -> None:
            bodies[index] = (await transport.post(server.url, b"%d" % index)).body

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for index in range(512):
                    nursery.start_soon(post, index)
        assert transport.idle_connections() == server.connections
    assert bodies == {index: b"%d" % index for index in range(512)}


async def test_transport_serves_httpx_client_get() -> None:
    """httpx.AsyncClient(transport=Http11Transport(...)) does a GET round-trip with a query."""
    seen: list[bytes] = []

    async def config(stream: trio.SocketStream) -> None:
        buffer = bytearray()
        while (request := await read_request(stream, buffer)) is not None:
            seen.append(request[0].split(b"\r\n")[0])
            await stream.send_all(response(200, b'{"status": "ok"}'))

    async with serving(config) as server:
        base = server.url.removesuffix("/run")
        transport = new_transport()
        async with httpx.AsyncClient(transport=transport, base_url=base) as client:
            reply = await client.get("/global_config_dict_yaml", params={"x": "1"})
            posted = await client.post("/run", json={"a": 1})
        assert reply.status_code == 200
        assert reply.json() == {"status": "ok"}
        assert posted.status_code == 200
        assert seen == [b"GET /global_config_dict_yaml?x=1 HTTP/1.1", b"POST /run HTTP/1.1"]
        assert server.connections == 1
