"""The Trio thread's edges: no front-end waiter outlives it, and asyncio cancellation at entry
and exit of `aio.open_rollouts` closes it.

A scenario that would hang without the behaviour under test runs in a daemon thread joined
under the hang guard, so a regression fails the test instead of hanging the suite.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
import trio

import trollout
from builders import HANG_GUARD_S, URLS, ScriptedTransport, materialized_rows, wait_for
from trollout.driver.bridge import BatchTask, RolloutsThread
from trollout.driver.sync import SyncBatch
from trollout.errors import TrolloutError
from trollout.records import MaterializedRow

T = TypeVar("T")


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
