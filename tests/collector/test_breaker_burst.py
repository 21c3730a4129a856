"""A 429 burst that honours Retry-After opens the breaker for a moment and fails nothing.

Rollouts the open breaker turns away wait for its probe, then go: 0 ``breaker_open`` failures
(before, 211 of 256 rollouts failed as ``breaker_open`` and 45 more as ``http_429`` here).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import trio

import trollout
from builders import URLS, materialized_rows
from trollout.collector.engine import open_collector
from trollout.collector.sink import ListSink
from trollout.collector.transport import RawResponse
from trollout.config import RunConfig
from trollout.records import Failed, Landed
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


async def test_429_burst_opens_the_breaker_and_every_rollout_lands(autojump_clock: Any) -> None:
    """256 rollouts at 64 in flight through a burst: the breaker opens; all 256 land."""
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
    assert kinds["breaker_open"] == 0
    assert sum(isinstance(o, Landed) for o in sink.outcomes) == 256
    counters = collector.retry_state.counters
    assert counters.breaker_transitions["open"] == 1
    assert counters.breaker_waits == counters.breaker_rejections > 0


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


async def test_429_burst_through_the_fake_ends_with_no_breaker_open_failure() -> None:
    """Over loopback, default budget: a burst shorter than the breaker's open period opens it;
    the probe after it succeeds, and every rollout lands (the window is shorter than the open
    period, so the probe always comes after the burst, however slow the machine)."""
    config = trollout.RunConfig(
        agent_name="math_agent",
        num_samples_in_parallel=64,
        breaker_open_s=0.5,
        retry_backoff_base_s=0.01,
    )
    spec = DeploymentSpec(agents=(AgentSpec(name="math_agent"),))
    async with (
        open_fake_deployment(spec, fault_fn=BurstHook(window_s=0.3), record_runs=False) as fake,
        trollout.open_rollouts(fake.run_urls, config=config) as rollouts,
    ):
        outcomes = await rollouts.run_batch(rollouts.plan(list(task_rows(256, seed=4))))
        counters = rollouts.collector.retry_state.counters
    failures = Counter(o.outcome.kind for o in outcomes if isinstance(o.outcome, Failed))
    assert failures["breaker_open"] == 0
    assert sum(o.landed for o in outcomes) == 256 - sum(failures.values())
    assert counters.breaker_transitions["open"] >= 1
