"""Tests of single-attempt dispatch: connect retries, backoff schedule, classification."""

from __future__ import annotations

import errno
import random
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import attrs
import orjson
import pytest
import trio
import trio.testing

from trollout.collector.dispatch.request import DispatchPolicy, check_run_url, dispatch
from trollout.collector.dispatch.retry import RetryPolicy, RetryState
from trollout.collector.http.transport import Http11Transport, RawResponse
from trollout.errors import ConfigError
from trollout.records import Delivery, Failed, Identity, Landed, MaterializedRow
from trollout.settings import RunConfig

URL = "http://agent:8000/run"
ROW = MaterializedRow.from_body(
    {
        "responses_create_params": {"input": [{"role": "user", "content": "2+2?"}]},
        "agent_ref": {"name": "math"},
        "expected_answer": "4",
        "_ng_task_index": 7,
        "_ng_rollout_index": 3,
    }
)
RETRY = RetryPolicy(max_connect_retries=3, backoff_base_s=0.25, backoff_max_s=8.0)
POLICY = DispatchPolicy(10.0, 60.0, retry=RETRY)
Handler = Callable[[trio.SocketStream], Awaitable[None]]
Step = Handler | str  # a server for the connection, "refuse" or "hang"


class ScriptedTransport(Http11Transport):
    """A transport whose successive connects follow a script; connections are socket pairs."""

    def __init__(self, nursery: trio.Nursery, script: list[Step], policy: DispatchPolicy) -> None:
        super().__init__(connect_timeout_s=policy.connect_timeout_s, read_timeout_s=60.0)
        self.nursery = nursery
        self.script = script
        self.connects: list[float] = []

    async def _open_stream(self, host: str, port: int) -> trio.SocketStream:
        self.connects.append(trio.current_time())
        step = self.script.pop(0)
        if step == "refuse":
            raise OSError(errno.ECONNREFUSED, "Connection refused")
        if step == "hang":
            await trio.sleep_forever()
        assert callable(step)
        client, server = trio.socket.socketpair()
        self.nursery.start_soon(_serve_one, step, trio.SocketStream(server))
        return trio.SocketStream(client)


async def _serve_one(handler: Handler, stream: trio.SocketStream) -> None:
    async with stream:
        await handler(stream)


@asynccontextmanager
async def scripted(script: list[Step], policy: DispatchPolicy) -> AsyncIterator[ScriptedTransport]:
    """Open a ScriptedTransport whose servers stop when the block ends."""
    async with trio.open_nursery() as nursery:
        async with ScriptedTransport(nursery, script, policy) as transport:
            yield transport
        nursery.cancel_scope.cancel(reason="test over")


def answer(status: int, body: bytes, seen: list[bytes] | None = None) -> Handler:
    """Return a server that answers one request with `status` and `body`."""

    async def handler(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data or not data.endswith(b"}"):
            data += await stream.receive_some(65536)
        if seen is not None:
            seen.append(data.partition(b"\r\n\r\n")[2])
        head = f"HTTP/1.1 {status} X\r\ncontent-length: {len(body)}\r\n\r\n".encode()
        await stream.send_all(head + body)

    return handler


def schedule(seed: int, retries: int, policy: DispatchPolicy = POLICY) -> list[float]:
    """Return the virtual times of the connects, replaying the backoff draws of `seed`."""
    rng, times, now = random.Random(seed), [0.0], 0.0
    for retry in range(retries):
        retry_policy = policy.retry
        cap = min(retry_policy.backoff_max_s, retry_policy.backoff_base_s * 2.0**retry)
        now += rng.uniform(0.0, cap)
        times.append(now)
    return times


# --- the policy -----------------------------------------------------------------------------


def test_dispatch_policy_from_config_takes_run_settings() -> None:
    """from_config copies the run's timeouts, retry count, grace and attempt cap."""
    config = RunConfig(
        connect_timeout_s=2.0,
        read_timeout_s=90.0,
        max_connect_retries=1,
        max_attempts=5,
        dispatch_connect_grace_s=7.0,
    )
    policy = DispatchPolicy.from_config(config)
    retry = RetryPolicy(max_connect_retries=1, outage_grace_s=7.0)
    assert policy == DispatchPolicy(2.0, 90.0, max_attempts=5, retry=retry)


def test_dispatch_policy_carries_the_reply_limits_to_its_transport() -> None:
    """from_config takes reply_timeout_s and max_reply_bytes; make_transport applies them."""
    config = RunConfig(read_timeout_s=90.0, reply_timeout_s=100.0, max_reply_bytes=1234)
    policy = DispatchPolicy.from_config(config)
    assert (policy.reply_timeout_s, policy.max_reply_bytes) == (100.0, 1234)
    transport = policy.make_transport()
    assert (transport._deadlines.reply_timeout_s, transport._max_body_bytes) == (100.0, 1234)
    default = DispatchPolicy.from_config(RunConfig(read_timeout_s=90.0)).make_transport()
    assert (default._deadlines.reply_timeout_s, default._max_body_bytes) == (180.0, 256 * 2**20)


def test_dispatch_policy_rejects_negative_values() -> None:
    """A negative retry count or zero timeout is refused with the setting's name."""
    with pytest.raises(ConfigError, match=r"max_connect_retries must be an integer from 0 .*-1"):
        RetryPolicy(max_connect_retries=-1)
    with pytest.raises(ConfigError, match="connect_timeout_s must be a number of seconds > 0"):
        DispatchPolicy(0.0, 1.0)


def test_dispatch_policy_backoff_is_capped_full_jitter() -> None:
    """Backoff n is uniform in [0, min(max, base * 2**n)]."""
    policy = RetryPolicy(max_connect_retries=10, backoff_base_s=1.0, backoff_max_s=4.0)
    rng = random.Random(1)
    for retry, cap in [(0, 1.0), (1, 2.0), (2, 4.0), (5, 4.0)]:
        draws = [policy.backoff_s(retry, rng) for _ in range(200)]
        assert min(draws) >= 0.0
        assert max(draws) <= cap
        assert max(draws) > cap * 0.9


# --- dispatch -----------------------------------------------------------------------------------


async def test_dispatch_lands_a_reply_and_sends_the_row(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A 200 object lands; the body sent is the row plus the attempt index."""
    seen: list[bytes] = []

    async def slow_answer(stream: trio.SocketStream) -> None:
        await trio.sleep(4)
        await answer(200, b'{"reward": 1.0, "response": {}}', seen)(stream)

    async with scripted([slow_answer], POLICY) as transport:
        outcome = await dispatch(transport, URL, ROW, 2, POLICY, rng=random.Random(0))
    assert isinstance(outcome, Landed)
    assert (outcome.reward, outcome.attempt_index, outcome.elapsed_seconds) == (1.0, 2, 4.0)
    assert orjson.loads(seen[0]) == {**ROW.body, "_ng_attempt_index": 2}


async def test_dispatch_classifies_an_error_status(autojump_clock: trio.testing.MockClock) -> None:
    """A 500 becomes agent_run_error with its body, without retrying."""
    async with scripted([answer(500, b'"boom"')], POLICY) as transport:
        outcome = await dispatch(transport, URL, ROW, 0, POLICY, rng=random.Random(0))
    assert isinstance(outcome, Failed)
    assert (outcome.failure_class, outcome.http_status, outcome.response_body) == (
        "agent_run_error",
        500,
        '"boom"',
    )
    assert len(transport.connects) == 1


async def test_dispatch_backoff_schedule_is_exact(autojump_clock: trio.testing.MockClock) -> None:
    """Refused connects are retried max_connect_retries times at the seeded jitter times."""
    async with scripted(["refuse"] * 4, POLICY) as transport:
        outcome = await dispatch(transport, URL, ROW, 0, POLICY, rng=random.Random(42))
    expected = schedule(42, 3)
    assert transport.connects == pytest.approx(expected, abs=1e-9)
    assert isinstance(outcome, Failed)
    assert (outcome.failure_class, outcome.kind, outcome.delivery) == (
        "agent_request_failed",
        "connect",
        Delivery.NOT_SENT,
    )
    assert outcome.elapsed_seconds == pytest.approx(expected[-1], abs=1e-9)
    assert (outcome.message or "").endswith("(after 3 connect retries)")


async def test_dispatch_lands_after_refused_connects(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A server that comes back within the grace period gets the request."""
    script: list[Step] = ["refuse", "refuse", answer(200, b"{}")]
    async with scripted(script, POLICY) as transport:
        outcome = await dispatch(transport, URL, ROW, 0, POLICY, rng=random.Random(5))
    assert isinstance(outcome, Landed)
    assert transport.connects == pytest.approx(schedule(5, 2), abs=1e-9)


async def test_dispatch_no_retry_starts_after_the_outage_grace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Connect timeouts are retried only until the endpoint has given no answer for the grace:
    the rollout then ends endpoint_down at once, not after its next backoff."""
    retry = attrs.evolve(RETRY, max_connect_retries=5, outage_grace_s=15.0)
    policy = DispatchPolicy(10.0, 60.0, retry=retry)
    state = RetryState(retry)
    async with scripted(["hang", "hang", "hang"], policy) as transport:
        outcome = await dispatch(
            transport, URL, ROW, 0, policy, rng=random.Random(3), retry_state=state
        )
    first_delay = random.Random(3).uniform(0.0, 0.25)
    assert transport.connects == pytest.approx([0.0, 10.0 + first_delay], abs=1e-9)
    assert isinstance(outcome, Failed)
    assert (outcome.kind, outcome.delivery, outcome.spends_attempt) == (
        "endpoint_down",
        Delivery.NOT_SENT,
        False,
    )
    assert outcome.elapsed_seconds == pytest.approx(20.0 + first_delay, abs=1e-9)
    assert (outcome.message or "").startswith(
        "http://agent:8000 gave no answer for 20.1s (2 requests failed in a row; last: "
    )
    assert "past dispatch_connect_grace_s=15; not sent (resume re-runs it)" in (
        outcome.message or ""
    )
    assert state.counters.outages == {"http://agent:8000": 1}


async def test_dispatch_never_resends_a_possibly_delivered_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A connection that breaks after the request went out ends the attempt at once."""

    async def drop(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)

    async with scripted([drop, answer(200, b"{}")], POLICY) as transport:
        outcome = await dispatch(transport, URL, ROW, 0, POLICY, rng=random.Random(0))
    assert isinstance(outcome, Failed)
    assert (outcome.kind, outcome.delivery) == ("reset", Delivery.POSSIBLY_DELIVERED)
    assert len(transport.connects) == 1


async def test_dispatch_lets_cancellation_through(autojump_clock: trio.testing.MockClock) -> None:
    """Cancelling a dispatch raises Cancelled (caught by the scope), never an outcome."""

    async def hang(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    results: list[object] = []
    async with scripted([hang], POLICY) as transport:
        with trio.move_on_after(7) as scope:
            results.append(await dispatch(transport, URL, ROW, 0, POLICY, rng=random.Random(0)))
        assert transport.idle_connections() == 0
    assert scope.cancelled_caught
    assert results == []
    assert trio.current_time() == 7.0


async def test_dispatch_refuses_https_url() -> None:
    """A URL the transport cannot speak is a ConfigError naming it, not a failed rollout."""
    async with Http11Transport(connect_timeout_s=1, read_timeout_s=1) as transport:
        with pytest.raises(ConfigError, match="https://agent/run"):
            await dispatch(transport, "https://agent/run", ROW, 0, POLICY, rng=random.Random(0))


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("https://agent/run", r"is 'https://agent/run'.*scheme is 'https'.*without TLS"),
        ("http:///run", r"is 'http:///run'.*it has no host"),
        ("http://agent:99999/run", r"is 'http://agent:99999/run'.*does not parse"),
        ("https://user:secret@agent/run", r"is 'https://agent/run'"),
        ("https://agent/run?api_key=secret#secret", r"is 'https://agent/run'"),
    ],
)
def test_check_run_url_names_the_url_and_the_remedy(url: str, needle: str) -> None:
    """A URL the transport cannot send to is one line: where it came from, why, the remedy."""
    with pytest.raises(ConfigError, match=needle) as info:
        check_run_url(url, what="the URL of 'agent'")
    message = str(info.value)
    assert message.startswith("the URL of 'agent' is ")
    assert message.endswith("through a local proxy or tunnel)")
    assert "secret" not in message
    assert "\n" not in message


def test_check_run_url_returns_a_plain_http_url() -> None:
    """A plain http:// URL passes unchanged."""
    assert check_run_url("http://agent:8000/run", what="x") == "http://agent:8000/run"


async def test_dispatch_refused_loopback_port_fails_not_sent() -> None:
    """A closed loopback port is retried, then fails as connect / not_sent without spending."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    policy = DispatchPolicy(
        5.0, 5.0, retry=RetryPolicy(max_connect_retries=2, backoff_base_s=0.001)
    )
    async with policy.make_transport() as transport:
        outcome = await dispatch(
            transport, f"http://127.0.0.1:{port}/run", ROW, 0, policy, rng=random.Random(0)
        )
    assert isinstance(outcome, Failed)
    assert (outcome.kind, outcome.delivery, outcome.spends_attempt) == (
        "connect",
        Delivery.NOT_SENT,
        False,
    )
    assert "Connection refused" in (outcome.message or "")
    assert (outcome.message or "").endswith("(after 2 connect retries)")


async def test_dispatch_foreign_reply_fails_and_drops_its_connection(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A 200 that echoes another rollout's identity is identity_mismatch, possibly delivered,
    and the connection that carried it is closed rather than pooled."""
    foreign = orjson.dumps({**ROW.body, "_ng_task_index": 8, "reward": 1.0})
    own = orjson.dumps({**ROW.body, "reward": 0.0})
    async with scripted([answer(200, foreign), answer(200, own)], POLICY) as transport:
        outcome = await dispatch(transport, URL, ROW, 0, POLICY, rng=random.Random(0))
        assert isinstance(outcome, Failed)
        assert (outcome.kind, outcome.delivery) == (
            "identity_mismatch",
            Delivery.POSSIBLY_DELIVERED,
        )
        assert "_ng_task_index 8 where 7 was sent" in (outcome.message or "")
        assert transport.idle_connections() == 0
        landed = await dispatch(transport, URL, ROW, 0, POLICY, rng=random.Random(0))
        assert isinstance(landed, Landed)
        assert landed.reward == 0.0
    assert len(transport.connects) == 2


# --- episodes (docs/protocol.md section 3) -------------------------------------------------------

TASK_ROW = MaterializedRow.from_body(
    {
        "task_id": {"taskset": "w", "task_id": "sf"},
        "task_input": {"prompt": "sf?"},
        "_ng_task_index": 4,
        "_ng_rollout_index": 2,
        "_ng_environment_server": "w_env",
    }
)


def episode_reply(attempt: int, **fields: object) -> bytes:
    """An episode reply to attempt `attempt` of TASK_ROW with `fields`."""
    identity = {
        "episode_id": {"rollout_id": "4-2", "attempt": attempt},
        "task_id": {"taskset": "w", "task_id": "sf"},
    }
    return orjson.dumps({**identity, **fields})


async def test_dispatch_sends_a_task_row_as_an_episode_and_lands_its_result(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The body is the episode envelope of the attempt; the inner result lands, stamped."""
    seen: list[bytes] = []
    reply = episode_reply(2, result={"reward": 0.5})
    async with scripted([answer(200, reply, seen)], POLICY) as transport:
        outcome = await dispatch(
            transport, URL, TASK_ROW, 2, POLICY, rng=random.Random(0), policy_model_server="pm"
        )
    assert orjson.loads(seen[0]) == {
        "episode_id": {"rollout_id": "4-2", "attempt": 2},
        "task": {"task_id": {"taskset": "w", "task_id": "sf"}, "task_input": {"prompt": "sf?"}},
    }
    assert isinstance(outcome, Landed)
    assert (outcome.result, outcome.reward) == ({"reward": 0.5}, 0.5)
    assert outcome.identity.policy_model_server == "pm"


async def test_dispatch_episode_identity_violation_drops_its_connection(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A reply echoing another episode is a violation, and its connection is not pooled."""
    foreign = episode_reply(1, result={"reward": 1.0})
    own = episode_reply(0, failure={"failure_reason": "no", "terminal": False})
    async with scripted([answer(200, foreign), answer(200, own)], POLICY) as transport:
        outcome = await dispatch(transport, URL, TASK_ROW, 0, POLICY, rng=random.Random(0))
        assert isinstance(outcome, Failed)
        assert (outcome.failure_class, outcome.exception_type) == (
            "environment_protocol_violation",
            "EpisodeIdentityMismatch",
        )
        assert transport.idle_connections() == 0
        failed = await dispatch(transport, URL, TASK_ROW, 0, POLICY, rng=random.Random(0))
        assert isinstance(failed, Failed)
        assert failed.failure_class == "environment_server_failed"
    assert len(transport.connects) == 2


async def test_dispatch_stamps_the_policy_model_server_on_flat_failures(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Every outcome of a rollout carries ng_policy_model_server when the engine knows it."""
    async with scripted([answer(500, b'"boom"')], POLICY) as transport:
        outcome = await dispatch(
            transport, URL, ROW, 0, POLICY, rng=random.Random(0), policy_model_server="pm"
        )
    assert isinstance(outcome, Failed)
    assert outcome.identity.policy_model_server == "pm"


def test_identity_from_row_takes_the_executors_model_server_first() -> None:
    """The deployment's model server of the row's agent (else of its environment server) wins
    over one the row carries; without an entry the row's own stays; a non-text one is dropped."""
    servers = {"math": "pm", "env": "pe"}
    body = dict(ROW.body, ng_policy_model_server="old")
    assert Identity.from_row(body, servers).policy_model_server == "pm"
    assert Identity.from_row(body, {"other": "x"}).policy_model_server == "old"
    assert Identity.from_row(body).policy_model_server == "old"
    fronted = {k: v for k, v in ROW.body.items() if k != "agent_ref"}
    fronted["_ng_environment_server"] = "env"
    assert Identity.from_row(fronted, servers).policy_model_server == "pe"
    assert Identity.from_row(dict(body, ng_policy_model_server=3)).policy_model_server is None
    assert Identity.from_row(body, servers) == Identity.from_row(body)  # not part of the key


async def test_dispatch_keeps_the_identity_of_a_row_read_stamped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A row whose identity already names the model server (a run folder reads its rows that
    way) is not copied per rollout: the outcome carries the row's own identity."""
    stamped = MaterializedRow.from_body(ROW.body, None, {"math": "pm"})
    assert stamped.identity.policy_model_server == "pm"
    replies = [answer(200, b'{"reward": 1.0}'), answer(200, b'{"reward": 1.0}')]
    async with scripted(replies, POLICY) as transport:
        outcome = await dispatch(
            transport, URL, stamped, 0, POLICY, rng=random.Random(0), policy_model_server="pm"
        )
        assert isinstance(outcome, Landed)
        assert outcome.identity is stamped.identity
        other = await dispatch(
            transport, URL, stamped, 0, POLICY, rng=random.Random(0), policy_model_server="pm2"
        )
    assert other.identity.policy_model_server == "pm2"  # the engine's own still wins


class _Recorder:
    """A `PostTransport` that keeps each request body and answers 200 with a reward."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def post(self, url: str, body: bytes) -> RawResponse:
        self.bodies.append(body)
        return RawResponse(status=200, headers=[], body=b'{"reward": 1.0}', truncated=False)

    async def aclose(self) -> None:
        pass


async def test_dispatch_sends_a_read_rows_first_attempt_as_it_was_read() -> None:
    """A flat row read from the materialized inputs goes out as its line: never re-serialized.

    A later attempt adds ``_ng_attempt_index``, so it is serialized from the row.
    """
    line = b'{"_ng_task_index": 7, "_ng_rollout_index": 3, "agent_ref": {"name": "math"}}'
    row = MaterializedRow.from_body(orjson.loads(line), line)
    transport = _Recorder()
    for attempt in (0, 1):
        outcome = await dispatch(transport, URL, row, attempt, POLICY, rng=random.Random(0))
        assert isinstance(outcome, Landed)
    first, second = transport.bodies
    assert first is line
    assert orjson.loads(second) == {**orjson.loads(line), "_ng_attempt_index": 1}
