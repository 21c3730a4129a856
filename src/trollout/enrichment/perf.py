"""`ng_perf`: the figures of one projected trajectory (turns, tool calls, tokens, coverage).

Pure functions (no I/O), over a trajectory that `trajectory.project` built and validated: the
caller (`enricher.enrich_result`) computes ``ng_perf`` only for a record that validated. Apart
from the projection because it reads a finished record and builds none: its joins go through
the record's own ``response_metadata``, not the captured calls the projection joins.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

__all__ = ["PERF_KEY", "perf_record"]

PERF_KEY: Final = "ng_perf"


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
