"""Content codings of response bodies: gzip and deflate, decoded as they arrive, bounded.

`decoder_for` reads a Content-Encoding value and returns a `Decoder` (None for identity); the
parser (http11.py) feeds it each piece of body with the room its size limit still allows.
Design note. Each piece is inflated with ``max_length`` one byte past that room, so more output
than the room proves the body too large without ever holding more than the limit plus one byte:
a zip bomb costs what the limit allows and no more. Rejected alternative: inflating whole and
checking afterwards, which is what a zip bomb exploits. Only gzip (also ``x-gzip``, several
members allowed, as the gzip format does) and deflate (zlib-wrapped as RFC 9110 says, or raw, as
some servers send; the two-byte zlib header tells them apart, so the choice does not depend on
how the body is split) are decoded: any other coding is a `ContentEncodingError`, as is a stream
that does not decode or ends early. Messages never quote the body, and quote a coding value only
when it is made of registered coding names.
"""

from __future__ import annotations

import re
import zlib
from typing import Final

from ...errors import TrolloutError

__all__ = ["ContentEncodingError", "Decoder", "coding_name", "decoder_for"]

# Registered coding names: a value made of these alone is safe to quote in a message.
_CODING_NAMES: Final = re.compile(
    rb"(?:(?:chunked|compress|deflate|gzip|identity|x-gzip|x-compress|br|zstd|dcb|dcz|exi"
    rb"|pack200-gzip|aes128gcm)(?:[\t ]*,[\t ]*|$))+",
    re.IGNORECASE,
)
_GZIP_WBITS: Final = 16 + zlib.MAX_WBITS


class ContentEncodingError(TrolloutError, ValueError):
    """The body has a Content-Encoding that is not supported, or does not decode."""


def coding_name(value: bytes) -> str:
    """Quote a coding value made of registered names only; otherwise give just its size."""
    if _CODING_NAMES.fullmatch(value.strip(b" \t")):
        return repr(value.decode("ascii"))
    return f"(a {len(value)}-byte value)"


def decoder_for(value: bytes) -> Decoder | None:
    """Return the decoder for a Content-Encoding value (None: identity), or raise."""
    tokens = (token.strip(b" \t") for token in value.lower().split(b","))
    codings = [token for token in tokens if token and token != b"identity"]
    if not codings:
        return None
    if len(codings) == 1 and codings[0] in (b"gzip", b"x-gzip", b"deflate"):
        return Decoder(gzip=codings[0] != b"deflate")
    raise ContentEncodingError(
        f"Content-Encoding {coding_name(value)} is not supported; gzip and deflate are"
    )


class Decoder:
    """Decode a gzip or deflate body incrementally, never inflating past a budget."""

    __slots__ = ("_gzip", "_pending", "_zlib")

    def __init__(self, *, gzip: bool) -> None:
        self._gzip = gzip
        self._pending = b""  # deflate: the first byte, until the zlib header can be told
        self._zlib: zlib._Decompress | None = None  # made at the first byte: b"" is no stream

    def decode(self, data: bytes | bytearray, room: int) -> bytes:
        """Return `data` decoded: at most ``room + 1`` bytes, so more than `room` means over."""
        decompressor = self._zlib
        if decompressor is None:
            decompressor = self._start(data)
            if decompressor is None:
                return b""
            data, self._pending = self._pending + data, b""
        out = self._inflate(decompressor, data, room)
        while decompressor.eof and decompressor.unused_data and len(out) <= room:
            if not self._gzip:
                raise ContentEncodingError("bytes follow the end of the deflate stream")
            rest = decompressor.unused_data  # another gzip member (gzip allows several)
            decompressor = self._zlib = zlib.decompressobj(_GZIP_WBITS)
            out += self._inflate(decompressor, rest, room - len(out))
        return out

    def _start(self, data: bytes | bytearray) -> zlib._Decompress | None:
        if self._gzip:
            self._zlib = zlib.decompressobj(_GZIP_WBITS)
            return self._zlib
        head = self._pending + data
        if len(head) < 2:
            self._pending = bytes(head)
            return None
        # RFC 9110's "deflate" is zlib-wrapped; some servers send raw deflate (as browsers and
        # httpx, accept both; the two-byte zlib header tells them apart).
        wrapped = head[0] & 0x0F == 8 and (head[0] << 8 | head[1]) % 31 == 0
        self._zlib = zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
        return self._zlib

    def _inflate(self, decompressor: zlib._Decompress, data: bytes | bytearray, room: int) -> bytes:
        try:
            return decompressor.decompress(data, room + 1)
        except zlib.error as exc:
            raise ContentEncodingError(f"the {self._name} body does not decode ({exc})") from None

    @property
    def _name(self) -> str:
        return "gzip" if self._gzip else "deflate"

    def finish(self) -> None:
        """Check that the compressed stream ended with the body (an empty body is fine)."""
        if self._zlib is None and not self._pending:
            return
        if self._zlib is None or not self._zlib.eof:
            raise ContentEncodingError(f"the {self._name} body ends before its compressed stream")
