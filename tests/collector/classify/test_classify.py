"""Tests of reply and error classification: every row of docs/protocol.md section 2."""

from __future__ import annotations

from email.utils import formatdate
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from trollout.collector.classify.echo import echo_mismatches, expected_echo
from trollout.collector.classify.outcomes import (
    cut_text,
    error_kind,
    outcome_from_error,
    outcome_from_response,
    retry_after_seconds,
)
from trollout.collector.http.replies import began
from trollout.collector.http.transport import (
    BodyProtocolError,
    BodyReadError,
    BodyReplyTimeout,
    ContentDecodingError,
    RawResponse,
    ReplyTimeout,
    ReplyTooLargeError,
)
from trollout.records import Delivery, Failed, Identity, Landed, outcome_to_row

IDENTITY = Identity(task_index=7, rollout_index=3, agent_name="math")
URL = "http://127.0.0.1:12233/run"
REFERENCE = Path(__file__).resolve().parents[4] / "shared" / "reference" / "nemo_gym_0.7.0"


def reply(status: int, body: bytes, *, headers: list[tuple[bytes, bytes]] | None = None) -> Any:
    """Classify a reply to attempt 1 of IDENTITY."""
    raw = RawResponse(status, headers or [], body, False, URL)
    return outcome_from_response(IDENTITY, 1, raw, elapsed_seconds=2.5, max_attempts=3)


def json_reply(payload: object) -> Any:
    """Classify a 200 whose body is `payload` as JSON."""
    return reply(200, orjson.dumps(payload))


# --- 200 with a JSON object: the sentinel keys decide --------------------------------------------


def test_outcome_from_response_plain_object_lands() -> None:
    """A 200 object without sentinels lands, echoed stamps dropped, extra fields kept."""
    outcome = json_reply(
        {
            "responses_create_params": {"input": []},
            "response": {"id": "r"},
            "reward": 1.0,
            "reward_components": {"exact": 1.0},
            "_ng_task_index": 7,
            "agent_ref": {"name": "math", "type": "responses_api_agents"},
            "_ng_failure_class": None,
        }
    )
    assert isinstance(outcome, Landed)
    assert (outcome.attempt_index, outcome.elapsed_seconds, outcome.reward) == (1, 2.5, 1.0)
    assert set(outcome.result) == {
        "responses_create_params",
        "response",
        "reward",
        "reward_components",
        "_ng_failure_class",
    }


def test_outcome_from_response_without_reward_is_unscored() -> None:
    """A 200 object without reward lands unscored (reward None), not failed."""
    outcome = json_reply({"response": {}})
    assert isinstance(outcome, Landed)
    assert outcome.reward is None


@pytest.mark.parametrize(
    ("payload", "failure_class", "terminal"),
    [
        ({"_ng_no_persist": True}, "kill_shaped", False),
        ({"_ng_no_persist": True, "_ng_failure_class": "transient"}, "transient", False),
        ({"_ng_no_persist": True, "_ng_failure_terminal": True}, "kill_shaped", True),
    ],
)
def test_outcome_from_response_no_persist_goes_nowhere(
    payload: dict[str, Any], failure_class: str, terminal: bool
) -> None:
    """`_ng_no_persist: true` is a no-persist failure, class from the reply or kill_shaped."""
    outcome = json_reply({"response": {}, **payload})
    assert isinstance(outcome, Failed)
    assert (outcome.no_persist, outcome.failure_class, outcome.terminal) == (
        True,
        failure_class,
        terminal,
    )
    assert outcome.delivery is Delivery.DELIVERED
    assert outcome.extra == {}  # a placeholder response is no generation


def test_outcome_from_response_no_persist_must_be_true() -> None:
    """Only a literal true is the kill-shaped sentinel; false or 1 lands."""
    assert isinstance(json_reply({"_ng_no_persist": False}), Landed)
    assert isinstance(json_reply({"_ng_no_persist": 1}), Landed)


@pytest.mark.parametrize(
    ("label", "terminal"),
    [
        ("timeout_exceeded", True),
        ("skipped", True),
        ("transient", False),
        ("legitimate", False),
        ("incomplete", False),
        ("remote_agent_error", False),
    ],
)
def test_outcome_from_response_producer_failure_keeps_label(label: str, terminal: bool) -> None:
    """`_ng_failure_class` makes a sidecar failure with the producer's class and terminal flag."""
    payload = {"_ng_failure_class": label, "_ng_failure_terminal": terminal, "info": {"x": 1}}
    outcome = json_reply({**payload, "failure_kind": "sandbox", "_ng_rollout_index": 3})
    assert isinstance(outcome, Failed)
    assert (outcome.failure_class, outcome.terminal, outcome.kind) == (label, terminal, "sandbox")
    assert (outcome.no_persist, outcome.http_status, outcome.max_attempts) == (False, 200, 3)
    assert outcome.extra == {"info": {"x": 1}}


def test_outcome_from_response_judge_failed_keeps_response_not_reward() -> None:
    """judge_failed keeps its judge error and real response; its reward 0.0 is no score."""
    response = {"output": [{"type": "message", "content": "42"}]}
    outcome = json_reply(
        {
            "_ng_failure_class": "judge_failed",
            "_ng_failure_message": "judge\nunreachable",
            "_ng_failure_judge_error": "timeout",
            "reward": 0.0,
            "response": response,
        }
    )
    assert isinstance(outcome, Failed)
    assert not outcome.terminal
    assert outcome.message == "judge unreachable"
    row = outcome_to_row(outcome)
    assert "reward" not in row
    assert (row["response"], row["_ng_failure_judge_error"]) == (response, "timeout")
    assert (row["_ng_failure_class"], row["_ng_failure_http_status"]) == ("judge_failed", 200)


@pytest.mark.parametrize(
    ("reply", "keeps_response"),
    [
        ({"_ng_failure_class": "incomplete"}, False),
        ({"_ng_failure_class": "transient", "_ng_failure_legacy_class": "judge_failed"}, True),
        ({"_ng_failure_class": "x", "_ng_failure_judge_error": "parse"}, True),
    ],
)
def test_producer_failure_rows_keep_diagnostics_not_placeholders(
    reply: dict[str, Any], keeps_response: bool
) -> None:
    """A failure row drops reward always and response unless the judge failed."""
    outcome = json_reply({**reply, "reward": 0.0, "response": {"id": "r"}, "detail": "why"})
    row = outcome_to_row(outcome)
    assert "reward" not in row
    assert ("response" in row) is keeps_response
    assert row["detail"] == "why"


@pytest.mark.parametrize(
    ("body", "exception_type"),
    [
        (b"<html>oops</html>", "MalformedReply"),
        (b"[1, 2]", "MalformedReply"),
        (b'"a string"', "MalformedReply"),
        (b"null", "MalformedReply"),
        (b"", "MalformedReply"),
    ],
)
def test_outcome_from_response_non_object_200_is_run_error(
    body: bytes, exception_type: str
) -> None:
    """A 200 whose body is not a JSON object is agent_run_error/malformed_body."""
    outcome = reply(200, body)
    assert isinstance(outcome, Failed)
    assert (outcome.failure_class, outcome.kind) == ("agent_run_error", "malformed_body")
    assert (outcome.http_status, outcome.response_body) == (200, body.decode())
    assert outcome.exception_type == exception_type
    assert URL in (outcome.message or "")


# --- other statuses -------------------------------------------------------------------------


@pytest.mark.parametrize("status", [429, 502, 503, 504])
def test_outcome_from_response_gateway_status_is_request_failed(status: int) -> None:
    """429/502/503/504 mean a gateway answered: agent_request_failed, nothing proven."""
    outcome = reply(status, b"busy")
    assert isinstance(outcome, Failed)
    assert (outcome.failure_class, outcome.kind, outcome.http_status) == (
        "agent_request_failed",
        f"http_{status}",
        status,
    )
    assert (outcome.delivery, outcome.terminal, outcome.response_body) == (
        Delivery.DELIVERED,
        False,
        "busy",
    )


@pytest.mark.parametrize("status", [201, 400, 404, 422, 500])
def test_outcome_from_response_other_status_is_run_error(status: int) -> None:
    """Any other status means the server answered with an error: agent_run_error."""
    outcome = reply(status, b'"Hit an exception"')
    assert isinstance(outcome, Failed)
    assert (outcome.failure_class, outcome.kind) == ("agent_run_error", f"http_{status}")
    assert outcome.exception_type == "HTTPStatusError"
    assert outcome.response_body == '"Hit an exception"'


def test_outcome_from_response_message_names_url_and_status() -> None:
    """The message is one line naming the status, its reason and the URL."""
    outcome = reply(500, b"x")
    assert outcome.message == f"HTTP 500 Internal Server Error from POST {URL}"


def test_outcome_from_response_unknown_status_has_no_reason() -> None:
    """A status without a standard reason phrase still names status and URL."""
    outcome = reply(599, b"x")
    assert outcome.message == f"HTTP 599 from POST {URL}"


def test_outcome_from_error_names_foreign_exception_type() -> None:
    """A non-httpx exception keeps its own class name and kind 'transport'."""
    outcome = outcome_from_error(IDENTITY, 0, OSError("boom"), elapsed_seconds=None, max_attempts=3)
    assert (outcome.exception_type, outcome.kind) == ("OSError", "transport")


def test_outcome_from_response_cuts_long_body() -> None:
    """A body longer than 2000 characters is cut there with an ellipsis."""
    outcome = reply(500, b"a" * 5000)
    assert outcome.response_body == "a" * 2000 + "…"


def test_outcome_from_response_marks_truncated_body() -> None:
    """A body the transport cut gets the ellipsis even when short."""
    raw = RawResponse(500, [], b"short", True, URL)
    outcome = outcome_from_response(IDENTITY, 0, raw, elapsed_seconds=None, max_attempts=3)
    assert isinstance(outcome, Failed)
    assert outcome.response_body == "short…"


def test_outcome_from_response_decodes_at_most_8kb() -> None:
    """Only the first 8 KB are decoded: multi-byte text beyond that is never touched."""
    body = "é".encode() * 3000 + b"\xff" * 100_000  # invalid UTF-8 past 8 KB
    outcome = reply(500, body)
    assert outcome.response_body == "é" * 2000 + "…"


def test_outcome_from_response_keeps_retry_after() -> None:
    """A 503's Retry-After is kept on the failure for the retry policy."""
    outcome = reply(503, b"", headers=[(b"retry-after", b"12")])
    assert outcome.retry_after_s == 12.0
    assert "retry_after_s" not in outcome_to_row(outcome)


def test_outcome_from_response_failure_rows_invent_no_reward() -> None:
    """Collector failure rows carry neither reward nor response."""
    for outcome in (reply(500, b"x"), reply(503, b"x"), reply(200, b"[]")):
        row = outcome_to_row(outcome)
        assert "reward" not in row
        assert "response" not in row


@pytest.mark.skipif(not REFERENCE.is_dir(), reason="NeMo Gym reference files not present")
def test_outcome_from_response_500_row_matches_reference_keys() -> None:
    """A 500 row has every key and the class of NeMo Gym 0.7.0's own 500 failure rows."""
    lines = (REFERENCE / "rollouts_failures.jsonl").read_bytes().splitlines()
    expected = orjson.loads(lines[0])
    identity = Identity.from_row(expected)
    raw = RawResponse(500, [], b'"Hit an exception"', False, URL)
    row = outcome_to_row(
        outcome_from_response(identity, 0, raw, elapsed_seconds=None, max_attempts=3)
    )
    assert set(expected) <= set(row)
    for key in ("_ng_failure_class", "_ng_failure_http_status", "_ng_task_index", "agent_ref"):
        assert row[key] == expected[key]


# --- no reply ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "kind", "delivery", "status"),
    [
        (httpx.ConnectError("refused"), "connect", Delivery.NOT_SENT, None),
        (httpx.ConnectTimeout("slow"), "connect_timeout", Delivery.NOT_SENT, None),
        (httpx.WriteError("pipe"), "write", Delivery.POSSIBLY_DELIVERED, None),
        (httpx.WriteTimeout("slow"), "write_timeout", Delivery.POSSIBLY_DELIVERED, None),
        (httpx.ReadError("reset"), "reset", Delivery.POSSIBLY_DELIVERED, None),
        (httpx.ReadTimeout("slow"), "read_timeout", Delivery.POSSIBLY_DELIVERED, None),
        (httpx.RemoteProtocolError("bad"), "protocol", Delivery.POSSIBLY_DELIVERED, None),
    ],
)
def test_outcome_from_error_is_request_failed(
    exc: Exception, kind: str, delivery: Delivery, status: int | None
) -> None:
    """Every transport error is agent_request_failed, status null, with its kind."""
    outcome = outcome_from_error(IDENTITY, 2, exc, elapsed_seconds=1.0, max_attempts=3)
    assert (outcome.failure_class, outcome.kind, outcome.delivery) == (
        "agent_request_failed",
        kind,
        delivery,
    )
    assert (outcome.http_status, outcome.response_body, outcome.terminal) == (status, None, False)
    assert outcome.exception_type == type(exc).__name__
    assert outcome.spends_attempt is (delivery is not Delivery.NOT_SENT)


def test_outcome_from_error_after_response_began() -> None:
    """A failure mid-body keeps the status, is delivered, and its type is httpx's."""
    exc = BodyReadError(f"the connection to {URL} broke (HTTP 200 began)")
    exc.status_code = 200
    outcome = outcome_from_error(IDENTITY, 0, exc, elapsed_seconds=None, max_attempts=3)
    assert (outcome.kind, outcome.http_status, outcome.delivery) == (
        "body_reset",
        200,
        Delivery.DELIVERED,
    )
    assert outcome.exception_type == "ReadError"
    assert error_kind(BodyProtocolError("x")) == "body_protocol"


def test_outcome_from_error_message_is_one_bounded_line() -> None:
    """Messages are flattened to one line of at most 2000 characters."""
    exc = httpx.ReadError("line one\nline two " + "x" * 5000)
    outcome = outcome_from_error(IDENTITY, 0, exc, elapsed_seconds=None, max_attempts=3)
    assert outcome.message is not None
    assert outcome.message.startswith("line one line two x")
    assert len(outcome.message) == 2000
    assert outcome.message.endswith("…")


# --- helpers ----------------------------------------------------------------------------------


def test_cut_text_only_marks_cuts() -> None:
    """cut_text leaves short text alone and appends … when it cuts."""
    assert cut_text("abc", 3) == "abc"
    assert cut_text("abcd", 3) == "abc…"
    assert cut_text("abc", 3, cut=True) == "abc…"


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (b"7", 7.0),
        (b"1.5", 1.5),
        (b"-3", 0.0),
        (b"soon", None),
        (b"nan", None),
        (formatdate(1_000_030, usegmt=True).encode(), 30.0),
        (formatdate(999_000, usegmt=True).encode(), 0.0),
    ],
)
def test_retry_after_seconds_reads_delta_and_date(value: bytes, seconds: float | None) -> None:
    """Retry-After is read as delta-seconds or an HTTP-date relative to now, never negative."""
    raw = RawResponse(503, [(b"retry-after", value)], b"", False)
    assert retry_after_seconds(raw, now=1_000_000) == seconds


def test_retry_after_seconds_absent_is_none() -> None:
    """No Retry-After header means no delay hint."""
    assert retry_after_seconds(RawResponse(503, [], b"", False)) is None


# --- reply limits and deadlines, foreign replies -------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "kind", "exception_type", "delivery", "status"),
    [
        (began(ReplyTooLargeError, "big", 200), "reply_too_large", "ReplyTooLargeError", "d", 200),
        (
            began(ContentDecodingError, "br", 200),
            "content_encoding",
            "ContentDecodingError",
            "d",
            200,
        ),
        (ReplyTimeout("slow"), "reply_timeout", "ReplyTimeout", "p", None),
        (began(BodyReplyTimeout, "slow", 200), "reply_timeout", "ReplyTimeout", "d", 200),
    ],
)
def test_outcome_from_error_names_reply_limits(
    exc: Exception, kind: str, exception_type: str, delivery: str, status: int | None
) -> None:
    """A reply over the size limit, in an unknown coding or past its deadline is a typed
    agent_request_failed, never malformed_body."""
    outcome = outcome_from_error(IDENTITY, 0, exc, elapsed_seconds=1.0, max_attempts=3)
    assert (outcome.failure_class, outcome.kind, outcome.exception_type) == (
        "agent_request_failed",
        kind,
        exception_type,
    )
    assert outcome.http_status == status
    want = Delivery.DELIVERED if delivery == "d" else Delivery.POSSIBLY_DELIVERED
    assert outcome.delivery is want


SENT = {"_ng_task_index": 7, "_ng_rollout_index": 3, "_ng_attempt_index": 1, "_ng_rollout_id": "q"}


def echo_reply(payload: dict[str, Any], sent: dict[str, Any] = SENT) -> Any:
    """Classify a 200 carrying `payload` as the reply to a request that carried `sent`."""
    raw = RawResponse(200, [], orjson.dumps(payload), False, URL)
    echo = expected_echo(sent)
    return outcome_from_response(IDENTITY, 1, raw, elapsed_seconds=1.0, max_attempts=3, echo=echo)


@pytest.mark.parametrize(
    ("key", "echoed"),
    [
        ("_ng_task_index", 8),
        ("_ng_rollout_index", 0),
        ("_ng_attempt_index", 0),
        ("_ng_rollout_id", "other"),
        ("_ng_task_index", "7"),
    ],
)
def test_outcome_from_response_foreign_identity_is_a_typed_failure(key: str, echoed: Any) -> None:
    """A 200 echoing another request's identity fails as identity_mismatch, possibly
    delivered, naming the key and both values, and keeps none of the foreign body."""
    outcome = echo_reply({**SENT, key: echoed, "reward": 1.0, "response": {"id": "theirs"}})
    assert isinstance(outcome, Failed)
    assert (outcome.failure_class, outcome.kind, outcome.delivery) == (
        "agent_request_failed",
        "identity_mismatch",
        Delivery.POSSIBLY_DELIVERED,
    )
    assert f"{key} {echoed!r} where {SENT[key]!r} was sent" in (outcome.message or "")
    assert outcome.response_body is None
    assert "theirs" not in str(outcome_to_row(outcome))


def test_outcome_from_response_foreign_identity_beats_sentinels() -> None:
    """Another request's failure sentinel is not this request's failure either."""
    outcome = echo_reply({**SENT, "_ng_task_index": 1, "_ng_failure_class": "transient"})
    assert isinstance(outcome, Failed)
    assert outcome.kind == "identity_mismatch"


@pytest.mark.parametrize(
    "payload",
    [
        {**SENT, "reward": 1.0},
        {"reward": 1.0},
        {"_ng_task_index": 7, "reward": 1.0},
    ],
)
def test_outcome_from_response_matching_or_absent_echo_lands(payload: dict[str, Any]) -> None:
    """An echo that matches, or no echo at all (0.7.0 environment servers), lands."""
    assert isinstance(echo_reply(payload), Landed)


def test_expected_echo_holds_only_what_the_request_carried() -> None:
    """Identity keys absent from the request are not expected back; others are ignored."""
    request = {"_ng_task_index": 2, "_ng_rollout_index": 0, "expected_answer": "4"}
    assert expected_echo(request) == [("_ng_task_index", 2), ("_ng_rollout_index", 0)]
    outcome = echo_reply({"_ng_attempt_index": 5, "_ng_rollout_id": "x"}, sent=request)
    assert isinstance(outcome, Landed)


def test_echo_mismatches_lists_each_contradiction() -> None:
    """echo_mismatches returns (key, sent, echoed) for every contradicted pair, in order."""
    expected = [("a", 1), ("b", {"id": 2}), ("c", 3)]
    assert echo_mismatches({"a": 1, "b": {"id": 9}, "c": 4}, expected) == [
        ("b", {"id": 2}, {"id": 9}),
        ("c", 3, 4),
    ]
