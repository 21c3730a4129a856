"""Every rollout the collector accepted settles exactly once, whatever ends the block.

The invariant (engine.py's docstring): a row handed to a worker produces exactly one outcome
(Landed, Failed or Omitted) that reaches the sink, on a normal exit, a cancelled scope, a
driver's exception or `wind_down`. Exits land at random virtual instants, often exactly when
rollouts finish, which is when a hand-over that is not protected loses an outcome.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import URLS, ScriptedTransport, materialized_rows
from trollout.collector.engine.collector import open_collector
from trollout.collector.engine.sink import ListSink
from trollout.collector.http.transport import RawResponse
from trollout.enrichment import Enricher, EnrichmentOptions
from trollout.errors import RunStoppedError
from trollout.records import Landed
from trollout.settings import RunConfig

EXITS = ("cancel", "raise", "wind_down", "cancel_in_flight", "normal")


class DriverQuit(Exception):
    """The driver's own error, leaving the block early."""


class NurseryTransport(ScriptedTransport):
    """Waits for its reply inside a nursery of its own, as happy eyeballs does.

    A cancellation then reaches the worker as a `BaseExceptionGroup` holding `trio.Cancelled`.
    """

    async def post(self, url: str, body: bytes, **_: Any) -> RawResponse:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)
            response = await super().post(url, body)
            nursery.cancel_scope.cancel()
        return response


async def run_and_exit(
    rows: int, delays: list[int], exit_at: int, how: str, concurrency: int, nested: bool = False
) -> tuple[int, ListSink]:
    """Submit rows one by one and leave the block as ``how`` says at virtual time ``exit_at``."""
    sink = ListSink()
    kind = NurseryTransport if nested else ScriptedTransport
    transport = kind(delay=lambda row: delays[row["_ng_task_index"] % len(delays)])
    config = RunConfig(num_samples_in_parallel=concurrency)
    submitted = 0
    with trio.move_on_at(exit_at if how == "cancel" else float("inf")):
        try:
            async with (
                open_collector(
                    config=config, urls=URLS, sink=sink, transport=transport
                ) as collector,
                trio.open_nursery() as nursery,
            ):
                if how in ("raise", "wind_down", "cancel_in_flight"):
                    nursery.start_soon(leave_at, collector, exit_at, how)
                for row in materialized_rows(rows):
                    await collector.submit(row)
                    submitted += 1
        except* DriverQuit:
            pass
    return submitted, sink


async def leave_at(collector: Any, at: int, how: str) -> None:
    """At virtual time ``at``: raise (the driver fails), cancel in flight, or wind down."""
    await trio.sleep_until(at)
    if how == "raise":
        raise DriverQuit
    if how == "cancel_in_flight":
        collector.cancel_in_flight("the driver stops")
        return
    await collector.wind_down("the driver stops", grace_s=0.5)


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(1, 24),
    delays=st.lists(st.integers(0, 3), min_size=1, max_size=5),
    exit_at=st.integers(0, 6),
    how=st.sampled_from(EXITS),
    concurrency=st.integers(1, 6),
    nested=st.booleans(),
)
def test_engine_settles_every_accepted_rollout_exactly_once(
    rows: int, delays: list[int], exit_at: int, how: str, concurrency: int, nested: bool
) -> None:
    """Whatever ends the block and whenever, each submitted row has one outcome in the sink.

    ``nested``: the transport waits in a nursery, so cancellations arrive in exception groups.
    """
    submitted, sink = trio.run(
        run_and_exit,
        rows,
        delays,
        exit_at,
        how,
        concurrency,
        nested,
        clock=trio.testing.MockClock(autojump_threshold=0),
    )
    settled = Counter(o.identity.task_index for o in sink.outcomes)
    assert sorted(settled) == list(range(submitted)), (submitted, settled)
    assert set(settled.values()) <= {1}


class GatedTransport:
    """Replies when the test opens the gate, as a socket turns readable, then never yields."""

    def __init__(self, expected: int, capture_dir: Path | None = None) -> None:
        self.capture_dir = capture_dir  # the model server's: a line still being written
        self.gate = trio.Event()
        self.all_waiting = trio.Event()
        self.expected = expected
        self.waiting = 0

    async def post(self, url: str, body: bytes, **_: Any) -> RawResponse:
        if self.capture_dir is not None:
            row = orjson.loads(body)
            key = f"{row['_ng_task_index']}-{row['_ng_rollout_index']}"
            (self.capture_dir / f"{key}.capture.jsonl").write_bytes(b'{"partial')
        self.waiting += 1
        if self.waiting == self.expected:
            self.all_waiting.set()
        await self.gate.wait()
        return RawResponse(status=200, headers=[], body=b'{"reward": 1.0}')

    async def aclose(self) -> None:
        pass


@pytest.mark.parametrize("observability", [False, True])
@pytest.mark.parametrize("how", ["cancel_in_flight", "raise", "outer_cancel", "stop"])
async def test_engine_reply_and_exit_in_one_instant_still_settles(
    how: str, observability: bool, tmp_path: Path
) -> None:
    """Replies that wake workers just as the block is left settle: no hand-over is lost.

    With observability on, each worker then enriches its outcome from a capture file whose
    last line is still being written (it waits): the exit reaches it mid-read.
    """
    transport = GatedTransport(4, tmp_path if observability else None)
    sink = ListSink()
    enrichment: dict[str, Any] = {}
    if observability:
        enrichment = {"observability_enabled": True, "model_call_capture_dir": str(tmp_path)}
    with trio.CancelScope() as outer:
        try:
            async with open_collector(
                config=RunConfig(num_samples_in_parallel=4, **enrichment),
                urls=URLS,
                sink=sink,
                transport=transport,
            ) as collector:
                for row in materialized_rows(4):
                    await collector.submit(row)
                await transport.all_waiting.wait()
                transport.gate.set()  # every worker is rescheduled with its reply ...
                if how == "cancel_in_flight":  # ... and its run ends before it runs
                    collector.cancel_in_flight("the driver leaves")
                elif how == "stop":
                    collector.stop("the driver stops the run")
                elif how == "outer_cancel":
                    outer.cancel()
                    await trio.lowlevel.checkpoint()
                else:
                    raise DriverQuit
        except (DriverQuit, RunStoppedError):
            pass
    assert sorted(o.identity.task_index for o in sink.outcomes) == [0, 1, 2, 3]


class CapturingTransport(ScriptedTransport):
    """Its model server leaves each rollout's last capture line half written."""

    def __init__(self, capture_dir: Path, **options: Any) -> None:
        super().__init__(**options)
        self.capture_dir = capture_dir
        self.replied = 0
        self.all_replied = trio.Event()

    async def post(self, url: str, body: bytes, **_: Any) -> RawResponse:
        row = orjson.loads(body)
        key = f"{row['_ng_task_index']}-{row['_ng_rollout_index']}"
        (self.capture_dir / f"{key}.capture.jsonl").write_bytes(b'{"partial')
        response = await super().post(url, body)
        self.replied += 1
        if self.replied == 3:
            self.all_replied.set()
        return response


async def test_enrichment_cancelled_mid_read_settles_each_rollout_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Every rollout landed and waits (fake clock) on a capture line that never ends; the
    driver cancels in flight: each settles once, landed, with the 'cancelled' gap marker."""
    # The wait is unbounded here: with threads (the reads) the fake clock jumps whenever every
    # task waits, so only "never" is a bound no jump can reach.
    options = EnrichmentOptions(observability=True, capture_dir=str(tmp_path), wait_s=1e9)
    sink = ListSink()
    transport = CapturingTransport(tmp_path, delay=lambda row: 0.5)
    async with open_collector(
        urls=URLS, sink=sink, transport=transport, enrich=Enricher(options)
    ) as c:
        for row in materialized_rows(3):
            await c.submit(row)
        await transport.all_replied.wait()
        await trio.sleep(1.0)  # every worker now waits on its capture's last line
        c.cancel_in_flight("the driver leaves")
    assert sorted(o.identity.task_index for o in sink.outcomes) == [0, 1, 2]
    for outcome in sink.outcomes:
        assert isinstance(outcome, Landed)
        assert outcome.reward in (0.0, 1.0)
        [gap] = outcome.result["ng_model_call_capture"]["gaps"]
        assert gap["code"] == "model_call_capture_unreadable"
        assert "cancelled" in gap["detail"]
