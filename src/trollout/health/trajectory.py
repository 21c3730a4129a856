"""Is a row's ``ng_trajectory`` a valid trajectory record? A hand-written validator.

The health checks trust only a trajectory that validates as NeMo Gym's ``TrajectoryRecord``
(docs/health.md, "What a check reads"): the documented field types, no unknown keys in any
record, and the record's invariants (unique invocation ids, unique non-null model call ids,
every turn stamped with the record's task and rollout id, ``(invocation_id, turn_no)`` unique).
A value that fails is reported by the name of the exception NeMo Gym's validator raises:
``ValidationError`` for a shape or invariant problem, ``ValueError`` for a value nested deeper
than `MAX_NESTING` levels (NeMo Gym's validator refuses those before looking at the shape).

Rejected: depending on pydantic to get the same behaviour for free. trollout does not ship it,
it would be the slowest step of the check (a model instance per row, when the checks only read
a few fields), and its lax coercions (``"5"`` accepted as an integer) are exactly what a health
check should not paper over. The cost of the choice is stated in docs/health.md: a value that
only such a coercion makes valid is ``record_unreadable`` here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from ..jsonl import nested_deeper_than

__all__ = ["MAX_NESTING", "InvalidTrajectoryError", "validate_trajectory"]

# Levels of nested arrays and objects a trajectory may hold (about where NeMo Gym's validator
# stops; a 700-deep answer is refused there with ValueError).
MAX_NESTING: Final = 255


class InvalidTrajectoryError(Exception):
    """The trajectory does not validate; ``error`` is the exception name NeMo Gym reports."""

    def __init__(self, error: str, where: str) -> None:
        super().__init__(where)
        self.error = error


def _fail(where: str) -> InvalidTrajectoryError:
    return InvalidTrajectoryError("ValidationError", where)


Check = Callable[[Any, str], None]


def _str(value: Any, where: str) -> None:
    if type(value) is not str:
        raise _fail(where)


def _ostr(value: Any, where: str) -> None:
    if value is not None and type(value) is not str:
        raise _fail(where)


def _int(value: Any, where: str, minimum: int | None = None) -> None:
    if type(value) is float and value.is_integer():
        value = int(value)
    if type(value) is not int or (minimum is not None and value < minimum):
        raise _fail(where)


def _oint0(value: Any, where: str) -> None:
    if value is not None:
        _int(value, where, 0)


def _oint(value: Any, where: str) -> None:
    if value is not None:
        _int(value, where)


def _float(value: Any, where: str) -> None:
    if type(value) is not float and type(value) is not int:
        raise _fail(where)


def _ofloat(value: Any, where: str) -> None:
    if value is not None:
        _float(value, where)


def _ofloat0(value: Any, where: str) -> None:
    if value is not None:
        _float(value, where)
        if value < 0:
            raise _fail(where)


def _obool(value: Any, where: str) -> None:
    if value is not None and type(value) is not bool:
        raise _fail(where)


def _any(value: Any, where: str) -> None:
    return None


def _one_of(*allowed: Any) -> Check:
    def check(value: Any, where: str) -> None:
        if value not in allowed or type(value) not in (str, type(None)):
            raise _fail(where)

    return check


def _model_ref(value: Any, where: str) -> None:
    if value is None:
        return
    _fields(value, where, {"type": _str, "name": _str}, required=("type", "name"))


def _model_call_ref(value: Any, where: str) -> None:
    spec = {"model_call_id": _ostr, "model_ref": _model_ref, "response_id": _ostr}
    _fields(value, where, spec)
    if value.get("model_call_id") is None and (
        value.get("model_ref") is None or value.get("response_id") is None
    ):
        raise _fail(f"{where}: needs model_call_id, or model_ref and response_id")


def _list_of(item: Check) -> Check:
    def check(value: Any, where: str) -> None:
        if type(value) is not list:
            raise _fail(where)
        for index, element in enumerate(value):
            item(element, f"{where}[{index}]")

    return check


def _object(value: Any, where: str) -> None:
    if type(value) is not dict:
        raise _fail(where)


def _fields(
    value: Any, where: str, spec: Mapping[str, Check], required: tuple[str, ...] = ()
) -> None:
    """Check a record: an object with only ``spec``'s keys, each valid, ``required`` present."""
    if type(value) is not dict:
        raise _fail(where)
    for key, field in value.items():
        check = spec.get(key)
        if check is None:
            raise _fail(f"{where}.{key}: unknown key")
        check(field, f"{where}.{key}")
    for key in required:
        if key not in value:
            raise _fail(f"{where}.{key}: missing")


_INVOCATION: Final[dict[str, Check]] = {
    "kind": _one_of("agent_invocation"),
    "invocation_id": _str,
    "parent_invocation_id": _ostr,
    "spawned_by_tool_call_id": _ostr,
    "status": _one_of("completed", "failed", "incomplete", "unknown"),
    "duration_ms": _ofloat0,
    "error_type": _ostr,
    "model_calls": _list_of(_model_call_ref),
    "conversation": _list_of(_object),
}
_TURN: Final[dict[str, Check]] = {
    "invocation_id": _str,
    "task_id": _str,
    "rollout_id": _str,
    "turn_no": lambda v, w: _int(v, w, 1),
    "timestamp": _float,
    "question": _any,
    "answer": _any,
    "reasoning_content": _any,
    "resolved": _obool,
    "step_count": lambda v, w: _int(v, w, 0),
    "model_calls": _list_of(_model_call_ref),
}
_METADATA: Final[dict[str, Check]] = {
    "response_id": _ostr,
    "model_ref": _model_ref,
    "model": _ostr,
    "dialect": _ostr,
    "status_code": _oint,
    "response_status": _ostr,
    "finish_reason": _ostr,
    "upstream_attempted": _obool,
    "response_source": _one_of(None, "upstream", "local"),
    "upstream_status_code": _oint,
    "local_response_reason": _ostr,
    "error_category": _ostr,
    "latency_ttft_ms": _ofloat0,
}
_TOKENS: Final[dict[str, Check]] = dict.fromkeys(
    ("prompt_tokens", "completion_tokens", "reasoning_tokens", "total_tokens", "cached_tokens"),
    _oint0,
)
_MODEL_CALL: Final[dict[str, Check]] = {
    "model_call_id": _ostr,
    "started_at": _ofloat,
    "completed_at": _ofloat,
    "duration_ms": _ofloat0,
    "request": _any,
    "response": _any,
    "response_metadata": lambda v, w: _fields(v, w, _METADATA),
    "token_stats": lambda v, w: _fields(v, w, _TOKENS),
}
_TOOL_CALL: Final[dict[str, Check]] = {
    "kind": _one_of("tool_call"),
    "invocation_id": _str,
    "tool_call_id": _str,
    "sandbox_id": _ostr,
    "tool_name": _ostr,
    "started_at": _ofloat,
    "completed_at": _ofloat,
    "duration_ms": _ofloat0,
    "timing_source": _one_of(None, "executor", "artifact", "harness"),
    "status": _one_of("completed", "failed", "timeout", "cancelled", "incomplete", "unknown"),
    "error_type": _ostr,
    "output": _any,
}
_GAP: Final[dict[str, Check]] = {"code": _str, "invocation_id": _ostr, "detail": _ostr}


def _record(key: str, spec: Mapping[str, Check], required: tuple[str, ...]) -> Check:
    def check(value: Any, where: str) -> None:
        _fields(value, where, spec, required)

    return check


_TRAJECTORY: Final[dict[str, Check]] = {
    "schema_version": _one_of("1.0"),
    "task_id": _str,
    "rollout_id": _str,
    "invocations": _list_of(_record("invocation", _INVOCATION, ("invocation_id",))),
    "turns": _list_of(
        _record("turn", _TURN, ("invocation_id", "task_id", "rollout_id", "turn_no", "timestamp"))
    ),
    "model_calls": _list_of(_record("model_call", _MODEL_CALL, ())),
    "tool_calls": _list_of(_record("tool_call", _TOOL_CALL, ("invocation_id", "tool_call_id"))),
    "gaps": _list_of(_record("gap", _GAP, ("code",))),
}


def validate_trajectory(value: Any, line: bytes | None = None) -> None:
    """Raise `InvalidTrajectoryError` unless ``value`` is a valid trajectory record.

    Args:
        value: the row's ``ng_trajectory``.
        line: the row's JSON text, if known: a line with few brackets cannot nest too deep, so
            the depth walk is skipped for it (`jsonl.row_too_deep`'s shortcut).
    """
    shallow = line is not None and line.count(b"[") + line.count(b"{") <= MAX_NESTING
    if not shallow and nested_deeper_than(value, MAX_NESTING):
        raise InvalidTrajectoryError("ValueError", f"nested deeper than {MAX_NESTING} levels")
    _fields(value, "ng_trajectory", _TRAJECTORY, ("task_id", "rollout_id"))
    invocations = [i["invocation_id"] for i in value.get("invocations", ())]
    if len(set(invocations)) != len(invocations):
        raise _fail("invocation ids are not unique")
    calls = value.get("model_calls", ())
    call_ids = [c["model_call_id"] for c in calls if c.get("model_call_id") is not None]
    if len(set(call_ids)) != len(call_ids):
        raise _fail("model call ids are not unique")
    seen = set()
    for turn in value.get("turns", ()):
        if turn["task_id"] != value["task_id"] or turn["rollout_id"] != value["rollout_id"]:
            raise _fail("a turn's task_id or rollout_id differs from the record's")
        key = (turn["invocation_id"], turn["turn_no"])
        if key in seen:
            raise _fail("(invocation_id, turn_no) is not unique")
        seen.add(key)
    for tool in value.get("tool_calls", ()):
        start, end = tool.get("started_at"), tool.get("completed_at")
        if start is not None and end is not None and end < start:
            raise _fail("a tool call completed before it started")
