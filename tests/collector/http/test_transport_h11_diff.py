"""Differential tests of the HTTP/1.1 response parser against h11 (a test-only dependency).

Responses are generated with every framing (Content-Length, chunked, until EOF), CRLF, bare LF
and mixed line ends, obsolete folding, interim responses, chunk extensions and trailers, some of
them mutated at one byte, and fed to both parsers in the same random pieces. Whenever both accept
a response, they must agree on its status, reason, headers and body. Unmutated responses must be
accepted by both, so the comparison is never vacuous.
"""

from __future__ import annotations

import attrs
import h11
from hypothesis import given, settings
from hypothesis import strategies as st

from trollout.collector.http.http11 import FramingError, ResponseParser


@attrs.frozen
class Seen:
    """What one parser made of a whole response."""

    status: int
    reason: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes


def ours(pieces: list[bytes]) -> Seen | None:
    """Parse with trollout's codec; None when it rejects the response."""
    parser = ResponseParser()
    try:
        for piece in pieces:
            parser.feed(piece)
        if not parser.complete:
            parser.feed_eof()
    except FramingError:
        return None
    return Seen(parser.status, parser.reason, h11_view(parser.headers), parser.body())


def h11_view(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Normalize framing headers as h11 does: one Content-Length, stripped; TE lower-cased."""
    view, seen_length = [], False
    for name, value in headers:
        if name == b"content-length":
            if seen_length:
                continue
            seen_length = True
            value = {item.strip() for item in value.split(b",")}.pop()
        elif name == b"transfer-encoding":
            value = value.lower()
        view.append((name, value))
    return view


def theirs(pieces: list[bytes]) -> Seen | None:
    """Parse with h11 as the client of a GET; None when it rejects the response."""
    conn = h11.Connection(our_role=h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
    conn.send(h11.EndOfMessage())
    head: h11.Response | None = None
    body = bytearray()
    try:
        for piece in [*pieces, b""]:  # b"": EOF
            conn.receive_data(piece)
            while (event := conn.next_event()) is not h11.NEED_DATA:
                if isinstance(event, h11.Response):
                    head = event
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    assert head is not None
                    return Seen(head.status_code, head.reason, list(head.headers), bytes(body))
                elif isinstance(event, h11.ConnectionClosed):
                    return None
    except h11.RemoteProtocolError:
        return None
    return None


# --- strategies ---------------------------------------------------------------------------------

ends = st.sampled_from([b"\r\n", b"\n"])
_TOKEN_CHARS = "-!#$%&'*+.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_FRAMING_NAMES = {b"content-length", b"transfer-encoding", b"connection", b"content-encoding"}
names = (
    st.text(_TOKEN_CHARS, min_size=1, max_size=10)
    .map(str.encode)
    .filter(lambda name: name.lower() not in _FRAMING_NAMES)
)
_visible = st.sampled_from([bytes([c]) for c in [*range(0x21, 0x7F), 0x80, 0xE9, 0xFF]])
_words = st.lists(_visible, min_size=1, max_size=4).map(b"".join)
values = st.lists(st.tuples(st.sampled_from([b" ", b"\t", b"  "]), _words), max_size=3).map(
    lambda parts: b"".join(sep + word for sep, word in parts)[1:] if parts else b""
)
spaces = st.sampled_from([b"", b" ", b"\t", b"  "])
INTERESTING = [b"\r", b"\n", b" ", b"\t", b":", b";", b"0", b"\x00", b"\x7f", b"x"]


@st.composite
def header_lines(draw: st.DrawFn) -> bytes:
    """Return header lines with random whitespace, line ends and obsolete folds."""
    lines = []
    for name, value in draw(st.lists(st.tuples(names, values), max_size=4)):
        line = name + b":" + draw(spaces) + value + draw(spaces)
        if draw(st.integers(0, 5)) == 0:
            line += draw(ends) + draw(st.sampled_from([b" ", b"\t", b"  "])) + draw(values)
        lines.append(line + draw(ends))
    return b"".join(lines)


@st.composite
def chunked_bodies(draw: st.DrawFn, body: bytes) -> bytes:
    """Return `body` chunked: random sizes, hex case, leading zeros, extensions, trailers."""
    out, rest = [], body
    while rest:
        size = draw(st.integers(1, len(rest)))
        digits = draw(st.sampled_from([b"%x", b"%X", b"%03x"])) % size
        extension = draw(st.sampled_from([b"", b";name", b";a=1;b=2", b"; x "]))
        out.append(digits + extension + b"\r\n" + rest[:size] + b"\r\n")
        rest = rest[size:]
    last = b"0" + draw(st.sampled_from([b"", b";end"])) + b"\r\n"
    return b"".join(out) + last + draw(header_lines()) + draw(ends)


@st.composite
def responses(draw: st.DrawFn) -> bytes:
    """Return a response h11 and trollout should both accept: any framing, any line ends."""
    interims = b"".join(
        b"HTTP/1.1 %d Early%s" % (code, draw(ends)) + draw(header_lines()) + draw(ends)
        for code in draw(st.lists(st.sampled_from([100, 102, 103]), max_size=2))
    )
    version = draw(st.sampled_from([b"1.1", b"1.0"]))
    status = draw(st.integers(200, 599))
    reason = draw(st.sampled_from([b"", b" ", b" OK", b" Not Found", b" odd\treason "]))
    body = draw(st.binary(max_size=120))
    framing = draw(st.sampled_from(["length", "lengths", "chunked", "both", "eof"]))
    if framing in ("length", "lengths"):
        extra = b", %d" % len(body) if framing == "lengths" else b""
        framing_lines = b"Content-Length: %s%s" % (b"%d" % len(body), extra) + draw(ends)
        payload = body
    elif framing in ("chunked", "both"):
        length = b"Content-Length: 99" + draw(ends) if framing == "both" else b""
        framing_lines = (
            length
            + b"Transfer-Encoding: "
            + draw(st.sampled_from([b"chunked", b"Chunked"]))
            + draw(ends)
        )
        payload = draw(chunked_bodies(body))
    else:
        framing_lines, payload = b"", body
    if status in (204, 304):
        payload = b""
    connection = draw(st.sampled_from([b"", b"Connection: keep-alive\r\n", b"connection: close\n"]))
    head = b"HTTP/%s %d%s" % (version, status, reason) + draw(ends)
    head += draw(header_lines()) + framing_lines + connection + draw(header_lines()) + draw(ends)
    return interims + head + payload


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """Return a generated response with one byte replaced, inserted or deleted."""
    data = draw(responses())
    at = draw(st.integers(0, len(data) - 1))
    byte = draw(st.sampled_from(INTERESTING))
    how = draw(st.sampled_from(["replace", "insert", "delete"]))
    if how == "replace":
        return data[:at] + byte + data[at + 1 :]
    if how == "insert":
        return data[:at] + byte + data[at:]
    return data[:at] + data[at + 1 :]


def splits(data: bytes) -> st.SearchStrategy[list[bytes]]:
    """Return a strategy of non-empty pieces that join back to `data`."""
    cuts = st.lists(st.integers(1, max(1, len(data) - 1)), max_size=10, unique=True)
    return cuts.map(
        lambda points: [
            data[start:end]
            for start, end in zip([0, *sorted(points)], [*sorted(points), len(data)], strict=True)
            if data[start:end]
        ]
    )


# --- tests ----------------------------------------------------------------------------------------


@settings(max_examples=100)
@given(st.data())
def test_codec_agrees_with_h11_on_generated_responses(data: st.DataObject) -> None:
    """Both parsers accept every generated response, in any pieces, and agree on it."""
    wire = data.draw(responses())
    pieces = data.draw(splits(wire))
    mine, h11s = ours(pieces), theirs(pieces)
    assert mine is not None
    assert h11s is not None
    assert mine == h11s
    assert ours([wire]) == mine


@settings(max_examples=200)
@given(st.data())
def test_codec_agrees_with_h11_on_mutated_responses(data: st.DataObject) -> None:
    """On a response mutated at one byte, whatever both parsers accept they read alike."""
    wire = data.draw(mutated())
    pieces = data.draw(splits(wire))
    mine, h11s = ours(pieces), theirs(pieces)
    if mine is not None and h11s is not None:
        assert mine == h11s
