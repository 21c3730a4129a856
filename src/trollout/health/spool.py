"""An external sort of small records: memory follows the size of a run, not the number of rows.

The reduce step (`health.run`) must write its verdict lines sorted by (task, rollout, stage),
and a line's content is only known once every copy of its (task, rollout) has been seen, which
may be at the end of the file. `SortedSpool` is how it gets there without keeping every row:
records (tuples whose first item is a unique, totally ordered key) are gathered in memory up
to `RUN_ROWS`; a full run is sorted and written to an anonymous temporary file as pickled
blocks of `BLOCK_ROWS` records; `sorted` merges the runs on disk with the last, in-memory run
(`heapq.merge`), reading each run one block at a time with ``os.pread`` (one descriptor for
all runs). The records of one (task, rollout) then arrive together, so the reader settles them
as a group and drops them.

Memory: one run (``RUN_ROWS`` records) while reading, and while merging the last run plus one
block per run on disk - ``BLOCK_ROWS`` records, a few kilobytes, per ``RUN_ROWS`` rows, which
is a few bytes a row at the very worst. A file of fewer than ``RUN_ROWS`` rows never touches
the disk.

The file is made with `tempfile.TemporaryFile` in the output folder (the same file system as
the files being written, so no tmpfs fills up): it has no name on Linux (``O_TMPFILE``) or is
unlinked at once elsewhere, so nothing is left behind by an error, a cancellation or a killed
process; `close` closes it.

Rejected: an index of (offset, packed sort key) per row in an ``array`` over a spool of the
verdict parts - sorting it needs a Python object per row for the duration of the sort (or a
key packed into 64 bits, which task indices that are strings do not fit), and every group's
records would be read back scattered across the file; a second pass over the rollouts file
(duplicates first, lines second) - it doubles the reading of a run's largest file.
"""

from __future__ import annotations

import heapq
import os
import pickle
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Final

__all__ = ["BLOCK_ROWS", "RUN_ROWS", "SortedSpool"]

RUN_ROWS = 2048  # records sorted in memory before a run goes to disk
BLOCK_ROWS = 16  # records per pickled block: what each run on disk holds in memory
_HEAD: Final = struct.Struct("<I")  # a block's length


class SortedSpool:
    """Records in, the same records out in key order (see the module docstring).

    Args:
        folder: where the temporary file goes (made on the first full run).
        run_rows: records per run (default `RUN_ROWS`, read when the spool is made);
        block_rows: records per block of a run on disk (default `BLOCK_ROWS`).
    """

    def __init__(
        self, folder: Path, *, run_rows: int | None = None, block_rows: int | None = None
    ) -> None:
        self.folder = folder
        self.run_rows = run_rows or RUN_ROWS
        self.block_rows = block_rows or BLOCK_ROWS
        self.runs: list[tuple[int, int]] = []  # (start, end) offsets in the file
        self._buffer: list[tuple[Any, ...]] = []
        self._file: IO[bytes] | None = None
        self._end = 0

    def __enter__(self) -> SortedSpool:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def add(self, record: tuple[Any, ...]) -> None:
        """Take one record (its first item: a key no other record has)."""
        self._buffer.append(record)
        if len(self._buffer) >= self.run_rows:
            self._spill()

    def _spill(self) -> None:
        self._buffer.sort()
        if self._file is None:
            # closed by `close` (the spool is a context manager)
            self._file = tempfile.TemporaryFile(dir=self.folder, prefix=".trollout-spool-")  # noqa: SIM115
        start = self._end
        for i in range(0, len(self._buffer), self.block_rows):
            block = pickle.dumps(self._buffer[i : i + self.block_rows], pickle.HIGHEST_PROTOCOL)
            self._file.write(_HEAD.pack(len(block)))
            self._file.write(block)
            self._end += _HEAD.size + len(block)
        self.runs.append((start, self._end))
        self._buffer = []

    def sorted(self) -> Iterator[tuple[Any, ...]]:
        """Yield every record in key order (once: the records are consumed)."""
        last, self._buffer = self._buffer, []
        last.sort()
        if not self.runs:
            yield from last
            return
        assert self._file is not None
        self._file.flush()
        fd = self._file.fileno()
        yield from heapq.merge(*(self._run(fd, start, end) for start, end in self.runs), last)

    @staticmethod
    def _run(fd: int, start: int, end: int) -> Iterator[tuple[Any, ...]]:
        offset = start
        while offset < end:
            (size,) = _HEAD.unpack(os.pread(fd, _HEAD.size, offset))
            data = os.pread(fd, size, offset + _HEAD.size)
            if len(data) != size:  # our own file, cut short under us
                raise OSError(f"health check spool file truncated at offset {offset}")
            offset += _HEAD.size + size
            yield from pickle.loads(data)

    def close(self) -> None:
        """Close (and so remove) the temporary file; idempotent."""
        self._buffer = []
        if self._file is not None:
            self._file.close()
            self._file = None
