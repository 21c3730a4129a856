"""The asyncio front end: `open_rollouts` for ``asyncio.run`` programs.

Same semantics as the Trio API (`rollouts`), run in a Trio thread (`bridge`; its design note says
why a thread and not Trio's guest mode, with the figures)::

    async with trollout.aio.open_rollouts(urls, config=config) as ro:
        async with ro.open_batch(ro.plan(rows), record_shard="step-0001") as batch:
            async for item in batch:           # completion order
                ...

The asyncio loop only ever runs one short callback per group of settled outcomes, so its other
tasks keep their pace. ``batch.stop_admission()`` (as the Trio API's; it does not block) starts
nothing more and lets what is in flight finish. Leaving a batch's block closes it; so does
cancelling the task that holds it: the exit asks the Trio side to cancel the batch's unfinished
rollouts and waits (shielded from a second cancellation) until every accepted rollout has
reached its sink.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Mapping
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any, TypeVar

from ..collector.deployment.discovery import Deployment
from ..collector.engine.batch import BatchOutcome, BatchRows
from .bridge import BatchCallbacks, FrontEndBatch, FrontEndRollouts, RolloutsThread

__all__ = ["AioBatch", "AioRollouts", "open_rollouts"]

_Message = tuple[str, Any, Any]
_T = TypeVar("_T")


class _ToLoop(BatchCallbacks):
    """Hands the Trio side's reports to an asyncio loop (one thread-safe call per report)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[_Message] = asyncio.Queue()
        self.closed: asyncio.Future[tuple[list[BatchOutcome], BaseException | None]]
        self.closed = loop.create_future()

    def _put(self, message: _Message) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is left to hear
            self.loop.call_soon_threadsafe(self._deliver, message)

    def _deliver(self, message: _Message) -> None:
        kind, value, error = message
        if kind == "done" and not self.closed.done():
            self.closed.set_result((value, error))
        self.queue.put_nowait(message)

    def opened(self, run_id: str) -> None:
        self._put(("opened", run_id, None))

    def items(self, items: list[BatchOutcome]) -> None:
        self._put(("items", items, None))

    def ended(self) -> None:
        self._put(("ended", None, None))

    def done(self, drained: list[BatchOutcome], error: BaseException | None) -> None:
        self._put(("done", drained, error))


class AioBatch(FrontEndBatch):
    """A batch in flight, for asyncio code; ``async for`` it for `BatchOutcome` values.

    Open with `AioRollouts.open_batch` (``async with``). ``run_id``: the batch's run id.
    """

    def __init__(self, thread: RolloutsThread, rows: BatchRows, options: Mapping[str, Any]):
        super().__init__(thread, rows, options)
        self._report = _ToLoop(asyncio.get_running_loop())

    async def __aenter__(self) -> AioBatch:
        self._task = self._thread.open_batch(self._rows, self._options, self._report)
        try:
            await self._next_message()
        except BaseException:
            await self._finish(drain=False)
            raise
        if self._done is not None:
            self._raise_error()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._finish(drain=False)
        if exc is None:
            self._raise_error()

    def __aiter__(self) -> AioBatch:
        return self

    async def __anext__(self) -> BatchOutcome:
        """Wait for the next settled outcome and return it.

        Raises:
            StopAsyncIteration: every row settled and was returned, or the batch closed.
            Exception: what the Trio API's iteration raises (a bad row, a failed sink).
        """
        while not self._buffer:
            if self._ended or self._done is not None:
                self._raise_error()
                raise StopAsyncIteration
            await self._next_message()
        return self._buffer.popleft()

    async def aclose(self) -> None:
        """Close the batch and wait until every accepted rollout reached its sink."""
        await self._finish(drain=False)
        self._raise_error()

    async def aclose_and_drain(self) -> list[BatchOutcome]:
        """Close the batch (as `aclose`) and return what settled but was not consumed."""
        await self._finish(drain=True)
        return self._take_drained()

    async def _finish(self, *, drain: bool) -> None:
        """Close the batch on the Trio side and wait, through cancellations, until it has."""
        closed = self._report.closed
        if not closed.done():
            self._thread.close_batch(self._task, drain=drain)
        try:
            await _outlast_cancellation(closed)
        finally:
            while not self._report.queue.empty():  # outcomes handed over before the close
                self._take(self._report.queue.get_nowait())

    async def _next_message(self) -> None:
        self._take(await self._report.queue.get())

    def _take(self, message: _Message) -> None:
        kind, value, error = message
        if kind == "opened":
            self.run_id = value
        elif kind == "items":
            self._buffer.extend(value)
        elif kind == "ended":
            self._ended = True
        elif self._done is None:
            self._done = (value, error)


class AioRollouts(FrontEndRollouts):
    """`Rollouts` for asyncio code (see the module docstring); from `open_rollouts`."""

    def open_batch(self, rows: BatchRows, **options: Any) -> AioBatch:
        """Open a batch (`Rollouts.open_batch`'s options): ``async with ro.open_batch(rows)``.

        Raises:
            ConfigError, InputError, RunFolderLockedError: as `Rollouts.open_batch`.
        """
        return AioBatch(self._thread, rows, options)

    async def run_batch(self, rows: BatchRows, **options: Any) -> list[BatchOutcome]:
        """Run a batch to its end; return its outcomes in completion order."""
        async with self.open_batch(rows, **options) as batch:
            return [item async for item in batch]


@asynccontextmanager
async def open_rollouts(
    deployment: Deployment | Mapping[str, str], **options: Any
) -> AsyncIterator[AioRollouts]:
    """Open an `AioRollouts` (takes `trollout.open_rollouts`'s arguments).

    Raises:
        ConfigError: bad agent URLs or settings.

    Cancellation: neither entry nor exit is cut short. A task cancelled while the collector
    opens waits until it is open, closes it, then raises; leaving the block, however often
    cancelled, returns once every batch is closed and the collector with it.
    """
    thread = RolloutsThread(deployment, **options)
    try:
        await _outlast_cancellation(asyncio.to_thread(thread.start))
    except asyncio.CancelledError:
        await _close(thread)  # the opening went on to its end: close what it opened
        raise
    try:
        yield AioRollouts(thread)
    finally:
        await _close(thread)


async def _close(thread: RolloutsThread) -> None:
    """Stop the Trio thread and wait, through cancellations, until it has ended."""
    thread.stop()
    await _outlast_cancellation(asyncio.to_thread(thread.join))


async def _outlast_cancellation(awaitable: Awaitable[_T]) -> _T:
    """Await ``awaitable`` to its end however often this task is cancelled meanwhile (a
    teardown must not be cut short), then re-raise the cancellation if there was one.

    Raises:
        Exception: what ``awaitable`` raised (it says more than the cancellation).
    """
    future = asyncio.ensure_future(awaitable)
    cancelled: asyncio.CancelledError | None = None
    while not future.done():
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError as exc:
            cancelled = exc
    result = future.result()
    if cancelled is not None:
        raise cancelled
    return result
