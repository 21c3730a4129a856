"""Every accepted row settles, whatever ends its rollout: groups, interrupts, slow sinks, bugs.

The exactly-once promise (engine.py's docstring) against the ways a rollout can end that are not
a reply or a plain `trio.Cancelled`: a cancellation that reaches the worker inside an exception
group (a transport waiting in a nursery of its own), a KeyboardInterrupt, an error raised by
`dispatch` itself (a URL the transport refuses, the ledger failing), and a sink write slower than
the teardown bound during a live run. Scripted transports under Trio's fake clock: exact times.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import httpx
import orjson
import pytest
import trio

from builders import URLS, ScriptedTransport, materialized_rows, row_body, scripted_collector
from trollout.collector.engine.collector import open_collector
from trollout.collector.engine.sink import ListSink
from trollout.collector.http.transport import RawResponse
from trollout.errors import ConfigError, RunFolderWriteError
from trollout.records import Failed, Identity, Landed, OmitReason, Omitted, Outcome
from trollout.settings import RunConfig

GUARD_S = 1000.0  # virtual seconds: a run still going by then is hung (the fake clock jumps)


class NurseryTransport:
    """Waits forever inside a nursery of its own, as happy eyeballs or a fan-out driver does.

    Cancelling it raises `trio.Cancelled` wrapped in a `BaseExceptionGroup` (strict groups).
    """

    def __init__(self) -> None:
        self.entered = 0

    async def post(self, url: str, body: bytes, **_: Any) -> RawResponse:
        self.entered += 1
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)
            await trio.sleep_forever()
        raise AssertionError("unreachable")  # pragma: no cover

    async def aclose(self) -> None:
        pass


def interrupted(sink: ListSink) -> list[int]:
    """The tasks the sink holds as interrupted, sorted; fail on any other outcome."""
    assert all(type(o) is Omitted and o.reason is OmitReason.INTERRUPTED for o in sink.outcomes)
    return sorted(o.identity.task_index for o in sink.outcomes)


async def test_batch_exit_settles_rollouts_cancelled_inside_a_transport_nursery(
    autojump_clock: Any,
) -> None:
    """A cancellation wrapped in a group still settles each row; the exit does not wait 30 s."""
    sink = ListSink()
    transport = NurseryTransport()
    async with scripted_collector(transport, sink=sink, num_samples_in_parallel=3) as collector:
        with trio.fail_after(GUARD_S):
            async with collector.open_batch([row_body(t) for t in range(3)]) as batch:
                await trio.sleep(1)
            left_at = trio.current_time()
            counts = (transport.entered, batch.accepted, batch.settled)
    assert counts == (3, 3, 3)
    assert left_at == 1.0
    assert interrupted(sink) == [0, 1, 2]


async def test_cancelled_collect_settles_rollouts_cancelled_inside_a_transport_nursery(
    autojump_clock: Any,
) -> None:
    """The collector's own rollouts settle too when its block is cancelled."""
    sink = ListSink()
    with trio.move_on_after(1):
        async with scripted_collector(NurseryTransport(), sink=sink) as collector:
            await collector.collect(materialized_rows(3))
    assert trio.current_time() == 1.0
    assert interrupted(sink) == [0, 1, 2]


class FailsWhenCancelledTransport:
    """Agent ``mixed``'s rollouts wait in a nursery whose other task fails as it is cancelled,
    so cancelling one raises a group of `trio.Cancelled` and a `ValueError`; others land."""

    async def post(self, url: str, body: bytes, **_: Any) -> RawResponse:
        if b'"mixed"' not in body:
            await trio.lowlevel.checkpoint()
            return RawResponse(200, [], b'{"reward": 1.0}', False, url)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._fails_when_cancelled)
            await trio.sleep_forever()
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    async def _fails_when_cancelled() -> None:
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            raise ValueError("the fan-out's cleanup failed") from None

    async def aclose(self) -> None:
        pass


async def test_a_cancellation_grouped_with_an_error_fails_that_batch_only(
    autojump_clock: Any,
) -> None:
    """Closing a batch whose rollout's transport raises Cancelled together with an error: the
    row settles, the batch raises the error, and another batch and the collector go on."""
    sink = ListSink()
    urls = {**URLS, "mixed": "http://127.0.0.1:1"}
    async with open_collector(
        urls=urls, transport=FailsWhenCancelledTransport(), sink=sink
    ) as collector:
        with trio.fail_after(GUARD_S):
            async with collector.open_batch([row_body(0), row_body(1)]) as steady:
                with pytest.RaisesGroup(
                    pytest.RaisesExc(ValueError, match="cleanup failed"), flatten_subgroups=True
                ):
                    async with collector.open_batch([row_body(5, agent="mixed")]) as doomed:
                        await trio.sleep(1)
                assert doomed.accepted == doomed.settled == 1
                assert [item.landed async for item in steady] == [True, True]
            async with collector.open_batch([row_body(2)]) as after:
                assert [item.landed async for item in after] == [True]
    final = {o.identity.task_index: o for o in sink.outcomes}
    assert [type(final[t]) for t in (0, 1, 2, 5)] == [Landed, Landed, Landed, Omitted]


class InterruptingTransport(ScriptedTransport):
    """Task 0's request is interrupted by KeyboardInterrupt after 1 s; the others hang."""

    async def post(self, url: str, body: bytes, **_: Any) -> RawResponse:
        if orjson.loads(body)["_ng_task_index"] == 0:
            await trio.sleep(1)
            raise KeyboardInterrupt
        await trio.sleep_forever()
        raise AssertionError("unreachable")  # pragma: no cover


async def test_keyboard_interrupt_in_a_worker_settles_its_rollout(autojump_clock: Any) -> None:
    """A KeyboardInterrupt raised in a worker settles that row as interrupted, then goes on."""
    sink = ListSink()
    with pytest.RaisesGroup(KeyboardInterrupt, flatten_subgroups=True):
        async with scripted_collector(InterruptingTransport(), sink=sink) as collector:
            await collector.collect(materialized_rows(3))
    assert interrupted(sink) == [0, 1, 2]


class SlowFirstWriteSink(ListSink):
    """A sink whose first write takes 40 s (a disk stalling), longer than the 30 s bound."""

    async def write(self, outcomes: Sequence[Outcome]) -> None:
        if not self.outcomes:
            await trio.sleep(40)
        await super().write(outcomes)


async def test_slow_sink_write_during_a_live_run_loses_no_outcome(autojump_clock: Any) -> None:
    """Workers wait for a slow sink as long as the writer is live: collect returns, all 6 kept."""
    sink = SlowFirstWriteSink()
    with trio.fail_after(GUARD_S):
        collector = await _collect(6, sink, num_samples_in_parallel=2)
    # Rows 0-1 land at 1 s and are written from 1 s to 41 s; 2-5 wait for the writer meanwhile.
    assert trio.current_time() == 41.0
    assert sorted(o.identity.task_index for o in sink.outcomes) == list(range(6))
    assert collector.unrecorded == 0


async def _collect(n: int, sink: ListSink, **settings: Any) -> Any:
    async with scripted_collector(sink=sink, **settings) as collector:
        await collector.collect(materialized_rows(n))
    return collector


class HangingSink(ListSink):
    """A sink whose writes never return (a hung network filesystem)."""

    async def write(self, outcomes: Sequence[Outcome]) -> None:
        await trio.sleep_forever()


async def test_outcomes_the_torn_down_writer_drops_are_counted_and_logged(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Leaving the block with a hung sink: the writer stops after 30 s and says what it lost."""
    with trio.move_on_after(5), caplog.at_level(logging.WARNING):
        async with scripted_collector(sink=HangingSink(), num_samples_in_parallel=2) as collector:
            await collector.collect(materialized_rows(4))
    assert trio.current_time() == 35.0  # cancelled at 5 s, the flush bound is 30 s
    assert (collector.progress.submitted, collector.unrecorded) == (4, 4)
    assert "4 accepted rollouts never reached the sink" in caplog.text


# --- errors from dispatch ---------------------------------------------------------------------


async def test_https_agent_url_is_refused_when_the_collector_opens() -> None:
    """A static URL the transport cannot send to is one ConfigError at open, naming it."""
    transport = ScriptedTransport()
    with pytest.raises(ConfigError, match=r"URL for 'agent' is 'https://agent\.example'") as info:
        async with open_collector(urls={"agent": "https://agent.example"}, transport=transport):
            raise AssertionError("the collector opened")  # pragma: no cover
    assert "\n" not in str(info.value)
    assert transport.requests == []


class HttpOnlyTransport(ScriptedTransport):
    """Refuses what is not http:// as Http11Transport does; ``refuse`` tasks after their delay.

    Task t takes t + 1 seconds.
    """

    def __init__(self, *, refuse: frozenset[int] = frozenset()) -> None:
        super().__init__(delay=lambda row: row["_ng_task_index"] + 1.0)
        self.refuse = refuse

    async def post(self, url: str, body: bytes, **_: Any) -> RawResponse:
        row = orjson.loads(body)
        if row["_ng_task_index"] in self.refuse:
            await trio.sleep(self.delay(row))
        if not url.startswith("http://") or row["_ng_task_index"] in self.refuse:
            raise httpx.UnsupportedProtocol(f"URL {url!r}: Http11Transport speaks http:// only")
        return await super().post(url, body)


def by_agent(identity: Identity) -> str:
    """Resolve agent 'secure' to an https:// URL, every other one to plain http://."""
    scheme = "https" if identity.agent_name == "secure" else "http"
    return f"{scheme}://127.0.0.1:1/run"


async def test_a_resolved_https_url_fails_that_batch_only(autojump_clock: Any) -> None:
    """The batch raises ConfigError, every row it accepted is in the sink, the next one works."""
    sink = ListSink()
    async with open_collector(
        resolve=by_agent, transport=HttpOnlyTransport(), sink=sink
    ) as collector:
        with pytest.raises(ConfigError, match=r"task 1 rollout 0 is 'https://127\.0\.0\.1:1/run'"):
            async with collector.open_batch([row_body(0), row_body(1, agent="secure")]) as batch:
                [item async for item in batch]
        assert batch.accepted == batch.settled == 1
        assert [o.identity.task_index for o in sink.outcomes] == [0]
        async with collector.open_batch([row_body(2)]) as batch:
            assert [item.landed async for item in batch] == [True]


class FailingLedgerSink(ListSink):
    """A sink whose attempt ledger fails after its first reservation (a full disk)."""

    def __init__(self) -> None:
        super().__init__()
        self.reservations = 0

    async def reserve(self, attempts: Sequence[tuple[Identity, int]]) -> None:
        self.reservations += 1
        if self.reservations > 1:
            raise RunFolderWriteError("cannot append to 'ledger': No space left on device")


async def test_an_error_inside_dispatch_settles_the_row_and_fails_that_batch_only(
    autojump_clock: Any,
) -> None:
    """A transport refusing a URL in one batch: its rows settle, it raises, the next one runs."""
    sink = ListSink()
    transport = HttpOnlyTransport(refuse=frozenset({1}))
    async with open_collector(urls=URLS, transport=transport, sink=sink) as collector:
        with pytest.raises(ConfigError, match="give agent URLs as http://host:port"):
            async with collector.open_batch([row_body(t) for t in range(3)]) as batch:
                [item async for item in batch]
        assert batch.accepted == batch.settled == 3
        async with collector.open_batch([row_body(3)]) as batch:
            assert [item.landed async for item in batch] == [True]
    final = {o.identity.task_index: o for o in sink.outcomes}
    assert [type(final[t]) for t in range(4)] == [Landed, Omitted, Omitted, Landed]


class ResetTransport(ScriptedTransport):
    """Every request is reset after its body went out (possibly delivered)."""

    async def post(self, url: str, body: bytes, **_: Any) -> RawResponse:
        await trio.sleep(1)
        raise httpx.ReadError("connection reset by peer")


async def test_a_ledger_failure_before_a_resend_settles_the_row_and_fails_its_batch(
    autojump_clock: Any,
) -> None:
    """retry_requests cannot reserve the next attempt: the row settles, the batch raises."""
    sink = FailingLedgerSink()
    config = RunConfig(retry_requests=True, retry_backoff_base_s=0.0)
    async with open_collector(
        config=config, urls=URLS, transport=ResetTransport(), sink=sink
    ) as collector:
        with pytest.raises(RunFolderWriteError, match="ledger"):
            async with collector.open_batch([row_body(0)]) as batch:
                [item async for item in batch]
    assert batch.accepted == batch.settled == 1
    superseded, final = sink.outcomes
    assert (type(superseded), superseded.attempt_index) == (Failed, 0)
    assert (type(final), final.attempt_index) == (Omitted, 1)


async def test_an_error_inside_dispatch_during_collect_stops_the_run_with_rows_settled(
    autojump_clock: Any,
) -> None:
    """In the collector's own rows the error ends the run: raised at exit, every row settled."""
    sink = ListSink()
    transport = HttpOnlyTransport(refuse=frozenset({1}))
    with pytest.raises(ConfigError, match="give agent URLs as http://host:port"):
        async with open_collector(urls=URLS, transport=transport, sink=sink) as collector:
            await collector.collect(materialized_rows(3))
    final = {o.identity.task_index: type(o) for o in sink.outcomes}
    assert final == {0: Landed, 1: Omitted, 2: Omitted}
    assert collector.progress.submitted == 3
