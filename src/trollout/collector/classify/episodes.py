"""Classify an environment server's reply to an episode request (docs/protocol.md section 3).

A task row (``task_id: {taskset, task_id}`` plus ``task_input``) goes out as
``{"episode_id": {"rollout_id", "attempt"}, "task": {"task_id", "task_input"}}``
(`records.MaterializedRow.request_body`). A non-200 reply, or a 200 whose body is not JSON, is
classified as any ``/run`` reply is (`classify.outcome_from_response`). Any JSON body is then
read in this order, the first rule that applies deciding:

| reply                                                   | outcome                              |
|---------------------------------------------------------|--------------------------------------|
| not an object, or ``episode_id`` / ``task_id`` not an   | violation ``EpisodeShapeViolation``  |
| object, or neither ``result`` nor ``failure``           |                                      |
| ``episode_id`` or ``task_id`` not the one dispatched    | violation ``EpisodeIdentityMismatch``|
| both or neither of ``result`` / ``failure`` non-null;   | violation ``EpisodeShapeViolation``  |
| a ``failure`` whose fields have the wrong types; a      |                                      |
| ``result`` that is not an object                        |                                      |
| a ``result`` using collector keys (`is_collector_key`)  | violation ``EpisodeCollectorKeys``   |
| ``failure``                                             | Failed(``failure_kind`` or           |
|                                                         | ``environment_server_failed``)       |
| ``result``                                              | Landed(result = the inner result)    |

A violation is ``Failed(environment_protocol_violation)``, kind the same, never terminal (the
run's violation stop, `stops`, ends a run whose server keeps breaking the protocol, and resume
re-runs the rollouts once it is fixed). Its message names the reply's JSON type and sorted
top-level keys, or the fields at fault, and never a value; its ``_ng_failure_response_body`` is
null, because the body holds values.

A ``failure`` keeps ``failure_kind`` under that name, its reason as ``_ng_failure_message``
(at most 2000 characters), ``_ng_failure_stage`` and ``_ng_failure_partial_response`` when not
null, and a valid FailureReport beside it (`failure_report`). A ``result`` is stored as
returned, except the stamp keys ``agent_ref``, ``task_source`` and ``elapsed_seconds``, which
the collector writes itself; the reward is its top-level ``reward``. ``_ng_task_id``, the
provenance keys and ``ng_policy_model_server`` come from the rollout's `Identity`.

Design note: the echoed identity is checked with the same `classify.echo_mismatches` as a flat
reply's echo, against `classify.expected_echo` of the episode request, so one mechanism stands
against replies that are not this request's. On the flat path a mismatch means a mixed-up
connection (``identity_mismatch``); here the protocol makes the echo mandatory, so a wrong one
is the server's violation. Either way the dispatcher closes the connection that carried it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, NamedTuple

import orjson

from ... import records
from ...records import Delivery, Failed, FailureClass, Identity, Landed
from ..http.transport import RawResponse
from .echo import echo_mismatches, json_type, same_json
from .outcomes import one_line_message, outcome_from_response
from .reports import MAX_REPORT_EVENTS, failure_report

__all__ = [
    "EPISODE_FAILURE",
    "IDENTITY_VIOLATION",
    "MAX_REPORT_EVENTS",
    "describe_reply",
    "failure_report",
    "is_collector_key",
    "outcome_from_episode_response",
]

EPISODE_FAILURE: Final = "EpisodeFailure"
"""``_ng_failure_type`` of a well-formed ``failure``: a usable reply (`stops` resets on it)."""
SHAPE_VIOLATION: Final = "EpisodeShapeViolation"
IDENTITY_VIOLATION: Final = "EpisodeIdentityMismatch"
COLLECTOR_KEYS_VIOLATION: Final = "EpisodeCollectorKeys"
_RESERVED_KEYS: Final = frozenset({"ng_model_call_capture", "ng_perf"})
_DROPPED_RESULT_KEYS: Final = frozenset({records.AGENT_REF, records.TASK_SOURCE, records.ELAPSED})
_MAX_KEYS_NAMED: Final = 20
_MAX_KEY_CHARS: Final = 64
_EXPECTED: Final = "expected an object with episode_id, task_id and exactly one of result / failure"
_REMEDY: Final = "fix the environment server, then resume the run"
_VIOLATION: Final = FailureClass.ENVIRONMENT_PROTOCOL_VIOLATION.value


class _Violation(NamedTuple):
    type: str  # the exception type written as _ng_failure_type
    detail: str  # what is wrong, naming types, keys and fields, never values


class _Failure(NamedTuple):
    failure: Mapping[str, Any]  # the reply's well-formed `failure` object
    report: dict[str, Any]  # its valid FailureReport keys (empty when none or invalid)


def is_collector_key(key: str) -> bool:
    """Return whether an episode result may not use ``key`` (the collector writes it)."""
    return key.startswith(records.COLLECTOR_KEY_PREFIX) or key in _RESERVED_KEYS


def outcome_from_episode_response(
    identity: Identity,
    attempt_index: int,
    response: RawResponse,
    *,
    elapsed_seconds: float | None,
    max_attempts: int | None,
    echo: Sequence[tuple[str, Any]] = (),
) -> Landed | Failed:
    """Classify the reply to an episode request (the table in the module doc).

    A `outcomes.ReplyClassifier`: its signature is `outcomes.outcome_from_response`'s.

    Args:
        identity: the rollout (its ``environment_server`` names the server in messages).
        attempt_index: the attempt that got this reply.
        response: the reply.
        elapsed_seconds: wall time of the attempt.
        max_attempts: the attempt cap in force, written on failure rows.
        echo: `classify.expected_echo` of the request: the ``episode_id`` and ``task_id`` the
            reply must echo.
    """
    if response.status == 200:
        try:
            reply = orjson.loads(response.body)
        except orjson.JSONDecodeError:
            pass  # not JSON: a run error, as on the flat path
        else:
            verdict = _read_reply(reply, echo)
            if isinstance(verdict, _Violation):
                return _violation(
                    identity, attempt_index, reply, verdict, elapsed_seconds, max_attempts
                )
            if isinstance(verdict, _Failure):
                return _failed(identity, attempt_index, verdict, elapsed_seconds, max_attempts)
            return Landed(identity, attempt_index, verdict, elapsed_seconds)
    return outcome_from_response(
        identity,
        attempt_index,
        response,
        elapsed_seconds=elapsed_seconds,
        max_attempts=max_attempts,
    )


def _read_reply(
    reply: Any, echo: Sequence[tuple[str, Any]]
) -> _Violation | _Failure | dict[str, Any]:
    """Return the violation, the failure, or the result (stamp keys dropped) a reply holds."""
    if not (
        isinstance(reply, dict)
        and isinstance(reply.get("episode_id"), dict)
        and isinstance(reply.get("task_id"), dict)
        and ("result" in reply or "failure" in reply)
    ):
        return _Violation(SHAPE_VIOLATION, _EXPECTED)
    mismatched = echo_mismatches(reply, echo)
    if mismatched:
        fields = [field for key, sent, echoed in mismatched for field in _fields(key, sent, echoed)]
        detail = f"it echoes another episode's identity ({', '.join(fields)} not as sent)"
        return _Violation(IDENTITY_VIOLATION, detail)
    result, failure = reply.get("result"), reply.get("failure")
    if (result is None) == (failure is None):
        which = "both" if result is not None else "neither"
        return _Violation(SHAPE_VIOLATION, f"{which} of result and failure are set; {_EXPECTED}")
    if failure is not None:
        problem = _failure_problem(failure)
        return (
            _Violation(SHAPE_VIOLATION, problem)
            if problem
            else _Failure(failure, failure_report(reply))
        )
    if not isinstance(result, dict):
        return _Violation(SHAPE_VIOLATION, f"its result is {_a(json_type(result))}, not an object")
    reserved = [key for key in result if is_collector_key(key)]
    if reserved:
        detail = f"its result uses keys reserved for rollout collection: {_key_list(reserved)}"
        return _Violation(COLLECTOR_KEYS_VIOLATION, detail)
    return {key: value for key, value in result.items() if key not in _DROPPED_RESULT_KEYS}


def _fields(key: str, sent: Any, echoed: Any) -> list[str]:
    """Return the fields of an echoed identity that differ from the ones sent (never values)."""
    if not (isinstance(sent, dict) and isinstance(echoed, dict)):
        return [key]
    differ = [
        f"{key}.{name}"
        for name, value in sent.items()
        if name not in echoed or not same_json(echoed[name], value)
    ]
    if echoed.keys() - sent.keys():
        differ.append(f"{key} (keys added)")
    return differ


def _failure_problem(failure: Any) -> str:
    """Return what makes a ``failure`` ill-formed (fields and types, no values), or ''."""
    if not isinstance(failure, dict):
        return f"its failure is {_a(json_type(failure))}, not an object"
    wrong = [
        f"failure.{name} is {_type_of(failure, name)}, not {expected}"
        for name, expected, ok in _FAILURE_FIELDS
        if not ok(failure.get(name))
    ]
    return "; ".join(wrong)


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _is_label(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value != "")


def _is_optional_str(value: Any) -> bool:
    return value is None or isinstance(value, str)


# The fields of an episode `failure` with their types (partial_response may be any JSON).
_FAILURE_FIELDS: Final[tuple[tuple[str, str, Callable[[Any], bool]], ...]] = (
    ("failure_reason", "a string", _is_str),
    ("terminal", "a boolean", _is_bool),
    ("failure_kind", "a non-empty string or null", _is_label),
    ("stage", "a string or null", _is_optional_str),
)


def _type_of(mapping: Mapping[str, Any], key: str) -> str:
    return _a(json_type(mapping[key])) if key in mapping else "missing"


def describe_reply(reply: Any) -> str:
    """Return a reply's JSON type, and an object's sorted top-level keys (never values)."""
    if not isinstance(reply, dict):
        return f"a JSON {json_type(reply)}"
    if not reply:
        return "an empty object"
    return f"an object with keys {_key_list(reply)}"


def _key_list(keys: Any) -> str:
    """Return keys sorted, each cut to 64 characters, at most 20 named, as a list's repr."""
    names = sorted(str(key) for key in keys)
    shown = [name if len(name) <= _MAX_KEY_CHARS else name[:_MAX_KEY_CHARS] + "…" for name in names]
    more = len(shown) - _MAX_KEYS_NAMED
    text = repr(shown[:_MAX_KEYS_NAMED])
    return f"{text} and {more} more" if more > 0 else text


def _a(type_name: str) -> str:
    return f"an {type_name}" if type_name[0] in "aeiou" else f"a {type_name}"


def _violation(
    identity: Identity,
    attempt_index: int,
    reply: Any,
    violation: _Violation,
    elapsed_seconds: float | None,
    max_attempts: int | None,
) -> Failed:
    message = (
        f"environment server {identity.environment_server!r} answered an episode request with "
        f"{describe_reply(reply)}; {violation.detail}; {_REMEDY}"
    )
    return Failed(
        identity=identity,
        attempt_index=attempt_index,
        failure_class=_VIOLATION,
        kind=_VIOLATION,
        exception_type=violation.type,
        message=one_line_message(message),
        http_status=200,
        max_attempts=max_attempts,
        delivery=Delivery.DELIVERED,
        elapsed_seconds=elapsed_seconds,
    )


def _failed(
    identity: Identity,
    attempt_index: int,
    verdict: _Failure,
    elapsed_seconds: float | None,
    max_attempts: int | None,
) -> Failed:
    failure = verdict.failure
    kind = failure.get("failure_kind")
    extra = dict(verdict.report)
    if failure.get("stage") is not None:
        extra[records.FAILURE_STAGE] = failure["stage"]
    if failure.get("partial_response") is not None:
        extra[records.FAILURE_PARTIAL_RESPONSE] = failure["partial_response"]
    return Failed(
        identity=identity,
        attempt_index=attempt_index,
        failure_class=kind or FailureClass.ENVIRONMENT_SERVER_FAILED.value,
        kind=kind,
        terminal=failure["terminal"],
        exception_type=EPISODE_FAILURE,
        message=one_line_message(failure["failure_reason"]),
        http_status=200,
        max_attempts=max_attempts,
        delivery=Delivery.DELIVERED,
        elapsed_seconds=elapsed_seconds,
        extra=extra,
    )
