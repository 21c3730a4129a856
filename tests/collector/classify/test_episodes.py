"""Episode requests and replies (docs/protocol.md section 3): every rule of `collector.episodes`."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from trollout.collector.classify.echo import echo_mismatches, expected_echo, same_json
from trollout.collector.classify.episodes import (
    MAX_REPORT_EVENTS,
    describe_reply,
    failure_report,
    is_collector_key,
    outcome_from_episode_response,
)
from trollout.collector.http.transport import RawResponse
from trollout.records import (
    Delivery,
    Failed,
    Identity,
    Landed,
    MaterializedRow,
    outcome_from_row,
    outcome_to_row,
)

URL = "http://127.0.0.1:12000/run"
TASK_ID = {"taskset": "weather", "task_id": "sf-1"}
BODY = {
    "task_id": TASK_ID,
    "task_input": {"prompt": "what's it like in sf?"},
    "task_data": {"_ng_digest": "sha256:aa", "_ng_dataset_digest": "sha256:bb", "_ng_x": 1},
    "_ng_task_index": 3,
    "_ng_rollout_index": 1,
    "_ng_environment_server": "weather_env",
    "_ng_result_type": "weather_native",
}
ROW = MaterializedRow.from_body(BODY)
SECRET = "sk-VALUE-NEVER-SHOWN"


def echo(attempt: int = 2) -> dict[str, Any]:
    """The identity a reply to attempt `attempt` of ROW echoes."""
    return {"episode_id": {"rollout_id": "3-1", "attempt": attempt}, "task_id": dict(TASK_ID)}


def classify(
    payload: object, *, attempt: int = 2, status: int = 200, raw: bytes | None = None
) -> Any:
    """Classify `payload` as the reply to attempt `attempt` of ROW."""
    body = orjson.dumps(payload) if raw is None else raw
    response = RawResponse(status, [], body, False, URL)
    return outcome_from_episode_response(
        ROW.identity,
        attempt,
        response,
        elapsed_seconds=1.5,
        max_attempts=3,
        echo=expected_echo(ROW.request_body(attempt)),
    )


def violation(payload: object, **kw: Any) -> Failed:
    """Classify `payload`; assert it is a protocol violation; return it."""
    outcome = classify(payload, **kw)
    assert isinstance(outcome, Failed)
    assert (outcome.failure_class, outcome.kind) == ("environment_protocol_violation",) * 2
    assert outcome.terminal is False
    assert outcome.response_body is None
    assert (outcome.http_status, outcome.delivery) == (200, Delivery.DELIVERED)
    assert SECRET not in (outcome.message or "")
    return outcome


# --- the request --------------------------------------------------------------------------------


def test_request_body_of_a_task_row_is_the_episode_envelope() -> None:
    """A task row goes out as episode_id (rollout id, no -aN; attempt) and task, nothing else."""
    assert ROW.is_episode
    assert ROW.request_body(2) == {
        "episode_id": {"rollout_id": "3-1", "attempt": 2},
        "task": {"task_id": TASK_ID, "task_input": {"prompt": "what's it like in sf?"}},
    }
    assert ROW.request_body()["episode_id"] == {"rollout_id": "3-1", "attempt": 0}


def test_request_body_uses_an_explicit_rollout_id() -> None:
    """A row's explicit _ng_rollout_id is the episode's rollout id, at every attempt."""
    row = MaterializedRow.from_body({**BODY, "_ng_rollout_id": "my-id"})
    assert row.request_body(4)["episode_id"] == {"rollout_id": "my-id", "attempt": 4}


def test_request_body_of_a_flat_row_is_unchanged() -> None:
    """A flat row (no task_id object with task_input) is sent whole, as before."""
    flat = {"responses_create_params": {"input": []}, "task_id": "x", "_ng_task_index": 0,
            "_ng_rollout_index": 0}  # fmt: skip
    row = MaterializedRow.from_body(flat)
    assert not row.is_episode
    assert row.request_body(1) == {**flat, "_ng_attempt_index": 1}


def test_expected_echo_of_an_episode_request_is_its_identity() -> None:
    """The reply must echo episode_id and the task's task_id."""
    assert expected_echo(ROW.request_body(2)) == [
        ("episode_id", {"rollout_id": "3-1", "attempt": 2}),
        ("task_id", TASK_ID),
    ]


def test_identity_of_a_task_row_reads_task_id_and_only_provenance_keys() -> None:
    """The identity holds the task id and task_data's _ng_digest/_ng_dataset_digest, no more."""
    assert ROW.identity.task_id == TASK_ID
    assert ROW.identity.provenance == (
        ("_ng_digest", "sha256:aa"),
        ("_ng_dataset_digest", "sha256:bb"),
    )
    assert ROW.identity.agent_name is None


# --- results ------------------------------------------------------------------------------------


def test_result_lands_as_the_inner_result_with_its_reward() -> None:
    """A result is stored as returned plus _ng_task_id and stamps; the reward is read from it."""
    result = {"response": {"id": "r"}, "reward": 0.75, "reward_components": {"a": 0.75},
              "ng_trajectory": [1], "nested": {"reward": 9}}  # fmt: skip
    outcome = classify({**echo(), "result": result, "failure": None})
    assert isinstance(outcome, Landed)
    assert outcome.result == result
    assert outcome.reward == 0.75
    row = outcome_to_row(outcome)
    assert {"episode_id", "task_id", "result"}.isdisjoint(row)
    assert row["_ng_task_id"] == TASK_ID
    assert (row["_ng_digest"], row["_ng_dataset_digest"]) == ("sha256:aa", "sha256:bb")
    assert "_ng_x" not in row
    assert (row["_ng_environment_server"], row["_ng_result_type"]) == (
        "weather_env",
        "weather_native",
    )
    assert row["_ng_attempt_index"] == 2


def test_result_without_reward_is_unscored() -> None:
    """Only a top-level reward scores; one nested elsewhere is data."""
    outcome = classify({**echo(), "result": {"info": {"reward": 1.0}}})
    assert isinstance(outcome, Landed)
    assert outcome.reward is None


def test_result_stamp_keys_are_dropped_not_refused() -> None:
    """agent_ref, task_source and elapsed_seconds in a result are the collector's: dropped."""
    result = {"reward": 1.0, "agent_ref": {"name": "x"}, "task_source": "y", "elapsed_seconds": 9}
    outcome = classify({**echo(), "result": result})
    assert isinstance(outcome, Landed)
    row = outcome_to_row(outcome)
    assert "agent_ref" not in row
    assert "task_source" not in row
    assert row["elapsed_seconds"] == 1.5


def test_episode_records_round_trip_through_rows() -> None:
    """Landed and failed episode records read back equal, stamps and extras included."""
    landed = classify({**echo(), "result": {"reward": 1.0}})
    failed = classify(
        {**echo(), "failure": {"failure_reason": "x", "terminal": True, "stage": "s"}}
    )
    for outcome in (landed, failed):
        again = outcome_from_row(outcome_to_row(outcome))
        assert again == outcome
        assert outcome_to_row(again) == outcome_to_row(outcome)
        assert again.identity.task_id == TASK_ID
        assert again.identity.provenance == ROW.identity.provenance


# --- failures -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("failure", "cls", "terminal"),
    [
        ({"failure_reason": "sandbox died", "terminal": False}, "environment_server_failed", False),
        ({"failure_reason": "gave up", "terminal": True, "failure_kind": None},
         "environment_server_failed", True),
        ({"failure_reason": "slow", "terminal": True, "failure_kind": "timeout_exceeded"},
         "timeout_exceeded", True),
    ],
)  # fmt: skip
def test_failure_becomes_a_sidecar_row_of_its_kind(
    failure: dict[str, Any], cls: str, terminal: bool
) -> None:
    """The class is failure_kind or environment_server_failed; terminal as sent; no reward."""
    outcome = classify({**echo(), "failure": failure, "result": None})
    assert isinstance(outcome, Failed)
    assert (outcome.failure_class, outcome.terminal) == (cls, terminal)
    assert outcome.kind == failure.get("failure_kind")
    assert outcome.message == failure["failure_reason"]
    row = outcome_to_row(outcome)
    assert row["failure_kind"] == failure.get("failure_kind")
    assert row["_ng_failure_response_body"] is None
    assert "reward" not in row
    assert "response" not in row
    assert "_ng_failure_stage" not in row
    assert "_ng_failure_partial_response" not in row
    assert row["_ng_task_id"] == TASK_ID


def test_failure_keeps_stage_partial_response_and_bounds_the_reason() -> None:
    """Stage and partial response are kept; the reason is cut to 2000 characters in all."""
    failure = {"failure_reason": "x" * 5000, "terminal": False, "stage": "tool_call",
               "partial_response": {"output": [{"text": "half"}]}}  # fmt: skip
    outcome = classify({**echo(), "failure": failure})
    row = outcome_to_row(outcome)
    assert row["_ng_failure_stage"] == "tool_call"
    assert row["_ng_failure_partial_response"] == {"output": [{"text": "half"}]}
    assert len(row["_ng_failure_message"]) == 2000
    assert row["_ng_failure_message"].endswith("…")


def test_failure_report_is_copied_onto_the_failure_row() -> None:
    """A valid FailureReport beside a failure lands on its row as sent."""
    report = {
        "_ng_failure_id": "f-1",
        "_ng_failure_events": [{"e": 1}],
        "_ng_failure_events_omitted": 2,
    }
    outcome = classify({**echo(), "failure": {"failure_reason": "r", "terminal": False}, **report})
    row = outcome_to_row(outcome)
    assert {k: row[k] for k in report} == report


def test_failure_report_beside_a_result_is_dropped() -> None:
    """A report beside a result is not stored: only failure rows carry one."""
    outcome = classify({**echo(), "result": {"reward": 1.0}, "_ng_failure_id": "f-1"})
    assert isinstance(outcome, Landed)
    assert "_ng_failure_id" not in outcome_to_row(outcome)


@pytest.mark.parametrize(
    "report",
    [
        {"_ng_failure_id": ""},
        {"_ng_failure_id": 5},
        {"_ng_failure_events": "boom"},
        {"_ng_failure_events": [1, 2]},
        {"_ng_failure_id": "f", "_ng_failure_events_omitted": -1},
        {"_ng_failure_id": "f", "_ng_failure_events_omitted": True},
        {"_ng_failure_events_omitted": 3},
    ],
)
def test_invalid_failure_report_is_omitted_whole_and_is_no_violation(
    report: dict[str, Any],
) -> None:
    """One ill-typed report key drops all three; the failure itself stands."""
    outcome = classify({**echo(), "failure": {"failure_reason": "r", "terminal": True}, **report})
    assert isinstance(outcome, Failed)
    assert outcome.failure_class == "environment_server_failed"
    assert not {"_ng_failure_id", "_ng_failure_events", "_ng_failure_events_omitted"} & set(
        outcome_to_row(outcome)
    )


def test_failure_report_events_are_capped_and_counted() -> None:
    """At most 32 events are kept; the rest are added to _ng_failure_events_omitted."""
    events = [{"i": i} for i in range(40)]
    kept = failure_report({"_ng_failure_events": events, "_ng_failure_events_omitted": 3})
    assert kept["_ng_failure_events"] == events[:MAX_REPORT_EVENTS]
    assert kept["_ng_failure_events_omitted"] == 3 + 40 - MAX_REPORT_EVENTS
    assert failure_report({"_ng_failure_id": None, "_ng_failure_events": [{}]}) == {
        "_ng_failure_events": [{}]
    }
    assert failure_report({}) == {}


# --- violations ---------------------------------------------------------------------------------

ECHO = echo()
SHAPES: list[tuple[object, str]] = [
    ([ECHO, SECRET], "a JSON array"),
    (SECRET, "a JSON string"),
    (None, "a JSON null"),
    (7, "a JSON number"),
    (True, "a JSON boolean"),
    ({}, "an empty object"),
    ({"responses_create_params": {}, "response": SECRET, "reward": 1.0},
     "['response', 'responses_create_params', 'reward']"),
    ({"task_id": TASK_ID, "result": {"reward": 1}}, "['result', 'task_id']"),
    ({"episode_id": SECRET, "task_id": TASK_ID, "result": {}},
     "['episode_id', 'result', 'task_id']"),
    ({"episode_id": ECHO["episode_id"], "result": {}}, "['episode_id', 'result']"),
    ({**ECHO, "reward": 1.0}, "['episode_id', 'reward', 'task_id']"),
    ({**ECHO, "result": None, "failure": None}, "neither of result and failure are set"),
    ({**ECHO, "result": {"reward": 1}, "failure": {"failure_reason": SECRET, "terminal": True}},
     "both of result and failure are set"),
    ({**ECHO, "result": [SECRET]}, "its result is an array, not an object"),
    ({**ECHO, "failure": SECRET}, "its failure is a string, not an object"),
    ({**ECHO, "failure": {"failure_reason": SECRET, "terminal": "yes"}},
     "failure.terminal is a string, not a boolean"),
    ({**ECHO, "failure": {"terminal": True}}, "failure.failure_reason is missing, not a string"),
    ({**ECHO, "failure": {"failure_reason": SECRET, "terminal": 1}},
     "failure.terminal is a number, not a boolean"),
    ({**ECHO, "failure": {"failure_reason": "r", "terminal": True, "failure_kind": ""}},
     "failure.failure_kind is a string, not a non-empty string or null"),
    ({**ECHO, "failure": {"failure_reason": "r", "terminal": True, "stage": {"s": SECRET}}},
     "failure.stage is an object, not a string or null"),
]  # fmt: skip


@pytest.mark.parametrize(("payload", "named"), SHAPES)
def test_reply_of_another_shape_is_a_violation_naming_type_and_keys(
    payload: object, named: str
) -> None:
    """Any JSON that is not an episode reply is a typed violation: type, keys, never values."""
    outcome = violation(payload)
    assert outcome.exception_type == "EpisodeShapeViolation"
    assert named in (outcome.message or "")
    assert "environment server 'weather_env'" in (outcome.message or "")


@pytest.mark.parametrize(
    ("echoed", "field"),
    [
        ({"episode_id": {"rollout_id": "3-1", "attempt": 1}}, "episode_id.attempt"),
        ({"episode_id": {"rollout_id": "3-1", "attempt": True}}, "episode_id.attempt"),
        ({"episode_id": {"rollout_id": "3-1", "attempt": 2.0}}, "episode_id.attempt"),
        ({"episode_id": {"rollout_id": SECRET, "attempt": 2}}, "episode_id.rollout_id"),
        ({"episode_id": {"rollout_id": "3-1"}}, "episode_id.attempt"),
        ({"episode_id": {"rollout_id": "3-1", "attempt": 2, SECRET: 1}}, "episode_id (keys added)"),
        ({"task_id": {"taskset": SECRET, "task_id": "sf-1"}}, "task_id.taskset"),
        ({"task_id": {"taskset": "weather", "task_id": SECRET}}, "task_id.task_id"),
    ],
)
def test_reply_echoing_another_identity_is_a_violation_naming_the_field(
    echoed: dict[str, Any], field: str
) -> None:
    """Both fields of both echoed identities must be what was sent, types included."""
    outcome = violation({**echo(), **echoed, "result": {"reward": 1.0}})
    assert outcome.exception_type == "EpisodeIdentityMismatch"
    assert f"({field} not as sent)" in (outcome.message or "")


def test_identity_is_checked_before_the_failure() -> None:
    """Another episode's failure is no failure of this one: a violation, not a sidecar class."""
    payload = {**echo(attempt=0), "failure": {"failure_reason": "r", "terminal": True}}
    assert violation(payload).exception_type == "EpisodeIdentityMismatch"


@pytest.mark.parametrize(
    "key", ["_ng_reward", "_ng_task_index", "ng_perf", "ng_model_call_capture"]
)
def test_result_using_collector_keys_is_a_violation_naming_the_keys(key: str) -> None:
    """_ng_*, ng_perf and ng_model_call_capture are reserved; the message names the key."""
    outcome = violation({**echo(), "result": {"reward": 1.0, key: SECRET}})
    assert outcome.exception_type == "EpisodeCollectorKeys"
    assert f"reserved for rollout collection: [{key!r}]" in (outcome.message or "")


def test_is_collector_key_leaves_producer_slots_alone() -> None:
    """ng_trajectory and ng_policy_model_server are not reserved in a result."""
    assert is_collector_key("_ng_anything")
    assert is_collector_key("ng_perf")
    assert not is_collector_key("ng_trajectory")
    assert not is_collector_key("ng_policy_model_server")
    assert not is_collector_key("reward")


def test_violation_message_lists_at_most_twenty_bounded_keys() -> None:
    """Keys are sorted, cut to 64 characters, at most 20 named, then a count."""
    payload = {f"k{i:02d}": SECRET for i in range(25)} | {"z" * 300: 1}
    outcome = violation(payload)
    message = outcome.message or ""
    assert "k00" in message
    assert "k19" in message
    assert "k20" not in message
    assert "and 6 more" in message
    assert describe_reply({"a" * 70: 1}) == f"an object with keys ['{'a' * 64}…']"


# --- not an episode reply at all: the flat rules ------------------------------------------------


def test_non_json_200_stays_a_run_error() -> None:
    """A 200 whose body is not JSON is agent_run_error/malformed_body, not a violation."""
    outcome = classify(None, raw=b"<html>oops")
    assert isinstance(outcome, Failed)
    assert (outcome.failure_class, outcome.kind) == ("agent_run_error", "malformed_body")


@pytest.mark.parametrize(
    ("status", "cls"),
    [(500, "agent_run_error"), (422, "agent_run_error"), (502, "agent_request_failed")],
)
def test_non_200_keeps_its_status_class(status: int, cls: str) -> None:
    """Statuses are classified as any /run reply, whatever the body says."""
    outcome = classify({**echo(), "result": {"reward": 1.0}}, status=status)
    assert isinstance(outcome, Failed)
    assert (outcome.failure_class, outcome.http_status) == (cls, status)


# --- the shared echo check ----------------------------------------------------------------------


def test_same_json_compares_types() -> None:
    """true is not 1, 1.0 is not 1, and objects compare key by key."""
    assert same_json({"a": [1, {"b": "c"}]}, {"a": [1, {"b": "c"}]})
    assert not same_json(True, 1)
    assert not same_json(1.0, 1)
    assert not same_json({"a": 1}, {"a": 1, "b": 2})
    assert not same_json([1], [1, 2])


def test_flat_echo_of_a_boolean_for_an_integer_is_a_mismatch() -> None:
    """The flat path's echo check is as strict: an attempt echoed as true contradicts 1."""
    assert echo_mismatches({"_ng_attempt_index": True}, [("_ng_attempt_index", 1)]) == [
        ("_ng_attempt_index", 1, True)
    ]


def test_flat_identity_carries_no_task_id() -> None:
    """A flat row's records carry no _ng_task_id (its identity has none)."""
    flat = Identity(0, 0, agent_name="a")
    assert "_ng_task_id" not in flat.stamps()
