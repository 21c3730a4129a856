# Stays whole: the 14 checks are one table, read side by side as the reference lists them.
"""The rollout checks: one JSONL line in, one `RowResult` out (findings, unobserved, digests).

This is the map step of the health check (`health.run` is the reduce): a pure function of one
line, so it runs in a worker process as well as inline, and a row is dropped as soon as its
result is built. A result carries only what the reduce needs: the row's identity, its findings
already rendered as JSON text (the verdict line is assembled from them), the checks that could
not be evaluated, the task digest (were the turn's model calls all bound, how many succeeded)
and the row's share of the summary's statistics.

Every check reads the row's canonical trajectory (``ng_trajectory``), never
``ng_model_call_capture`` or ``ng_perf``: the trajectory is where enrichment leaves the
evidence, and reading one source keeps the verdict independent of how much payload a row kept.
What each check flags, and when it cannot tell, is docs/health.md's table; the comments below
name only what the table leaves to the code.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

import orjson

from .trajectory import InvalidTrajectoryError, validate_trajectory

__all__ = [
    "CHECKS",
    "ROLLOUT_CHECKS",
    "TASK_CHECKS",
    "RowResult",
    "evaluate_line",
    "render",
]

CHECKS: Final = (
    "check_execution_error",
    "record_unreadable",
    "rollout_duplicate_identity",
    "rollout_missing_agent_turns",
    "rollout_ended_on_failed_model_call",
    "agent_turn_hollow",
    "model_call_zero_completion_tokens",
    "model_call_missing_token_counts",
    "trajectory_capture_mismatch",
    "model_call_failed",
    "rollout_token_count_mismatch",
    "model_call_runaway_generation",
    "task_consistently_unhealthy",
    "task_no_successful_model_calls",
)
ROLLOUT_CHECKS: Final = CHECKS[:12]
TASK_CHECKS: Final = CHECKS[12:]
_TRAJECTORY_CHECKS: Final = CHECKS[3:12]  # unobserved together when there is no trajectory
UNREADABLE_TASK: Final = "__unreadable_record__"

_CALL_GAPS: Final = frozenset(
    {
        "model_calls_unavailable",
        "model_call_capture_incomplete",
        "model_call_capture_records_unreadable",
        "model_call_capture_unreadable",
    }
)
_JOIN_GAPS: Final = {
    "model_call_reference_unmatched": "missing_captured_call",
    "model_call_reference_ambiguous": "duplicated_captured_call",
    "model_call_reference_conflict": "conflicting_call_ownership",
}
_FAILED_STATUSES: Final = frozenset({"failed", "error", "cancelled"})
_LENGTH_REASONS: Final = frozenset({"length", "max_output_tokens", "max_tokens"})
# Keys whose (recursive) text makes an answer or reasoning a message.
_TEXT_KEYS: Final = (
    "text",
    "content",
    "output_text",
    "refusal",
    "summary",
    "reasoning",
    "reasoning_content",
)

_encode = json.JSONEncoder(separators=(",", ":")).encode  # NeMo Gym's: ASCII, compact


def render(obj: Any) -> str:
    """Render JSON the way NeMo Gym writes verdict lines (compact, ASCII-escaped)."""
    return _encode(obj)


class RowResult:
    """What the reduce step keeps of one row (picklable; slots keep it small).

    Attributes:
        task: the task index (int or str; the unreadable-line form for a line that is not JSON).
        rollout: the rollout index (default 0).
        stage: the stage index, or `NO_STAGE`.
        rollout_id: as the verdict line shows it.
        readable: the line is a JSON object (only then can it be a duplicate).
        findings: (check index, rendered finding), registry order.
        unobserved: indices of the non-ignored rollout checks that could not be evaluated.
        turn_complete: every turn-bound model call reference resolved (task check 14).
        successful: successful turn-bound calls (task check 14).
        failed_statuses: the status (as text, or "unknown") of each failed call.
        ended_on_error: check 5's rule holds (whether or not the check is ignored).
        replayed: copies beyond the first of calls with one identity.
        tokens: transcript prompt, completion; trajectory prompt, completion.
        captured: the trajectory holds at least one model call.
    """

    __slots__ = (
        "captured",
        "ended_on_error",
        "failed_statuses",
        "findings",
        "readable",
        "replayed",
        "rollout",
        "rollout_id",
        "stage",
        "successful",
        "task",
        "tokens",
        "turn_complete",
        "unobserved",
    )

    def __init__(self, task: Any, rollout: Any, stage: Any, rollout_id: str) -> None:
        self.task = task
        self.rollout = rollout
        self.stage = stage
        self.rollout_id = rollout_id
        self.readable = True
        self.findings: list[tuple[int, str]] = []
        self.unobserved: list[int] = []
        self.turn_complete = False
        self.successful = 0
        self.failed_statuses: list[str] = []
        self.ended_on_error = False
        self.replayed = 0
        self.tokens = (0, 0, 0, 0)
        self.captured = False

    def __getstate__(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        for name, value in zip(self.__slots__, state, strict=True):
            setattr(self, name, value)


NO_STAGE: Final = None  # a row without ``stage_index`` (null is not a stage index NeMo Gym writes)
_INDEX: Final = {check: index for index, check in enumerate(CHECKS)}


def _finding(check: str, locator: Mapping[str, Any] | None, detail: Mapping[str, Any]) -> str:
    out: dict[str, Any] = {"check": check}
    if locator is not None:
        out["locator"] = locator
    out["detail"] = detail
    return render(out)


def evaluate_line(
    line: bytes, number: int, file_index: int, source: str, ignored: frozenset[str]
) -> RowResult:
    """Run every rollout check that is not ignored on one JSONL line.

    Args:
        line: the line's text (stripped, not blank).
        number: its 1-based line number; file_index: which input file (0 for one file);
        source: the file's absolute path, for the unreadable-line locator.
        ignored: check ids to skip entirely.
    """
    try:
        row = orjson.loads(line)
        if type(row) is not dict:
            raise ValueError("not a JSON object")
    except (orjson.JSONDecodeError, ValueError) as exc:
        return _unreadable(exc, number, file_index, source, ignored)
    task = row.get("_ng_task_index")
    rollout = row.get("_ng_rollout_index", 0)
    stage = row.get("stage_index", NO_STAGE)
    trajectory = row.get("ng_trajectory")
    rollout_id = row.get("_ng_rollout_id")
    if type(rollout_id) is not str:
        given = trajectory.get("rollout_id") if type(trajectory) is dict else None
        rollout_id = given if type(given) is str else f"{task}-{rollout}"
    result = RowResult(task, rollout, stage, rollout_id)
    prompt, completion = _transcript_usage(row.get("response"))
    if trajectory is None:
        result.unobserved = [_INDEX[c] for c in _TRAJECTORY_CHECKS if c not in ignored]
        result.tokens = (prompt or 0, completion or 0, 0, 0)
        return result
    try:
        validate_trajectory(trajectory, line)
    except InvalidTrajectoryError as exc:
        if "record_unreadable" not in ignored:
            detail = {"reason": "canonical trajectory is unreadable", "error": exc.error}
            result.findings.append((1, _finding("record_unreadable", None, detail)))
        result.unobserved = [_INDEX[c] for c in _TRAJECTORY_CHECKS if c not in ignored]
        result.tokens = (prompt or 0, completion or 0, 0, 0)
        return result
    view = _View(trajectory, prompt, completion)
    view.stats(result)
    for index in range(3, 12):
        check = CHECKS[index]
        if check in ignored:
            continue
        try:
            found = _RUN[check](view)
        except Exception as exc:  # a check's bug must not lose the row: NeMo Gym's rule
            if "check_execution_error" not in ignored:
                detail = {
                    "reason": "check raised an unexpected exception",
                    "failed_check": check,
                    "error": type(exc).__name__,
                }
                result.findings.insert(0, (0, _finding("check_execution_error", None, detail)))
            result.unobserved.append(index)
            continue
        if found is None:
            result.unobserved.append(index)
        else:
            result.findings.extend((index, text) for text in found)
    result.findings.sort(key=lambda f: f[0])  # stable: each check's findings keep their order
    return result


def _unreadable(
    exc: Exception, number: int, file_index: int, source: str, ignored: frozenset[str]
) -> RowResult:
    task = f"{UNREADABLE_TASK}:input-{file_index}:line-{number}"
    result = RowResult(task, 0, NO_STAGE, f"{task}-0")
    result.readable = False
    if "record_unreadable" not in ignored:
        locator = {"source_file": source, "line": number}
        detail = {"reason": "rollout record is unreadable", "error": type(exc).__name__}
        result.findings.append((1, _finding("record_unreadable", locator, detail)))
    result.unobserved = [
        index
        for index, check in enumerate(ROLLOUT_CHECKS)
        if check != "record_unreadable" and check not in ignored
    ]
    return result


def _count(value: Any) -> int | None:
    return value if type(value) is int else None


def _transcript_usage(response: Any) -> tuple[int | None, int | None]:
    usage = response.get("usage") if type(response) is dict else None
    if type(usage) is not dict:
        return None, None
    prompt = _count(usage.get("input_tokens"))
    if prompt is None:
        prompt = _count(usage.get("prompt_tokens"))
    completion = _count(usage.get("output_tokens"))
    if completion is None:
        completion = _count(usage.get("completion_tokens"))
    return prompt, completion


class _Call:
    """One ``ng_trajectory.model_calls`` entry, normalised."""

    __slots__ = (
        "completion_tokens",
        "error_category",
        "failed",
        "finish_reason",
        "model_call_id",
        "model_ref",
        "position",
        "prompt_tokens",
        "response",
        "response_id",
        "started_at",
        "status",
        "successful",
    )

    def __init__(self, position: int, call: Mapping[str, Any]) -> None:
        meta = call.get("response_metadata") or {}
        tokens = call.get("token_stats") or {}
        ref = meta.get("model_ref")
        self.position = position
        self.model_call_id = call.get("model_call_id")
        self.started_at: float | None = call.get("started_at")
        self.response = call.get("response")
        self.response_id = meta.get("response_id")
        self.model_ref = (ref["type"], ref["name"]) if ref is not None else None
        self.status = meta.get("status_code")
        self.error_category = meta.get("error_category")
        self.finish_reason = meta.get("finish_reason")
        self.prompt_tokens: int | None = tokens.get("prompt_tokens")
        self.completion_tokens: int | None = tokens.get("completion_tokens")
        status = self.status
        self.failed = bool(
            (status is not None and status >= 400)
            or self.error_category
            or meta.get("response_status") in _FAILED_STATUSES
        )
        self.successful = not self.failed and (status is None or 200 <= status <= 399)

    @property
    def call_id(self) -> str | int:
        return self.model_call_id or self.response_id or self.position


class _Bindings:
    """Model call references resolved against the trajectory's calls (docs/health.md)."""

    __slots__ = ("duplicated", "matched", "missing", "refs")

    def __init__(self, refs: Iterable[Mapping[str, Any]], view: _View) -> None:
        keys: dict[str, list[_Call]] = {}
        for ref in refs:
            key, candidates = view.resolve(ref)
            keys.setdefault(key, candidates)
        self.refs = len(keys)
        self.missing = [key for key, found in keys.items() if not found]
        self.duplicated = [(key, len(found)) for key, found in keys.items() if len(found) > 1]
        matched = {found[0].position: found[0] for found in keys.values() if len(found) == 1}
        self.matched = [matched[position] for position in sorted(matched)]

    @property
    def complete(self) -> bool:
        return self.refs > 0 and not self.missing and not self.duplicated


class _View:
    """The derived views of one valid trajectory (lazily, each computed once)."""

    def __init__(self, trajectory: Mapping[str, Any], prompt: int | None, completion: int | None):
        gaps = trajectory.get("gaps", ())
        codes = {gap["code"] for gap in gaps}
        self.gaps = gaps
        self.prompt, self.completion = prompt, completion
        self.trajectory_observed = "trajectory_projection_failed" not in codes
        self.turns_observed = self.trajectory_observed and "turns_unavailable" not in codes
        self.calls_observed = self.trajectory_observed and not (codes & _CALL_GAPS)
        self.scope_complete = (
            self.calls_observed and "turn_model_call_scope_incomplete" not in codes
        )
        self.turns = trajectory.get("turns", ())
        self.invocations = trajectory.get("invocations", ())
        self.calls = [_Call(i, call) for i, call in enumerate(trajectory.get("model_calls", ()))]
        self.by_id: dict[str, list[_Call]] = {}
        self.by_response: dict[tuple[Any, ...], list[_Call]] = {}
        for call in self.calls:
            if call.model_call_id is not None:
                self.by_id.setdefault(call.model_call_id, []).append(call)
            self.by_response.setdefault((call.model_ref, call.response_id), []).append(call)
        self._owned: _Bindings | None = None
        self._turn: _Bindings | None = None

    def resolve(self, ref: Mapping[str, Any]) -> tuple[str, list[_Call]]:
        model_ref = ref.get("model_ref")
        pair = (model_ref["type"], model_ref["name"]) if model_ref is not None else None
        response_id = ref.get("response_id")
        call_id = ref.get("model_call_id")
        if call_id is not None:
            found = [
                c
                for c in self.by_id.get(call_id, ())
                if (pair is None or c.model_ref == pair)
                and (response_id is None or c.response_id == response_id)
            ]
            return f"call:{call_id}", found
        assert pair is not None  # a valid reference has model_ref and response_id here
        key = f"response:{pair[0]}:{pair[1]}:{response_id}"
        return key, list(self.by_response.get((pair, response_id), ()))

    @property
    def owned(self) -> _Bindings:
        if self._owned is None:
            refs = [r for turn in self.turns for r in turn.get("model_calls", ())]
            refs += [r for inv in self.invocations for r in inv.get("model_calls", ())]
            self._owned = _Bindings(refs, self)
        return self._owned

    @property
    def turn_bindings(self) -> _Bindings:
        if self._turn is None:
            refs = [r for turn in self.turns for r in turn.get("model_calls", ())]
            self._turn = _Bindings(refs, self)
        return self._turn

    def ended_on_failed(self) -> list[tuple[_Call, tuple[Any, ...] | None, list[_Call]]]:
        """Per model (first appearance order), its last call when that one failed."""
        groups: dict[Any, list[_Call]] = {}
        for call in self.calls:
            groups.setdefault(call.model_ref, []).append(call)
        out = []
        for model_ref, calls in groups.items():
            timed = all(c.started_at is not None for c in calls)
            last = max(reversed(calls), key=lambda c: c.started_at or 0.0) if timed else calls[-1]
            if all(c.failed for c in calls) or (timed and last.failed):
                out.append((last, model_ref, calls))
        return out

    def stats(self, result: RowResult) -> None:
        """Fill the row's share of the summary statistics (independent of ignored checks)."""
        calls = self.calls
        result.captured = bool(calls)
        result.failed_statuses = [
            str(c.status) if c.status is not None else "unknown" for c in calls if c.failed
        ]
        result.ended_on_error = bool(calls) and self.calls_observed and bool(self.ended_on_failed())
        identities = Counter(
            c.model_call_id
            if c.model_call_id is not None
            else (c.model_ref, c.response_id)
            if c.model_ref is not None
            else c.response_id
            for c in calls
            if c.model_call_id is not None or c.response_id is not None
        )
        result.replayed = sum(n - 1 for n in identities.values())
        result.tokens = (
            self.prompt or 0,
            self.completion or 0,
            sum(c.prompt_tokens or 0 for c in calls),
            sum(c.completion_tokens or 0 for c in calls),
        )
        turn = self.turn_bindings
        result.turn_complete = self.scope_complete and turn.complete
        result.successful = sum(1 for c in turn.matched if c.successful)


# --- the checks: each returns its findings, or None when it cannot be evaluated ---------------

Found = list[str] | None


def _has_text(value: Any) -> bool:
    kind = type(value)
    if kind is str:
        return bool(value.strip())
    if kind is list:
        return any(_has_text(v) for v in value)
    if kind is dict:
        return any(_has_text(value.get(key)) for key in _TEXT_KEYS)
    return False


def _is_tool_call(item: Any) -> bool:
    if type(item) is not dict:
        return False
    kind = item.get("type")
    if type(kind) is str and (kind.endswith("_call") or kind == "tool_use"):
        return True
    return bool(item.get("tool_calls"))


def _has_tool_call(answer: Any) -> bool:
    items = answer if type(answer) is list else [answer]
    return any(_is_tool_call(item) for item in items)


def _has_message(turn: Mapping[str, Any]) -> bool:
    answer = turn.get("answer")
    message_items = [a for a in answer if not _is_tool_call(a)] if type(answer) is list else answer
    return _has_text(message_items) or _has_text(turn.get("reasoning_content"))


def _missing_agent_turns(view: _View) -> Found:
    if not view.turns_observed:
        return None
    for turn in view.turns:
        if turn.get("model_calls") or _has_message(turn) or _has_tool_call(turn.get("answer")):
            return []
    return [
        _finding(
            "rollout_missing_agent_turns", None, {"reason": "no agent turn with model activity"}
        )
    ]


def _ended_on_failed_model_call(view: _View) -> Found:
    if not view.calls_observed or not view.calls:
        return None
    out = []
    for last, model_ref, calls in view.ended_on_failed():
        detail = {
            "model_ref": f"{model_ref[0]}/{model_ref[1]}" if model_ref is not None else None,
            "status": last.status,
            "error_category": last.error_category,
            "observed_calls": len(calls),
            "successful_calls": sum(1 for c in calls if c.successful),
        }
        out.append(
            _finding("rollout_ended_on_failed_model_call", {"call_id": last.call_id}, detail)
        )
    return out


def _agent_turn_hollow(view: _View) -> Found:
    if not view.turns_observed:
        return None
    detail = {"reason": "agent turn has no message or tool calls"}
    return [
        _finding("agent_turn_hollow", {"turn": turn["turn_no"]}, detail)
        for turn in view.turns
        if not _has_message(turn) and not _has_tool_call(turn.get("answer"))
    ]


def _owned_calls(view: _View) -> list[_Call] | None:
    if not view.calls_observed:
        return None
    matched = view.owned.matched
    return matched or None


def _zero_completion_tokens(view: _View) -> Found:
    calls = _owned_calls(view)
    if calls is None:
        return None
    return [
        _finding(
            "model_call_zero_completion_tokens", {"call_id": c.call_id}, {"completion_tokens": 0}
        )
        for c in calls
        if c.completion_tokens == 0
    ]


def _missing_token_counts(view: _View) -> Found:
    calls = _owned_calls(view)
    if calls is None:
        return None
    out = []
    for c in calls:
        missing = [
            name
            for name, value in (
                ("prompt_tokens", c.prompt_tokens),
                ("completion_tokens", c.completion_tokens),
            )
            if value is None
        ]
        if missing:
            out.append(
                _finding(
                    "model_call_missing_token_counts", {"call_id": c.call_id}, {"missing": missing}
                )
            )
    return out


def _trajectory_capture_mismatch(view: _View) -> Found:
    if not view.calls_observed:
        return None
    owned = view.owned
    join_gaps = [gap for gap in view.gaps if gap["code"] in _JOIN_GAPS]
    if not owned.refs and not join_gaps:
        return None
    out: dict[tuple[str, str], str] = {}
    check = "trajectory_capture_mismatch"
    for key in owned.missing:
        call_id = key.rpartition(":")[2]
        detail: dict[str, Any] = {"kind": "missing_captured_call"}
        out.setdefault((detail["kind"], call_id), _finding(check, {"call_id": call_id}, detail))
    for key, count in owned.duplicated:
        call_id = key.rpartition(":")[2]
        detail = {"kind": "duplicated_captured_call", "count": count}
        out.setdefault((detail["kind"], call_id), _finding(check, {"call_id": call_id}, detail))
    for gap in join_gaps:
        call_id = (gap.get("detail") or "").rpartition(":")[2]
        detail = {
            "kind": _JOIN_GAPS[gap["code"]],
            "observation_gap": gap["code"],
            "invocation_id": gap.get("invocation_id"),
        }
        out.setdefault((detail["kind"], call_id), _finding(check, {"call_id": call_id}, detail))
    return list(out.values())


def _model_call_failed(view: _View) -> Found:
    calls = _owned_calls(view)
    if calls is None:
        return None
    complete = view.owned.complete
    last = max(c.position for c in calls)
    return [
        _finding(
            "model_call_failed",
            {"call_id": c.call_id},
            {
                "status": c.status,
                "error_category": c.error_category,
                "terminal": complete and c.position == last,
            },
        )
        for c in calls
        if c.failed
    ]


def _token_count_mismatch(view: _View) -> Found:
    if not view.scope_complete or view.prompt is None or view.completion is None:
        return None
    turn = view.turn_bindings
    if not turn.complete:
        return None
    calls = turn.matched
    if any(c.prompt_tokens is None or c.completion_tokens is None for c in calls):
        return None
    prompt = sum(c.prompt_tokens or 0 for c in calls)
    completion = sum(c.completion_tokens or 0 for c in calls)
    if (prompt, completion) == (view.prompt, view.completion):
        return []
    detail = {
        "transcript_prompt": view.prompt,
        "transcript_completion": view.completion,
        "capture_prompt": prompt,
        "capture_completion": completion,
    }
    return [_finding("rollout_token_count_mismatch", None, detail)]


def _has_content(response: Any) -> bool:
    if type(response) is not dict:
        return bool(response)
    if _nonempty_text(response.get("output_text")):
        return True
    if response.get("content") or response.get("output"):
        return True
    for choice in response.get("choices") or ():
        if type(choice) is not dict:
            continue
        message = choice.get("message")
        content = message.get("content") if type(message) is dict else None
        if _nonempty_text(choice.get("text")) or content:
            return True
    return False


def _nonempty_text(value: Any) -> bool:
    return type(value) is str and bool(value)


def _runaway_generation(view: _View) -> Found:
    calls = _owned_calls(view)
    if calls is None:
        return None
    out = []
    for c in calls:
        if c.finish_reason not in _LENGTH_REASONS:
            continue
        if c.response is None:
            return None
        if not _has_content(c.response):
            out.append(
                _finding(
                    "model_call_runaway_generation",
                    {"call_id": c.call_id},
                    {"finish_reason": c.finish_reason},
                )
            )
    return out


_RUN: Final[dict[str, Callable[[_View], Found]]] = {
    "rollout_missing_agent_turns": _missing_agent_turns,
    "rollout_ended_on_failed_model_call": _ended_on_failed_model_call,
    "agent_turn_hollow": _agent_turn_hollow,
    "model_call_zero_completion_tokens": _zero_completion_tokens,
    "model_call_missing_token_counts": _missing_token_counts,
    "trajectory_capture_mismatch": _trajectory_capture_mismatch,
    "model_call_failed": _model_call_failed,
    "rollout_token_count_mismatch": _token_count_mismatch,
    "model_call_runaway_generation": _runaway_generation,
}


def evaluate_chunk(
    lines: Sequence[tuple[int, bytes]], file_index: int, source: str, ignored: frozenset[str]
) -> list[RowResult]:
    """Evaluate a chunk of lines (a worker process's unit of work)."""
    return [evaluate_line(line, number, file_index, source, ignored) for number, line in lines]
