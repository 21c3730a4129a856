"""Tests of the codec's body rules (sans-I/O): size limit, content decoding, quiet errors."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trollout.collector.http.http11 import (
    BodyTooLargeError,
    ContentEncodingError,
    FramingError,
    ResponseParser,
    check_field_value,
)

CHUNKED = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n"


def feed_all(parser: ResponseParser, data: bytes, *, step: int = 0, eof: bool = False) -> None:
    """Feed `data` whole, or in pieces of `step` bytes, then EOF if asked."""
    pieces = [data[i : i + step] for i in range(0, len(data), step)] if step else [data]
    for piece in pieces:
        parser.feed(piece)
    if eof:
        parser.feed_eof()


def chunked(body: bytes, size: int = 1000) -> bytes:
    """Return `body` as chunks of `size` bytes and the last chunk."""
    parts = [
        b"%x\r\n%s\r\n" % (len(body[i : i + size]), body[i : i + size])
        for i in range(0, len(body), size)
    ]
    return b"".join(parts) + b"0\r\n\r\n"


# --- the body limit ----------------------------------------------------------------------------


def test_body_limit_content_length_fails_before_the_body() -> None:
    """A Content-Length over the limit raises as soon as the head ends, no body byte read."""
    parser = ResponseParser(max_body_bytes=1000)
    with pytest.raises(BodyTooLargeError, match="2000000000 bytes declared") as caught:
        parser.feed(b"HTTP/1.1 200 OK\r\ncontent-length: 2000000000\r\n\r\n")
    assert (caught.value.size, caught.value.limit, parser.size) == (2_000_000_000, 1000, 0)


@pytest.mark.parametrize(
    ("head", "framed"),
    [(CHUNKED + b"\r\n", chunked), (b"HTTP/1.1 200 OK\r\n\r\n", lambda body: body)],
)
def test_body_limit_streamed_bodies_fail_as_they_pass_it(
    head: bytes, framed: Callable[[bytes], bytes]
) -> None:
    """Chunked and close-delimited bodies raise once more than the limit arrived, not before."""
    parser = ResponseParser(max_body_bytes=5000)
    parser.feed(head)
    data = framed(b"x" * 5000)
    feed_all(parser, data[: len(data) - 5], step=700)  # the limit itself is fine
    assert parser.size <= 5000
    parser = ResponseParser(max_body_bytes=4999)
    parser.feed(head)
    with pytest.raises(BodyTooLargeError, match=r"5000 bytes received, over the limit of 4999"):
        feed_all(parser, framed(b"x" * 5000), step=700)
    assert parser.size <= 4999


def test_body_limit_exactly_reached_is_accepted() -> None:
    """A body of exactly max_body_bytes parses in any framing."""
    for data in (
        b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nabc",
        CHUNKED + b"\r\n" + chunked(b"abc", 1),
    ):
        parser = ResponseParser(max_body_bytes=3)
        feed_all(parser, data, step=1)
        assert (parser.complete, parser.body()) == (True, b"abc")


def test_body_join_drops_the_pieces() -> None:
    """body() joins the pieces once and keeps only the joined copy."""
    parser = ResponseParser()
    feed_all(parser, b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nabcdef", step=3)
    body = parser.body()
    assert body == b"abcdef"
    assert parser.chunks == [body]
    assert parser.body() is body


# --- content codings -------------------------------------------------------------------------

PAYLOAD = b'{"reward": 1.0, "text": "' + b"hello " * 300 + b'"}'


def _raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


ENCODED = [
    (b"gzip", gzip.compress(PAYLOAD)),
    (b"x-gzip", gzip.compress(PAYLOAD)),
    (b"GZIP", gzip.compress(PAYLOAD[:500]) + gzip.compress(PAYLOAD[500:])),  # two members
    (b"deflate", zlib.compress(PAYLOAD)),
    (b"deflate", _raw_deflate(PAYLOAD)),
    (b"identity", PAYLOAD),
    (b"identity, gzip", gzip.compress(PAYLOAD)),
]


@pytest.mark.parametrize(("coding", "encoded"), ENCODED)
@pytest.mark.parametrize("framing", ["length", "chunked", "eof"])
def test_body_decoded_in_any_split(coding: bytes, encoded: bytes, framing: str) -> None:
    """gzip (one or more members), x-gzip, zlib or raw deflate decode, cut anywhere."""
    head = b"HTTP/1.1 200 OK\r\ncontent-encoding: " + coding + b"\r\n"
    if framing == "length":
        data = head + b"content-length: %d\r\n\r\n" % len(encoded) + encoded
    elif framing == "chunked":
        data = head + b"transfer-encoding: chunked\r\n\r\n" + chunked(encoded, 97)
    else:
        data = head + b"\r\n" + encoded
    for step in (0, 1, 2, 3, 50):
        parser = ResponseParser(max_body_bytes=len(PAYLOAD))
        feed_all(parser, data, step=step, eof=framing == "eof")
        assert (parser.complete, parser.body(), parser.size) == (True, PAYLOAD, len(PAYLOAD))


@given(st.binary(max_size=3000), st.integers(1, 64), st.sampled_from([b"gzip", b"deflate"]))
def test_body_decoding_round_trips(body: bytes, step: int, coding: bytes) -> None:
    """Any body, compressed and fed in pieces of any size, decodes to itself."""
    encoded = gzip.compress(body) if coding == b"gzip" else zlib.compress(body)
    data = b"HTTP/1.1 200 OK\r\ncontent-encoding: %s\r\ncontent-length: %d\r\n\r\n" % (
        coding,
        len(encoded),
    )
    parser = ResponseParser()
    feed_all(parser, data + encoded, step=step)
    assert parser.body() == body


def test_body_empty_gzip_body_is_empty() -> None:
    """An empty body labelled gzip is an empty body (as httpx reads it), not an error."""
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: 0\r\n\r\n")
    assert (parser.complete, parser.body()) == (True, b"")


def test_body_zip_bomb_never_inflates_past_the_limit() -> None:
    """100 MB of zeros gzipped to ~100 kB fails at the limit, holding no more than it."""
    bomb = gzip.compress(bytes(100_000_000), compresslevel=9)
    parser = ResponseParser(max_body_bytes=1_000_000)
    parser.feed(
        b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: %d\r\n\r\n" % len(bomb)
    )
    with pytest.raises(BodyTooLargeError, match="decoded"):
        feed_all(parser, bomb, step=65536)
    assert sum(len(chunk) for chunk in parser.chunks) <= 1_000_000


@pytest.mark.parametrize(
    ("coding", "body", "problem"),
    [
        (b"br", b"\x0b\x02\x80hi\x03", "'br' is not supported"),
        (b"gzip, gzip", gzip.compress(gzip.compress(b"x")), "'gzip, gzip' is not supported"),
        (b"sk-secret-coding", b"x", r"\(a 16-byte value\) is not supported"),
        (b"gzip", b"not gzip at all", "gzip body does not decode"),
        (b"deflate", b"\x78\x9c not deflate", "deflate body does not decode"),
        (b"gzip", gzip.compress(PAYLOAD)[:-9], "ends before its compressed stream"),
        (b"deflate", zlib.compress(b"x") + b"more", "bytes follow the end of the deflate"),
        (b"deflate", b"x", "ends before its compressed stream"),
    ],
)
def test_body_unknown_or_broken_codings_raise(coding: bytes, body: bytes, problem: str) -> None:
    """Unknown codings, corrupt or cut streams raise ContentEncodingError, naming no bytes."""
    data = b"HTTP/1.1 200 OK\r\ncontent-encoding: %s\r\ncontent-length: %d\r\n\r\n" % (
        coding,
        len(body),
    )
    with pytest.raises(ContentEncodingError, match=problem) as caught:
        ResponseParser().feed(data + body)
    assert b"secret" not in str(caught.value).encode()


def test_body_head_and_no_content_replies_skip_decoding() -> None:
    """A 204, or a reply to HEAD, labelled gzip has no body to decode."""
    head = b"HTTP/1.1 %d X\r\ncontent-encoding: gzip\r\ncontent-length: 9\r\n\r\n"
    parser = ResponseParser()
    parser.feed(head % 204)
    assert parser.complete
    parser = ResponseParser(no_body=True)
    parser.feed(head % 200)
    assert parser.complete


# --- error messages never quote the peer -------------------------------------------------------

SECRET = b"sk-live-0123456789abcdefXYZ"


@pytest.mark.parametrize(
    "data",
    [
        SECRET + b" 200 OK\r\n\r\n",
        b"HTTP/1.1 200 " + SECRET + b"\x01\r\n\r\n",
        b"HTTP/1.1 200 OK\r\napi-key: " + SECRET + b"\x01\r\n\r\n",
        b"HTTP/1.1 200 OK\napi-key " + SECRET + b"\n\n",
        b"HTTP/1.1 200 OK\r\n" + SECRET + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: " + SECRET + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 1, 2" + SECRET + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: " + SECRET + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-encoding: " + SECRET + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nx: " + SECRET * 700 + b"\r\n\r\n",
        CHUNKED + b"\r\n" + SECRET + b"\r\n",
        CHUNKED + b"\r\n3\r\n" + SECRET + b"\r\n",
        CHUNKED + b"\r\n3\n" + SECRET,
        CHUNKED + b"\r\n1;" + SECRET * 400,
        CHUNKED + b"\r\n0\r\n" + SECRET + b"\r\n\r\n",
        CHUNKED + b"\r\n0\r\n\r" + SECRET,
        CHUNKED + b"\r\n0\r\nx: " + SECRET * 700,
        b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\n\r\n" + SECRET,
    ],
)
def test_framing_errors_never_quote_the_peer(data: bytes) -> None:
    """No framing or coding error quotes 8 bytes in a row of what the peer sent."""
    with pytest.raises((FramingError, ContentEncodingError)) as caught:
        feed_all(ResponseParser(), data, eof=True)
    message = str(caught.value).encode()
    assert not any(SECRET[i : i + 8] in message for i in range(len(SECRET) - 7)), message


def test_check_field_value_never_quotes_the_value() -> None:
    """A header value with control characters (a key with a newline) is refused by size only."""
    with pytest.raises(FramingError, match=r"a header value \(28 bytes\)") as caught:
        check_field_value(SECRET + b"\n")
    assert SECRET not in str(caught.value).encode()


# --- error bodies ------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [500, 200])
def test_error_body_is_decoded_only_to_the_error_limit(status: int) -> None:
    """A chunked gzip body of 16 members (64 kB of zeros each), fed at once, is decoded only to
    max_error_body_bytes + 1 bytes when the status is not 2xx: later members are framed but
    never inflated, and the cut stream is no decoding error. A 2xx body is decoded whole."""
    member = gzip.compress(bytes(65536))
    head = b"HTTP/1.1 %d X\r\ntransfer-encoding: chunked\r\ncontent-encoding: gzip\r\n\r\n"
    parser = ResponseParser(max_body_bytes=1 << 30, max_error_body_bytes=1000)
    parser.feed(head % status + chunked(member * 16, len(member)))
    expected = 1001 if status == 500 else 16 * 65536
    assert (parser.complete, parser.size, parser.body()) == (True, expected, bytes(expected))


def test_error_body_pieces_past_the_error_limit_are_dropped() -> None:
    """An identity error body is kept up to the piece that passes the limit, then dropped;
    its framing still completes the response."""
    parser = ResponseParser(max_error_body_bytes=1000)
    parser.feed(b"HTTP/1.1 500 X\r\ncontent-length: 5000\r\n\r\n")
    feed_all(parser, b"e" * 5000, step=300)
    assert (parser.complete, parser.size, parser.body()) == (True, 1200, b"e" * 1200)
