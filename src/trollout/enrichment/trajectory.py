"""`ng_trajectory` (the canonical TrajectoryRecord) and `ng_perf`, projected from the evidence.

Pure functions (no I/O). The record's models forbid unknown keys and are written with every
field, in NeMo Gym 0.7.0's field order (docs/enrichment.md lists them): `_normalize` checks one
record against its field table and fills defaults, so a producer trajectory passes through
unchanged when it is valid and is reported (gap ``producer_trajectory_invalid``) when not.

Projection, in order: the agent's own trajectory (validated, identity re-stamped with a gap on
mismatch), the agent's observation bundle (invocations added, tool observations merged, its
model-call references joined to the captured calls), turns sorted, each captured call turned
into a trajectory model call (merged by ``model_call_id`` or appended), capture gaps appended,
turns synthesised when the agent sent none, the ``*_unavailable`` gaps, deduplication.

Not done (no agent of ours or of the reference runs produces them): joining context-compaction
records' model-call references; their records are kept in the bundle as sent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

__all__ = [
    "OBSERVATIONS_KEY",
    "PERF_KEY",
    "TRAJECTORY_KEY",
    "InvalidRecordError",
    "perf_record",
    "project",
]

TRAJECTORY_KEY: Final = "ng_trajectory"
OBSERVATIONS_KEY: Final = "ng_agent_observations"
PERF_KEY: Final = "ng_perf"
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

_GAP: Fields = (
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
_METADATA: Fields = (
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
_TOOL_CALL: Fields = (
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


def _normalize(value: Any, fields: Fields, what: str) -> dict[str, Any]:
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
    ref = _normalize(value, _REF, "ModelCallRef")
    if ref["model_call_id"] is None and (ref["model_ref"] is None or ref["response_id"] is None):
        raise InvalidRecordError("ModelCallRef needs model_call_id, or model_ref and response_id")
    return ref


def _invocation(value: Any) -> dict[str, Any]:
    inv = _normalize(value, _INVOCATION, "AgentInvocation")
    inv["model_calls"] = [_ref(r) for r in inv["model_calls"]]
    return inv


def _turn(value: Any) -> dict[str, Any]:
    turn = _normalize(value, _TURN, "TrajectoryTurn")
    turn["model_calls"] = [_ref(r) for r in turn["model_calls"]]
    return turn


def _model_call(value: Any) -> dict[str, Any]:
    call = _normalize(value, _MODEL_CALL, "TrajectoryModelCall")
    call["response_metadata"] = _normalize(call["response_metadata"], _METADATA, "metadata")
    call["token_stats"] = _normalize(call["token_stats"], _TOKENS, "token_stats")
    return call


def _record(value: Any) -> dict[str, Any]:
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
        "invocations": [_invocation(v) for v in lists["invocations"]],
        "turns": [_turn(v) for v in lists["turns"]],
        "model_calls": [_model_call(v) for v in lists["model_calls"]],
        "tool_calls": [
            _normalize(v, _TOOL_CALL, "TrajectoryToolCall") for v in lists["tool_calls"]
        ],
        "gaps": [_normalize(v, _GAP, "ObservationGap") for v in lists["gaps"]],
    }
    _check_invariants(record)
    return record


def _check_invariants(record: Mapping[str, Any]) -> None:
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


def _gap(code: str, invocation_id: str | None = None, detail: str | None = None) -> dict[str, Any]:
    return {"code": code, "invocation_id": invocation_id, "detail": detail}


def _dedup(gaps: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    seen: set[tuple[Any, Any, Any]] = set()
    out = []
    for g in gaps:
        key = (g.get("code"), g.get("invocation_id"), g.get("detail"))
        if key not in seen:
            seen.add(key)
            out.append(_gap(g["code"], g.get("invocation_id"), g.get("detail")))
    return out


# --- captured calls -----------------------------------------------------------------------


def _trajectory_call(call: Mapping[str, Any]) -> dict[str, Any]:
    response = call.get("response")
    status = call.get("response_status")
    if status is None and isinstance(response, dict) and isinstance(response.get("status"), str):
        status = response["status"]
    metadata = {name: call.get(name) for name, _, _ in _METADATA}
    metadata["response_status"] = status
    request = call.get("request")
    return {
        "model_call_id": call.get("model_call_id"),
        "started_at": call.get("started_at"),
        "completed_at": call.get("completed_at"),
        "duration_ms": call.get("latency_total_ms"),
        "request": request if request is not None else call.get("request_raw"),
        "response": response if response is not None else call.get("response_raw"),
        "response_metadata": metadata,
        "token_stats": {
            "prompt_tokens": call.get("tokens_in"),
            "completion_tokens": call.get("tokens_out"),
            "reasoning_tokens": call.get("tokens_reasoning"),
            "total_tokens": call.get("tokens_total"),
            "cached_tokens": call.get("cached_tokens"),
        },
    }


def _merge_call(into: dict[str, Any], new: Mapping[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            for k, v in value.items():
                if into[key].get(k) is None:
                    into[key][k] = v
        elif into.get(key) is None:
            into[key] = value


def _canonical_ref(call: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "model_call_id": call.get("model_call_id"),
        "model_ref": call.get("model_ref"),
        "response_id": call.get("response_id"),
    }


def _candidates(ref: Mapping[str, Any], calls: Sequence[Mapping[str, Any]]) -> list[int]:
    """Indices of captured calls a reference names (by id, else by (model_ref, response_id))."""
    if ref.get("model_call_id") is not None:
        return [
            i
            for i, c in enumerate(calls)
            if c.get("model_call_id") == ref["model_call_id"]
            and (ref.get("model_ref") is None or ref["model_ref"] == c.get("model_ref"))
            and (ref.get("response_id") is None or ref["response_id"] == c.get("response_id"))
        ]
    return [
        i
        for i, c in enumerate(calls)
        if ref.get("response_id") is not None
        and c.get("response_id") == ref.get("response_id")
        and c.get("model_ref") == ref.get("model_ref")
    ]


def _join(
    invocations: list[dict[str, Any]], calls: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Join a bundle's invocations to the captured calls in place; return the join's gaps."""
    gaps: list[dict[str, Any]] = []
    owner: dict[int, str] = {}
    by_id = {inv["invocation_id"]: inv for inv in invocations}
    for call in calls:  # x-session-id attribution
        inv = by_id.get(call.get("client_session_id") or "")
        call_id = call.get("model_call_id")
        if (
            inv is not None
            and call_id is not None
            and not any(r.get("model_call_id") == call_id for r in inv["model_calls"])
        ):
            inv["model_calls"].append(_canonical_ref(call))
    for inv in invocations:
        resolved = []
        for ref in inv["model_calls"]:
            found = _candidates(ref, calls)
            detail = ref.get("model_call_id") or ref.get("response_id")
            if not found:
                gaps.append(_gap("model_call_reference_unmatched", inv["invocation_id"], detail))
            elif len(found) > 1:
                gaps.append(_gap("model_call_reference_ambiguous", inv["invocation_id"], detail))
            elif owner.get(found[0], inv["invocation_id"]) != inv["invocation_id"]:
                gaps.append(_gap("model_call_reference_conflict", inv["invocation_id"], detail))
            else:
                owner[found[0]] = inv["invocation_id"]
                resolved.append(_canonical_ref(calls[found[0]]))
                continue
            resolved.append(ref)
        inv["model_calls"] = resolved
    for index, call in enumerate(calls):
        if index not in owner:
            ident = call.get("model_call_id") or call.get("response_id") or "unknown"
            detail = f"capture:{ident}:call_index={call.get('call_index', index)}"
            gaps.append(_gap("model_call_ownership_unavailable", None, detail))
    return gaps


def _bundle(
    bundle: Any,
    calls: Sequence[Mapping[str, Any]],
    invocations: list[dict[str, Any]],
    tool_calls: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """Take an observation bundle's invocations and tool observations; return its gaps."""
    if not isinstance(bundle, dict) or not isinstance(bundle.get("records", []), list):
        return [_gap("agent_observations_invalid", None, "ValidationError")]
    try:
        records = bundle.get("records", [])
        new_invocations = [_invocation(r) for r in records if r.get("kind") == "agent_invocation"]
        tools = [
            _normalize(r, _TOOL_CALL[:-1], "ToolCall")
            for r in records
            if r.get("kind") == "tool_call"
        ]
        bundle_gaps = [_normalize(g, _GAP, "ObservationGap") for g in bundle.get("gaps", [])]
    except (InvalidRecordError, AttributeError) as exc:
        return [
            _gap(
                "agent_observations_invalid",
                None,
                type(exc).__name__
                if not isinstance(exc, InvalidRecordError)
                else "ValidationError",
            )
        ]
    ids = [inv["invocation_id"] for inv in new_invocations]
    if len(ids) != len(set(ids)):
        return [_gap("agent_observations_invalid", None, "ValidationError")]
    keep = [g for g in bundle_gaps if not g["code"].startswith("model_call_")]
    join_gaps = _join(new_invocations, calls)
    bundle["records"] = [
        *new_invocations,
        *(r for r in records if r.get("kind") != "agent_invocation"),
    ]
    bundle["gaps"] = _dedup([*keep, *join_gaps])
    present = {inv["invocation_id"] for inv in invocations}
    invocations.extend(inv for inv in new_invocations if inv["invocation_id"] not in present)
    outputs = {
        (inv["invocation_id"], item.get("call_id")): item.get("output")
        for inv in invocations
        for item in inv["conversation"]
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    }
    by_key = {(t["invocation_id"], t["tool_call_id"]): t for t in tool_calls}
    for tool in tools:
        tool = {**tool, "output": outputs.get((tool["invocation_id"], tool["tool_call_id"]))}
        known = by_key.get((tool["invocation_id"], tool["tool_call_id"]))
        if known is None:
            tool_calls.append(tool)
            by_key[(tool["invocation_id"], tool["tool_call_id"])] = tool
            continue
        for key, value in tool.items():
            if value is None or (key == "status" and value == "unknown"):
                continue
            known[key] = value
    return [*bundle["gaps"]]


def _synthesised_turns(
    invocations: Sequence[Mapping[str, Any]],
    calls: Sequence[Mapping[str, Any]],
    task_id: str,
    rollout_id: str,
    resolved: bool | None,
) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = []
    for inv in invocations:
        refs = inv["model_calls"]
        steps = 0
        for call in calls:
            if call.get("response") is None and call.get("response_raw") is None:
                continue
            if not any(
                (r.get("model_call_id") and r["model_call_id"] == call.get("model_call_id"))
                or (r.get("response_id") and r["response_id"] == call.get("response_id"))
                for r in refs
            ):
                continue
            request = call.get("request")
            response = call.get("response")
            turns.append(
                {
                    "invocation_id": inv["invocation_id"],
                    "task_id": task_id,
                    "rollout_id": rollout_id,
                    "turn_no": sum(1 for t in turns if t["invocation_id"] == inv["invocation_id"])
                    + 1,
                    "timestamp": float(call.get("started_at") or 0.0),
                    "question": request.get("input") if isinstance(request, dict) else None,
                    "answer": response.get("output") if isinstance(response, dict) else None,
                    "reasoning_content": call.get("reasoning_content"),
                    "resolved": None,
                    "step_count": steps,
                    "model_calls": [_canonical_ref(call)],
                }
            )
            steps += len(call.get("tool_calls") or ())
    if turns and resolved is not None:
        turns[-1]["resolved"] = resolved
    return turns


def project(
    result: Mapping[str, Any],
    *,
    task_id: str,
    rollout_id: str,
    calls: Sequence[Mapping[str, Any]],
    capture_gaps: Sequence[Mapping[str, Any]],
) -> tuple[dict[str, Any], bool]:
    """Return the canonical ``ng_trajectory`` and whether it validated.

    ``calls`` are the ``ng_model_call_capture`` call records (payloads included when kept);
    ``capture_gaps`` that record's gaps. An ``ng_agent_observations`` bundle in ``result`` is
    joined in place (the caller's copy).
    """
    gaps: list[dict[str, Any]] = []
    invocations: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    model_calls: list[dict[str, Any]] = []
    tool_calls: list[dict[str, Any]] = []
    producer_ok = False
    producer = result.get(TRAJECTORY_KEY)
    if producer is not None:
        try:
            record = _record(producer)
        except InvalidRecordError:
            gaps.append(_gap("producer_trajectory_invalid", None, "ValidationError"))
        else:
            producer_ok = True
            wrong = [
                k for k, v in (("task_id", task_id), ("rollout_id", rollout_id)) if record[k] != v
            ]
            for turn in record["turns"]:
                turn["task_id"], turn["rollout_id"] = task_id, rollout_id
            invocations, turns = record["invocations"], record["turns"]
            model_calls, tool_calls = record["model_calls"], record["tool_calls"]
            gaps = [*record["gaps"], *gaps]
            if wrong:
                gaps.append(_gap("producer_trajectory_identity_mismatch", None, ",".join(wrong)))
    if OBSERVATIONS_KEY in result:
        gaps.extend(_bundle(result[OBSERVATIONS_KEY], calls, invocations, tool_calls))
    turns.sort(key=lambda t: (t["timestamp"], t["invocation_id"], t["turn_no"]))
    by_id = {c["model_call_id"]: c for c in model_calls if c["model_call_id"] is not None}
    for call in calls:
        new = _trajectory_call(call)
        same = by_id.get(new["model_call_id"]) if new["model_call_id"] is not None else None
        if same is not None:
            _merge_call(same, new)
        else:
            model_calls.append(new)
            if new["model_call_id"] is not None:
                by_id[new["model_call_id"]] = new
    gaps.extend(_gap(g["code"], None, g.get("detail")) for g in capture_gaps)
    if not producer_ok:
        resolved = result.get("resolved")
        turns = _synthesised_turns(
            invocations,
            calls,
            task_id,
            rollout_id,
            resolved if isinstance(resolved, bool) else None,
        )
    if not model_calls:
        gaps.append(_gap("model_calls_unavailable"))
    if not turns and not producer_ok:
        gaps.append(_gap("turns_unavailable"))
    if not any(inv["conversation"] for inv in invocations):
        gaps.append(_gap("conversation_unavailable"))
    trajectory = {
        "schema_version": "1.0",
        "task_id": task_id,
        "rollout_id": rollout_id,
        "invocations": invocations,
        "turns": turns,
        "model_calls": model_calls,
        "tool_calls": tool_calls,
        "gaps": _dedup(gaps),
    }
    try:
        _check_invariants(trajectory)
        [_model_call(c) for c in model_calls]
    except InvalidRecordError:
        return trajectory, False
    return trajectory, True


def perf_record(trajectory: Mapping[str, Any], latency_ms: float | None) -> dict[str, Any] | None:
    """Return ``ng_perf`` for a validated trajectory, or None when it has no invocation."""
    invocations = trajectory["invocations"]
    if not invocations:
        return None
    calls = trajectory["model_calls"]
    used: set[int] = set()
    owned_by: dict[str, int] = {}
    for inv in invocations:
        count = 0
        for ref in inv["model_calls"]:
            found = _perf_candidates(ref, calls)
            if len(found) == 1 and found[0] not in used:
                used.add(found[0])
                count += 1
        owned_by[inv["invocation_id"]] = count
    num_turns = 0
    for inv in invocations:
        turns = sum(1 for t in trajectory["turns"] if t["invocation_id"] == inv["invocation_id"])
        num_turns += turns or owned_by[inv["invocation_id"]] or 1
    ids = set(owned_by)
    perf: dict[str, Any] = {
        "num_turns": num_turns,
        "num_tool_calls": sum(1 for t in trajectory["tool_calls"] if t["invocation_id"] in ids),
        "token_observability_coverage": min(1.0, len(used) / num_turns),
    }
    for name, stat in (
        ("prompt_tokens", "prompt_tokens"),
        ("cached_prompt_tokens", "cached_tokens"),
        ("completion_tokens", "completion_tokens"),
        ("reasoning_tokens", "reasoning_tokens"),
    ):
        values = [calls[i]["token_stats"].get(stat) for i in sorted(used)]
        present = [v for v in values if v is not None]
        if present:
            perf[name] = sum(present)
    if latency_ms is not None:
        perf["total_latency_ms"] = latency_ms
    return perf


def _perf_candidates(ref: Mapping[str, Any], calls: Sequence[Mapping[str, Any]]) -> list[int]:
    if ref.get("model_call_id") is not None:
        found = []
        for i, c in enumerate(calls):
            meta = c["response_metadata"]
            if c["model_call_id"] != ref["model_call_id"]:
                continue
            if ref.get("model_ref") is not None and meta.get("model_ref") != ref["model_ref"]:
                continue
            if ref.get("response_id") is not None and meta.get("response_id") != ref["response_id"]:
                continue
            found.append(i)
        return found
    return [
        i
        for i, c in enumerate(calls)
        if c["response_metadata"].get("response_id") == ref.get("response_id")
        and c["response_metadata"].get("model_ref") == ref.get("model_ref")
    ]
