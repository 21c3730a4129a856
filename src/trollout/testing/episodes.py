"""How the fake's episode environment servers answer an episode (docs/protocol.md section 3).

An episode request is exactly ``{"episode_id": {"rollout_id", "attempt"}, "task": {"task_id":
{"taskset", "task_id"}, "task_input"}}``. It is validated as NeMo Gym's episode models do (every
object closed to other keys, ``rollout_id`` a capture id without an ``-aN`` suffix, ``attempt``
an integer >= 0, both task id fields non-empty strings), a 422 shaped like FastAPI's otherwise.

The answer is ``{"episode_id": <echo>, "task_id": <echo>, "result": {...}}``; the ``episode_*``
fault kinds make it a ``failure``, a reply of another shape, a result with collector keys or a
wrong echo, and any fault's ``report`` puts a FailureReport beside it (`faults.EPISODE_VARIANTS`,
`faults.REPORT_VARIANTS`). Faults are keyed by (task, rollout, attempt) like a flat row's: the
rollout id ``"<task>-<rollout>"`` gives the first two (an explicit id is hashed into a task
number, rollout 0), ``episode_id.attempt`` the third.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Final

import orjson

from ..errors import ConfigError
from ..httpserver import Reply
from .faults import Fault, FaultKind, unit_hash

__all__ = ["episode_key", "episode_reply", "parse_episode"]

Answer = Callable[[dict[str, Any]], dict[str, Any]]  # episode request -> its `result`

_ROLLOUT_ID: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_RESERVED_SUFFIX: Final = re.compile(r"-a[1-9][0-9]*\Z")
# "<task>-<rollout>", after the run id a driver's batch prefixes ("<run>-<task>-<rollout>").
_TASK_ROLLOUT: Final = re.compile(r"^(?:(.+)-)?([0-9]+)-([0-9]+)\Z")
_FLAT_ONLY: Final = frozenset(
    {FaultKind.FAILURE_CLASS, FaultKind.NO_PERSIST, FaultKind.JUDGE_FAILED, FaultKind.MASKED}
)


def _detail(kind: str, loc: list[Any], msg: str, value: Any) -> Reply:
    body = {"detail": [{"type": kind, "loc": loc, "msg": msg, "input": value}]}
    return Reply(status=422, body=orjson.dumps(body))


def _closed(value: Any, keys: tuple[str, ...], loc: list[Any]) -> Reply | None:
    """Return the 422 for `value` unless it is an object of exactly `keys`."""
    if not isinstance(value, dict):
        msg = "Input should be a valid dictionary or object to extract fields from"
        return _detail("model_attributes_type", loc, msg, value)
    for key in keys:
        if key not in value:
            return _detail("missing", [*loc, key], "Field required", value)
    for key in value:
        if key not in keys:
            return _detail("extra_forbidden", [*loc, key], "Extra inputs are not permitted", value)
    return None


def _field_problem(request: dict[str, Any]) -> Reply | None:
    episode_id, task_id = request["episode_id"], request["task"]["task_id"]
    rollout_id, attempt = episode_id["rollout_id"], episode_id["attempt"]
    if not (
        isinstance(rollout_id, str)
        and _ROLLOUT_ID.match(rollout_id)
        and not _RESERVED_SUFFIX.search(rollout_id)
    ):
        msg = "rollout_id must be a capture id without an -aN suffix"
        return _detail("value_error", ["body", "episode_id", "rollout_id"], msg, rollout_id)
    if type(attempt) is not int or attempt < 0:
        msg = "Input should be a valid integer, greater than or equal to 0"
        return _detail("int_type", ["body", "episode_id", "attempt"], msg, attempt)
    for key in ("taskset", "task_id"):
        if not (isinstance(task_id[key], str) and task_id[key]):
            msg = "String should have at least 1 character"
            return _detail("string_too_short", ["body", "task", "task_id", key], msg, task_id[key])
    return None


def parse_episode(data: dict[str, Any]) -> Reply | None:
    """Return the 422 a decoded episode request deserves, or None when it is valid."""
    return (
        _closed(data, ("episode_id", "task"), ["body"])
        or _closed(data["episode_id"], ("rollout_id", "attempt"), ["body", "episode_id"])
        or _closed(data["task"], ("task_id", "task_input"), ["body", "task"])
        or _closed(data["task"]["task_id"], ("taskset", "task_id"), ["body", "task", "task_id"])
        or _field_problem(data)
    )


def episode_key(request: dict[str, Any]) -> tuple[int, int, int]:
    """Return the (task, rollout, attempt) a valid episode request stands for."""
    episode_id = request["episode_id"]
    match = _TASK_ROLLOUT.match(episode_id["rollout_id"])
    if match is None:
        task, rollout = int(unit_hash("rollout_id", episode_id["rollout_id"]) * 2**31), 0
    else:
        task, rollout = int(match[2]), int(match[3])
    return (task, rollout, episode_id["attempt"])


def run_id_of(request: Mapping[str, Any]) -> str | None:
    """Return the run id a driver's batch stamped on a request (flat row or episode)."""
    run_id = request.get("_ng_run_id")
    if isinstance(run_id, str):
        return run_id
    episode_id = request.get("episode_id")
    rollout_id = episode_id.get("rollout_id") if isinstance(episode_id, Mapping) else None
    match = _TASK_ROLLOUT.match(rollout_id) if isinstance(rollout_id, str) else None
    return match[1] if match is not None else None


def _echo(request: dict[str, Any]) -> dict[str, Any]:
    return {"episode_id": request["episode_id"], "task_id": request["task"]["task_id"]}


def episode_reply(request: dict[str, Any], answer: Answer, fault: Fault | None) -> dict[str, Any]:
    """Return the JSON reply of an episode server to `request` under `fault` (None: answer).

    Raises:
        ConfigError: `fault` is of a kind only flat-row servers apply (the server answers 500).
    """
    kind = None if fault is None else fault.kind
    if kind in _FLAT_ONLY:
        raise ConfigError(
            f"fault kind {kind.value!r} is for flat rows; an episode server answers with the "
            "episode_* kinds (episode_shape variant 'flat' sends a flat reply)"
        )
    if fault is None or kind not in _BUILDERS:
        reply: Any = {**_echo(request), "result": answer(request)}
    else:
        reply = _BUILDERS[fault.kind](request, answer, fault)
    if fault is not None and fault.report is not None and isinstance(reply, dict):
        reply.update(failure_report(fault.report, request))
    return reply  # type: ignore[no-any-return]


def _failure(request: dict[str, Any], answer: Answer, fault: Fault) -> dict[str, Any]:
    failure: dict[str, Any] = {
        "failure_reason": fault.body or "fake episode failure",
        "terminal": fault.terminal,
    }
    if fault.failure_class is not None:
        failure["failure_kind"] = fault.failure_class
    if fault.stage is not None:
        failure["stage"] = fault.stage
    if fault.partial:
        failure["partial_response"] = answer(request)["response"]
    return {**_echo(request), "failure": failure}


def _shape(request: dict[str, Any], answer: Answer, fault: Fault) -> Any:
    echo, result = _echo(request), answer(request)
    failure = {"failure_reason": "fake", "terminal": False}
    replies: dict[str, Any] = {  # a few small objects per request: built eagerly, one is sent
        "array": [echo, result],
        "string": "episode done",
        "null": None,
        "flat": {"responses_create_params": {"input": []}, **result},
        "no_episode_id": {"task_id": echo["task_id"], "result": result},
        "no_task_id": {"episode_id": echo["episode_id"], "result": result},
        "neither": {**echo, "reward": result["reward"]},
        "both": {**echo, "result": result, "failure": failure},
        "result_not_object": {**echo, "result": [result]},
        "failure_not_object": {**echo, "failure": "it broke"},
        "bad_terminal": {**echo, "failure": {**failure, "terminal": "yes"}},
        "no_reason": {**echo, "failure": {"terminal": True}},
    }
    return replies[fault.episode_variant]


_COLLECTOR_KEYS: Final[dict[str, dict[str, Any]]] = {
    "ng": {"_ng_reward_override": 1.0},
    "perf": {"ng_perf": {"tokens_per_s": 100.0}},
    "capture": {"ng_model_call_capture": [{"request": {}, "response": {}}]},
}


def _collector_keys(request: dict[str, Any], answer: Answer, fault: Fault) -> dict[str, Any]:
    result = answer(request) | _COLLECTOR_KEYS[fault.episode_variant]
    return {**_echo(request), "result": result}


def _identity(request: dict[str, Any], answer: Answer, fault: Fault) -> dict[str, Any]:
    episode_id = dict(request["episode_id"])
    task_id = dict(request["task"]["task_id"])
    variant = fault.episode_variant
    if variant == "attempt":
        episode_id["attempt"] += 1
    elif variant == "attempt_bool":
        episode_id["attempt"] = bool(episode_id["attempt"])
    elif variant == "rollout_id":
        episode_id["rollout_id"] += "x"
    elif variant == "extra_key":
        episode_id["server"] = "fake"
    else:  # taskset, task_id
        task_id[variant] += "-other"
    return {"episode_id": episode_id, "task_id": task_id, "result": answer(request)}


_BUILDERS: Final[dict[FaultKind, Callable[[dict[str, Any], Answer, Fault], Any]]] = {
    FaultKind.EPISODE_FAILURE: _failure,
    FaultKind.EPISODE_SHAPE: _shape,
    FaultKind.EPISODE_COLLECTOR_KEYS: _collector_keys,
    FaultKind.EPISODE_IDENTITY: _identity,
}


def failure_report(variant: str, request: dict[str, Any]) -> dict[str, Any]:
    """Return the FailureReport keys of `variant` for `request` (`faults.REPORT_VARIANTS`)."""
    episode_id = request["episode_id"]
    failure_id = f"fake-{episode_id['rollout_id']}-{episode_id['attempt']}"
    if variant == "invalid":
        return {"_ng_failure_id": failure_id, "_ng_failure_events": "sandbox died"}
    count = 40 if variant == "many" else 2
    events = [{"event": "step", "index": i} for i in range(count)]
    report: dict[str, Any] = {"_ng_failure_id": failure_id, "_ng_failure_events": events}
    if variant == "many":
        report["_ng_failure_events_omitted"] = 3
    return report
