"""The Trio thread's edges: no front-end waiter outlives it, and asyncio cancellation at entry
and exit of `aio.open_rollouts` closes it.

A scenario that would hang without the behaviour under test runs in a daemon thread joined
under the hang guard, so a regression fails the test instead of hanging the suite.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio

import trollout
from builders import (
    HANG_GUARD_S,
    URLS,
    ScriptedTransport,
    materialized_rows,
    read_jsonl,
    wait_for,
)
from trollout.collector.http.transport import RawResponse
from trollout.errors import TrolloutError
from trollout.frontends.bridge import BatchTask, RolloutsThread
from trollout.frontends.sync import SyncBatch
from trollout.records import MaterializedRow
from trollout.recovery.layout import RunLayout

T = TypeVar("T")
RECORD_OMITTED = trollout.RunConfig(record_omitted_rollouts=True)


class Crash(BaseException):
    """Stands in for a KeyboardInterrupt or SystemExit raised inside the collector."""


class CrashingRun:
    """Rows whose reading raises `Crash`: the collector dies, and so does the thread's `_main`.

    (A transport raising it would do the same, but the crashed rollout never settles, so the
    batch's close would wait out its 30 s bound first.) A shielded system task then holds the
    Trio run open past its main task (the collector and the thread's nursery closed, the Trio
    token still live) until `release` is set; `held` says it holds.
    """

    def __init__(self) -> None:
        self.held = threading.Event()
        self.release = threading.Event()

    def rows(self) -> Iterator[MaterializedRow]:
        """A batch's rows (read in the Trio thread): reading them crashes the run."""
        trio.lowlevel.spawn_system_task(self._hold)
        raise Crash("reading the rows crashed")
        yield  # a generator: read lazily, by the batch's feeder

    async def _hold(self) -> None:
        try:
            await trio.sleep_forever()  # system tasks are cancelled once the main task is done
        finally:
            with trio.CancelScope(shield=True):
                self.held.set()
                await trio.to_thread.run_sync(self.release.wait)


def guarded(scenario: Callable[[], T]) -> T:
    """Run `scenario` in a daemon thread; fail if it has not ended within the hang guard."""
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(scenario())
        except BaseException as exc:
            error.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    assert not thread.is_alive(), f"hung: the scenario did not end within {HANG_GUARD_S:g} s"
    if error:
        raise error[0]
    return result[0]


def crashed() -> Any:
    """What leaving the front end raises once the collector crashed: the crash itself."""
    return pytest.RaisesGroup(Crash, allow_unwrapped=True, flatten_subgroups=True)


def trio_threads() -> set[threading.Thread]:
    """The front ends' Trio threads alive now."""
    return {t for t in threading.enumerate() if t.name == "trollout-trio" and t.is_alive()}


# --- no waiter outlives the Trio thread -----------------------------------------------------------


def test_sync_batches_around_a_dying_trio_thread_end_with_errors() -> None:
    """After the collector crashed: a batch opened while the Trio run ends is refused at once;
    one open before is closed once the thread has ended; leaving the block raises the crash
    (not Trio's internal error, nor a "has stopped" hiding it)."""
    crash = CrashingRun()
    before = trio_threads()

    def scenario() -> None:
        with (
            crashed(),
            trollout.sync.open_rollouts(URLS, transport=ScriptedTransport()) as rollouts,
        ):
            try:
                first = rollouts.open_batch(crash.rows())
                assert crash.held.wait(HANG_GUARD_S)
                with pytest.raises(TrolloutError, match="front end is closed"):
                    rollouts.run_batch(materialized_rows(1))
            finally:
                crash.release.set()
            wait_for(lambda: trio_threads() <= before, "the Trio thread ended")
            with pytest.raises(TrolloutError, match="closed while the batch was open"):
                first.close()

    guarded(scenario)


def test_aio_batch_opened_as_the_trio_thread_dies_is_refused() -> None:
    """As the blocking front end: the late asyncio batch raises, nothing waits forever."""
    crash = CrashingRun()

    async def main() -> None:
        async with trollout.aio.open_rollouts(URLS, transport=ScriptedTransport()) as rollouts:
            try:
                with pytest.raises(TrolloutError, match="closed while the batch was open"):
                    await rollouts.run_batch(crash.rows())
                await asyncio.to_thread(crash.held.wait, HANG_GUARD_S)
                with pytest.raises(TrolloutError, match="front end is closed"):
                    await rollouts.run_batch(materialized_rows(1))
            finally:
                crash.release.set()

    def scenario() -> None:
        with crashed():
            asyncio.run(main())

    guarded(scenario)


class CrashesOnStart(RolloutsThread):
    """Fault injection: starting a batch raises, which kills the Trio run (TrioInternalError)
    before any task could report the batch: only the thread's end can."""

    def _start_batch(self, task: BatchTask) -> None:
        raise Crash("a bug in starting a batch")


def test_a_batch_waiting_when_the_trio_run_dies_is_failed_by_the_threads_end() -> None:
    """Whatever ends the Trio run, a batch not yet reported done is failed as the thread ends,
    with the run's error as its cause, and a batch opened afterwards is refused."""
    thread = CrashesOnStart(URLS, transport=ScriptedTransport())
    thread.start()
    try:
        with pytest.raises(TrolloutError, match="ended while the batch was open") as lost:
            guarded(lambda: SyncBatch(thread, materialized_rows(1), {}))
        assert isinstance(lost.value.__cause__, trio.TrioInternalError), lost.value.__cause__
        with pytest.raises(TrolloutError, match="has stopped"):
            SyncBatch(thread, materialized_rows(1), {})
    finally:
        thread.stop()
        with pytest.raises(trio.TrioInternalError):
            thread.join()


# --- asyncio cancellation at entry and exit of aio.open_rollouts ----------------------------------


class SlowUrls(Mapping[str, str]):
    """Agent URLs whose reading (in the Trio thread, while the collector opens) blocks until
    `release` is set; `reading` says it blocks: a slow discovery."""

    def __init__(self, urls: Mapping[str, str]) -> None:
        self._urls = dict(urls)
        self.reading = threading.Event()
        self.release = threading.Event()

    def __getitem__(self, name: str) -> str:
        return self._urls[name]

    def __len__(self) -> int:
        return len(self._urls)

    def __iter__(self) -> Iterator[str]:
        self.reading.set()
        self.release.wait(HANG_GUARD_S)
        return iter(self._urls)


class HeldTransport(ScriptedTransport):
    """Never answers; once cancelled, holds the rollout's end (shielded) until `release` is set.

    `entered`: a request arrived; `held`: a cancelled request holds.
    """

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.held = threading.Event()
        self.release = threading.Event()

    async def post(self, url: str, body: bytes, **_: Any) -> RawResponse:
        self.entered.set()
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                self.held.set()
                await trio.to_thread.run_sync(self.release.wait)
        raise AssertionError("unreachable")


async def still_running(task: asyncio.Task[Any]) -> bool:
    """Whether `task` is still running after it had every chance to react to a cancellation
    (a few loop iterations: it runs before this coroutine resumes)."""
    for _ in range(3):
        await asyncio.sleep(0)
    return not task.done()


def test_aio_cancelled_while_opening_closes_what_it_opened() -> None:
    """A task cancelled while the collector opens (a slow discovery, an asyncio.timeout)
    waits until the opening has ended, closes the Trio thread, then raises CancelledError."""
    urls = SlowUrls(URLS)
    before = trio_threads()

    async def main() -> None:
        async def hold() -> None:
            async with trollout.aio.open_rollouts(urls, transport=ScriptedTransport()):
                raise AssertionError("a cancelled entry must not run the block")

        task = asyncio.create_task(hold())
        try:
            await asyncio.to_thread(urls.reading.wait, HANG_GUARD_S)
            task.cancel()
            assert await still_running(task), "the cancelled entry left the thread opening"
        finally:
            urls.release.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    guarded(lambda: asyncio.run(main()))
    assert trio_threads() <= before, "a Trio thread outlived open_rollouts"


def test_aio_cancelled_twice_while_closing_still_flushes_the_shard(tmp_path: Path) -> None:
    """A second cancellation while leaving open_rollouts does not cut the close short: the
    task ends once the Trio thread has, with the open batch's interrupted rollout recorded."""
    transport = HeldTransport()
    before = trio_threads()

    async def main() -> None:
        async def hold() -> None:
            async with trollout.aio.open_rollouts(
                URLS, config=RECORD_OMITTED, transport=transport, record_output_dir=tmp_path
            ) as rollouts:
                batch = rollouts.open_batch(materialized_rows(1), record_shard="x")
                await batch.__aenter__()  # left open: leaving open_rollouts closes it
                await asyncio.Event().wait()

        task = asyncio.create_task(hold())
        try:
            await asyncio.to_thread(transport.entered.wait, HANG_GUARD_S)
            task.cancel()  # leaving open_rollouts cancels the rollout, which holds
            await asyncio.to_thread(transport.held.wait, HANG_GUARD_S)
            task.cancel()
            assert await still_running(task), "a second cancellation cut the close short"
        finally:
            transport.release.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    guarded(lambda: asyncio.run(main()))
    assert trio_threads() <= before, "a Trio thread outlived open_rollouts"
    failures = read_jsonl(RunLayout.for_output(tmp_path / "rollouts-x.jsonl").failures)
    assert [row["_ng_omitted_rollout"] for row in failures] == [True], failures
