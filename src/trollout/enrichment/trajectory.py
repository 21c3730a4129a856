"""`ng_trajectory`, the canonical TrajectoryRecord, projected from the evidence.

Pure functions (no I/O). Projection, in order: the agent's own trajectory (validated against
`schema`, identity re-stamped with a gap on mismatch), the agent's observation bundle
(invocations added, tool observations merged, its model-call references joined to the captured
calls), turns sorted, each captured call turned into a trajectory model call (merged by
``model_call_id`` or appended), capture gaps appended, turns synthesised when the agent sent
none, the ``*_unavailable`` gaps, deduplication.

The record's schema (field tables and their checks) is `schema`; the figures computed from a
projected record, ``ng_perf``, are `perf`: each reads a record, neither builds one.

Not done (no agent of ours or of the reference runs produces them): joining context-compaction
records' model-call references; their records are kept in the bundle as sent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from .schema import (
    GAP_FIELDS,
    METADATA_FIELDS,
    TOOL_CALL_FIELDS,
    InvalidRecordError,
    check_invariants,
    normalize,
    normalize_invocation,
    normalize_model_call,
    normalize_record,
)

__all__ = ["OBSERVATIONS_KEY", "TRAJECTORY_KEY", "InvalidRecordError", "project"]

TRAJECTORY_KEY: Final = "ng_trajectory"
OBSERVATIONS_KEY: Final = "ng_agent_observations"


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
    metadata = {name: call.get(name) for name, _, _ in METADATA_FIELDS}
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
        new_invocations = [
            normalize_invocation(r) for r in records if r.get("kind") == "agent_invocation"
        ]
        tools = [
            normalize(r, TOOL_CALL_FIELDS[:-1], "ToolCall")
            for r in records
            if r.get("kind") == "tool_call"
        ]
        bundle_gaps = [normalize(g, GAP_FIELDS, "ObservationGap") for g in bundle.get("gaps", [])]
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
            record = normalize_record(producer)
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
        check_invariants(trajectory)
        [normalize_model_call(c) for c in model_calls]
    except InvalidRecordError:
        return trajectory, False
    return trajectory, True
