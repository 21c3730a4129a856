"""The input echo: a 200 whose ``responses_create_params.input`` is another conversation fails.

classify.py's design note says why (a stray or forged reply carries the input of the request it
answered) and what is compared (each item's role and text, not the defaults a server adds).
The real deployment's replies must all pass: NeMo Gym 0.7.0's own rollouts against the rows it
sent (../shared's reference files when present, and a copy of a few of them in tests/data).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
import trio.testing
from test_dispatch import POLICY, URL, answer, scripted

from builders import AGENT, materialized_rows, row_body
from trollout.collector.classify.echo import ECHOED_PARAMS, expected_echo, same_input
from trollout.collector.classify.outcomes import IDENTITY_MISMATCH, outcome_from_response
from trollout.collector.dispatch.request import DispatchPolicy, dispatch
from trollout.collector.engine.collector import open_collector
from trollout.collector.http.transport import RawResponse
from trollout.records import Delivery, Failed, Identity, Landed, MaterializedRow
from trollout.settings import RunConfig
from trollout.testing import DeploymentSpec, Fault, FaultContext, Generation, open_fake_deployment

IDENTITY = Identity(task_index=0, rollout_index=0, agent_name=AGENT)
REFERENCE = Path(__file__).resolve().parents[4] / "shared" / "reference" / "nemo_gym_0.7.0"
COPY = Path(__file__).resolve().parents[2] / "data" / "nemo_gym_0.7.0_echo"
STAMPS = ("_ng_task_index", "_ng_rollout_index", "_ng_attempt_index", "_ng_rollout_id")


def classify(sent: dict[str, Any], reply: dict[str, Any], **echo: bool) -> Landed | Failed:
    """Classify a 200 carrying `reply` as the answer to the request `sent`."""
    raw = RawResponse(200, [], orjson.dumps(reply), False, URL)
    return outcome_from_response(
        IDENTITY, 0, raw, elapsed_seconds=1.0, max_attempts=3, echo=expected_echo(sent, **echo)
    )


def pairs(folder: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Return (row sent, reply) for every rollout of a NeMo Gym run folder's files."""
    sent = {}
    for line in (folder / "rollouts_materialized_inputs.jsonl").read_bytes().splitlines():
        row = orjson.loads(line)
        sent[row["_ng_task_index"], row["_ng_rollout_index"]] = row
    replies = [orjson.loads(line) for line in (folder / "rollouts.jsonl").read_bytes().splitlines()]
    assert replies
    return [(sent[r["_ng_task_index"], r["_ng_rollout_index"]], r) for r in replies]


def check_real_replies(folder: Path) -> None:
    """Every real reply passes against its own row and, identity aside, fails against another."""
    found = pairs(folder)
    for row, reply in found:
        assert reply[ECHOED_PARAMS] != row[ECHOED_PARAMS]  # the echo is not the bytes sent
        assert (ECHOED_PARAMS, row[ECHOED_PARAMS]) in expected_echo(row)
        assert isinstance(classify(row, reply), Landed)
    for (row, _), (_, other) in zip(found, found[1:] + found[:1], strict=True):
        anonymous = {key: value for key, value in other.items() if key not in STAMPS}
        outcome = classify(row, anonymous)
        assert isinstance(outcome, Failed)
        assert outcome.kind == IDENTITY_MISMATCH


@pytest.mark.skipif(not REFERENCE.is_dir(), reason="NeMo Gym reference files not present")
def test_reference_deployment_replies_echo_their_own_input() -> None:
    """Every reply of NeMo Gym 0.7.0's reference run passes the input check against the row it
    was sent, though its echo has defaults added; swapped between rows, each fails."""
    check_real_replies(REFERENCE)


def test_copied_deployment_replies_echo_their_own_input() -> None:
    """As the reference test, on rows copied from it into tests/data (CI has no ../shared)."""
    check_real_replies(COPY)


SENT = row_body(0) | {
    ECHOED_PARAMS: {
        "input": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "input_text", "text": "2+2?"}]},
            {"type": "function_call_output", "call_id": "c1", "output": "4"},
        ],
        "temperature": 0.5,
    }
}


def echoed(items: Any) -> dict[str, Any]:
    """Return a reply that echoes `items` as its input (and lands otherwise)."""
    return {ECHOED_PARAMS: {"input": items, "model": "m"}, "response": {"id": "r"}, "reward": 1.0}


@pytest.mark.parametrize(
    "items",
    [
        SENT[ECHOED_PARAMS]["input"],  # verbatim
        [
            {"role": "system", "content": "be brief", "type": "message", "phase": None},
            {
                "role": "user",
                "content": [{"type": "input_text", "text": "2+2?", "annotations": []}],
                "type": "message",
            },
            {"type": "function_call_output", "call_id": "c1", "output": "4", "id": None},
        ],
    ],
    ids=["verbatim", "defaults-added"],
)
def test_an_echo_of_the_same_conversation_lands(items: Any) -> None:
    """Defaults a server's request model adds to each item are no difference."""
    assert isinstance(classify(SENT, echoed(items)), Landed)


@pytest.mark.parametrize(
    ("items", "says"),
    [
        (
            [{"role": "system", "content": "be brief"}, {"role": "user", "content": "3+3?"}],
            "2 input items where 3 were sent",
        ),
        (
            [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "input_text", "text": "3+3?"}]},
                {"type": "function_call_output", "call_id": "c1", "output": "4"},
            ],
            "input item 1 ('user') has other text than was sent",
        ),
        (
            [
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "input_text", "text": "2+2?"}]},
                {"type": "function_call_output", "call_id": "c1", "output": "4"},
            ],
            "input item 0 has role 'developer' where 'system' was sent",
        ),
        ("2+2?", "1 input items where 3 were sent"),
    ],
    ids=["fewer-items", "other-text", "other-role", "a-string"],
)
def test_an_echo_of_another_conversation_is_identity_mismatch(items: Any, says: str) -> None:
    """Another input fails as identity_mismatch, possibly delivered, saying where it differs
    (never the text) and naming the setting that turns the check off."""
    outcome = classify(SENT, echoed(items))
    assert isinstance(outcome, Failed)
    assert (outcome.failure_class, outcome.kind, outcome.delivery) == (
        "agent_request_failed",
        IDENTITY_MISMATCH,
        Delivery.POSSIBLY_DELIVERED,
    )
    message = outcome.message or ""
    assert f"responses_create_params: {says}" in message
    assert "+check_echoed_input=false" in message
    assert "3+3?" not in message


@pytest.mark.parametrize(
    "reply",
    [
        {"response": {"id": "r"}, "reward": 1.0},  # no echo at all
        {ECHOED_PARAMS: {"model": "m"}, "reward": 1.0},  # an echo without its input
        {ECHOED_PARAMS: None, "reward": 1.0},  # nothing to compare
    ],
    ids=["no-echo", "no-input", "null"],
)
def test_a_reply_that_echoes_no_input_lands(reply: dict[str, Any]) -> None:
    """Not every agent echoes: only an echoed input is compared."""
    assert isinstance(classify(SENT, reply), Landed)


def test_check_input_off_compares_identity_only() -> None:
    """check_input=False (``check_echoed_input: false``) lands a rewritten input; the identity
    stamps are still checked."""
    rewritten = echoed([{"role": "system", "content": "agent's own prompt"}])
    assert isinstance(classify(SENT, rewritten, check_input=False), Landed)
    foreign = classify(SENT, rewritten | {"_ng_task_index": 5}, check_input=False)
    assert isinstance(foreign, Failed)
    assert foreign.kind == IDENTITY_MISMATCH


def test_same_input_reads_a_string_as_one_user_message() -> None:
    """A string input and its echo as one user message (string or text-part content) agree."""
    assert same_input([{"role": "user", "content": "hi", "type": "message"}], "hi")
    assert same_input([{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}], "hi")
    assert not same_input([{"role": "user", "content": "hello"}], "hi")
    assert not same_input([{"role": "assistant", "content": "hi"}], "hi")


def test_config_carries_check_echoed_input_to_dispatch() -> None:
    """``check_echoed_input`` defaults to true; false reaches the dispatch policy."""
    assert RunConfig().check_echoed_input is True
    assert DispatchPolicy.from_config(RunConfig(check_echoed_input=False)).check_echoed_input is (
        False
    )


@pytest.mark.parametrize("check", [True, False])
async def test_dispatch_checks_the_echoed_input_unless_told_not_to(
    autojump_clock: trio.testing.MockClock, check: bool
) -> None:
    """Over a socket, a reply echoing another conversation is identity_mismatch (its
    connection closed); with the check off, the same reply lands."""
    row = MaterializedRow.from_body(row_body(7))
    reply = orjson.dumps(echoed([{"role": "user", "content": "q8"}]))
    policy = DispatchPolicy(POLICY.connect_timeout_s, 60.0, check_echoed_input=check)
    async with scripted([answer(200, reply)], policy) as transport:
        outcome = await dispatch(transport, URL, row, 0, policy, rng=random.Random(0))
        if check:
            assert isinstance(outcome, Failed)
            assert outcome.kind == IDENTITY_MISMATCH
            assert transport.idle_connections() == 0
        else:
            assert isinstance(outcome, Landed)


FORGED = "FORGED"


async def test_unsolicited_forged_replies_never_land_through_the_engine() -> None:
    """0.7.0 environment servers echo the input but no identity. Each answers, then 5 ms later
    sends a forged copy of its answer (reward 1.0) on the same connection: at 8 in flight, no
    landed row holds the forged body, and every landed row answers its own input."""
    rows = materialized_rows(60)
    spec = DeploymentSpec(agents=(AGENT,), generation=Generation.V0_7_0)

    def stray(context: FaultContext) -> Fault:
        return Fault(kind="unsolicited_reply", interval_s=0.005, body=FORGED)

    config = RunConfig(num_samples_in_parallel=8)
    async with (
        open_fake_deployment(spec, fault_fn=stray) as fake,
        open_collector(config=config, urls=fake.run_urls, retain_outcomes=True) as collector,
    ):
        await collector.collect(rows)
        outcomes = collector.drain_nowait()
    assert len(outcomes) == len(rows)
    sent = {row.identity.task_index: row.body[ECHOED_PARAMS] for row in rows}
    for outcome in outcomes:
        if isinstance(outcome, Landed):
            result = outcome.result
            assert result["response"]["output"][0]["content"][0]["text"] != FORGED
            assert result[ECHOED_PARAMS] == sent[outcome.identity.task_index]
        else:
            assert isinstance(outcome, Failed)
            assert outcome.kind == IDENTITY_MISMATCH, outcome
