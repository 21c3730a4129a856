"""The fake model server's call capture: capture files written the way NeMo Gym 0.7.0's are.

With ``model_call_capture_dir`` set on the spec, every fake agent's rollout makes two model
calls (a ``lookup`` tool call, then the answer), as a ``simple_agent`` with one tool does, and
the model server's capture appends one line per call to ``<dir>/<key>.capture.jsonl`` (key:
``_ng_rollout_id`` or ``task-rollout``, ``-aN`` for attempt N > 0), each line flushed before the
agent goes on, as the reference's middleware does. The agent's reply carries its producer
``ng_trajectory`` (one ``root`` invocation, a turn per model response, the tool call), and its
``response.usage`` is the sum of the two calls, as the reference agent's is.

The fake agent calls its model in-process (no HTTP hop: the fake deployment answers ``/run``
itself), so the capture is written by the agent's handler on the model server's behalf; the
files are the same.

A row's ``fake_capture`` field picks what the capture shows (tests and the demo use it):

- ``retry``: the first call fails (HTTP 500, ``error_category: upstream_error``, ``response:
  null``, ``response_raw``), the agent retries it, then goes on: three lines;
- ``incomplete``: one exchange could not be written: the ``.capture.incomplete`` marker;
- ``late``: the last line is written in two parts, the rest ``fake_capture_delay_s`` (default
  0.05) after the reply, on the server's clock (a reader must wait for it);
- ``none``: nothing captured (no file).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Mapping
from typing import Any, Final

import orjson
import trio

__all__ = ["CAPTURE_FIELD", "capture_key", "capture_rollout"]

CAPTURE_FIELD: Final = "fake_capture"
_DELAY_FIELD: Final = "fake_capture_delay_s"


def capture_key(row: Mapping[str, Any]) -> str:
    """Return the rollout's capture key, as the reference's agent computes it."""
    base = row.get("_ng_rollout_id") or f"{row['_ng_task_index']}-{row['_ng_rollout_index']}"
    attempt = row.get("_ng_attempt_index") or 0
    return f"{base}-a{attempt}" if attempt else str(base)


def _usage(tokens_in: int, tokens_out: int) -> dict[str, Any]:
    return {
        "input_tokens": tokens_in,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": tokens_out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": tokens_in + tokens_out,
    }


def _line(
    model_name: str, request: Any, response: Any, status: int = 200, started: float = 0.0
) -> dict[str, Any]:
    line: dict[str, Any] = {
        "model_call_id": uuid.uuid4().hex,
        "dialect": "responses",
        "model_ref": {"type": "responses_api_models", "name": model_name},
        "started_at": started,
        "completed_at": started + 0.004,
        "latency_ms": 4.0,
        "latency_ttft_ms": 3.5 if status == 200 else None,
        "status_code": status,
        "error_category": None if status == 200 else "upstream_error",
        "request": request,
        "response": response,
    }
    if status != 200:
        line["response_raw"] = '{"error":{"message":"injected failure (HTTP 500)"}}'
    return line


def capture_rollout(
    directory: str, row: Mapping[str, Any], response: dict[str, Any], model_name: str
) -> dict[str, Any]:
    """Write the rollout's capture file; return the agent's producer ``ng_trajectory``.

    ``response`` (the final answer) gets the two calls' summed usage.
    """
    params = row["responses_create_params"]
    question = list(params.get("input") or []) if isinstance(params.get("input"), list) else []
    key = capture_key(row)
    mode = row.get(CAPTURE_FIELD)
    now = time.time()
    call_id = f"call_{key.replace('-', '_')}"
    tool_call = {
        "arguments": '{"query": "lookup"}',
        "call_id": call_id,
        "name": "lookup",
        "type": "function_call",
        "id": f"fc_{key}",
        "status": "completed",
    }
    first_response = {
        "id": f"resp_{key}_0",
        "model": response.get("model"),
        "object": "response",
        "output": [tool_call],
        "status": "completed",
        "incomplete_details": None,
        "usage": _usage(40, 10),
    }
    tool_output = {"call_id": call_id, "output": '{"found": true}', "type": "function_call_output"}
    first_request = {"input": question, "metadata": params.get("metadata")}
    second_request = {
        "input": [*question, tool_call, tool_output],
        "metadata": params.get("metadata"),
    }
    final_usage = response.get("usage") or _usage(0, 0)
    response["usage"] = _usage(
        40 + final_usage.get("input_tokens", 0), 10 + final_usage.get("output_tokens", 0)
    )
    lines = []
    if mode == "retry":
        lines.append(_line(model_name, first_request, None, 500, now))
    lines.append(_line(model_name, first_request, first_response, 200, now + 0.01))
    final = {**response, "usage": final_usage}
    lines.append(_line(model_name, second_request, final, 200, now + 0.03))
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, key + ".capture.jsonl")
    if mode == "incomplete":
        with open(os.path.join(directory, key + ".capture.incomplete"), "wb"):
            pass
        lines = lines[:-1]  # the exchange whose write failed
    if mode != "none":
        data = b"".join(orjson.dumps(line) + b"\n" for line in lines)
        if mode == "late":
            split = len(data) - 20
            _append(path, data[:split])
            delay = float(row.get(_DELAY_FIELD, 0.05))
            trio.lowlevel.spawn_system_task(_append_later, path, data[split:], delay)
        else:
            _append(path, data)

    def ref(response_id: Any) -> dict[str, Any]:
        model_ref = {"type": "responses_api_models", "name": model_name}
        return {"model_call_id": None, "model_ref": model_ref, "response_id": response_id}

    turn = {"invocation_id": "root", "task_id": "", "rollout_id": key, "question": None}
    return {
        "schema_version": "1.0",
        "task_id": str(row.get("_ng_task_index")),
        "rollout_id": key,
        "invocations": [
            {
                "kind": "agent_invocation",
                "invocation_id": "root",
                "status": "completed",
                "model_calls": [ref(first_response["id"]), ref(response.get("id"))],
                "conversation": [*question, tool_call, tool_output, *response.get("output", [])],
            }
        ],
        "turns": [
            {
                **turn,
                "task_id": str(row.get("_ng_task_index")),
                "turn_no": 1,
                "timestamp": now + 0.005,
                "question": question,
                "answer": [tool_call],
                "step_count": 1,
                "model_calls": [ref(first_response["id"])],
            },
            {
                **turn,
                "task_id": str(row.get("_ng_task_index")),
                "turn_no": 2,
                "timestamp": now + 0.025,
                "question": [*question, tool_call, tool_output],
                "answer": response.get("output"),
                "step_count": 1,
                "model_calls": [ref(response.get("id"))],
            },
        ],
        "model_calls": [],
        "tool_calls": [
            {
                "kind": "tool_call",
                "invocation_id": "root",
                "tool_call_id": call_id,
                "tool_name": "lookup",
                "started_at": now + 0.015,
                "completed_at": now + 0.02,
                "duration_ms": 5.0,
                "timing_source": "executor",
                "status": "completed",
                "output": tool_output["output"],
            }
        ],
        "gaps": [{"code": "resolution_unavailable", "invocation_id": "root", "detail": None}],
    }


def _append(path: str, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)
        f.flush()


async def _append_later(path: str, data: bytes, delay: float) -> None:
    try:
        await trio.sleep(delay)
        _append(path, data)
    except OSError:
        pass  # the dir is gone: the line stays cut, as a killed server's would
