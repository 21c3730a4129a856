"""What the transport's callers see: `RawResponse`, and the errors of an exchange.

Errors are httpx's exception types, so httpx callers and the hot path share one vocabulary.
Failures after the response's status line arrived are `ResponseBeganError` subclasses: the server
certainly got the request (`Delivery.DELIVERED`). A class with a ``failure_kind`` names its own
``failure_kind`` in the outcome (classify.py), where httpx's class would say less.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar, TypeVar

import attrs
import httpx
from attrs import frozen

from ...records import Delivery

__all__ = [
    "BodyProtocolError",
    "BodyReadError",
    "BodyReadTimeout",
    "BodyReplyTimeout",
    "ContentDecodingError",
    "RawResponse",
    "ReplyTimeout",
    "ReplyTooLargeError",
    "ResponseBeganError",
    "began",
    "delivery_of",
    "response_began",
]

_Headers = Sequence[tuple[bytes, bytes]]


@frozen
class RawResponse:
    """A response as the hot path sees it: status, raw headers, bytes.

    Attributes:
        status: the HTTP status code.
        headers: the header pairs as received, names lower-cased.
        body: the body (decoded); for non-2xx at most the transport's `max_error_body_bytes`.
        truncated: the body was cut (an oversized or interrupted error body).
        url: the URL that was requested, for messages.
        discard_connection: closes the connection that carried this response if it is idle in
            the pool (a caller that finds the reply was not its own calls it), or None.
    """

    status: int
    headers: _Headers = attrs.field(eq=False)
    body: bytes = attrs.field(repr=False)
    truncated: bool = False
    url: str = ""
    discard_connection: Callable[[], None] | None = attrs.field(default=None, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        # A transport a driver writes may build these: a wrong type would be ignored silently
        # (str header names never match), so refuse it here. One pair checked: O(1) per reply.
        if type(self.body) is not bytes:
            raise TypeError(f"RawResponse body must be bytes (got {type(self.body).__name__})")
        headers = self.headers
        if not isinstance(headers, list | tuple) or (headers and not _is_bytes_pair(headers[0])):
            raise TypeError(
                f"RawResponse headers must be a list of (bytes, bytes) pairs, names lower-cased "
                f"(got {_shape(headers)}); encode them, e.g. [(b'retry-after', b'5')]"
            )

    def header(self, name: str) -> str | None:
        """Return the first value of header `name` (any case), or None."""
        key = name.lower().encode("latin-1")
        for header_name, value in self.headers:
            if header_name == key:
                return value.decode("latin-1")
        return None


def _is_bytes_pair(pair: object) -> bool:
    return (
        isinstance(pair, tuple)
        and len(pair) == 2
        and type(pair[0]) is bytes
        and type(pair[1]) is bytes
    )


def _shape(headers: object) -> str:
    if isinstance(headers, list | tuple) and headers:
        first = headers[0]
        if isinstance(first, tuple):
            return "pairs of (" + ", ".join(type(x).__name__ for x in first) + ")"
        return f"a sequence of {type(first).__name__}"
    return type(headers).__name__


class ResponseBeganError(httpx.TransportError):
    """Base mixin of failures that came after the response's status line arrived.

    Attributes:
        status_code: the status of the response that began.
    """

    status_code: int = 0


class BodyReadError(ResponseBeganError, httpx.ReadError):
    """The connection broke while a 2xx body was being read."""


class BodyReadTimeout(ResponseBeganError, httpx.ReadTimeout):
    """A 2xx body stopped arriving for longer than the read timeout."""


class BodyProtocolError(ResponseBeganError, httpx.RemoteProtocolError):
    """A 2xx body broke HTTP/1.1 framing."""


class ReplyTooLargeError(ResponseBeganError, httpx.RemoteProtocolError):
    """The body is longer than the transport's ``max_body_bytes`` (declared or received)."""

    failure_kind: ClassVar[str] = "reply_too_large"


class ContentDecodingError(ResponseBeganError, httpx.RemoteProtocolError):
    """The body has a Content-Encoding that is not supported, or does not decode."""

    failure_kind: ClassVar[str] = "content_encoding"


class ReplyTimeout(httpx.ReadTimeout):
    """The exchange did not finish within the transport's ``reply_timeout_s``."""

    failure_kind: ClassVar[str] = "reply_timeout"


class BodyReplyTimeout(ResponseBeganError, ReplyTimeout):
    """As `ReplyTimeout`, after the response's status line arrived."""


def response_began(exc: BaseException) -> bool:
    """Return whether `exc` happened after a response began (never retry then)."""
    return isinstance(exc, ResponseBeganError)


def delivery_of(exc: BaseException) -> Delivery:
    """Return how far a request that raised `exc` got."""
    if isinstance(
        exc,
        httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout | httpx.LocalProtocolError,
    ):
        return Delivery.NOT_SENT
    if isinstance(exc, ResponseBeganError):
        return Delivery.DELIVERED
    return Delivery.POSSIBLY_DELIVERED


Began = TypeVar("Began", bound=ResponseBeganError)


def began(cls: type[Began], message: str, status: int) -> Began:
    """Return a `cls` error for a response whose status line arrived."""
    exc = cls(f"{message} (HTTP {status} began)")
    exc.status_code = status
    return exc
