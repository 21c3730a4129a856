"""A number goes on record only for a request about to leave (pool.py's design note).

On the fake clock, with a reserver that records in memory: every request's number was reserved
before it was posted, and at every quiet instant nothing is reserved that was not sent, so a
kill at any such instant spends no number; stopping admission leaves nothing reserved either.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import httpx
import orjson
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import URLS, ScriptedTransport, collect_scripted, materialized_rows
from trollout.collector.engine.collector import open_collector
from trollout.collector.engine.sink import ListSink
from trollout.collector.http.transport import RawResponse
from trollout.records import Delivery, Failed, Identity
from trollout.settings import RunConfig

Key = tuple[int, int, int]


class ReservingSink(ListSink):
    """A sink that reserves attempt numbers in memory."""

    def __init__(self) -> None:
        super().__init__()
        self.reserved: list[Key] = []

    async def reserve(self, attempts: Sequence[tuple[Identity, int]]) -> None:
        """Record the numbers (no checkpoint, as the run folder's store under ``batch``)."""
        self.reserved.extend((i.task_index, i.rollout_index, a) for i, a in attempts)


class CheckingTransport(ScriptedTransport):
    """Answers after a scripted delay, noting each request and whether it was reserved first."""

    def __init__(self, sink: ReservingSink, delays: list[int]) -> None:
        super().__init__(delay=lambda row: delays[row["_ng_task_index"] % len(delays)])
        self.sink = sink
        self.sent: list[Key] = []
        self.unreserved: list[Key] = []

    async def post(self, url: str, body: bytes, **kw: Any) -> RawResponse:
        row = orjson.loads(body)
        key = (row["_ng_task_index"], row["_ng_rollout_index"], row.get("_ng_attempt_index", 0))
        if key not in self.sink.reserved:
            self.unreserved.append(key)
        self.sent.append(key)
        return await super().post(url, body, **kw)


async def run(
    rows: int, concurrency: int, delays: list[int], stop_at: float
) -> tuple[ReservingSink, CheckingTransport, list[tuple[int, int]]]:
    """Collect ``rows`` and stop admission at ``stop_at``; note (reserved, sent) when quiet."""
    sink = ReservingSink()
    transport = CheckingTransport(sink, delays)
    quiet: list[tuple[int, int]] = []
    config = RunConfig(num_samples_in_parallel=concurrency)
    async with (
        open_collector(config=config, urls=URLS, sink=sink, transport=transport) as collector,
        trio.open_nursery() as nursery,
    ):

        async def watch() -> None:
            # Delays are whole seconds: at every half second nothing is between two steps.
            for tick in range(2 * rows + 4):
                await trio.sleep_until(tick + 0.5)
                quiet.append((len(sink.reserved), len(transport.sent)))

        async def stop() -> None:
            await trio.sleep_until(stop_at)
            collector.stop_admission("the test stops admission")

        nursery.start_soon(watch)
        nursery.start_soon(stop)
        await collector.collect(materialized_rows(rows))
        nursery.cancel_scope.cancel()
    return sink, transport, quiet


@settings(max_examples=100, deadline=None)
@given(
    rows=st.integers(1, 40),
    concurrency=st.integers(1, 8),
    delays=st.lists(st.integers(1, 3), min_size=1, max_size=4),
    stop_at=st.sampled_from([0.5, 1.5, 2.5, 4.5, 1000.0]),
)
def test_reservation_only_for_requests_that_leave(
    rows: int, concurrency: int, delays: list[int], stop_at: float
) -> None:
    """Reserved before sent, and never reserved unless sent: at quiet instants and at the end."""
    sink, transport, quiet = trio.run(
        run, rows, concurrency, delays, stop_at, clock=trio.testing.MockClock(autojump_threshold=0)
    )
    assert transport.unreserved == []
    for reserved, sent in quiet:
        assert reserved == sent, quiet  # a kill here would spend no number
    assert Counter(sink.reserved) == Counter(transport.sent)
    if stop_at > 100:
        assert len(transport.sent) == rows


class RefusedAfterA503:
    """Answers the first request 503 (Retry-After 0), then refuses every connection."""

    def __init__(self) -> None:
        self.posts = 0

    async def post(self, url: str, body: bytes, **_: Any) -> RawResponse:
        self.posts += 1
        if self.posts == 1:
            return RawResponse(status=503, headers=[(b"retry-after", b"0")], body=b'"busy"')
        raise httpx.ConnectError("connection refused")

    async def aclose(self) -> None:
        pass


async def test_attempt_seen_by_the_server_is_never_released_as_not_sent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A 503 then a refused re-send of the same attempt: the failure is not not_sent."""
    sink = ListSink()
    transport = RefusedAfterA503()
    await collect_scripted(1, transport, sink=sink, max_connect_retries=0)
    assert transport.posts == 2
    (outcome,) = sink.outcomes
    assert isinstance(outcome, Failed)
    assert outcome.delivery is not Delivery.NOT_SENT
