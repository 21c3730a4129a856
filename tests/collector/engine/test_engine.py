"""The engine's nursery: limits, back-pressure, cancellation and the single writer.

These tests drive the engine with a scripted transport (a stand-in for the network, not for the
engine) under Trio's fake clock, so they assert exact virtual times.
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
import trio

from builders import (
    ScriptedTransport,
    collect_scripted,
    materialized_rows,
    scripted_collector,
)
from trollout.collector.engine.sink import ListSink
from trollout.collector.http.transport import RawResponse
from trollout.errors import RunStoppedError
from trollout.records import Failed, Landed, OmitReason, Omitted


async def test_engine_bounds_requests_and_resident_tasks(autojump_clock: Any) -> None:
    """In flight never exceeds the limiter and reaches it; resident tasks stop at the workers."""
    transport = ScriptedTransport()
    sink = ListSink()
    collector = await collect_scripted(
        100, transport, sink=sink, num_samples_in_parallel=8, max_resident_rollout_tasks=12
    )
    assert transport.max_in_flight == 8
    assert collector.max_resident == 12
    assert len(sink.outcomes) == 100
    assert all(isinstance(o, Landed) for o in sink.outcomes)


async def test_engine_runs_in_exact_virtual_time(autojump_clock: Any) -> None:
    """100 one-second rollouts at concurrency 10 take exactly 10 virtual seconds."""
    start = trio.current_time()
    progress = (await collect_scripted(100, num_samples_in_parallel=10)).progress
    assert trio.current_time() - start == pytest.approx(10.0)
    assert progress.landed == 100
    assert progress.mean_reward == pytest.approx(0.5)


async def test_engine_times_a_rollout_from_its_token(autojump_clock: Any) -> None:
    """A worker that waited for a concurrency token times its rollout from the token on.

    4 three-second rollouts, 2 tokens, 4 workers: the last two wait 3 s for a token. Their
    outcomes and the run's latency both say 3 s (the clock is read once when a rollout starts,
    and once per settled batch: neither may be a reading from before the wait).
    """
    sink = ListSink()
    transport = ScriptedTransport(delay=lambda row: 3.0)
    collector = await collect_scripted(
        4, transport, sink=sink, num_samples_in_parallel=2, max_resident_rollout_tasks=4
    )
    assert collector.max_resident == 4
    assert [o.elapsed_seconds for o in sink.outcomes] == pytest.approx([3.0] * 4)
    latency = collector.timer.latency()
    assert (latency.finished, latency.max_s, latency.task_hours) == (
        4,
        pytest.approx(3.0),
        pytest.approx(4 * 3.0 / 3600),
    )


async def test_engine_failed_rollout_does_not_abort_run(autojump_clock: Any) -> None:
    """A 500 on some rollouts lands them in failures; every other rollout still lands."""
    transport = ScriptedTransport(status=lambda row: 500 if row["_ng_task_index"] % 5 == 0 else 200)
    sink = ListSink()
    collector = await collect_scripted(20, transport, sink=sink, num_samples_in_parallel=4)
    failed = [o for o in sink.outcomes if isinstance(o, Failed)]
    assert sorted(o.identity.task_index for o in failed) == [0, 5, 10, 15]
    assert {o.failure_class for o in failed} == {"agent_run_error"}
    assert collector.progress.landed == 16


async def test_engine_cancellation_settles_in_flight_as_omitted(autojump_clock: Any) -> None:
    """Cancelling the run turns each rollout in flight into exactly one Omitted outcome."""
    transport = ScriptedTransport(delay=lambda row: 1.0 if row["_ng_task_index"] < 4 else 100.0)
    sink = ListSink()
    with trio.move_on_after(5.0):
        await collect_scripted(20, transport, sink=sink, num_samples_in_parallel=4)
    landed = sorted(o.identity.task_index for o in sink.outcomes if isinstance(o, Landed))
    omitted = [o for o in sink.outcomes if isinstance(o, Omitted)]
    assert landed == [0, 1, 2, 3]
    assert sorted(o.identity.task_index for o in omitted) == [4, 5, 6, 7]
    assert all(o.reason is OmitReason.INTERRUPTED for o in omitted)
    assert all(o.elapsed_seconds == pytest.approx(4.0) for o in omitted)
    assert transport.in_flight == 0


async def test_engine_fail_fast_stops_run(autojump_clock: Any) -> None:
    """With fail_fast, the first failure stops the run with RunStoppedError."""
    transport = ScriptedTransport(status=lambda row: 503 if row["_ng_task_index"] == 3 else 200)
    sink = ListSink()
    with pytest.raises(RunStoppedError, match="fail-fast"):
        await collect_scripted(50, transport, sink=sink, num_samples_in_parallel=2, fail_fast=True)
    assert len(sink.outcomes) < 50
    assert any(isinstance(o, Failed) for o in sink.outcomes)


async def test_engine_submit_and_next_outcome_for_drivers(autojump_clock: Any) -> None:
    """An embedding driver submits rows and reads settled outcomes as they come."""
    transport = ScriptedTransport(delay=lambda row: float(10 - row["_ng_task_index"]))
    async with scripted_collector(
        transport, retain_outcomes=True, num_samples_in_parallel=10
    ) as collector:
        for row in materialized_rows(3):
            await collector.submit(row)
        first = await collector.next_outcome()
        assert first.identity.task_index == 2  # the shortest finishes first
        await trio.sleep(20)
        rest = collector.drain_nowait()
    assert sorted(o.identity.task_index for o in rest) == [0, 1]


async def test_engine_early_exit_drains_settled_outcomes(autojump_clock: Any) -> None:
    """Leaving the block with an error still flushes settled outcomes to the sink."""
    transport = ScriptedTransport(delay=lambda row: 1.0 if row["_ng_task_index"] == 0 else 50.0)
    sink = ListSink()

    async def drive() -> None:
        async with scripted_collector(transport, sink=sink, num_samples_in_parallel=4) as collector:
            for row in materialized_rows(4):
                await collector.submit(row)
            await trio.sleep(2)
            raise KeyError("driver bug")

    with pytest.raises(KeyError, match="driver bug"):
        await drive()
    kinds = sorted((type(o).__name__, o.identity.task_index) for o in sink.outcomes)
    assert kinds == [("Landed", 0), ("Omitted", 1), ("Omitted", 2), ("Omitted", 3)]


# --- the dispatch window, winding down, run-level stops ---------------------------------------


async def test_engine_budget_stops_starting_at_the_deadline(autojump_clock: Any) -> None:
    """With a 10 s budget, 4 s rollouts start at 0, 4 and 8 only; the rest never start."""
    transport = ScriptedTransport(delay=lambda row: 4.0)
    sink = ListSink()
    start = trio.current_time()
    collector = await collect_scripted(
        20,
        transport,
        sink=sink,
        num_samples_in_parallel=2,
        dispatch_budget_s=10.0,
        drain_margin_s=0.0,
    )
    progress = collector.progress
    assert trio.current_time() - start == pytest.approx(12.0)
    assert progress.landed == progress.submitted == 6  # the feeder's deadline stopped the rest
    assert progress.drained == 0
    assert collector.window.closed_reason == "dispatch budget of 10 s spent"


async def test_engine_budget_drains_rows_waiting_for_a_slot(autojump_clock: Any) -> None:
    """A row that waited for a slot past the budget is drained, not started late."""
    transport = ScriptedTransport(delay=lambda row: 4.0)
    sink = ListSink()
    collector = await collect_scripted(
        20,
        transport,
        sink=sink,
        num_samples_in_parallel=2,
        max_resident_rollout_tasks=4,
        dispatch_budget_s=6.0,
        drain_margin_s=0.0,
    )
    progress = collector.progress
    assert progress.landed == 4  # started at 0 and 4
    assert progress.drained == 2  # held by the two waiting workers when slots freed at 8
    drained = [o for o in sink.outcomes if isinstance(o, Omitted)]
    assert [o.reason for o in drained] == [OmitReason.DRAINED] * 2
    assert collector.window.closed_reason == "dispatch budget of 6 s spent"


async def test_engine_default_margin_is_p75_of_finished(autojump_clock: Any) -> None:
    """Once 5 rollouts finished, admission stops a p75 (2 s) before the 10 s budget ends."""
    transport = ScriptedTransport(delay=lambda row: 2.0)
    start = trio.current_time()
    collector = await collect_scripted(
        100, transport, num_samples_in_parallel=5, dispatch_budget_s=10.0
    )
    progress = collector.progress
    assert trio.current_time() - start == pytest.approx(8.0)
    assert progress.landed == 20  # started at 0, 2, 4 and 6; at 8 less than 2 s remained
    assert collector.window.margin() == pytest.approx(2.0)


async def wind_down_after_one_second(grace_s: float) -> ListSink:
    """Run 10-second rollouts at concurrency 3 and wind the run down at t=1."""
    sink = ListSink()
    transport = ScriptedTransport(delay=lambda row: 10.0)
    async with (
        scripted_collector(transport, sink=sink, num_samples_in_parallel=3) as collector,
        trio.open_nursery() as nursery,
    ):

        async def stop_soon() -> None:
            await trio.sleep(1.0)
            await collector.wind_down("test", grace_s=grace_s)

        nursery.start_soon(stop_soon)
        await collector.collect(materialized_rows(10))
    return sink


async def test_engine_wind_down_cancels_after_grace(autojump_clock: Any) -> None:
    """wind_down stops admission, and cancels rollouts still running when the grace ends."""
    sink = await wind_down_after_one_second(grace_s=5.0)
    omitted = [o for o in sink.outcomes if isinstance(o, Omitted)]
    assert len(sink.outcomes) == len(omitted) == 3
    assert all(o.elapsed_seconds == pytest.approx(6.0) for o in omitted)
    assert all(o.reason is OmitReason.INTERRUPTED for o in omitted)


async def test_engine_wind_down_lets_rollouts_finish_within_grace(autojump_clock: Any) -> None:
    """Rollouts that end within the grace period land; nothing new starts meanwhile."""
    sink = await wind_down_after_one_second(grace_s=30.0)
    assert sorted(type(o).__name__ for o in sink.outcomes) == ["Landed"] * 3
    assert trio.current_time() == pytest.approx(10.0)


async def test_engine_stops_when_credentials_are_rejected(autojump_clock: Any) -> None:
    """Five consecutive 401s from one server stop the run with a message naming it."""
    transport = ScriptedTransport(status=lambda row: 401)
    with pytest.raises(RunStoppedError, match="credentials rejected by 'agent'"):
        await collect_scripted(50, transport, num_samples_in_parallel=1, stop_after_auth_failures=5)
    assert len(transport.requests) <= 6


class ReservingSink(ListSink):
    """A sink that also records attempt reservations, in order, beside the outcomes."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, int, int]] = []

    async def reserve(self, attempts: Any) -> None:
        self.events += [("reserve", identity.task_index, attempt) for identity, attempt in attempts]

    async def write(self, outcomes: Any) -> None:
        await super().write(outcomes)
        self.events += [
            (type(o).__name__, o.identity.task_index, o.attempt_index) for o in outcomes
        ]


class DropsFirstReply(ScriptedTransport):
    """Loses the connection after sending task 0's first request, then answers normally."""

    def __init__(self, events: list[tuple[str, int, int]]) -> None:
        super().__init__()
        self.events = events

    async def post(self, url: str, body: bytes, **kw: Any) -> RawResponse:
        row = orjson.loads(body)
        self.events.append(("send", row["_ng_task_index"], row.get("_ng_attempt_index", 0)))
        if row["_ng_task_index"] == 0 and "_ng_attempt_index" not in row:
            await trio.sleep(1.0)
            raise httpx.ReadError("connection lost after the request went out")
        return await super().post(url, body, **kw)


async def test_engine_retry_requests_resends_under_a_new_reserved_attempt(
    autojump_clock: Any,
) -> None:
    """A possibly-delivered request is recorded as failed and re-sent as reserved attempt 1."""
    sink = ReservingSink()
    transport = DropsFirstReply(sink.events)
    await collect_scripted(
        2, transport, sink=sink, seed=1, num_samples_in_parallel=2, retry_requests=True
    )
    task0 = [event for event in sink.events if event[1] == 0]
    assert sorted(task0) == [
        ("Failed", 0, 0),
        ("Landed", 0, 1),
        ("reserve", 0, 0),
        ("reserve", 0, 1),
        ("send", 0, 0),
        ("send", 0, 1),
    ]
    assert task0.index(("reserve", 0, 0)) < task0.index(("send", 0, 0))
    assert task0.index(("reserve", 0, 1)) < task0.index(("send", 0, 1))
    failed = next(o for o in sink.outcomes if isinstance(o, Failed))
    assert failed.delivery.value == "possibly_delivered"
