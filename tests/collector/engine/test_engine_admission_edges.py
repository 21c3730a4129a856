"""Admission at the edges of a cancellation, and an observer that misbehaves.

Rows lent to the workers (`pool.Pool.feed`) must not start once the code that lent them was
cancelled, nor once a worker's own deadline has passed, even in the very step the cancellation
happens; and an observer (telemetry's hook, or a driver's own) can never fail a rollout, change
what the transport is called with, or keep an accepted rollout from settling.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import trio
import trio.testing

from builders import URLS, ScriptedTransport, materialized_rows
from trollout.collector.engine.collector import open_collector
from trollout.collector.engine.sink import ListSink
from trollout.collector.http.transport import RawResponse
from trollout.records import Failed, Landed, MaterializedRow, Omitted
from trollout.settings import RunConfig


async def test_cancelled_collect_starts_no_lent_row_in_the_same_instant(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """`collect` cancelled at the instant its workers' replies arrive: nothing more is sent.

    The workers finish in the same scheduling step as the cancellation; a lent row a worker
    took then would go out after `collect` was cancelled. Twenty rounds, since Trio runs the
    tasks of one step in varying order.
    """
    for _ in range(20):
        transport = ScriptedTransport(delay=lambda row: 1.0)
        sink = ListSink()
        config = RunConfig(num_samples_in_parallel=4)
        async with open_collector(
            config=config, urls=URLS, sink=sink, transport=transport
        ) as collector:
            with trio.move_on_after(1.0):
                await collector.collect(materialized_rows(40))
        assert len(transport.requests) == 4
        assert Counter(type(o).__name__ for o in sink.outcomes) == {"Landed": 4}


async def test_worker_whose_deadline_passed_in_this_step_takes_no_row(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A deadline that passed while a reply was handled (not yet delivered) stops the next row.

    The transport moves the clock past the block's deadline as it returns, as a slow step on a
    busy machine would; the worker must not take a lent row and send it only to be interrupted.
    """

    class SlowStep(ScriptedTransport):
        async def post(self, url: str, body: bytes, **options: Any) -> RawResponse:
            reply = await super().post(url, body, **options)
            autojump_clock.jump(5.0)
            return reply

    transport = SlowStep(delay=lambda row: 0.5)
    sink = ListSink()
    with trio.move_on_after(1.0):
        async with open_collector(
            config=RunConfig(num_samples_in_parallel=1), urls=URLS, sink=sink, transport=transport
        ) as collector:
            await collector.collect(materialized_rows(5))
    assert transport.requests == [(0, 0)]
    assert [type(o) for o in sink.outcomes] == [Landed]


class RaisingObserver:
    """An observer whose every hook raises (a driver's buggy one)."""

    def __init__(self, headers: bytes = b"") -> None:
        self.headers = headers
        self.calls = 0

    def attempt_started(self, row: MaterializedRow, attempt: int, url: str) -> Any:
        self.calls += 1
        if self.headers:
            return self  # a trace whose header lines are malformed
        raise RuntimeError("attempt_started broke")

    def retry_wait(self, trace: Any, reason: str, delay_s: float) -> None:
        raise RuntimeError("retry_wait broke")

    def attempt_ended(self, trace: Any, outcome: Landed | Failed | None, retries: int) -> None:
        raise RuntimeError("attempt_ended broke")

    def outcome_settled(self, outcome: Any, final: bool) -> None:
        raise RuntimeError("outcome_settled broke")


class PlainTransport:
    """A driver's transport written before headers existed: ``post(url, body)`` only."""

    def __init__(self) -> None:
        self.inner = ScriptedTransport(delay=lambda row: 1.0 + row["_ng_task_index"] % 3)

    async def post(self, url: str, body: bytes) -> RawResponse:
        return await self.inner.post(url, body)

    async def aclose(self) -> None:
        pass


async def test_observer_that_raises_fails_no_rollout_and_loses_none_on_cancel(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Hooks that raise, an old-style transport, a cancel mid-run: every accepted row settles
    exactly once, the landed ones as successes."""
    observer = RaisingObserver()
    transport = PlainTransport()
    sink = ListSink()
    with trio.move_on_after(2.5):
        async with open_collector(
            config=RunConfig(num_samples_in_parallel=4),
            urls=URLS,
            sink=sink,
            transport=transport,  # type: ignore[arg-type]
            observer=observer,  # type: ignore[arg-type]
        ) as collector:
            await collector.collect(materialized_rows(12))
    assert observer.calls > 0
    keys = Counter((o.identity.task_index, o.identity.rollout_index) for o in sink.outcomes)
    assert set(keys.values()) == {1}
    assert len(keys) == len(transport.inner.requests)
    assert not [o for o in sink.outcomes if isinstance(o, Failed)]
    assert {type(o) for o in sink.outcomes} == {Landed, Omitted}


async def test_observer_header_lines_that_could_break_framing_are_not_sent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Header lines from an observer that are not well-formed CRLF lines are dropped."""
    seen: list[Any] = []

    class Recording(ScriptedTransport):
        async def post(self, url: str, body: bytes, **options: Any) -> RawResponse:
            seen.append(options.get("headers", b""))
            return await super().post(url, body)

    sink = ListSink()
    async with open_collector(
        urls=URLS,
        sink=sink,
        transport=Recording(delay=lambda row: 0.1),
        observer=RaisingObserver(headers=b"x-a: 1\r\nInjected\r\n\r\nGET / HTTP/1.1"),  # type: ignore[arg-type]
    ) as collector:
        await collector.collect(materialized_rows(3))
    assert seen == [b"", b"", b""]
    assert [type(o) for o in sink.outcomes] == [Landed] * 3
