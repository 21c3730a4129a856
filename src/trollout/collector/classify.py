"""Turn a `/run` reply or a transport error into an outcome (protocol.md section 2).

Pure functions, no I/O. A reply decides by status first, then, for a 200 whose body is a JSON
object, by the sentinel keys:

| reply                                    | outcome                                         |
|------------------------------------------|-------------------------------------------------|
| 200, ``_ng_no_persist: true``            | Failed(no_persist, class from reply or kill)    |
| 200, ``_ng_failure_class`` not null      | Failed(producer's class, terminal, kind, extra) |
| 200, other JSON object                   | Landed(result = the reply without stamps)       |
| 200, body not a JSON object              | Failed(agent_run_error, ``malformed_body``)     |
| 429, 502, 503, 504                       | Failed(agent_request_failed, ``http_<status>``) |
| any other status                         | Failed(agent_run_error, ``http_<status>``)      |
| no reply (connect, reset, timeout...)    | Failed(agent_request_failed, status null)       |

Failure rows never carry a reward or response the collector made up: an infrastructure failure
is not a zero score. Bodies are decoded from at most `MAX_DECODED_BODY_BYTES` and kept to
`MAX_TEXT_CHARS` characters, with ``…`` appended when cut.
"""

from __future__ import annotations

import email.utils
import http
import time
from collections.abc import Mapping
from typing import Any, Final

import httpx
import orjson

from .. import records
from ..records import Delivery, Failed, FailureClass, Identity, Landed
from .transport import RawResponse, ResponseBegan, delivery_of

__all__ = [
    "GATEWAY_STATUSES",
    "MAX_DECODED_BODY_BYTES",
    "MAX_TEXT_CHARS",
    "cut_text",
    "error_kind",
    "one_line_message",
    "outcome_from_error",
    "outcome_from_response",
    "retry_after_seconds",
]

GATEWAY_STATUSES: Final = frozenset({429, 502, 503, 504})  # a gateway answered: nothing proven
MAX_DECODED_BODY_BYTES: Final = 8192
MAX_TEXT_CHARS: Final = 2000
_ELLIPSIS: Final = "…"

# Keys of the reply the collector owns: stamps it re-applies, failure fields it maps.
_STAMP_KEYS: Final = records.IDENTITY_KEYS | {
    records.AGENT_REF,
    records.TASK_SOURCE,
    records.ELAPSED,
}
_FAILURE_FIELD_KEYS: Final = frozenset(
    {
        records.FAILURE_CLASS,
        records.FAILURE_TERMINAL,
        records.FAILURE_TYPE,
        records.FAILURE_MESSAGE,
        records.FAILURE_HTTP_STATUS,
        records.FAILURE_BODY,
        records.FAILURE_MAX_ATTEMPTS,
        records.FAILURE_DELIVERY,
        records.FAILURE_KIND,
        records.NO_PERSIST,
    }
)

# Exception kinds, most specific first (ConnectTimeout is no ConnectError in httpx).
_KINDS: Final[tuple[tuple[type[BaseException], str], ...]] = (
    (httpx.ConnectTimeout, "connect_timeout"),
    (httpx.ConnectError, "connect"),
    (httpx.PoolTimeout, "pool_timeout"),
    (httpx.WriteTimeout, "write_timeout"),
    (httpx.ReadTimeout, "read_timeout"),
    (httpx.WriteError, "write"),
    (httpx.ReadError, "reset"),
    (httpx.RemoteProtocolError, "protocol"),
)


def cut_text(text: str, limit: int = MAX_TEXT_CHARS, *, cut: bool = False) -> str:
    """Return `text` kept to `limit` characters, with ``…`` appended when cut.

    Args:
        text: the text.
        limit: characters kept.
        cut: the text is already a cut of something longer (append ``…`` regardless).
    """
    if len(text) > limit:
        return text[:limit] + _ELLIPSIS
    return text + _ELLIPSIS if cut else text


def one_line_message(text: str) -> str:
    """Return `text` on one line, at most `MAX_TEXT_CHARS` characters (``…`` when cut)."""
    line = " ".join(text.split())
    return line[: MAX_TEXT_CHARS - 1] + _ELLIPSIS if len(line) > MAX_TEXT_CHARS else line


def _body_text(response: RawResponse) -> str:
    head = response.body[:MAX_DECODED_BODY_BYTES]
    cut = response.truncated or len(response.body) > MAX_DECODED_BODY_BYTES
    return cut_text(head.decode("utf-8", errors="replace"), cut=cut)


def retry_after_seconds(response: RawResponse, *, now: float | None = None) -> float | None:
    """Return the reply's ``Retry-After`` as seconds from now (>= 0), or None.

    Args:
        response: the reply.
        now: Unix time an HTTP-date is measured from (default: the wall clock).
    """
    value = response.header("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            moment = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = moment.timestamp() - (time.time() if now is None else now)
    return max(seconds, 0.0) if seconds == seconds else None  # NaN is no delay


def outcome_from_response(
    identity: Identity,
    attempt_index: int,
    response: RawResponse,
    *,
    elapsed_seconds: float | None,
    max_attempts: int | None,
) -> Landed | Failed:
    """Classify a `/run` reply (protocol.md section 2).

    Args:
        identity: the rollout.
        attempt_index: the attempt that got this reply.
        response: the reply.
        elapsed_seconds: wall time of the attempt.
        max_attempts: the attempt cap in force, written on failure rows.
    """
    if response.status != 200:
        return _status_failure(identity, attempt_index, response, elapsed_seconds, max_attempts)
    try:
        reply = orjson.loads(response.body)
    except orjson.JSONDecodeError as exc:
        problem = f"is not JSON ({exc})"
        return _malformed(identity, attempt_index, response, elapsed_seconds, max_attempts, problem)
    if not isinstance(reply, dict):
        problem = f"is a JSON {_json_type(reply)}, not an object"
        return _malformed(identity, attempt_index, response, elapsed_seconds, max_attempts, problem)
    if reply.get(records.NO_PERSIST) is True or reply.get(records.FAILURE_CLASS) is not None:
        return _producer_failure(identity, attempt_index, reply, elapsed_seconds, max_attempts)
    result = {key: value for key, value in reply.items() if key not in _STAMP_KEYS}
    return Landed(identity, attempt_index, result, elapsed_seconds)


def outcome_from_error(
    identity: Identity,
    attempt_index: int,
    exc: BaseException,
    *,
    elapsed_seconds: float | None,
    max_attempts: int | None,
) -> Failed:
    """Classify a request that got no (complete) reply: always ``agent_request_failed``.

    Args:
        identity: the rollout.
        attempt_index: the attempt that failed.
        exc: what the transport raised (httpx's exception types).
        elapsed_seconds: wall time of the attempt.
        max_attempts: the attempt cap in force.
    """
    began = exc.status_code if isinstance(exc, ResponseBegan) else None
    return Failed(
        identity=identity,
        attempt_index=attempt_index,
        failure_class=FailureClass.AGENT_REQUEST_FAILED.value,
        kind=error_kind(exc),
        exception_type=_public_type_name(exc),
        message=one_line_message(str(exc) or type(exc).__name__),
        http_status=began,
        max_attempts=max_attempts,
        delivery=delivery_of(exc),
        elapsed_seconds=elapsed_seconds,
    )


def error_kind(exc: BaseException) -> str:
    """Return the short machine word for a transport error (``body_`` once a reply began)."""
    kind = next((word for cls, word in _KINDS if isinstance(exc, cls)), "transport")
    return f"body_{kind}" if isinstance(exc, ResponseBegan) else kind


def _public_type_name(exc: BaseException) -> str:
    # Our ResponseBegan subclasses report the httpx class they stand for.
    for cls in type(exc).__mro__:
        if cls.__module__.startswith("httpx"):
            return cls.__name__
    return type(exc).__name__


def _status_failure(
    identity: Identity,
    attempt_index: int,
    response: RawResponse,
    elapsed_seconds: float | None,
    max_attempts: int | None,
) -> Failed:
    gateway = response.status in GATEWAY_STATUSES
    failure_class = FailureClass.AGENT_REQUEST_FAILED if gateway else FailureClass.AGENT_RUN_ERROR
    return Failed(
        identity=identity,
        attempt_index=attempt_index,
        failure_class=failure_class.value,
        kind=f"http_{response.status}",
        exception_type="HTTPStatusError",
        message=one_line_message(f"{_status_line(response.status)} from {_where(response)}"),
        http_status=response.status,
        response_body=_body_text(response),
        max_attempts=max_attempts,
        delivery=Delivery.DELIVERED,
        elapsed_seconds=elapsed_seconds,
        retry_after_s=retry_after_seconds(response),
    )


def _malformed(
    identity: Identity,
    attempt_index: int,
    response: RawResponse,
    elapsed_seconds: float | None,
    max_attempts: int | None,
    problem: str,
) -> Failed:
    return Failed(
        identity=identity,
        attempt_index=attempt_index,
        failure_class=FailureClass.AGENT_RUN_ERROR.value,
        kind="malformed_body",
        exception_type="MalformedReply",
        message=one_line_message(f"the HTTP 200 reply from {_where(response)} {problem}"),
        http_status=response.status,
        response_body=_body_text(response),
        max_attempts=max_attempts,
        delivery=Delivery.DELIVERED,
        elapsed_seconds=elapsed_seconds,
    )


def _producer_failure(
    identity: Identity,
    attempt_index: int,
    reply: Mapping[str, Any],
    elapsed_seconds: float | None,
    max_attempts: int | None,
) -> Failed:
    no_persist = reply.get(records.NO_PERSIST) is True
    label = reply.get(records.FAILURE_CLASS)
    failure_class = str(label) if label is not None else FailureClass.KILL_SHAPED.value
    message = reply.get(records.FAILURE_MESSAGE)
    body = reply.get(records.FAILURE_BODY)
    extra = {
        key: value
        for key, value in reply.items()
        if key not in _STAMP_KEYS and key not in _FAILURE_FIELD_KEYS
    }
    return Failed(
        identity=identity,
        attempt_index=attempt_index,
        failure_class=failure_class,
        kind=_optional_str(reply.get(records.FAILURE_KIND)),
        terminal=reply.get(records.FAILURE_TERMINAL) is True,
        exception_type=_optional_str(reply.get(records.FAILURE_TYPE)),
        message=one_line_message(str(message)) if message is not None else None,
        http_status=200,
        response_body=cut_text(str(body)) if body is not None else None,
        max_attempts=max_attempts,
        delivery=Delivery.DELIVERED,
        no_persist=no_persist,
        elapsed_seconds=elapsed_seconds,
        extra=extra,
    )


def _optional_str(value: object) -> str | None:
    return None if value is None else str(value)


def _status_line(status: int) -> str:
    try:
        return f"HTTP {status} {http.HTTPStatus(status).phrase}"
    except ValueError:
        return f"HTTP {status}"


def _where(response: RawResponse) -> str:
    return f"POST {response.url}" if response.url else "the server"


def _json_type(value: object) -> str:
    names = {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return names.get(type(value), "null")
