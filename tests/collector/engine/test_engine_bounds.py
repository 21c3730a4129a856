"""The engine's resources are bounded by the work, and a failing sink ends the run, never hangs.

Scripted transports and sinks (stand-ins for the network and the disk, not for the engine)
under Trio's fake clock, so times are exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import trio

from builders import URLS, ScriptedTransport
from builders import materialized_rows as make_rows
from trollout.collector.engine.collector import open_collector
from trollout.collector.engine.sink import ListSink
from trollout.errors import RunFolderWriteError
from trollout.records import Identity, Landed, OmitReason, Omitted, Outcome
from trollout.settings import RunConfig


async def test_engine_starts_no_more_workers_than_rollouts(autojump_clock: Any) -> None:
    """--concurrency 1000000 over 3 rows starts 3 workers, and all 3 run at once."""
    transport = ScriptedTransport()
    config = RunConfig(num_samples_in_parallel=1_000_000)
    async with open_collector(config=config, urls=URLS, transport=transport) as collector:
        start = trio.current_time()
        await collector.collect(make_rows(3))
        assert trio.current_time() - start == pytest.approx(1.0)
    assert collector._spawned == 3
    assert collector.max_resident == 3
    assert transport.max_in_flight == 3


async def test_engine_reuses_idle_workers_before_starting_more(autojump_clock: Any) -> None:
    """Rows fed one at a time, each after the last settled, need a single worker."""
    config = RunConfig(num_samples_in_parallel=64)
    async with open_collector(
        config=config, urls=URLS, transport=ScriptedTransport(), retain_outcomes=True
    ) as collector:
        for row in make_rows(5):
            await collector.submit(row)
            await collector.next_outcome()
    assert collector._spawned == 1


class FailingSink(ListSink):
    """Accepts ``good`` batches, then fails every write as a full disk does."""

    def __init__(self, good: int) -> None:
        super().__init__()
        self.good = good
        self.calls = 0

    async def write(self, outcomes: Sequence[Outcome]) -> None:
        self.calls += 1
        if self.calls > self.good:
            raise RunFolderWriteError("cannot append to 'r.jsonl': No space left on device")
        await super().write(outcomes)


async def test_engine_sink_failure_stops_the_run_without_hanging(autojump_clock: Any) -> None:
    """The first failed write cancels rollouts in flight at once; the block raises it."""
    fast_then_slow = ScriptedTransport(delay=lambda row: 1.0 if row["_ng_task_index"] < 1 else 50)
    sink = FailingSink(good=0)
    config = RunConfig(num_samples_in_parallel=4)
    start = trio.current_time()
    with pytest.raises(RunFolderWriteError, match="No space left"):
        async with open_collector(
            config=config, urls=URLS, sink=sink, transport=fast_then_slow
        ) as collector:
            await collector.collect(make_rows(40))
    assert trio.current_time() - start == pytest.approx(1.0)  # not 50: in flight was cancelled
    # Admission closed at the failure: 4 in flight, and at most the row a freed worker took.
    assert collector.progress.submitted in (4, 5)
    assert sink.outcomes == []
    assert collector.stop_reason is not None
    assert "could not be written" in collector.stop_reason


async def test_engine_sink_failure_later_keeps_what_was_written(autojump_clock: Any) -> None:
    """Batches written before the failure stay written; the rest is left for a resume."""
    sink = FailingSink(good=2)
    with pytest.raises(RunFolderWriteError):
        async with open_collector(
            config=RunConfig(num_samples_in_parallel=2),
            urls=URLS,
            sink=sink,
            transport=ScriptedTransport(),
        ) as collector:
            await collector.collect(make_rows(20))
    assert 0 < len(sink.outcomes) < 20
    assert all(isinstance(o, Landed) for o in sink.outcomes)


class FailingReserver(ListSink):
    """A sink whose attempt reservation fails (the ledger's disk is full)."""

    async def reserve(self, attempts: Sequence[tuple[Identity, int]]) -> None:
        raise RunFolderWriteError("cannot append to 'r_attempts.jsonl': No space left on device")


async def test_engine_reservation_failure_sends_nothing(autojump_clock: Any) -> None:
    """A ledger that cannot be written stops the run before any request leaves."""
    transport = ScriptedTransport()
    with pytest.RaisesGroup(RunFolderWriteError, allow_unwrapped=True, flatten_subgroups=True):
        async with open_collector(
            config=RunConfig(), urls=URLS, sink=FailingReserver(), transport=transport
        ) as collector:
            await collector.collect(make_rows(10))
    assert transport.requests == []


async def test_engine_cancelled_during_the_failing_write_still_ends(autojump_clock: Any) -> None:
    """A surrounding cancel after a sink failure ends the block; in-flight rows settle omitted."""
    with trio.move_on_after(0.5):
        async with open_collector(
            config=RunConfig(num_samples_in_parallel=3),
            urls=URLS,
            sink=FailingSink(good=0),
            transport=ScriptedTransport(),
            retain_outcomes=True,
        ) as collector:
            await collector.collect(make_rows(3))
    retained = collector.drain_nowait()
    assert [o.reason for o in retained if isinstance(o, Omitted)] == [OmitReason.INTERRUPTED] * 3
    assert trio.current_time() == pytest.approx(0.5)
