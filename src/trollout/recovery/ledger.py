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

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson

from .. import jsonl
from ..errors import InputError, RunFolderError

__all__ = ["encode_reservation", "read_ledger"]

_KEY = "attempts"


def encode_reservation(attempts: Sequence[tuple[int, int, int]]) -> bytes:
    """Return the ledger line reserving ``(task, rollout, attempt)`` triples."""
    return orjson.dumps({_KEY: attempts}, option=orjson.OPT_APPEND_NEWLINE)


def read_ledger(path: Path) -> Iterator[tuple[int, int, int]]:
    """Yield every reserved ``(task, rollout, attempt)``; a missing file yields nothing.

    A torn last line (no newline, does not parse) is skipped: its batch was never sent.

    Raises:
        RunFolderError: a line in the middle of the file is damaged.
    """
    if not path.exists():
        return
    try:
        for number, _, row in jsonl.read_appended(path):
            triples = _triples(row)
            if triples is None:
                raise _damaged(f"{path!s}:{number}")
            yield from triples
    except InputError as exc:  # names the file and line
        raise _damaged(exc.problems[0]) from None


def _triples(row: dict[str, Any]) -> list[tuple[int, int, int]] | None:
    try:
        return [(int(t), int(r), int(a)) for t, r, a in row[_KEY]]
    except (KeyError, TypeError, ValueError):
        return None


def _damaged(where: str) -> RunFolderError:
    return RunFolderError(
        f"{where}: the attempt ledger line is damaged; the run folder was changed by something "
        "other than trollout; restore it or collect into a new folder"
    )
