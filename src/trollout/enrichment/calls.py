"""`ng_model_call_capture`: one record per captured exchange, their sums, and the gap markers.

Pure functions over parsed capture lines (no I/O). Field names, order and derivations follow
NeMo Gym 0.7.0's merge (docs/enrichment.md, "The capture record"): tokens from the Responses,
chat or Anthropic usage shapes, tool calls with parsed arguments, reasoning text, finish reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson

__all__ = [
    "CAPTURE_KEY",
    "PAYLOAD_KEYS",
    "call_record",
    "capture_record",
    "gap",
]

CAPTURE_KEY: Final = "ng_model_call_capture"
PAYLOAD_KEYS: Final = ("request", "response", "request_raw", "response_raw")
_EXECUTION_KEYS: Final = (
    "upstream_attempted",
    "response_source",
    "upstream_status_code",
    "local_response_reason",
)
_METRICS: Final = (
    ("tokens_in", "tokens_in"),
    ("tokens_out", "tokens_out"),
    ("tokens_reasoning", "tokens_reasoning"),
    ("tokens_total", "tokens_total"),
    ("cached_tokens", "cached_tokens"),
    ("latency_total_ms", "latency_total_ms"),
)


def gap(code: str, detail: str | None = None) -> dict[str, Any]:
    """Return a capture gap marker ``{code, detail?}``."""
    return {"code": code} if detail is None else {"code": code, "detail": detail}


def _dict(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def _int(value: Any) -> int | None:
    return value if type(value) is int else None


def _first_int(usage: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = _int(usage.get(key))
        if value is not None:
            return value
    return None


def _arguments(raw: Any) -> Any:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            parsed = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return {"_raw": raw}
        return parsed if isinstance(parsed, dict) else {"_raw": raw}
    return {"_raw": raw} if raw is not None else {}


def _tool_calls(response: Mapping[str, Any]) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    for item in response.get("output") or ():  # Responses
        if isinstance(item, dict) and item.get("type") == "function_call":
            calls.append(
                {
                    "call_id": item.get("call_id"),
                    "name": item.get("name"),
                    "arguments": _arguments(item.get("arguments")),
                }
            )
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):  # chat
        message = _dict(choices[0].get("message")) or {}
        for call in message.get("tool_calls") or ():
            if isinstance(call, dict):
                function = _dict(call.get("function")) or {}
                calls.append(
                    {
                        "call_id": call.get("id"),
                        "name": function.get("name"),
                        "arguments": _arguments(function.get("arguments")),
                    }
                )
    content = response.get("content")
    if isinstance(content, list):  # Anthropic messages
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                calls.append(
                    {
                        "call_id": block.get("id"),
                        "name": block.get("name"),
                        "arguments": _arguments(block.get("input")),
                    }
                )
    return calls


def _reasoning(response: Mapping[str, Any]) -> str | None:
    texts: list[str] = []
    for item in response.get("output") or ():
        if isinstance(item, dict) and item.get("type") == "reasoning":
            for part in item.get("summary") or ():
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    texts.append(part["text"])
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = _dict(choices[0].get("message")) or {}
        for key in ("reasoning_content", "reasoning"):
            if isinstance(message.get(key), str):
                texts.append(message[key])
                break
    content = response.get("content")
    if isinstance(content, list):
        for block in content:
            if not isinstance(block, dict) or block.get("type") != "thinking":
                continue
            if isinstance(block.get("thinking"), str):
                texts.append(block["thinking"])
    return "\n".join(texts) if texts else None


def _finish_reason(response: Mapping[str, Any]) -> str | None:
    if isinstance(response.get("stop_reason"), str):
        return str(response["stop_reason"])
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        reason = choices[0].get("finish_reason")
        if isinstance(reason, str):
            return reason
    details = _dict(response.get("incomplete_details"))
    if details is not None and isinstance(details.get("reason"), str):
        return str(details["reason"])
    return None


def call_record(index: int, exchange: Mapping[str, Any], include_payloads: bool) -> dict[str, Any]:
    """Return the ``ng_model_call_capture.calls`` record of one captured exchange."""
    request = _dict(exchange.get("request"))
    response = _dict(exchange.get("response"))
    usage = _dict(response.get("usage")) if response is not None else None
    tokens_in = tokens_out = tokens_total = reasoning = cached = creation = None
    if usage is not None:
        tokens_in = _first_int(usage, "input_tokens", "prompt_tokens")
        tokens_out = _first_int(usage, "output_tokens", "completion_tokens")
        cache_read = _int(usage.get("cache_read_input_tokens"))
        creation = _int(usage.get("cache_creation_input_tokens"))
        if tokens_in is not None and (cache_read is not None or creation is not None):
            tokens_in += (cache_read or 0) + (creation or 0)  # Anthropic counts them apart
        tokens_total = _int(usage.get("total_tokens"))
        if tokens_total is None and tokens_in is not None and tokens_out is not None:
            tokens_total = tokens_in + tokens_out
        out_details = _dict(usage.get("output_tokens_details")) or _dict(
            usage.get("completion_tokens_details")
        )
        if out_details is not None:
            reasoning = _int(out_details.get("reasoning_tokens"))
        in_details = _dict(usage.get("input_tokens_details")) or _dict(
            usage.get("prompt_tokens_details")
        )
        if in_details is not None:
            cached = _int(in_details.get("cached_tokens"))
        if cached is None:
            cached = cache_read
    model = response.get("model") if response is not None else None
    if not isinstance(model, str):
        model = request.get("model") if request is not None else None
        model = model if isinstance(model, str) else None
    response_id = response.get("id") if response is not None else None
    record: dict[str, Any] = {
        "model_call_id": exchange.get("model_call_id"),
        "response_id": response_id if isinstance(response_id, str) else None,
        "client_session_id": exchange.get("client_session_id"),
        "call_index": index,
        "model_ref": exchange.get("model_ref"),
        "model": model,
        "dialect": exchange.get("dialect"),
        "status_code": exchange.get("status_code"),
        "response_status": response.get("status") if response is not None else None,
        "finish_reason": _finish_reason(response) if response is not None else None,
    }
    for key in _EXECUTION_KEYS:
        record[key] = exchange.get(key)
    record["started_at"] = exchange.get("started_at")
    record["completed_at"] = exchange.get("completed_at")
    record["tokens_in"] = tokens_in
    record["tokens_out"] = tokens_out
    record["tokens_reasoning"] = reasoning
    record["tokens_total"] = tokens_total
    record["tool_calls"] = _tool_calls(response) if response is not None else []
    record["reasoning_content"] = _reasoning(response) if response is not None else None
    record["cache_hit"] = None if cached is None else cached > 0
    record["cached_tokens"] = cached
    record["cache_creation_tokens"] = creation
    record["error_category"] = exchange.get("error_category")
    record["latency_total_ms"] = exchange.get("latency_ms")
    record["latency_ttft_ms"] = exchange.get("latency_ttft_ms")
    if include_payloads:
        record["request"] = exchange.get("request")
        record["response"] = exchange.get("response")
        for key in ("request_raw", "response_raw"):
            if key in exchange:
                record[key] = exchange[key]
    return record


def _metrics(calls: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    metrics: dict[str, Any] = {}
    for name, key in _METRICS:
        total: Any = None
        for call in calls:
            value = call.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                total = value if total is None else total + value
        metrics[name] = total
    metrics["num_calls"] = len(calls)
    return metrics


def capture_record(
    key: str,
    exchanges: Sequence[Mapping[str, Any] | None],
    gaps: Sequence[dict[str, Any]],
    include_payloads: bool,
) -> dict[str, Any]:
    """Return ``ng_model_call_capture`` for a rollout: calls in file order, sums, gaps.

    ``exchanges`` holds None for an unreadable line (counted in ``call_index`` and in the
    ``model_call_capture_records_unreadable`` gap). ``gaps`` are the read's own (incomplete
    marker, refused file); the record's gaps are those plus what the lines show.
    """
    calls = [
        call_record(index, exchange, include_payloads)
        for index, exchange in enumerate(exchanges)
        if exchange is not None
    ]
    all_gaps = list(gaps)
    damaged = sum(1 for exchange in exchanges if exchange is None)
    if damaged:
        all_gaps.append(gap("model_call_capture_records_unreadable", f"count={damaged}"))
    if not calls and not any(g["code"] == "model_call_capture_unreadable" for g in gaps):
        all_gaps.append(gap("model_call_capture_no_records"))
    record: dict[str, Any] = {"rollout_id": key, "metrics": _metrics(calls), "calls": calls}
    if all_gaps:
        record["gaps"] = all_gaps
    return record
