"""Tests of the transport while a request goes out: floods, stray successes, slow readers,
error bodies that inflate (real sockets: loopback TCP, or socket pairs under the fake clock)."""

from __future__ import annotations

import zlib

import pytest
import trio
import trio.testing
from test_transport import read_request, response, serving

from trollout.collector import transport as transport_module
from trollout.collector.exchange import Exchange
from trollout.collector.transport import H11Transport

URL = "http://agent:8000/run"
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


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
    bytes (protocol.md: never decode more than ~8 kB of an error body), whatever
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
        H11Transport(connect_timeout_s=10, read_timeout_s=10) as transport,
    ):
        raw = await transport.post(server.url, b"{}")
    assert (raw.status, raw.body, raw.truncated) == (500, bytes(8192), True)
    assert [exchange.parser.size for exchange in exchanges] == [8193]
