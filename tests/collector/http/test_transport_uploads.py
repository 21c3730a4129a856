"""Tests of the transport while a request goes out: floods, stray successes, slow readers,
error bodies that inflate (real sockets: loopback TCP, or socket pairs under the fake clock)."""

from __future__ import annotations

import socket
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager

import attrs
import httpx
import pytest
import trio
import trio.testing
from test_transport import paired, read_request, response, serving

from builders import HANG_GUARD_S
from trollout.collector.classify.outcomes import error_kind
from trollout.collector.http import transport as transport_module
from trollout.collector.http.exchange import Exchange
from trollout.collector.http.transport import Http11Transport, delivery_of, response_began
from trollout.records import Delivery

URL = "http://agent:8000/run"
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


# --- a server flooding interim heads (a thread: it must run while the Trio loop is busy) --------


@attrs.define
class Flood:
    """A flooding server's URL and how its flood ended (``"client closed"`` or ``"guard"``)."""

    url: str
    ended: list[str] = attrs.Factory(list)


def _flood(listener: socket.socket, flood: Flood) -> None:
    """Accept one connection, read the request head, then send 100 Continue until it closes."""
    blob = CONTINUE * 4000
    conn, _ = listener.accept()
    with conn:
        conn.settimeout(HANG_GUARD_S)
        conn.recv(65536)  # the request head: the body is never read
        deadline = time.monotonic() + HANG_GUARD_S
        try:
            while time.monotonic() < deadline:
                conn.sendall(blob)
        except TimeoutError:
            pass  # the client neither read nor closed: a hang
        except OSError:
            flood.ended.append("client closed")
            return
    flood.ended.append("guard")


@contextmanager
def flooding() -> Iterator[Flood]:
    """Serve one flooding connection on 127.0.0.1 from a thread; join it when the block ends."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(HANG_GUARD_S)
        flood = Flood(f"http://127.0.0.1:{listener.getsockname()[1]}/run")
        thread = threading.Thread(target=_flood, args=(listener, flood), daemon=True)
        thread.start()
        try:
            yield flood
        finally:
            thread.join(HANG_GUARD_S)


async def test_upload_flooded_with_interim_heads_ends_at_its_timer() -> None:
    """A server that reads only the head of a 32 MB POST and floods 100 Continue forever
    never holds the Trio loop: other tasks run, and the silence timer ends the exchange with
    WriteTimeout while the flood is still on (the client closes; the server sees it)."""
    ticks = 0

    async def heartbeat() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.sleep(0.01)

    with flooding() as flood:
        async with (
            Http11Transport(
                connect_timeout_s=10, read_timeout_s=1.0, reply_timeout_s=HANG_GUARD_S
            ) as transport,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(heartbeat)  # it first ticks at the post's first checkpoint
            with pytest.raises(httpx.WriteTimeout, match=r"stalled for 1\.0s"):
                await transport.post(flood.url, b"x" * 32_000_000)
            during = ticks
            nursery.cancel_scope.cancel(reason="test over")
            assert transport.idle_connections() == 0
    assert flood.ended == ["client closed"]
    assert during > 0


# --- a success that began before its request was sent -------------------------------------------


async def test_upload_stray_200_during_the_next_upload_is_a_failure_not_its_reply() -> None:
    """A complete 200 that a server sends while the next request's 50 MB body is still going
    out (a duplicated or replayed reply) is a protocol failure, possibly delivered, and the
    connection is closed; it is never returned as that request's result."""

    async def stray(stream: trio.SocketStream) -> None:
        request = await read_request(stream, bytearray())
        assert request is not None
        await stream.send_all(response(200, b'{"response": {"id": "A"}}'))
        await stream.receive_some(65536)  # the next request has begun to arrive
        await stream.send_all(response(200, b'{"reward": 1.0, "response": {"id": "STRAY"}}'))
        await trio.sleep_forever()  # reads no more

    async with (
        serving(stray) as server,
        Http11Transport(connect_timeout_s=10, read_timeout_s=10) as transport,
    ):
        assert (await transport.post(server.url, b"{}")).body == b'{"response": {"id": "A"}}'
        assert transport.idle_connections() == 1
        with pytest.raises(httpx.RemoteProtocolError, match="before the whole request") as caught:
            await transport.post(server.url, b"x" * 50_000_000)
        assert transport.idle_connections() == 0
    assert not response_began(caught.value)
    assert delivery_of(caught.value) is Delivery.POSSIBLY_DELIVERED
    assert error_kind(caught.value) == "protocol"
    assert "STRAY" not in str(caught.value)


# --- a server that reads slowly but steadily ----------------------------------------------------


async def test_upload_read_steadily_restarts_the_silence_timer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A server that reads a 6 MB POST 64 kB every half second (about 47 s, with a 10 s
    silence timer) and answers 5 s after the last byte gets its 200 read: every send that made
    progress restarts the timer, and the server's time to answer counts from the upload's end."""
    size = 6_000_000

    async def steady(stream: trio.SocketStream) -> None:
        buffer = bytearray()
        while b"\r\n\r\n" not in buffer or len(buffer) < buffer.index(b"\r\n\r\n") + 4 + size:
            buffer += await stream.receive_some(65536)
            await trio.sleep(0.5)
        await trio.sleep(5)  # thinking
        await stream.send_all(response(200, b"%d" % len(buffer)))

    async with paired(steady, read_timeout_s=10.0, reply_timeout_s=1000.0) as transport:
        raw = await transport.post(URL, b"x" * size)
    assert raw.status == 200
    assert int(raw.body) > size
    assert trio.current_time() > 40.0  # the upload outlasted the silence timer four times


# --- an error body that inflates ----------------------------------------------------------------


def gzip_of_zeros(size: int) -> bytes:
    """Return `size` zero bytes gzip-compressed (a zip bomb: about 1000 to 1)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    piece = bytes(1 << 20)
    parts = [compressor.compress(piece) for _ in range(size >> 20)]
    return b"".join(parts) + compressor.flush()


async def test_upload_gzip_error_body_is_decoded_no_further_than_the_error_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 500 whose gzip body inflates to 64 MB is decoded only to max_error_body_bytes + 1
    bytes (docs/protocol.md: never decode more than ~8 kB of an error body), whatever
    max_body_bytes allows; the reply keeps its first 8192 bytes, cut."""
    exchanges: list[Exchange] = []

    class Recorded(Exchange):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            exchanges.append(self)

    monkeypatch.setattr(transport_module, "Exchange", Recorded)
    bomb = gzip_of_zeros(64 << 20)

    async def error(stream: trio.SocketStream) -> None:
        await read_request(stream, bytearray())
        await stream.send_all(response(500, bomb, headers=b"content-encoding: gzip\r\n"))
        await trio.sleep_forever()

    async with (
        serving(error) as server,
        Http11Transport(connect_timeout_s=10, read_timeout_s=10) as transport,
    ):
        raw = await transport.post(server.url, b"{}")
    assert (raw.status, raw.body, raw.truncated) == (500, bytes(8192), True)
    assert [exchange.parser.size for exchange in exchanges] == [8193]
