"""The iterator ``run_examples`` and ``run_outcomes`` return: awaitables in completion order.

`RowResultIterator` is a plain (synchronous) iterator of ``total`` awaitables, one per row, as
NeMo Gym's: ``for future in completions: row, result = await future``. Any awaitable, whichever
is awaited first, resolves to the earliest settled outcome not yet taken, so the pairs come in
completion order whatever order the awaitables are awaited in, and each outcome goes to exactly
one awaitable (the package docstring has the design).

The session (deployment, `AioRollouts`, one batch) is opened by the first await, through the
``open_session`` callable the helper gives; the pump task then moves the batch's outcomes into
``_ready`` (converted by the helper's ``convert`` into a pair or the error the awaitable
raises), and when the batch ends by itself adds the pairs of the rows the dispatch budget never
started (``never_started``) and closes the session. Closing (`aclose`, `aclose_and_drain`)
cancels the pump (a message it has not read stays in the front end's queue, so nothing is
lost), closes the batch and the session, and wakes every awaitable that holds no outcome:
they raise ``CancelledError``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Generator, Iterator
from contextlib import AsyncExitStack
from typing import Any, TypeVar

from ..aio import AioBatch
from ..errors import TrolloutError

__all__ = ["RowResultIterator", "Settled"]

_T = TypeVar("_T")
Pair = tuple[dict[str, Any], Any]


class Settled:
    """One settled row as an awaitable hands it out: its pair, or the error it raises."""

    __slots__ = ("error", "pair")

    def __init__(self, pair: Pair | None = None, error: BaseException | None = None) -> None:
        self.pair = pair
        self.error = error

    def unwrap(self) -> Pair:
        """Return the pair, or raise the error."""
        if self.error is not None:
            raise self.error
        assert self.pair is not None
        return self.pair

    def future(self) -> asyncio.Future[Pair]:
        """Return a settled future of it (its exception marked retrieved, as NeMo Gym's)."""
        future: asyncio.Future[Pair] = asyncio.get_running_loop().create_future()
        if isinstance(self.error, asyncio.CancelledError):
            future.cancel()
        elif self.error is not None:
            future.set_exception(self.error)
            future.exception()
        else:
            assert self.pair is not None
            future.set_result(self.pair)
        return future


OpenSession = Callable[[AsyncExitStack], Awaitable[AioBatch]]
Convert = Callable[[Any], Settled]
NeverStarted = Callable[[set[tuple[int, int]], str], list[Settled]]


class _Completion:
    """One handed-out awaitable; awaiting it (once or again) claims one outcome, once."""

    __slots__ = ("_iterator", "_task")

    def __init__(self, iterator: RowResultIterator) -> None:
        self._iterator = iterator
        self._task: asyncio.Task[Pair] | None = None

    def __await__(self) -> Generator[Any, None, Pair]:
        if self._task is None:
            self._task = asyncio.ensure_future(self._iterator._claim())
        return self._task.__await__()


class RowResultIterator:
    """Awaitables resolving to ``(row, result)`` in completion order, with `aclose` and
    `aclose_and_drain` (the module docstring). Returned by ``run_examples`` / ``run_outcomes``.
    """

    def __init__(
        self,
        total: int,
        open_session: OpenSession,
        convert: Convert,
        never_started: NeverStarted,
    ) -> None:
        self._total = total
        self._open_session = open_session
        self._convert = convert
        self._never_started = never_started
        self._issued = 0
        self._claimed = 0
        self._ready: deque[Settled] = deque()
        self._failure: BaseException | None = None  # what the batch raised; ends every claim
        self._closed = False
        self._open_task: asyncio.Task[None] | None = None
        self._pump_task: asyncio.Task[None] | None = None
        self._pump_done = False
        self._stack: AsyncExitStack | None = None
        self._batch: AioBatch | None = None
        self._session_close: asyncio.Task[None] | None = None
        self._close_error: BaseException | None = None
        self._ended: asyncio.Event | None = None
        self._changed: asyncio.Event | None = None

    # --- the iterator -----------------------------------------------------------------------

    def __iter__(self) -> Iterator[Awaitable[Pair]]:
        return self

    def __next__(self) -> Awaitable[Pair]:
        """Return the next awaitable; stop after one per row, or once the iterator closed."""
        if self._closed or self._issued >= self._total:
            raise StopIteration
        self._issued += 1
        return _Completion(self)

    def __len__(self) -> int:
        return self._total

    @property
    def run_id(self) -> str | None:
        """The run id of the batch (a recorded shard's), once the first await opened it."""
        return self._batch.run_id if self._batch is not None else None

    # --- closing ----------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Cancel unfinished rollouts and wait until every accepted one reached its sink.

        Rows not started never start; awaitables that hold no outcome raise
        ``CancelledError``; iteration stops. Safe to call again, or before first use (nothing
        starts). Returns once the session (its thread, a shard's lock) is closed.

        Raises:
            Exception: what closing the batch raised (a shard's disk), once.
        """
        await self._close(drain=False)
        error, self._close_error = self._close_error, None
        if error is not None:
            raise error

    async def aclose_and_drain(self) -> list[asyncio.Future[Pair]]:
        """Close as `aclose`, and return settled futures of what settled and was not taken.

        Admission stops before the first suspension; outcomes are transferred once (a second
        call, or one after `aclose`, returns ``[]``); a future of a failed row raises its error.
        Before first use it starts nothing and returns ``[]``.
        """
        settled = await self._close(drain=True)
        return [s.future() for s in settled]

    async def _close(self, *, drain: bool) -> list[Settled]:
        if self._closed:
            await self._wait_ended()
            return []
        self._closed = True
        kept = list(self._ready) if drain else []
        self._ready.clear()
        if self._pump_task is not None:
            self._pump_task.cancel()  # before any suspension: it takes nothing more
        self._wake()
        if self._open_task is None:  # before first use: nothing was started
            self._ended_event().set()
            return []
        extra = await _outlast_cancellation(self._shutdown(drain))
        return kept + extra

    async def _shutdown(self, drain: bool) -> list[Settled]:
        assert self._open_task is not None
        with contextlib.suppress(BaseException):
            await self._open_task  # opening fails or finishes; either way there is one end
        extra: list[Settled] = []
        if self._pump_task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump_task
        if self._batch is not None and drain and self._session_close is None:
            try:
                extra = [self._convert(item) for item in await self._batch.aclose_and_drain()]
            except Exception as exc:
                self._close_error = exc
        await self._close_session()
        return extra

    async def _close_session(self) -> None:
        """Close the batch and the session once, whoever asks (pump or close), shielded."""
        if self._session_close is None:
            self._session_close = asyncio.ensure_future(self._exit_stack())
        await asyncio.shield(self._session_close)

    async def _exit_stack(self) -> None:
        try:
            if self._stack is not None:
                await self._stack.aclose()
        except Exception as exc:
            self._close_error = self._close_error or exc
        finally:
            self._ended_event().set()

    async def _wait_ended(self) -> None:
        if self._open_task is not None:
            await self._ended_event().wait()

    # --- claiming ---------------------------------------------------------------------------

    async def _claim(self) -> Pair:
        """Take the earliest settled outcome not yet taken (the body of every awaitable)."""
        await self._ensure_open()
        while True:
            if self._ready:
                settled = self._ready.popleft()
                self._claimed += 1
                if self._claimed >= self._total and not self._closed:
                    try:  # the last pair: return it once the session (a shard) is closed
                        await self._ended_event().wait()
                    except asyncio.CancelledError:
                        self._ready.appendleft(settled)  # not handed out: the next claim's
                        self._claimed -= 1
                        raise
                return settled.unwrap()
            if self._closed:
                raise asyncio.CancelledError("the collection was closed")
            if self._pump_done:
                if self._failure is not None:
                    raise self._failure
                raise TrolloutError("the batch ended with no outcome left for this awaitable")
            await self._wait_changed()

    async def _ensure_open(self) -> None:
        if self._open_task is None:
            if self._closed:
                raise asyncio.CancelledError("the collection was closed before it started")
            self._open_task = asyncio.ensure_future(self._open())
        await asyncio.shield(self._open_task)

    async def _open(self) -> None:
        stack = AsyncExitStack()
        self._stack = stack
        try:
            batch = await self._open_session(stack)
        except BaseException:
            await stack.aclose()  # what opened before the error (the thread) closes now
            raise
        self._batch = batch
        if self._closed:  # closed while opening: _shutdown closes what was opened
            return
        self._pump_task = asyncio.ensure_future(self._pump(batch))

    async def _pump(self, batch: AioBatch) -> None:
        """Move the batch's outcomes into ``_ready``; at its natural end, close the session."""
        seen: set[tuple[int, int]] = set()
        try:
            while True:
                try:
                    item = await batch.__anext__()
                except StopAsyncIteration:
                    break
                except Exception as exc:  # raised once by the front end; outcomes go on
                    self._failure = self._failure or exc
                    continue
                row = item.row
                seen.add((row["_ng_task_index"], row["_ng_rollout_index"]))
                self._ready.append(self._convert(item))
                self._wake()
            if self._failure is None:
                self._ready.extend(self._never_started(seen, batch.run_id))
        finally:
            self._pump_done = True
            self._wake()
        await self._close_session()

    # --- wake-ups ---------------------------------------------------------------------------

    def _ended_event(self) -> asyncio.Event:
        if self._ended is None:
            self._ended = asyncio.Event()
        return self._ended

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def _wait_changed(self) -> None:
        if self._changed is None:
            self._changed = asyncio.Event()
        await self._changed.wait()


async def _outlast_cancellation(awaitable: Awaitable[_T]) -> _T:
    """Await ``awaitable`` to its end however often this task is cancelled meanwhile (a close
    must not be cut short), then re-raise the cancellation if there was one."""
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
