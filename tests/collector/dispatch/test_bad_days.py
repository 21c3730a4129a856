"""The four bad days of issue 21, through the engine with the CLI's default settings, on the
fake clock: how long each takes (virtual seconds), what lands, what fails, what the server took.

The same four cases run through the real command in tests/cli/test_bad_days_cli.py (counts and
exit codes) and in bench/retry_days.py (wall-clock figures, side by side with older code).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest
import trio
import trio.testing

from builders import materialized_rows
from trollout.collector.engine.collector import open_collector
from trollout.collector.engine.sink import ListSink
from trollout.collector.http.transport import RawResponse
from trollout.errors import RunStoppedError
from trollout.records import Delivery, Failed, Landed
from trollout.settings import RunConfig

URLS = {"agent": "http://agent.test:80"}
LATENCY = 0.005  # replies in milliseconds
Answer = Callable[[tuple[int, int], int], Any]  # (rollout key, request number) -> a behaviour


class Server:
    """A transport answering each request by `answer(key, n)`: an int status (200 lands), a
    ``(status, retry_after)`` pair, ``"refused"``, ``"reset"`` or ``"not json"``."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests: Counter[tuple[int, int]] = Counter()
        self.headers: list[bytes] = []

    async def post(self, url: str, body: bytes, *, headers: bytes = b"") -> RawResponse:
        request = orjson.loads(body)
        key = (request["_ng_task_index"], request["_ng_rollout_index"])
        n = self.requests[key]
        self.requests[key] += 1
        self.headers.append(headers)
        behaviour = self.answer(key, n)
        if behaviour == "refused":
            await trio.lowlevel.checkpoint()
            raise httpx.ConnectError("Connection refused")
        await trio.sleep(LATENCY)
        if behaviour == "reset":
            raise httpx.ReadError("connection reset by peer")
        if behaviour == "not json":
            return RawResponse(200, [], b"<html>oops")
        status, retry_after = behaviour if isinstance(behaviour, tuple) else (behaviour, None)
        headers_out = [] if retry_after is None else [(b"retry-after", b"%g" % retry_after)]
        body_out = b'{"reward": 1.0}' if status == 200 else b'"no"'
        return RawResponse(status, headers_out, body_out)

    async def aclose(self) -> None:
        pass


async def collect(
    server: Server, rollouts: int, concurrency: int, **settings: Any
) -> tuple[ListSink, float]:
    """Collect `rollouts` rows with the CLI's defaults (but `settings`); return the sink and
    the virtual seconds it took."""
    config = RunConfig(num_samples_in_parallel=concurrency, **settings)
    sink = ListSink()
    start = trio.current_time()
    async with open_collector(
        config=config, urls=URLS, sink=sink, transport=server, seed=21
    ) as collector:
        await collector.collect(materialized_rows(rollouts))
    return sink, trio.current_time() - start


def kinds(sink: ListSink) -> Counter[str]:
    return Counter(o.kind or "" for o in sink.outcomes if isinstance(o, Failed))


async def test_dead_endpoint_stops_the_run_at_the_grace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """40 rollouts at 8 in flight to a refused port: the run stops at the 30 s grace (was: 14 of
    40 started after 210 s), in one line, every rollout resumable (nothing spent)."""
    server = Server(lambda key, n: "refused")
    sink = ListSink()
    start = trio.current_time()
    with pytest.raises(RunStoppedError, match=r"^'agent' is down: http://agent\.test:80 gave"):
        async with open_collector(
            config=RunConfig(num_samples_in_parallel=8),
            urls=URLS,
            sink=sink,
            transport=server,
            seed=21,
        ) as collector:
            await collector.collect(materialized_rows(40))
    assert trio.current_time() - start == pytest.approx(30.0)
    assert not any(isinstance(o, Landed) for o in sink.outcomes)
    assert all(isinstance(o, Failed) and not o.spends_attempt for o in sink.outcomes)
    assert sum(server.requests.values()) <= 8 * (1 + 4) + 10  # own retries, then probes


async def test_dead_endpoint_in_fail_mode_ends_every_rollout_by_the_grace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The same with on_endpoint_outage=fail: all 40 end endpoint_down, unsent, by 30 s."""
    sink, virtual_s = await collect(
        Server(lambda key, n: "refused"), 40, 8, on_endpoint_outage="fail"
    )
    assert virtual_s == pytest.approx(30.0)
    assert kinds(sink) == Counter({"endpoint_down": 40})
    assert {o.delivery for o in sink.outcomes if isinstance(o, Failed)} == {Delivery.NOT_SENT}


async def test_429_forever_ends_within_the_rollouts_retries(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """40 rollouts at 8 in flight, every request 429 without Retry-After: each sends at most
    1 + 3 requests, all within the endpoint's budget of 100 re-sends, and fails http_429
    (delivered); the run ends well within 120 s (was: 11 of 40 started after 330 s)."""
    server = Server(lambda key, n: 429)
    sink, virtual_s = await collect(server, 40, 8)
    assert virtual_s <= 120.0
    assert kinds(sink) == Counter({"http_429": 40})
    assert max(server.requests.values()) == 4  # <= 10 per rollout
    assert sum(server.requests.values()) == 40 + 100  # the re-sends it paced: the budget
    assert all(isinstance(o, Failed) and o.spends_attempt for o in sink.outcomes)


async def test_a_server_that_asks_politely_is_waited_for_as_asked(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """16 rollouts, each answered 429 + Retry-After: 0.05 twice, then 200: all land with no
    failure in well under a second (was: 2.6 s, "waited 14.0 s"), the re-sends numbered."""
    server = Server(lambda key, n: (429, 0.05) if n < 2 else 200)
    config = RunConfig(num_samples_in_parallel=16)
    sink = ListSink()
    start = trio.current_time()
    async with open_collector(
        config=config, urls=URLS, sink=sink, transport=server, seed=21
    ) as collector:
        await collector.collect(materialized_rows(16))
        waited = collector.retry_state.counters.retry_wait_s
    virtual_s = trio.current_time() - start
    assert all(isinstance(o, Landed) for o in sink.outcomes)
    assert len(sink.outcomes) == 16
    assert virtual_s <= 2 * 0.05 * 1.1 + 3 * LATENCY + 1e-9
    assert 32 * 0.05 <= waited <= 32 * 0.055  # what the server asked, not inflated
    assert Counter(server.headers) == Counter(
        {b"": 16, b"x-trollout-retry: 1\r\n": 16, b"x-trollout-retry: 2\r\n": 16}
    )


def mixed_day(seed: int) -> Answer:
    """10 % 503, 15 % 500, 10 % reset, 10 % not JSON, the rest 200, drawn per request."""
    draws: dict[tuple[tuple[int, int], int], Any] = {}

    def answer(key: tuple[int, int], n: int) -> Any:
        if (key, n) not in draws:
            u = random.Random(hash((seed, key, n))).random()
            draws[key, n] = (
                503 if u < 0.10 else 500 if u < 0.25 else "reset" if u < 0.35 else
                "not json" if u < 0.45 else 200
            )  # fmt: skip
        return draws[key, n]

    return answer


@pytest.mark.parametrize("seed", range(5))
async def test_a_mixed_fault_day_ends_in_seconds(
    seed: int, autojump_clock: trio.testing.MockClock
) -> None:
    """20 tasks x 3 repeats at 8 in flight, 10 % 503, 15 % 500, 10 % resets, 10 % bad JSON:
    the breaker never opens (every one of those is an answer, or one reset among answers), the
    503s are retried, and the run ends in seconds (was: a 6-minute tail with the server idle)."""
    server = Server(mixed_day(seed))
    sink, virtual_s = await collect(server, 60, 8)
    assert virtual_s <= 60.0
    assert len(sink.outcomes) == 60
    assert set(kinds(sink)) <= {"http_500", "reset", "malformed_body", "http_503"}
    landed = sum(isinstance(o, Landed) for o in sink.outcomes)
    assert landed == 60 - sum(kinds(sink).values())


async def test_the_cli_defaults_are_the_documented_policy() -> None:
    """The defaults the four cases rely on: a 30 s grace, stop on outage, 5 failures to open,
    5 s longest open period, 4 own connect re-sends, 3 request re-sends."""
    config = RunConfig()
    assert (
        config.dispatch_connect_grace_s,
        config.on_endpoint_outage.value,
        config.breaker_failure_threshold,
        config.breaker_open_s,
        config.max_connect_retries,
        config.max_request_retries,
    ) == (30.0, "stop", 5, 5.0, 4, 3)
