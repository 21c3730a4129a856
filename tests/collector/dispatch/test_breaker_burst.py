"""A 429 burst that honours Retry-After fails nothing and never opens the breaker.

A 429 is the server answering: rollouts wait what it asked and go (once, 211 of 256 rollouts
failed as ``breaker_open`` and 45 more as ``http_429`` here; then the breaker opened and every
rollout queued behind its probes).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import trio

import trollout
from builders import URLS, materialized_rows
from trollout.collector.engine.collector import open_collector
from trollout.collector.engine.sink import ListSink
from trollout.collector.http.transport import RawResponse
from trollout.records import Failed, Landed
from trollout.settings import RunConfig
from trollout.testing import (
    AgentSpec,
    DeploymentSpec,
    Fault,
    FaultContext,
    open_fake_deployment,
    task_rows,
)


class Burst:
    """Answers 429 (Retry-After: 1) to every request sent before `until`, then 200."""

    def __init__(self, until: float) -> None:
        self.until = until
        self.sent = 0

    async def post(self, url: str, body: bytes, **_: Any) -> RawResponse:
        self.sent += 1
        await trio.sleep(0.1)
        if trio.current_time() < self.until:
            return RawResponse(429, [(b"retry-after", b"1")], b'"slow down"')
        return RawResponse(200, [], b'{"reward": 1.0}')

    async def aclose(self) -> None:
        pass


async def test_429_burst_leaves_the_breaker_closed_and_every_rollout_lands(
    autojump_clock: Any,
) -> None:
    """256 rollouts at 64 in flight through a burst: all 256 land, the breaker stays closed,
    and no re-send takes a budget token (the server paced them)."""
    sink = ListSink()
    async with open_collector(
        config=RunConfig(num_samples_in_parallel=64),
        urls=URLS,
        sink=sink,
        transport=Burst(until=1.5),
        seed=1,
    ) as collector:
        await collector.collect(materialized_rows(256))
    kinds = Counter(o.kind for o in sink.outcomes if isinstance(o, Failed))
    assert kinds == Counter()
    assert sum(isinstance(o, Landed) for o in sink.outcomes) == 256
    counters = collector.retry_state.counters
    assert counters.breaker_transitions["open"] == 0
    assert counters.budget_refusals == 0
    assert counters.retries["http_429"] > 0


class BurstHook:
    """The fake's fault hook: requests in the first `window_s` seconds get 429 + Retry-After."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.started: float | None = None

    def __call__(self, context: FaultContext) -> Fault | None:
        now = trio.current_time()
        self.started = now if self.started is None else self.started
        if now - self.started < self.window_s:
            return Fault(kind="status", status=429, retry_after=0.05)
        return None


async def test_429_burst_through_the_fake_fails_nothing() -> None:
    """Over loopback, default settings: every rollout of a Retry-After burst lands. The burst
    (0.12 s from the first request) is shorter than the three waits of 0.05 s a rollout may make,
    so each rollout's fourth request comes after it, however slow the machine."""
    config = trollout.RunConfig(agent_name="math_agent", num_samples_in_parallel=64)
    spec = DeploymentSpec(agents=(AgentSpec(name="math_agent"),))
    async with (
        open_fake_deployment(spec, fault_fn=BurstHook(window_s=0.12), record_runs=False) as fake,
        trollout.open_rollouts(fake.run_urls, config=config) as rollouts,
    ):
        outcomes = await rollouts.run_batch(rollouts.plan(list(task_rows(256, seed=4))))
        counters = rollouts.collector.retry_state.counters
    failures = Counter(o.outcome.kind for o in outcomes if isinstance(o.outcome, Failed))
    assert failures == Counter()
    assert sum(o.landed for o in outcomes) == 256
    assert counters.breaker_transitions["open"] == 0
