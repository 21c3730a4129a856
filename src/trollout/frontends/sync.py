"""The blocking front end: `open_rollouts` for synchronous code, usable from any thread.

Same semantics as the Trio API (`rollouts`), run in a Trio thread (`bridge`)::

    with trollout.sync.open_rollouts(urls, config=config) as ro:
        with ro.open_batch(ro.plan(rows), record_shard="step-0001") as batch:
            for item in batch:                 # completion order; blocks until the next settles
                ...
        outcomes = ro.run_batch(ro.plan(rows))  # or: a whole batch at once

Leaving a batch's ``with`` closes it (its unfinished rollouts are cancelled, every accepted one
reaches its sink first); `SyncBatch.close_and_drain` also returns what settled unconsumed, and
`stop_admission` (every front end's batch has it) starts nothing more while what is in flight
finishes and is still yielded.
Leaving `open_rollouts`'s ``with`` closes every batch still open and the collector.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import TracebackType
from typing import Any

from ..collector.deployment.discovery import Deployment
from ..collector.engine.batch import BatchOutcome, BatchRows
from .bridge import BatchCallbacks, FrontEndBatch, FrontEndRollouts, RolloutsThread

__all__ = ["SyncBatch", "SyncRollouts", "open_rollouts"]

_Message = tuple[str, Any, Any]


class _ToQueue(BatchCallbacks):
    """Hands the Trio side's reports to the caller's thread through a queue."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[_Message] = queue.SimpleQueue()

    def opened(self, run_id: str) -> None:
        self.queue.put(("opened", run_id, None))

    def items(self, items: list[BatchOutcome]) -> None:
        self.queue.put(("items", items, None))

    def ended(self) -> None:
        self.queue.put(("ended", None, None))

    def done(self, drained: list[BatchOutcome], error: BaseException | None) -> None:
        self.queue.put(("done", drained, error))


class SyncBatch(FrontEndBatch):
    """A batch in flight, for blocking code; iterate it for `BatchOutcome` values.

    ``run_id``: the batch's run id (its rollout ids' prefix, a shard's run id).
    """

    def __init__(self, thread: RolloutsThread, rows: BatchRows, options: Mapping[str, Any]):
        super().__init__(thread, rows, options)
        self._report = _ToQueue()
        self._task = thread.open_batch(rows, options, self._report)
        self._next_message()  # "opened", or "done" with the error that refused the batch
        self._raise_refusal()

    def __iter__(self) -> Iterator[BatchOutcome]:
        return self

    def __next__(self) -> BatchOutcome:
        """Block until the next outcome settles and return it.

        Raises:
            StopIteration: every row settled and was returned, or the batch closed.
            Exception: what the Trio API's iteration raises (a bad row, a failed sink).
        """
        while not self._buffer:
            if self._ended or self._done is not None:
                self._raise_error()
                raise StopIteration
            self._next_message()
        return self._buffer.popleft()

    def close(self) -> None:
        """Close the batch and wait until every accepted rollout reached its sink.

        Raises:
            Exception: the error that ended the batch, if the iteration did not raise it.
        """
        self._finish(drain=False)
        self._raise_error()

    def close_and_drain(self) -> list[BatchOutcome]:
        """Close the batch (as `close`) and return what settled but was not consumed."""
        self._finish(drain=True)
        return self._take_drained()

    def __enter__(self) -> SyncBatch:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._finish(drain=False)
        if exc is None:
            self._raise_error()

    def _finish(self, *, drain: bool) -> None:
        if self._done is None:
            self._thread.close_batch(self._task, drain=drain)
        while self._done is None:
            self._next_message()

    def _next_message(self) -> None:
        kind, value, error = self._report.queue.get()
        if kind == "opened":
            self.run_id = value
        elif kind == "items":
            self._buffer.extend(value)
        elif kind == "ended":
            self._ended = True
        else:
            self._done = (value, error)

    def _raise_refusal(self) -> None:
        if self._done is not None:
            self._raise_error()


class SyncRollouts(FrontEndRollouts):
    """`Rollouts` for blocking code (see the module docstring); from `open_rollouts`."""

    def open_batch(self, rows: BatchRows, **options: Any) -> SyncBatch:
        """Open a batch (`Rollouts.open_batch`'s options); use it with ``with``.

        Raises:
            ConfigError, InputError, RunFolderLockedError: as `Rollouts.open_batch`.
        """
        return SyncBatch(self._thread, rows, options)

    def run_batch(self, rows: BatchRows, **options: Any) -> list[BatchOutcome]:
        """Run a batch to its end; return its outcomes in completion order."""
        with self.open_batch(rows, **options) as batch:
            return list(batch)


@contextmanager
def open_rollouts(
    deployment: Deployment | Mapping[str, str], **options: Any
) -> Iterator[SyncRollouts]:
    """Open a `SyncRollouts` (takes `trollout.open_rollouts`'s arguments).

    Raises:
        ConfigError: bad agent URLs or settings.
    """
    thread = RolloutsThread(deployment, **options)
    thread.start()
    try:
        yield SyncRollouts(thread)
    finally:
        thread.stop()
        thread.join()
