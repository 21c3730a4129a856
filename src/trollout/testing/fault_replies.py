"""How a scripted fault answers: a `faults.Fault` turned into the reply a server sends.

`fault_reply` is what `servers.FakeServer` sends for a ``/run`` that a fault plan picked: an
error status, a stream cut short or trickled, a reset or close (before or in the body), a hang,
a body that is not JSON or not an object, a producer's failure sentinel, or a reply nobody asked
for after the real one. Its own module beside `servers`: the servers say what each endpoint
answers, this module how each fault misbehaves.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from functools import partial
from typing import Any

import orjson
import trio

from ..httpserver import Action, Reply, encode_head
from .faults import ONE_MEGABYTE, Fault, FaultKind

__all__ = ["fault_reply"]


def _sentinel(
    fault: Fault, row: dict[str, Any], result: Callable[[dict[str, Any]], dict[str, Any]]
) -> dict[str, Any]:
    params = {"responses_create_params": row["responses_create_params"]}
    if fault.kind is FaultKind.NO_PERSIST:
        extra = {} if fault.failure_class is None else {"_ng_failure_class": fault.failure_class}
        return params | {"_ng_no_persist": True} | extra
    if fault.kind is FaultKind.FAILURE_CLASS:
        cls = fault.failure_class or "transient"
        terminal = {"_ng_failure_terminal": True} if fault.terminal else {}
        kind = {} if fault.failure_kind is None else {"failure_kind": fault.failure_kind}
        said = {"failure_reason": f"fake {cls} failure"}
        return params | {"_ng_failure_class": cls} | said | terminal | kind
    reason = fault.body or f"fake {fault.kind.value}"
    masked = {"reward": 0.0, "mask_sample": True, "failure_reason": reason}
    if fault.kind is FaultKind.JUDGE_FAILED:
        judge = {"failure_kind": "judge_failed", "_ng_failure_class": "judge_failed"}
        return result(row) | masked | judge | {"_ng_failure_judge_error": reason}
    return result(row) | masked | {"failure_kind": fault.failure_class or "session_lost"}


def fault_reply(
    fault: Fault, row: dict[str, Any], result: Callable[[dict[str, Any]], dict[str, Any]]
) -> Reply:
    """Return the reply that carries out ``fault`` for ``row`` (``result``: the good answer)."""
    kind = fault.kind
    if kind is FaultKind.STATUS:
        status = fault.status or 500
        headers: tuple[tuple[str, str], ...] = ()
        if fault.retry_after is not None:
            headers += (("retry-after", f"{fault.retry_after:g}"),)
        if fault.failure_kind is not None:
            headers += (("x-ng-failure-report", _report(fault.failure_kind, row)),)
        body = orjson.dumps(fault.body or f"fake HTTP {status}")
        return Reply(status=status, body=body, headers=headers)
    if kind is FaultKind.OVERSIZED:
        size = max(fault.size, 2)
        stream = partial(_json_string, size)
        length = None if fault.until_eof else size
        return Reply(status=fault.status or 500, action=Action.STREAM, length=length, stream=stream)
    if kind is FaultKind.SLOWLORIS:
        return Reply(action=Action.STREAM, stream=partial(_trickle, fault.interval_s))
    if kind is FaultKind.UNSOLICITED_REPLY:
        return _unsolicited(fault, result(row))
    if kind is FaultKind.RESET_MID_REQUEST:
        return Reply(action=Action.RESET)
    if kind is FaultKind.DISCONNECT:
        return Reply(action=Action.CLOSE)
    if kind is FaultKind.RESET_MID_RESPONSE:
        return Reply(body=orjson.dumps(result(row)), action=Action.RESET_MID_BODY)
    if kind is FaultKind.HANG:
        return Reply(action=Action.HANG)
    if kind is FaultKind.NOT_JSON:
        return Reply(body=b"<html>this is not JSON</html>")
    if kind is FaultKind.NOT_OBJECT:
        return Reply(body=b'["not", "an", "object"]')
    return Reply(body=orjson.dumps(_sentinel(fault, row, result)))


def _report(kind: str, row: dict[str, Any]) -> str:
    """The failure report a failed ``/run`` forwards: the agent's routing failure (selected),
    caused by its environment's failure of `kind`."""
    at = f"{row.get('_ng_task_index')}-{row.get('_ng_rollout_index')}"
    events = [
        {"failure_id": f"agent-{at}", "kind": "agent_run_error", "caused_by": f"env-{at}"},
        {"failure_id": f"env-{at}", "kind": kind, "message": f"fake provider: {kind}"},
    ]
    report = {"_ng_failure_id": f"agent-{at}", "_ng_failure_events": events}
    return orjson.dumps(report).decode()


async def _json_string(size: int) -> AsyncGenerator[bytes]:
    """Yield a JSON string of `size` (>= 2) bytes in pieces: it never exists whole."""
    yield b'"'
    piece, left = b"x" * ONE_MEGABYTE, size - 2
    while left > 0:
        yield piece if left >= len(piece) else piece[:left]
        left -= len(piece)
    yield b'"'


async def _trickle(interval_s: float) -> AsyncGenerator[bytes]:
    """Yield the start of a JSON string, then one more byte every `interval_s`, forever."""
    yield b'"'
    while True:
        await trio.sleep(interval_s)
        yield b"x"


def _unsolicited(fault: Fault, answer: dict[str, Any]) -> Reply:
    """Answer with `answer`, then send one more complete reply nobody asked for.

    The extra reply replays the answer, or (`fault.body` set) forges its text and reward while
    keeping whatever identity the answer echoes.
    """
    body = orjson.dumps(answer)
    extra = body
    if fault.body is not None:
        forged = orjson.loads(body)
        result = forged.get("result", forged)  # an episode reply nests its result
        result["response"]["output"][0]["content"][0]["text"] = fault.body
        result["reward"] = 1.0
        extra = orjson.dumps(forged)
    unsolicited = encode_head(Reply(body=extra), keep_alive=True) + extra
    stream = partial(_then, body, fault.interval_s, unsolicited)
    return Reply(action=Action.STREAM, length=len(body), stream=stream)


async def _then(first: bytes, gap_s: float, then: bytes) -> AsyncGenerator[bytes]:
    yield first
    await trio.sleep(gap_s)
    yield then
