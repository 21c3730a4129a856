"""Mistakes a driver makes get an error at once, naming the remedy, never a hang or a crash."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import trio

from builders import HANG_GUARD_S, URLS, ScriptedTransport, materialized_row, materialized_rows
from trollout.collector.engine.collector import open_collector
from trollout.collector.http.transport import Http11Transport, RawResponse
from trollout.errors import ConfigError, UnknownAgentError
from trollout.records import Delivery, Failed, Landed
from trollout.testing import AgentSpec, DeploymentSpec, open_fake_deployment


async def test_next_outcome_without_retention_raises_at_once(autojump_clock: Any) -> None:
    """Without retain_outcomes, next_outcome would wait forever: it raises with the remedy."""
    async with open_collector(urls=URLS, transport=ScriptedTransport()) as collector:
        await collector.submit(materialized_row(0))
        with pytest.raises(ConfigError, match=r"retain_outcomes=True"):
            await collector.next_outcome()


async def test_unknown_agent_is_one_typed_error_to_the_caller(autojump_clock: Any) -> None:
    """A row for an agent with no URL raises UnknownAgentError from submit, nothing sent."""
    transport = ScriptedTransport()
    with pytest.raises(UnknownAgentError, match=r"'nobody'.*known: agent"):
        async with open_collector(urls=URLS, transport=transport) as collector:
            await collector.submit(materialized_row(0, agent="nobody"))
    assert transport.requests == []


async def test_unknown_agent_in_collect_ends_the_run_with_that_error(autojump_clock: Any) -> None:
    """collect() raises the same single error; the rows before it still settle."""
    transport = ScriptedTransport()
    rows = [*materialized_rows(3), materialized_row(3, agent="nobody")]
    with pytest.raises(UnknownAgentError, match="nobody"):
        async with open_collector(
            urls=URLS, transport=transport, retain_outcomes=True
        ) as collector:
            await collector.collect(rows)
    assert sorted(o.identity.task_index for o in collector.drain_nowait()) == [0, 1, 2]


@pytest.mark.parametrize(
    ("headers", "body", "needle"),
    [
        ([("retry-after", "5")], b"", r"\(bytes, bytes\) pairs.*got pairs of \(str, str\)"),
        ({"retry-after": "5"}, b"", r"got dict"),
        ([b"retry-after: 5"], b"", r"got a sequence of bytes"),
        ([], "text", r"body must be bytes \(got str\)"),
        ([], bytearray(b"x"), r"body must be bytes \(got bytearray\)"),
    ],
)
def test_raw_response_refuses_wrong_types(headers: Any, body: Any, needle: str) -> None:
    """Headers that would never match (str pairs) or a non-bytes body are refused, not ignored."""
    with pytest.raises(TypeError, match=needle):
        RawResponse(status=503, headers=headers, body=body)


def test_raw_response_accepts_bytes_pairs() -> None:
    """The documented shape works, and header() finds the value."""
    raw = RawResponse(status=503, headers=[(b"retry-after", b"5")], body=b"")
    assert raw.header("Retry-After") == "5"


async def test_transport_timeout_watcher_ends_when_its_transport_closes() -> None:
    """A transport per step leaves no task behind: live tasks return to where they were."""
    spec = DeploymentSpec(agents=(AgentSpec(name="math_agent"),), record_runs=False)
    body = orjson.dumps(materialized_row(0, agent="math_agent").request_body(0))
    async with open_fake_deployment(spec) as fake:
        url = fake.run_urls["math_agent"].rstrip("/") + "/run"
        await _one_request(url, body)  # the fake's own tasks for a connection, once
        with trio.fail_after(HANG_GUARD_S):
            await _settle_tasks()
        baseline = trio.lowlevel.current_statistics().tasks_living
        for _ in range(50):
            await _one_request(url, body)
        with trio.fail_after(HANG_GUARD_S):
            while trio.lowlevel.current_statistics().tasks_living > baseline:  # noqa: ASYNC110
                await trio.sleep(0.01)  # no event says "a task ended"; the guard bounds it
        assert trio.lowlevel.current_statistics().tasks_living == baseline


async def _one_request(url: str, body: bytes) -> None:
    transport = Http11Transport(connect_timeout_s=10, read_timeout_s=60)
    try:
        response = await transport.post(url, body)
        assert response.status == 200, response.body
    finally:
        await transport.aclose()


async def _settle_tasks() -> None:
    """Wait until the number of live tasks stops falling (the server saw the close)."""
    last = -1
    while (now := trio.lowlevel.current_statistics().tasks_living) != last:
        last = now
        await trio.sleep(0.05)


class BrokenTransport(ScriptedTransport):
    """A driver's transport with a bug: it raises ValueError on every third row."""

    async def post(self, url: str, body: bytes, **_: Any) -> RawResponse:
        if orjson.loads(body)["_ng_task_index"] % 3 == 0:
            raise ValueError("driver bug: bad thing")
        return await super().post(url, body)


async def test_an_exception_from_a_drivers_transport_is_a_failed_outcome(
    autojump_clock: Any,
) -> None:
    """A transport's own error fails that rollout (typed) and the run goes on."""
    async with open_collector(
        urls=URLS, transport=BrokenTransport(), retain_outcomes=True
    ) as collector:
        await collector.collect(materialized_rows(9))
    outcomes = {o.identity.task_index: o for o in collector.drain_nowait()}
    assert sorted(outcomes) == list(range(9))
    for task, outcome in outcomes.items():
        if task % 3:
            assert isinstance(outcome, Landed)
        else:
            assert isinstance(outcome, Failed)
            assert (outcome.failure_class, outcome.kind) == ("agent_request_failed", "transport")
            assert outcome.exception_type == "ValueError"
            assert "driver bug" in (outcome.message or "")
            assert outcome.delivery is Delivery.POSSIBLY_DELIVERED
