"""The TrajectoryRecord's schema: NeMo Gym 0.7.0's field tables, and records checked against them.

Pure functions (no I/O). The record's models forbid unknown keys and are written with every
field, in NeMo Gym 0.7.0's field order (docs/enrichment.md lists them): `normalize` checks one
object against its field table and fills defaults, so a producer trajectory passes through
unchanged when it is valid and raises `InvalidRecordError` when not (the projection reports it
as the gap ``producer_trajectory_invalid``).

Apart from the projection (`trajectory`) because it is the schema, not a step: the tables say
what a valid record is; the projection builds one from the evidence and checks its result
against the same tables, and a reader of either does not need the other's details.

Not shared with `health.trajectory`, the health checks' own validator: that one reads a row
already written and reports NeMo Gym's exception names; this one fills defaults to write the
record, and the layering keeps enrichment (leaves only) from importing health.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

__all__ = [
    "GAP_FIELDS",
    "METADATA_FIELDS",
    "TOOL_CALL_FIELDS",
    "Fields",
    "InvalidRecordError",
    "check_invariants",
    "normalize",
    "normalize_invocation",
    "normalize_model_call",
    "normalize_record",
]

_MODEL_KIND: Final = "responses_api_models"


class InvalidRecordError(ValueError):
    """A trajectory record breaks its schema (reported as the gap detail ``ValidationError``)."""


# --- field tables -------------------------------------------------------------------------

Check = Callable[[Any], bool]
_REQUIRED: Final = object()


def _str(v: Any) -> bool:
    return isinstance(v, str)


def _opt_str(v: Any) -> bool:
    return v is None or isinstance(v, str)


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _opt_num(v: Any) -> bool:
    return v is None or _num(v)


def _opt_nonneg(v: Any) -> bool:
    return v is None or (_num(v) and v >= 0)


def _opt_count(v: Any) -> bool:
    return v is None or (type(v) is int and v >= 0)


def _any(v: Any) -> bool:
    return True


def _opt_bool(v: Any) -> bool:
    return v is None or isinstance(v, bool)


def _list(v: Any) -> bool:
    return isinstance(v, list)


def _one_of(*values: Any) -> Check:
    return lambda v: v in values


def _model_ref(v: Any) -> bool:
    return v is None or (
        isinstance(v, dict)
        and set(v) <= {"type", "name"}
        and v.get("type") == _MODEL_KIND
        and isinstance(v.get("name"), str)
    )


Fields = tuple[tuple[str, Any, Check], ...]
_FLOATS: Final = frozenset(
    {"timestamp", "started_at", "completed_at", "duration_ms", "latency_ttft_ms"}
)

GAP_FIELDS: Fields = (
    ("code", _REQUIRED, _str),
    ("invocation_id", None, _opt_str),
    ("detail", None, _opt_str),
)
_REF: Fields = (
    ("model_call_id", None, _opt_str),
    ("model_ref", None, _model_ref),
    ("response_id", None, _opt_str),
)
_INVOCATION: Fields = (
    ("kind", "agent_invocation", _one_of("agent_invocation")),
    ("invocation_id", _REQUIRED, _str),
    ("parent_invocation_id", None, _opt_str),
    ("spawned_by_tool_call_id", None, _opt_str),
    ("status", "unknown", _one_of("completed", "failed", "incomplete", "unknown")),
    ("duration_ms", None, _opt_nonneg),
    ("error_type", None, _opt_str),
    ("model_calls", list, _list),
    ("conversation", list, _list),
)
_TURN: Fields = (
    ("invocation_id", _REQUIRED, _str),
    ("task_id", _REQUIRED, _str),
    ("rollout_id", _REQUIRED, _str),
    ("turn_no", _REQUIRED, lambda v: type(v) is int and v >= 1),
    ("timestamp", _REQUIRED, _num),
    ("question", None, _any),
    ("answer", None, _any),
    ("reasoning_content", None, _any),
    ("resolved", None, _opt_bool),
    ("step_count", 0, lambda v: type(v) is int and v >= 0),
    ("model_calls", list, _list),
)
METADATA_FIELDS: Fields = (
    ("response_id", None, _opt_str),
    ("model_ref", None, _model_ref),
    ("model", None, _opt_str),
    ("dialect", None, _opt_str),
    ("status_code", None, lambda v: v is None or type(v) is int),
    ("response_status", None, _opt_str),
    ("finish_reason", None, _opt_str),
    ("upstream_attempted", None, _opt_bool),
    ("response_source", None, _one_of(None, "upstream", "local")),
    ("upstream_status_code", None, lambda v: v is None or type(v) is int),
    ("local_response_reason", None, _opt_str),
    ("error_category", None, _opt_str),
    ("latency_ttft_ms", None, _opt_nonneg),
)
_TOKENS: Fields = (
    ("prompt_tokens", None, _opt_count),
    ("completion_tokens", None, _opt_count),
    ("reasoning_tokens", None, _opt_count),
    ("total_tokens", None, _opt_count),
    ("cached_tokens", None, _opt_count),
)
_MODEL_CALL: Fields = (
    ("model_call_id", None, _opt_str),
    ("started_at", None, _opt_num),
    ("completed_at", None, _opt_num),
    ("duration_ms", None, _opt_nonneg),
    ("request", None, _any),
    ("response", None, _any),
    ("response_metadata", dict, lambda v: isinstance(v, dict)),
    ("token_stats", dict, lambda v: isinstance(v, dict)),
)
TOOL_CALL_FIELDS: Fields = (
    ("kind", "tool_call", _one_of("tool_call")),
    ("invocation_id", _REQUIRED, _str),
    ("tool_call_id", _REQUIRED, _str),
    ("sandbox_id", None, _opt_str),
    ("tool_name", None, _opt_str),
    ("started_at", None, _opt_num),
    ("completed_at", None, _opt_num),
    ("duration_ms", None, _opt_nonneg),
    ("timing_source", None, _one_of(None, "executor", "artifact", "harness")),
    (
        "status",
        "unknown",
        _one_of("completed", "failed", "timeout", "cancelled", "incomplete", "unknown"),
    ),
    ("error_type", None, _opt_str),
    ("output", None, _any),
)
_RECORD_KEYS: Final = (
    "schema_version",
    "task_id",
    "rollout_id",
    "invocations",
    "turns",
    "model_calls",
    "tool_calls",
    "gaps",
)


def normalize(value: Any, fields: Fields, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidRecordError(f"{what} is not an object")
    unknown = set(value) - {name for name, _, _ in fields}
    if unknown:
        raise InvalidRecordError(f"{what} has unknown keys {sorted(unknown)}")
    out: dict[str, Any] = {}
    for name, default, check in fields:
        if name in value:
            item = value[name]
        elif default is _REQUIRED:
            raise InvalidRecordError(f"{what} lacks {name}")
        else:
            item = default() if callable(default) else default
        if not check(item):
            raise InvalidRecordError(f"{what}.{name} is invalid")
        if name in _FLOATS and type(item) is int:
            item = float(item)
        out[name] = item
    return out


def _ref(value: Any) -> dict[str, Any]:
    ref = normalize(value, _REF, "ModelCallRef")
    if ref["model_call_id"] is None and (ref["model_ref"] is None or ref["response_id"] is None):
        raise InvalidRecordError("ModelCallRef needs model_call_id, or model_ref and response_id")
    return ref


def normalize_invocation(value: Any) -> dict[str, Any]:
    inv = normalize(value, _INVOCATION, "AgentInvocation")
    inv["model_calls"] = [_ref(r) for r in inv["model_calls"]]
    return inv


def _turn(value: Any) -> dict[str, Any]:
    turn = normalize(value, _TURN, "TrajectoryTurn")
    turn["model_calls"] = [_ref(r) for r in turn["model_calls"]]
    return turn


def normalize_model_call(value: Any) -> dict[str, Any]:
    call = normalize(value, _MODEL_CALL, "TrajectoryModelCall")
    call["response_metadata"] = normalize(call["response_metadata"], METADATA_FIELDS, "metadata")
    call["token_stats"] = normalize(call["token_stats"], _TOKENS, "token_stats")
    return call


def normalize_record(value: Any) -> dict[str, Any]:
    """Validate a whole TrajectoryRecord; return it normalized (every field, in order)."""
    if not isinstance(value, dict):
        raise InvalidRecordError("TrajectoryRecord is not an object")
    unknown = set(value) - set(_RECORD_KEYS)
    if unknown or value.get("schema_version", "1.0") != "1.0":
        raise InvalidRecordError("TrajectoryRecord has unknown keys or schema_version")
    for key in ("task_id", "rollout_id"):
        if not isinstance(value.get(key), str):
            raise InvalidRecordError(f"TrajectoryRecord.{key} is not a string")
    lists = {k: value.get(k, []) for k in _RECORD_KEYS[3:]}
    if not all(isinstance(v, list) for v in lists.values()):
        raise InvalidRecordError("TrajectoryRecord lists are not lists")
    record = {
        "schema_version": "1.0",
        "task_id": value["task_id"],
        "rollout_id": value["rollout_id"],
        "invocations": [normalize_invocation(v) for v in lists["invocations"]],
        "turns": [_turn(v) for v in lists["turns"]],
        "model_calls": [normalize_model_call(v) for v in lists["model_calls"]],
        "tool_calls": [
            normalize(v, TOOL_CALL_FIELDS, "TrajectoryToolCall") for v in lists["tool_calls"]
        ],
        "gaps": [normalize(v, GAP_FIELDS, "ObservationGap") for v in lists["gaps"]],
    }
    check_invariants(record)
    return record


def check_invariants(record: Mapping[str, Any]) -> None:
    ids = [inv["invocation_id"] for inv in record["invocations"]]
    if len(ids) != len(set(ids)):
        raise InvalidRecordError("invocation ids are not unique")
    call_ids = [c["model_call_id"] for c in record["model_calls"] if c["model_call_id"]]
    if len(call_ids) != len(set(call_ids)):
        raise InvalidRecordError("model_call_ids are not unique")
    turn_keys = [(t["invocation_id"], t["turn_no"]) for t in record["turns"]]
    if len(turn_keys) != len(set(turn_keys)):
        raise InvalidRecordError("(invocation_id, turn_no) is not unique")
    for turn in record["turns"]:
        if turn["task_id"] != record["task_id"] or turn["rollout_id"] != record["rollout_id"]:
            raise InvalidRecordError("a turn's task_id/rollout_id differ from the record's")
