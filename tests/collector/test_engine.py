"""The engine's nursery: limits, back-pressure, cancellation and the single writer.

These tests drive the engine with a scripted transport (a stand-in for the network, not for the
engine) under Trio's fake clock, so they assert exact virtual times.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson
import pytest
import trio

from trollout.collector.engine import open_collector
from trollout.collector.sink import ListSink
from trollout.collector.transport import RawResponse
from trollout.config import RunConfig
from trollout.errors import RunStoppedError
from trollout.records import Failed, Landed, MaterializedRow, OmitReason, Omitted


def make_rows(n: int, *, agent: str = "agent") -> list[MaterializedRow]:
    """Build n materialized rows, one task each."""
    return [
        MaterializedRow.from_body(
            {
                "responses_create_params": {"input": [{"role": "user", "content": f"q{i}"}]},
                "agent_ref": {"name": agent},
                "_ng_task_index": i,
                "_ng_rollout_index": 0,
            }
        )
        for i in range(n)
    ]


class ScriptedTransport:
    """Answers each POST after a scripted delay with a scripted status; counts what is in flight."""

    def __init__(
        self,
        *,
        delay: Callable[[Mapping[str, Any]], float] = lambda row: 1.0,
        status: Callable[[Mapping[str, Any]], int] = lambda row: 200,
    ) -> None:
        self.delay = delay
        self.status = status
        self.in_flight = 0
        self.max_in_flight = 0
        self.requests: list[tuple[int, int]] = []

    async def post(self, url: str, body: bytes, **_: Any) -> RawResponse:
        row = orjson.loads(body)
        self.requests.append((row["_ng_task_index"], row["_ng_rollout_index"]))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await trio.sleep(self.delay(row))
        finally:
            self.in_flight -= 1
        status = self.status(row)
        reply = {"response": {"output": []}, "reward": float(row["_ng_task_index"] % 2)}
        body_out = orjson.dumps(reply) if status == 200 else b'"boom"'
        return RawResponse(status=status, headers=[], body=body_out, truncated=False)

    async def aclose(self) -> None:
        pass


URLS = {"agent": "http://127.0.0.1:1"}


async def test_engine_bounds_requests_and_resident_tasks(autojump_clock: Any) -> None:
    """In flight never exceeds the limiter and reaches it; resident tasks stop at the workers."""
    transport = ScriptedTransport()
    sink = ListSink()
    config = RunConfig(num_samples_in_parallel=8, max_resident_rollout_tasks=12)
    async with open_collector(
        config=config,
        urls=URLS,
        sink=sink,
        transport=transport,  # type: ignore[arg-type]
    ) as collector:
        await collector.collect(make_rows(100))
    assert transport.max_in_flight == 8
    assert collector.max_resident == 12
    assert len(sink.outcomes) == 100
    assert all(isinstance(o, Landed) for o in sink.outcomes)


async def test_engine_runs_in_exact_virtual_time(autojump_clock: Any) -> None:
    """100 one-second rollouts at concurrency 10 take exactly 10 virtual seconds."""
    start = trio.current_time()
    async with open_collector(
        config=RunConfig(num_samples_in_parallel=10),
        urls=URLS,
        transport=ScriptedTransport(),  # type: ignore[arg-type]
    ) as collector:
        progress = await collector.collect(make_rows(100))
    assert trio.current_time() - start == pytest.approx(10.0)
    assert progress.landed == 100
    assert progress.mean_reward == pytest.approx(0.5)


async def test_engine_failed_rollout_does_not_abort_run(autojump_clock: Any) -> None:
    """A 500 on some rollouts lands them in failures; every other rollout still lands."""
    transport = ScriptedTransport(status=lambda row: 500 if row["_ng_task_index"] % 5 == 0 else 200)
    sink = ListSink()
    async with open_collector(
        config=RunConfig(num_samples_in_parallel=4),
        urls=URLS,
        sink=sink,
        transport=transport,  # type: ignore[arg-type]
    ) as collector:
        await collector.collect(make_rows(20))
    failed = [o for o in sink.outcomes if isinstance(o, Failed)]
    assert sorted(o.identity.task_index for o in failed) == [0, 5, 10, 15]
    assert {o.failure_class for o in failed} == {"agent_run_error"}
    assert collector.progress.landed == 16


async def test_engine_cancellation_settles_in_flight_as_omitted(autojump_clock: Any) -> None:
    """Cancelling the run turns each rollout in flight into exactly one Omitted outcome."""
    transport = ScriptedTransport(delay=lambda row: 1.0 if row["_ng_task_index"] < 4 else 100.0)
    sink = ListSink()
    with trio.move_on_after(5.0):
        async with open_collector(
            config=RunConfig(num_samples_in_parallel=4),
            urls=URLS,
            sink=sink,
            transport=transport,  # type: ignore[arg-type]
        ) as collector:
            await collector.collect(make_rows(20))
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
        async with open_collector(
            config=RunConfig(num_samples_in_parallel=2, fail_fast=True),
            urls=URLS,
            sink=sink,
            transport=transport,  # type: ignore[arg-type]
        ) as collector:
            await collector.collect(make_rows(50))
    assert len(sink.outcomes) < 50
    assert any(isinstance(o, Failed) for o in sink.outcomes)


async def test_engine_submit_and_next_outcome_for_drivers(autojump_clock: Any) -> None:
    """An embedding driver submits rows and reads settled outcomes as they come."""
    transport = ScriptedTransport(delay=lambda row: float(10 - row["_ng_task_index"]))
    async with open_collector(
        config=RunConfig(num_samples_in_parallel=10),
        urls=URLS,
        retain_outcomes=True,
        transport=transport,  # type: ignore[arg-type]
    ) as collector:
        for row in make_rows(3):
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
        async with open_collector(
            config=RunConfig(num_samples_in_parallel=4),
            urls=URLS,
            sink=sink,
            transport=transport,  # type: ignore[arg-type]
        ) as collector:
            for row in make_rows(4):
                await collector.submit(row)
            await trio.sleep(2)
            raise KeyError("driver bug")

    with pytest.raises(KeyError, match="driver bug"):
        await drive()
    kinds = sorted((type(o).__name__, o.identity.task_index) for o in sink.outcomes)
    assert kinds == [("Landed", 0), ("Omitted", 1), ("Omitted", 2), ("Omitted", 3)]
