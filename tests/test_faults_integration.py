"""Time and faults over loopback: rate-limited, dead and hanging endpoints; model-server queues.

These run against `trollout.testing`'s fake deployment on real sockets and the real clock, so
they assert what happened (counts, order, the server's arrival times), never how long it took;
the exact timings are unit tests under Trio's fake clock (test_dispatch, test_retry).
"""

from __future__ import annotations

import itertools
import random
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import httpx
import trio

from builders import HANG_GUARD_S, materialized_rows, wait_until
from trollout.collector.dispatch.request import DispatchPolicy, dispatch
from trollout.collector.dispatch.retry import RetryPolicy, RetryState
from trollout.collector.engine.collector import open_collector
from trollout.collector.engine.sink import ListSink
from trollout.collector.engine.timing import RunTimer, TimingBounds
from trollout.collector.http.transport import Http11Transport
from trollout.records import Delivery, Failed, Landed, MaterializedRow
from trollout.settings import RunConfig
from trollout.testing import (
    AgentSpec,
    DeploymentSpec,
    Fault,
    FaultContext,
    FaultPlan,
    Generation,
    Latency,
    open_fake_deployment,
)


def always(fault: Fault) -> FaultPlan:
    """A plan that gives every request `fault`."""
    return FaultPlan(rate=1.0, mix=((fault, 1.0),))


RATE_LIMITED = DeploymentSpec(
    agents=(
        AgentSpec(name="busy", faults=always(Fault(kind="status", status=429, retry_after=1))),
    ),
    generation=Generation.LEGACY,
)


class ArrivalTimes:
    """A fault callable that only records when each task's `/run` requests arrive."""

    def __init__(self) -> None:
        self.by_task: dict[int, list[float]] = defaultdict(list)

    def __call__(self, context: FaultContext) -> None:
        self.by_task[context.task_index].append(trio.current_time())


async def test_rate_limited_endpoint_is_waited_for_as_asked_and_bounded_per_rollout() -> None:
    """429 + Retry-After: 1 forever: each rollout re-sends after at least the second asked, at
    most max_request_retries times, then ends agent_request_failed; no budget is spent."""
    retries, rollouts = 2, 6
    state = RetryState(
        RetryPolicy(
            budget=0, max_request_retries=retries, backoff_base_s=0.05, max_connect_retries=0
        )
    )
    policy = DispatchPolicy(5.0, 5.0, retry=state.policy)
    outcomes: list[Landed | Failed] = []
    arrivals = ArrivalTimes()
    async with (
        open_fake_deployment(RATE_LIMITED, fault_fn=arrivals) as fake,
        policy.make_transport() as transport,
    ):
        url = fake.run_urls["busy"] + "/run"

        async def one(row: MaterializedRow) -> None:
            rng = random.Random(row.identity.task_index)
            outcomes.append(
                await dispatch(transport, url, row, 0, policy, rng=rng, retry_state=state)
            )

        async with trio.open_nursery() as nursery:
            for row in materialized_rows(rollouts, agent="busy"):
                nursery.start_soon(one, row)
        received = fake.stats.by_path["/run"]
    assert received == rollouts * (1 + retries)
    assert len(outcomes) == rollouts
    assert {(o.failure_class, o.http_status) for o in outcomes if isinstance(o, Failed)} == {
        ("agent_request_failed", 429)
    }
    assert state.counters.retries["http_429"] == rollouts * retries
    assert state.counters.budget_refusals == 0
    # Retry-After was honoured: the server saw each re-send at least 1 s after the one before,
    # and never more than 10 % later (measured between arrivals, so only the lower bound is
    # asserted here; the upper one is timed on the fake clock in test_retry).
    gaps = [b - a for times in arrivals.by_task.values() for a, b in itertools.pairwise(times)]
    assert len(gaps) == rollouts * retries
    assert min(gaps) >= 1.0


async def test_rate_limited_run_through_the_engine_is_bounded_per_rollout() -> None:
    """Through open_collector, each 429-forever rollout sends at most 1 + max_request_retries."""
    config = RunConfig(num_samples_in_parallel=8, max_request_retries=1, retry_backoff_base_s=0.01)
    sink = ListSink()
    async with open_fake_deployment(RATE_LIMITED) as fake:
        async with open_collector(config=config, urls=fake.run_urls, sink=sink, seed=1) as c:
            await c.collect(materialized_rows(5, agent="busy"))
        received = fake.stats.by_path["/run"]
    assert received == 5 * 2
    assert {(o.failure_class, o.kind) for o in sink.outcomes if isinstance(o, Failed)} == {
        ("agent_request_failed", "http_429")
    }


MIXED = DeploymentSpec(
    agents=(
        AgentSpec(name="good", latency=Latency(fixed_s=0.05)),
        AgentSpec(name="dead", refuse=True),
        AgentSpec(name="stuck", faults=always(Fault(kind="hang"))),
    ),
)


async def test_dead_and_hanging_endpoints_fail_typed_while_others_complete() -> None:
    """Refused and hanging endpoints end within their limits; the good agent's rollouts land
    (on_endpoint_outage=fail: the dead agent's rollouts fail, the others go on)."""
    config = RunConfig(
        num_samples_in_parallel=16,
        connect_timeout_s=1.0,
        max_connect_retries=2,
        dispatch_connect_grace_s=0.5,
        rollout_timeout_s=1.0,
        on_endpoint_outage="fail",
    )
    rows = (
        materialized_rows(4, agent="good")
        + materialized_rows(4, agent="dead", first_task=10)
        + materialized_rows(4, agent="stuck", first_task=20)
    )
    random.Random(0).shuffle(rows)
    sink = ListSink()
    async with open_fake_deployment(MIXED) as fake:
        with trio.fail_after(HANG_GUARD_S):
            async with open_collector(config=config, urls=fake.run_urls, sink=sink, seed=3) as c:
                await c.collect(rows)
    order = [o.identity.agent_name for o in sink.outcomes]
    by_agent: dict[str, list[Landed | Failed]] = {}
    for outcome in sink.outcomes:
        assert isinstance(outcome, Landed | Failed)
        by_agent.setdefault(outcome.identity.agent_name or "", []).append(outcome)
    assert all(isinstance(o, Landed) for o in by_agent["good"])
    # Not behind the hangs: every good rollout settled before the first stuck one timed out.
    assert max(i for i, agent in enumerate(order) if agent == "good") < order.index("stuck")
    dead = {
        (o.failure_class, o.kind, o.delivery) for o in by_agent["dead"] if isinstance(o, Failed)
    }
    # Each ends on its own connect retries (spent while the breaker was still closed) or, held
    # by the open breaker, at the end of the outage grace; never sent, never spending.
    assert dead <= {
        ("agent_request_failed", "connect", Delivery.NOT_SENT),
        ("agent_request_failed", "endpoint_down", Delivery.NOT_SENT),
    }
    assert c.retry_state.counters.retries["connect"] <= 4 * 2
    stuck = [o for o in by_agent["stuck"] if isinstance(o, Failed)]
    assert {(o.failure_class, o.kind, o.terminal) for o in stuck} == {
        ("agent_request_failed", "timeout", False)
    }
    # Ended by the limit (the timeout path names it). That it fires at the limit exactly, never
    # earlier, is timed on the fake clock: test_dispatch_rollout_timeout_ends_a_hang_at_the_limit
    # in tests/collector/dispatch/test_retry.py.
    assert all("rollout_timeout_s=1.0" in (o.message or "") for o in stuck)
    assert len(sink.outcomes) == 12


async def test_dead_endpoint_is_probed_then_its_rollouts_end_at_the_grace() -> None:
    """A refused endpoint trips its breaker; the rollouts it holds wait while probes go out one
    per open period, and all end endpoint_down, unsent, once it has been silent for the grace."""
    retry = RetryPolicy(
        breaker_failure_threshold=3,
        breaker_open_s=0.2,
        backoff_base_s=0.05,
        max_connect_retries=5,
        outage_grace_s=1.0,
    )
    state = RetryState(retry)
    policy = DispatchPolicy(1.0, 1.0, retry=retry)
    outcomes: list[Landed | Failed] = []
    async with open_fake_deployment(MIXED) as fake, policy.make_transport() as transport:
        url = fake.run_urls["dead"] + "/run"

        async def one(row: MaterializedRow) -> None:
            rng = random.Random(row.identity.task_index)
            outcomes.append(
                await dispatch(transport, url, row, 0, policy, rng=rng, retry_state=state)
            )

        with trio.fail_after(HANG_GUARD_S):
            async with trio.open_nursery() as nursery:
                for row in materialized_rows(6, agent="dead"):
                    nursery.start_soon(one, row)
    assert len(outcomes) == 6
    assert {(o.kind, o.delivery) for o in outcomes if isinstance(o, Failed)} == {
        ("endpoint_down", Delivery.NOT_SENT)
    }
    assert all(not o.spends_attempt for o in outcomes if isinstance(o, Failed))
    transitions = state.counters.breaker_transitions
    assert transitions["open"] >= 2  # opened, probed (half open), re-opened: probes went out
    assert transitions["half_open"] >= 1
    assert state.counters.outages == {state.endpoint(url).endpoint: 6}
    assert "gave no answer for" in (outcomes[0].message or "")


# --- model-server queues ------------------------------------------------------------------------

QUEUED = DeploymentSpec(
    agents=(AgentSpec(name="slow"),), generation=Generation.LEGACY, max_running=1
)


@asynccontextmanager
async def busy_deployment(hanging: int) -> AsyncIterator[str]:
    """Serve a fake whose model server reports `hanging` requests (1 running); yield /metrics."""
    all_in = trio.Event()
    seen: list[FaultContext] = []

    def hang(context: FaultContext) -> Fault:
        # Called as each /run arrives; the server counts it in flight before its next checkpoint.
        seen.append(context)
        if len(seen) == hanging:
            all_in.set()
        return Fault(kind="hang")

    transport = Http11Transport(connect_timeout_s=2, read_timeout_s=30)
    async with (
        open_fake_deployment(QUEUED, fault_fn=hang) as fake,
        httpx.AsyncClient(transport=transport) as client,
        trio.open_nursery() as nursery,
    ):
        for row in materialized_rows(hanging, agent="slow"):
            url, body = fake.run_urls["slow"] + "/run", row.request_body()
            nursery.start_soon(partial(client.post, url, json=body))
        await all_in.wait()
        yield fake.urls.metrics_urls[0]
        nursery.cancel_scope.cancel()


async def test_timing_report_sums_vllm_queues_over_servers() -> None:
    """The sampler sums waiting/running over two model servers; the report warns on the ratio."""
    timer = RunTimer(TimingBounds(server_queue_max_waiting_ratio=1.0), expected=5)
    async with busy_deployment(3) as first, busy_deployment(2) as second:
        transport = Http11Transport(connect_timeout_s=2, read_timeout_s=2)
        async with httpx.AsyncClient(transport=transport) as client, trio.open_nursery() as n:
            await n.start(timer.run_queue_sampler, client, [first, second], 0.2)
            await wait_until(lambda: len(timer.samples) >= 2, "two queue samples")
            n.cancel_scope.cancel()
    assert len(timer.samples) >= 2
    for sample in timer.samples:
        assert (sample.waiting, sample.running, sample.servers, sample.errors) == (3.0, 2.0, 2, 0)
    report = timer.report()
    (warning,) = report.warnings
    assert warning.check == "model-server queue waiting/running"
    assert warning.value.startswith("1.50 (mean waiting 3.0, peak 3; mean running 2.0;")
    assert "WARN  model-server queue waiting/running" in report.render()
