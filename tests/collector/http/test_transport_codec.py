"""Tests of the HTTP/1.1 codec (sans-I/O): response parsing, request encoding, limits."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trollout.collector.http.http11 import (
    MAX_HEAD_BYTES,
    MAX_LINE_BYTES,
    FramingError,
    IncompleteResponseError,
    ResponseParser,
    encode_request,
    post_prefix,
)


@attrs.frozen
class Parsed:
    """What a parser made of a whole response."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes
    complete: bool
    keep_alive: bool


def parse(*pieces: bytes, eof: bool = False, no_body: bool = False) -> Parsed:
    """Feed `pieces` (then EOF if asked) to a fresh parser and return what it made."""
    parser = ResponseParser(no_body=no_body)
    for piece in pieces:
        parser.feed(piece)
    if eof:
        parser.feed_eof()
    return Parsed(parser.status, parser.headers, parser.body(), parser.complete, parser.keep_alive)


# --- strategies ---------------------------------------------------------------------------------

_FRAMING_NAMES = {b"content-length", b"transfer-encoding", b"connection"}
names = st.from_regex(rb"[A-Za-z][-A-Za-z0-9!#$%&'*+.^_`|~]{0,11}", fullmatch=True).filter(
    lambda name: name.lower() not in _FRAMING_NAMES
)
values = st.from_regex(
    rb"([\x21-\x7e\x80-\xff]([\t \x21-\x7e\x80-\xff]{0,12}[\x21-\x7e])?)?", fullmatch=True
)
spaces = st.sampled_from([b"", b" ", b"\t", b"  "])


@attrs.frozen
class Wire:
    """A valid response's bytes and what parsing them must give."""

    data: bytes
    expected: Parsed
    eof: bool


@st.composite
def header_blocks(draw: st.DrawFn) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """Return header lines (random case and optional whitespace) and their parsed pairs."""
    pairs = draw(st.lists(st.tuples(names, values), max_size=4))
    lines = b"".join(
        name + b":" + draw(spaces) + value + draw(spaces) + b"\r\n" for name, value in pairs
    )
    return lines, [(name.lower(), value) for name, value in pairs]


@st.composite
def chunked(draw: st.DrawFn, body: bytes) -> bytes:
    """Return `body` in chunks of random sizes, with optional extensions and trailers."""
    out, rest = [], body
    while rest:
        size = draw(st.integers(1, len(rest)))
        digits = draw(st.sampled_from([b"%x", b"%X", b"%04x"])) % size
        extension = draw(st.sampled_from([b"", b";name", b';a=1;b="q v"', b" ;x=y"]))
        out.append(digits + extension + b"\r\n" + rest[:size] + b"\r\n")
        rest = rest[size:]
    trailers, _ = draw(header_blocks())
    return (
        b"".join(out) + b"0" + draw(st.sampled_from([b"", b";end"])) + b"\r\n" + trailers + b"\r\n"
    )


@st.composite
def wires(draw: st.DrawFn) -> Wire:
    """Return a valid response: 1xx interims, a status line, headers and a framed body."""
    interims = b"".join(
        b"HTTP/1.1 %d Continue\r\n\r\n" % status
        for status in draw(st.lists(st.sampled_from([100, 102, 103]), max_size=2))
    )
    status = draw(st.integers(200, 599).filter(lambda code: code not in (204, 304)))
    reason = draw(st.sampled_from([b" OK", b" Not Found", b" ", b"", b" odd\treason "]))
    lines, pairs = draw(header_blocks())
    body = draw(st.binary(max_size=200))
    framing = draw(st.sampled_from(["length", "chunked", "eof"]))
    if framing == "length":
        framing_line = b"Content-Length: %d\r\n" % len(body)
        payload = body
    elif framing == "chunked":
        framing_line, payload = b"Transfer-Encoding: chunked\r\n", draw(chunked(body))
    else:
        framing_line, payload = b"", body
    head = b"HTTP/1.1 %d%s\r\n" % (status, reason) + framing_line + lines + b"\r\n"
    framing_pair = framing_line.split(b":")[0].lower()
    headers = [(framing_pair, framing_line.split(b": ")[1][:-2])] if framing_line else []
    expected = Parsed(status, headers + pairs, body, True, framing != "eof")
    return Wire(interims + head + payload, expected, framing == "eof")


def splits(data: bytes) -> st.SearchStrategy[list[bytes]]:
    """Return a strategy of non-empty pieces that join back to `data`."""
    cuts = st.lists(st.integers(1, max(1, len(data) - 1)), max_size=12, unique=True)
    return cuts.map(
        lambda points: [
            data[start:end]
            for start, end in zip([0, *sorted(points)], [*sorted(points), len(data)], strict=True)
            if data[start:end]
        ]
    )


# --- parsing valid responses ---------------------------------------------------------------------


@given(st.data())
def test_parser_any_split_parses_the_same(data: st.DataObject) -> None:
    """A valid response cut at any byte boundaries parses as it does in one piece."""
    wire = data.draw(wires())
    pieces = data.draw(splits(wire.data))
    assert parse(wire.data, eof=wire.eof) == wire.expected
    assert parse(*pieces, eof=wire.eof) == wire.expected


@given(st.data())
def test_parser_completes_only_at_the_last_byte(data: st.DataObject) -> None:
    """A length- or chunk-framed response is complete exactly when its last byte arrives."""
    wire = data.draw(wires().filter(lambda wire: not wire.eof))
    parser = ResponseParser()
    for index in range(len(wire.data)):
        assert not parser.complete
        parser.feed(wire.data[index : index + 1])
    assert parser.complete
    assert parser.body() == wire.expected.body


def test_parser_chunked_with_extensions_and_trailers() -> None:
    """Chunk extensions are ignored and trailers are checked, then dropped."""
    data = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n"
        b'5;ext=1;q="a b"\r\nhello\r\n1 ; x\r\n \r\n5\r\nworld\r\n'
        b"0;last\r\nX-Checksum: abc\r\nX-More: 1\r\n\r\n"
    )
    parsed = parse(data)
    assert (parsed.body, parsed.complete, parsed.keep_alive) == (b"hello world", True, True)
    assert parsed.headers == [(b"transfer-encoding", b"Chunked")]


def test_parser_obsolete_line_folding_becomes_a_space() -> None:
    """A folded header value is unfolded with a space, as RFC 9112 asks of user agents."""
    data = b"HTTP/1.1 200 OK\r\nX-Long: one\r\n  two\r\n\ttwo-b\r\ncontent-length: 0\r\n\r\n"
    assert parse(data).headers == [(b"x-long", b"one two two-b"), (b"content-length", b"0")]


@pytest.mark.parametrize(
    ("data", "body", "keep_alive"),
    [
        (b"HTTP/1.1 204 No Content\r\ncontent-length: 7\r\n\r\n", b"", True),
        (b"HTTP/1.1 304 Not Modified\r\ntransfer-encoding: chunked\r\n\r\n", b"", True),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 2, 2\r\ncontent-length: 02\r\n\r\nok", b"ok", True),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 9\r\n\r\n0\r\n\r\n",
            b"",
            True,
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nConnection: keep-alive, Close\r\n\r\nok",
            b"ok",
            False,
        ),
        (b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\nconnection: keep-alive\r\n\r\nok", b"ok", False),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokEXTRA", b"ok", False),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\nEXTRA", b"", False),
    ],
)
def test_parser_framing_rules(data: bytes, body: bytes, keep_alive: bool) -> None:
    """No-body statuses, agreeing lengths, chunked over length, close and stray bytes."""
    parsed = parse(data)
    assert (parsed.body, parsed.complete, parsed.keep_alive) == (body, True, keep_alive)


def test_parser_head_reply_has_no_body() -> None:
    """The reply to a HEAD request ends with its head whatever Content-Length says."""
    parsed = parse(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n", no_body=True)
    assert (parsed.body, parsed.complete, parsed.keep_alive) == (b"", True, True)


def test_parser_close_delimited_body_ends_at_eof() -> None:
    """A body with no length and no chunking runs to EOF and never keeps the connection."""
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\n\r\npart one, ")
    parser.feed(b"part two")
    assert not parser.complete
    parser.feed_eof()
    assert (parser.body(), parser.complete, parser.keep_alive) == (
        b"part one, part two",
        True,
        False,
    )


@pytest.mark.parametrize(
    ("pieces", "where"),
    [
        ([], "response"),
        ([b"HTTP/1.1 200 OK\r\ncontent-le"], "head"),
        ([b"HTTP/1.1 100 Continue\r\n\r\n"], "response"),
        ([b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nabc"], "body"),
        ([b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n"], "body"),
        ([b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\nx: 1\r\n"], "body"),
    ],
)
def test_parser_eof_before_the_end_is_incomplete(pieces: list[bytes], where: str) -> None:
    """EOF anywhere before a framed response ends raises IncompleteResponseError."""
    with pytest.raises(IncompleteResponseError, match=f"before the {where} ended"):
        parse(*pieces, eof=True)


# --- rejecting malformed responses ---------------------------------------------------------------


@pytest.mark.parametrize(
    "status_line",
    [
        b"HTTP/1.1 200OK",
        b"HTTP/1.1 20 OK",
        b"HTTP/1.1 2000 OK",
        b"HTTP/1.1 099 Low",
        b"HTTP/2 200 OK",
        b"HTTP/1.1  200 OK",
        b"http/1.1 200 OK",
        b"ICY 200 OK",
        b"HTTP/1.1 200 OK\x00",
        b"NOT HTTP AT ALL",
        b"HTTP/1.1 101 Switching Protocols",
    ],
)
def test_parser_rejects_malformed_status_lines(status_line: bytes) -> None:
    """Status lines that are not 'HTTP/1.x NNN reason' (or ask to switch) raise FramingError."""
    with pytest.raises(FramingError):
        parse(status_line + b"\r\ncontent-length: 0\r\n\r\n")


@pytest.mark.parametrize(
    "header_lines",
    [
        b"no-colon\r\n",
        b"space before: colon\r\nbad name : x\r\n",
        b"x: a\x00b\r\n",
        b"x: a\x7fb\r\n",
        b"x: bare\rcr\r\n",
        b"x: bare\nlf\r\n",
        b" folded-first: x\r\n",
        b": empty-name\r\n",
        b"content-length: -1\r\n",
        b"content-length: 1e3\r\n",
        b"content-length: 12345678901234567890\r\n",
        b"content-length: 1\r\ncontent-length: 2\r\n",
        b"content-length: 1, 2\r\n",
        b"transfer-encoding: gzip, chunked\r\n",
        b"transfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n",
    ],
)
def test_parser_rejects_malformed_headers(header_lines: bytes) -> None:
    """Bad names, control bytes, bad or conflicting lengths and unknown codings raise."""
    with pytest.raises(FramingError):
        parse(b"HTTP/1.1 200 OK\r\n" + header_lines + b"\r\n")


@pytest.mark.parametrize(
    "body",
    [
        b"zz\r\n",
        b"3\r\nabcd\r\n",
        b"3\r\nabc0\r\n\r\n",
        b"-1\r\n",
        b"10000000000000000\r\n",
        b"3\nabc\r\n",
        b"0\r\nbad trailer\r\n\r\n",
    ],
)
def test_parser_rejects_malformed_chunks(body: bytes) -> None:
    """Bad chunk sizes, overlong data, bare LF and bad trailers raise FramingError."""
    with pytest.raises(FramingError):
        parse(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + body)


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\ncontent-length: 2\nx-a: 1\n\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\nx-a: 1\r\n\n",
        b"HTTP/1.1 200 OK\ncontent-length: 2\r\nx-a: 1\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-a: 1\r\n\n",
        b"HTTP/1.1 100 Continue\n\nHTTP/1.1 200 OK\ncontent-length: 2\nx-a: 1\n\r\n",
    ],
)
def test_parser_accepts_bare_lf_and_mixed_line_ends(head: bytes) -> None:
    """Heads with bare LF or mixed line ends (even ending \\n\\r\\n) parse, in any split."""
    data = head + b"ok"
    expected = Parsed(200, [(b"content-length", b"2"), (b"x-a", b"1")], b"ok", True, True)
    for cut in range(1, len(data)):
        assert parse(data[:cut], data[cut:]) == expected
    assert parse(*[data[i : i + 1] for i in range(len(data))]) == expected


def test_parser_accepts_bare_lf_trailers() -> None:
    """A chunked body's trailers may end their lines with a bare LF; chunk lines may not."""
    data = b"HTTP/1.1 200 OK\ntransfer-encoding: chunked\n\n2\r\nok\r\n0\r\nx-t: 1\n\n"
    assert parse(data).body == b"ok"
    with pytest.raises(FramingError, match="chunk-size line"):
        parse(b"HTTP/1.1 200 OK\ntransfer-encoding: chunked\n\n2\nok\r\n")


@pytest.mark.parametrize("trickle", [False, True])
def test_parser_rejects_oversized_heads(trickle: bool) -> None:
    """A head longer than MAX_HEAD_BYTES raises, whole or arriving in small pieces."""
    data = b"HTTP/1.1 200 OK\r\n" + b"x-filler: %s\r\n" % (b"f" * 100) * 200 + b"\r\n"
    assert len(data) > MAX_HEAD_BYTES
    pieces = [data[i : i + 1000] for i in range(0, len(data), 1000)] if trickle else [data]
    with pytest.raises(FramingError, match="MAX_HEAD_BYTES"):
        parse(*pieces)


def test_parser_accepts_a_head_just_under_the_limit() -> None:
    """A head of exactly MAX_HEAD_BYTES parses."""
    start, end = b"HTTP/1.1 200 OK\r\nx: ", b"\r\ncontent-length: 0\r\n\r\n"
    data = start + b"v" * (MAX_HEAD_BYTES - len(start) - len(end)) + end
    assert len(data) == MAX_HEAD_BYTES
    assert parse(data).complete


def test_parser_rejects_an_endless_chunk_size_line() -> None:
    """A chunk-size line longer than MAX_LINE_BYTES raises instead of buffering forever."""
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;")
    parser.feed(b"e" * (MAX_LINE_BYTES - 3))
    with pytest.raises(FramingError, match="chunk-size line"):
        parser.feed(b"e")


# --- encoding requests ----------------------------------------------------------------------------


def test_post_prefix_is_checked_once() -> None:
    """The POST prefix is built from a path and host; spaces or CRLF in them are rejected."""
    assert post_prefix(b"/run?x=1", b"agent:8000") == (
        b"POST /run?x=1 HTTP/1.1\r\nhost: agent:8000\r\ncontent-type: "
    )
    with pytest.raises(FramingError, match="request target"):
        post_prefix(b"/a b", b"agent")
    with pytest.raises(FramingError, match="header value"):
        post_prefix(b"/run", b"agent\r\nx: y")


def test_encode_request_frames_bodies() -> None:
    """Bodies keep their length header, get one if missing, or go out as one chunk."""
    data, close = encode_request(b"GET", b"/", [(b"Host", b"h")], b"")
    assert (data, close) == (b"GET / HTTP/1.1\r\nHost: h\r\n\r\n", False)
    data, _ = encode_request(b"POST", b"/p", [(b"host", b"h")], b"abc")
    assert data == b"POST /p HTTP/1.1\r\nhost: h\r\ncontent-length: 3\r\n\r\nabc"
    data, _ = encode_request(b"POST", b"/p", [(b"Transfer-Encoding", b"chunked")], b"abc")
    assert data.endswith(b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
    data, _ = encode_request(b"POST", b"/p", [(b"transfer-encoding", b"chunked")], b"")
    assert data.endswith(b"\r\n\r\n0\r\n\r\n")


def test_encode_request_notes_connection_close() -> None:
    """A request that says Connection: close is reported, so its connection is not pooled."""
    assert encode_request(b"GET", b"/", [(b"Connection", b"Keep-Alive, Close")], b"")[1]


@pytest.mark.parametrize(
    ("method", "target", "headers"),
    [
        (b"GE T", b"/", []),
        (b"GET", b"/a b", []),
        (b"GET", b"", []),
        (b"GET", b"/", [(b"bad name", b"x")]),
        (b"GET", b"/", [(b"x", b"a\r\nInjected: 1")]),
        (b"GET", b"/", [(b"x", b" padded")]),
        (b"POST", b"/", [(b"transfer-encoding", b"gzip")]),
    ],
)
def test_encode_request_rejects_what_would_break_framing(
    method: bytes, target: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    """Bad methods, targets, header names or values, and unknown codings raise FramingError."""
    with pytest.raises(FramingError):
        encode_request(method, target, headers, b"")


def test_parser_bytes_fed_after_the_end_stop_reuse() -> None:
    """Bytes fed after a complete response mark the connection as not reusable."""
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
    assert (parser.complete, parser.keep_alive) == (True, True)
    parser.feed(b"HTTP/1.1 200 OK\r\n")
    assert (parser.complete, parser.keep_alive, parser.body()) == (True, False, b"ok")


def test_parser_rejects_oversized_trailers() -> None:
    """Trailers longer than MAX_HEAD_BYTES raise instead of buffering forever."""
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\nx-trailer: ")
    with pytest.raises(FramingError, match="trailers"):
        parser.feed(b"t" * MAX_HEAD_BYTES)
