# Stays whole: the reply table (the docstring) and the rule behind each of its rows, read side
# by side; the echo check is `echo`, episode replies `episodes`.
"""Turn a `/run` reply or a transport error into an outcome (docs/protocol.md section 2).

Pure functions, no I/O. A reply decides by status first, then, for a 200 whose body is a JSON
object, by the identity it echoes and the sentinel keys:

| reply                                    | outcome                                         |
|------------------------------------------|-------------------------------------------------|
| 200, echoes another request's identity   | Failed(agent_request_failed, identity_mismatch) |
| 200, ``_ng_no_persist: true``            | Failed(no_persist, class from reply or kill)    |
| 200, ``_ng_failure_class`` not null      | Failed(producer's class, terminal, kind, extra) |
| 200, other JSON object                   | Landed(result = the reply without stamps)       |
| 200, body not a JSON object              | Failed(agent_run_error, ``malformed_body``)     |
| 429, 502, 503, 504                       | Failed(agent_request_failed, ``http_<status>``) |
| any other status                         | Failed(agent_run_error, ``http_<status>``)      |

A non-200 reply whose headers forward a failure report (`reports`) keeps it on the row, and the
kind the report names replaces ``http_<status>``.
| no reply (connect, reset, timeout...)    | Failed(agent_request_failed, status null)       |

The reply to an episode request (a 0.7.0 task row) is read by `episodes`, which hands non-200 and
non-JSON replies back to this table.

Failure rows never carry a reward or response the collector made up: an infrastructure failure
is not a zero score; a producer's failure keeps its diagnostics but not its ``reward``, nor its
``response`` unless it is a judge failure (`failure_compatibility_fields`). Bodies are decoded
from at most `MAX_DECODED_BODY_BYTES` and kept to `MAX_TEXT_CHARS` characters, with ``…``
appended when cut.

Design note (forged and foreign replies). HTTP/1.1 has no request ids: on a kept-alive
connection, whatever complete response follows a request is taken as its reply. A server (or a
proxy) that sends a reply nobody asked for can therefore make a request take the reply of
another one, or a forged body. Two mechanisms stand against it, one per layer:

- the transport (transport.py) never sends a request on a connection that carried bytes nobody
  asked for: bytes after a complete response close the connection after that exchange, and a
  pooled connection that is readable at checkout (one ``poll`` just before the request is
  written) is discarded;
- here, a 200 whose echo contradicts the request is `identity_mismatch`, possibly delivered
  (the reply is not ours and nothing proves ours ran); the dispatcher then closes the connection
  that carried it, which is no longer in step with its server. `echo_mismatches` checks what
  `expected_echo` lists, each only when the request carried it and the reply echoes it: the
  identity stamps (``_ng_task_index``, ``_ng_rollout_index``, ``_ng_attempt_index``,
  ``_ng_rollout_id``), compared as JSON; and the input, ``responses_create_params.input``
  (`echo`: how the input is compared, and what no check can catch).
"""

from __future__ import annotations

import email.utils
import http
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol

import httpx
import orjson

from ... import records
from ...records import Delivery, Failed, FailureClass, Identity, Landed
from ...text import public_url
from ..http.transport import RawResponse, ResponseBeganError, delivery_of
from .echo import ECHOED_PARAMS, conversation, echo_mismatches, json_type
from .reports import reply_failure_kind, reply_failure_report

__all__ = [
    "GATEWAY_STATUSES",
    "IDENTITY_MISMATCH",
    "MAX_DECODED_BODY_BYTES",
    "MAX_TEXT_CHARS",
    "ReplyClassifier",
    "cut_text",
    "error_kind",
    "failure_compatibility_fields",
    "one_line_message",
    "outcome_from_error",
    "outcome_from_response",
    "retry_after_seconds",
]

GATEWAY_STATUSES: Final = frozenset({429, 502, 503, 504})  # a gateway answered: nothing proven
MAX_DECODED_BODY_BYTES: Final = 8192
MAX_TEXT_CHARS: Final = 2000
IDENTITY_MISMATCH: Final = "identity_mismatch"
_ELLIPSIS: Final = "…"
_LEGACY_CLASS: Final = "_ng_failure_legacy_class"  # the original producer's class
_JUDGE_ERROR: Final = "_ng_failure_judge_error"  # a judge failure's reason
_MAX_VALUE_CHARS: Final = 60

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


class ReplyClassifier(Protocol):
    """The one interface of the reply classifiers: `outcome_from_response` for a flat row's
    reply, `episodes.outcome_from_episode_response` for an episode's; dispatch calls whichever
    the row needs, and each spells this signature out (mypy holds both to it)."""

    def __call__(
        self,
        identity: Identity,
        attempt_index: int,
        response: RawResponse,
        *,
        elapsed_seconds: float | None,
        max_attempts: int | None,
        echo: Sequence[tuple[str, Any]] = (),
    ) -> Landed | Failed: ...


def outcome_from_response(
    identity: Identity,
    attempt_index: int,
    response: RawResponse,
    *,
    elapsed_seconds: float | None,
    max_attempts: int | None,
    echo: Sequence[tuple[str, Any]] = (),
) -> Landed | Failed:
    """Classify a `/run` reply (docs/protocol.md section 2).

    Args:
        identity: the rollout.
        attempt_index: the attempt that got this reply.
        response: the reply.
        elapsed_seconds: wall time of the attempt.
        max_attempts: the attempt cap in force, written on failure rows.
        echo: the (key, value sent) pairs a 200 may echo only unchanged (`expected_echo`).
    """
    if response.status != 200:
        return _status_failure(identity, attempt_index, response, elapsed_seconds, max_attempts)
    try:
        reply = orjson.loads(response.body)
    except orjson.JSONDecodeError as exc:
        problem = f"is not JSON ({exc})"
        return _malformed(identity, attempt_index, response, elapsed_seconds, max_attempts, problem)
    if not isinstance(reply, dict):
        problem = f"is a JSON {json_type(reply)}, not an object"
        return _malformed(identity, attempt_index, response, elapsed_seconds, max_attempts, problem)
    mismatched = echo_mismatches(reply, echo) if echo else None
    if mismatched:
        return _foreign(
            identity, attempt_index, response, elapsed_seconds, max_attempts, mismatched
        )
    if reply.get(records.NO_PERSIST) is True or reply.get(records.FAILURE_CLASS) is not None:
        return _producer_failure(identity, attempt_index, reply, elapsed_seconds, max_attempts)
    if not records.STAMP_KEYS.isdisjoint(reply):  # an echo of the row: the record restamps it
        reply = {key: value for key, value in reply.items() if key not in records.STAMP_KEYS}
    return Landed(identity, attempt_index, reply, elapsed_seconds)


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
        exc: what the transport raised: httpx's exception types, or any error of a driver's
            own transport (kind ``transport``, possibly delivered: the run goes on).
        elapsed_seconds: wall time of the attempt.
        max_attempts: the attempt cap in force.
    """
    began = exc.status_code if isinstance(exc, ResponseBeganError) else None
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
    """Return the short machine word for a transport error (``body_`` once a reply began).

    An error class with a ``failure_kind`` (a reply limit or deadline) names its own.
    """
    own: str | None = getattr(exc, "failure_kind", None)
    if own is not None:
        return own
    kind = next((word for cls, word in _KINDS if isinstance(exc, cls)), "transport")
    return f"body_{kind}" if isinstance(exc, ResponseBeganError) else kind


def _public_type_name(exc: BaseException) -> str:
    # Our ResponseBeganError subclasses report the httpx class they stand for, or, for a class that
    # names its own failure_kind, the class that named it.
    for cls in type(exc).__mro__:
        if "failure_kind" in vars(cls) or cls.__module__.startswith("httpx"):
            return cls.__name__
    return type(exc).__name__


def _input_difference(echoed: Any, sent: Any) -> str:
    """Say how an echoed input differs from the one sent (roles and counts, never text)."""
    have, want = conversation(echoed), conversation(sent)
    if len(have) != len(want):
        return f"{len(have)} input items where {len(want)} were sent"
    for index, (got, expected) in enumerate(zip(have, want, strict=True)):
        if got[0] != expected[0]:
            return (
                f"input item {index} has role {_short(got[0])} where {_short(expected[0])} was sent"
            )
        if got != expected:
            return f"input item {index} ({_short(expected[0])}) has other text than was sent"
    return "another input"  # not reached: the conversations differ somewhere


def _foreign(
    identity: Identity,
    attempt_index: int,
    response: RawResponse,
    elapsed_seconds: float | None,
    max_attempts: int | None,
    mismatched: list[tuple[str, Any, Any]],
) -> Failed:
    contradictions = "; ".join(
        f"{key}: {_input_difference(echoed['input'], sent['input'])}"
        if key == ECHOED_PARAMS
        else f"{key} {_short(echoed)} where {_short(sent)} was sent"
        for key, sent, echoed in mismatched
    )
    message = (
        f"the HTTP 200 reply from {_where(response)} is another request's: it echoes "
        f"{contradictions}; a connection or proxy mixed up replies (or the server forged one), "
        "so whether this attempt ran is unknown"
    )
    if any(key == ECHOED_PARAMS for key, _, _ in mismatched):
        message += " (an agent that rewrites its input: set +check_echoed_input=false)"
    return Failed(
        identity=identity,
        attempt_index=attempt_index,
        failure_class=FailureClass.AGENT_REQUEST_FAILED.value,
        kind=IDENTITY_MISMATCH,
        exception_type="IdentityMismatch",
        message=one_line_message(message),
        http_status=response.status,
        max_attempts=max_attempts,
        delivery=Delivery.POSSIBLY_DELIVERED,
        elapsed_seconds=elapsed_seconds,
    )


def _short(value: object) -> str:
    return cut_text(repr(value), _MAX_VALUE_CHARS)


def _status_failure(
    identity: Identity,
    attempt_index: int,
    response: RawResponse,
    elapsed_seconds: float | None,
    max_attempts: int | None,
) -> Failed:
    gateway = response.status in GATEWAY_STATUSES
    failure_class = FailureClass.AGENT_REQUEST_FAILED if gateway else FailureClass.AGENT_RUN_ERROR
    report = reply_failure_report(response)  # what the server forwarded in its headers
    return Failed(
        identity=identity,
        attempt_index=attempt_index,
        failure_class=failure_class.value,
        kind=reply_failure_kind(report) or f"http_{response.status}",
        exception_type="HTTPStatusError",
        message=one_line_message(f"{_status_line(response.status)} from {_where(response)}"),
        http_status=response.status,
        response_body=_body_text(response),
        max_attempts=max_attempts,
        delivery=Delivery.DELIVERED,
        elapsed_seconds=elapsed_seconds,
        extra=report,
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
    extra = failure_compatibility_fields(reply)
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


def failure_compatibility_fields(reply: Mapping[str, Any]) -> dict[str, Any]:
    """Return what a producer's failure row keeps of its reply (NeMo Gym's failure rows).

    The producer's diagnostics stay; ``reward`` never does (a failure is no verifier's score,
    ``_failure_compatibility_row``), and ``response`` only for a judge failure, whose response
    is real generation that can be judged again (``_judge_failure_response``): any other
    failure's response is a placeholder that readers would take for generation.
    """
    keep_response = _is_judge_failure(reply)
    return {
        key: value
        for key, value in reply.items()
        if key not in records.STAMP_KEYS
        and key not in records.FAILURE_KEYS
        and key != "reward"
        and (key != "response" or keep_response)
    }


def _is_judge_failure(reply: Mapping[str, Any]) -> bool:
    classes = (reply.get(records.FAILURE_CLASS), reply.get(_LEGACY_CLASS))
    return FailureClass.JUDGE_FAILED.value in classes or _JUDGE_ERROR in reply


def _optional_str(value: object) -> str | None:
    return None if value is None else str(value)


def _status_line(status: int) -> str:
    try:
        return f"HTTP {status} {http.HTTPStatus(status).phrase}"
    except ValueError:
        return f"HTTP {status}"


def _where(response: RawResponse) -> str:
    return f"POST {public_url(response.url)}" if response.url else "the server"
