"""The attempt ledger: attempt numbers go on record before their requests are sent.

``<stem>_attempts.jsonl`` holds one line per reserved batch, ``{"attempts": [[task, rollout,
attempt], ...]}``. The store appends a line (one ``write(2)``, then an fsync unless the policy
is ``never``) before the engine hands any row of the batch to a worker, so every request that
can reach a server has its number on record first. Resume takes, per rollout, the largest
number found here or in the outcome files and starts above it: a number is never reused, even
for an attempt that was killed in flight and left no row anywhere.

A kill can tear only the line being written, and a torn line was never followed by a send
(the send waits for the write), so dropping it (`jsonl.repair_tail`) loses nothing.

Design note: the rejected alternative kept one counter per rollout in a status-like file
replaced atomically. That is one write per batch too, but each write rewrites every rollout's
counter (O(run) per batch); the append-only ledger costs O(batch) per write and is read once,
streaming, by resume.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import orjson

from ..errors import RunFolderError

__all__ = ["AttemptLedger", "encode_reservation", "read_ledger"]

_KEY = "attempts"


def encode_reservation(attempts: Sequence[tuple[int, int, int]]) -> bytes:
    """Return the ledger line reserving ``(task, rollout, attempt)`` triples."""
    return orjson.dumps({_KEY: attempts}, option=orjson.OPT_APPEND_NEWLINE)


class AttemptLedger:
    """The append-only ledger file of one run (the store owns it and calls it per batch)."""

    def __init__(self, path: Path) -> None:
        """Prepare the ledger at ``path``; it is opened on the first reservation."""
        self.path = path
        self.fd: int | None = None
        self.created = False

    def append(self, line: bytes) -> int:
        """Write one reservation line with a single ``write(2)``; return the file descriptor."""
        if self.fd is None:
            self.created = not self.path.exists()
            self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        view = memoryview(line)
        while view:
            view = view[os.write(self.fd, view) :]
        return self.fd

    def close(self) -> None:
        """Close the file (idempotent)."""
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


def read_ledger(path: Path) -> Iterator[tuple[int, int, int]]:
    """Yield every reserved ``(task, rollout, attempt)``; a missing file yields nothing.

    A torn last line (no newline, does not parse) is skipped: its batch was never sent.

    Raises:
        RunFolderError: a line in the middle of the file is damaged.
    """
    if not path.exists():
        return
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            triples = _parse(line)
            if triples is None:
                if not line.endswith(b"\n"):
                    return  # a torn tail
                raise RunFolderError(
                    f"{path!s}:{number}: the attempt ledger line is damaged; the run folder "
                    "was changed by something other than trollout; restore it or collect into "
                    "a new folder"
                )
            yield from triples


def _parse(line: bytes) -> list[tuple[int, int, int]] | None:
    if not line.strip():
        return []
    try:
        entries = orjson.loads(line)[_KEY]
        return [(int(t), int(r), int(a)) for t, r, a in entries]
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None
