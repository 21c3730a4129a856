"""The attempt ledger: a number goes on record before its request can leave, and comes back
when it provably never left.

``<stem>_attempts.jsonl`` holds three kinds of line, appended in the order things happened:

- ``{"attempts": [[task, rollout, attempt], ...]}``: a reservation. A worker appends one (one
  ``write(2)``) for the attempt it is about to send, after its limiter token and the admission
  check and before `dispatch`, so nothing is reserved for a row that is queued, waiting for a
  token or drained; the line is fsynced per the run's fsync policy (``row``: before the request
  leaves; ``batch``: with the outcome rows, within ``fsync_every_s``; ``never``: not at all).
- ``{"released": [[task, rollout, attempt], ...]}``: numbers whose attempt never reached a
  server: the store appends one with each batch of outcomes that holds a never-started attempt
  (an ``Omitted`` drained, a ``Failed`` that was ``not_sent``). It is only a hint: one lost to a
  kill costs a number, never a reuse, so it is not fsynced on its own.
- ``{"resent": [[task, rollout, attempt, retry]]}``: a re-send within an attempt (a 429 or 503
  retried, a connection re-tried), written just before it leaves; ``retry`` is the number the
  request carries in ``X-Trollout-Retry``. It reserves no number (the attempt's is on record
  already): it makes a retry visible beside the attempts, and resume skips it.

The rule resume applies (`SentNumbers`), per rollout, in file order: a release takes back the
rollout's latest reservation if it names that number, and nothing else (a number a session
releases is always its latest for that rollout: a rollout's numbers only grow within a session,
and a later one is reserved only after an earlier one was possibly delivered). Every other
reserved number may have reached a server. The next attempt number is one above the largest
that may have: a number that may have reached a server is never reused, one that provably did
not is handed out again. A ledger written before release lines existed has none, so every
reservation counts as possibly sent: the old, safe reading.

A kill can tear only the line being written; a torn reservation was never followed by its send
(the send waits for the write), and a torn release only keeps a number spent, so dropping it
(`jsonl.repair_tail`) loses nothing.

Design note: rejected alternatives.

- Reserving a batch of up to 256 rows before lending them to workers (what this replaced): one
  write per 256 rollouts, but a kill (SIGKILL, preemption) spent the numbers of every row still
  queued, so a rollout sent once could land as attempt 2 or 3, past ``--max-attempts``.
- Releasing queued numbers at the orderly stop only: a SIGKILL has no orderly stop, and it is
  the case that burned numbers. Reserving at the send leaves nothing queued to release.
- Deriving releases from the outcome files alone: a drained attempt is written nowhere unless
  ``record_omitted_rollouts``, and the sidecar is not ordered with the ledger, so a number
  released by one session and sent by the next could not be told from one still unsent.
- One counter per rollout in a file replaced atomically: O(run) per write; the append-only
  ledger costs O(line) per write and is read once, streaming, by resume.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson

from .. import jsonl
from ..errors import InputError, RunFolderError

__all__ = [
    "SentNumbers",
    "encode_release",
    "encode_resend",
    "encode_reservation",
    "read_entries",
    "read_ledger",
]

_KEY = "attempts"
_RELEASED = "released"
_RESENT = "resent"


class SentNumbers:
    """The attempt numbers of one rollout that may have reached a server (module docstring).

    Fed the rollout's ledger lines in file order (`reserved`, `released`) and the numbers of
    its outcome rows that reached a server (`sent`); `largest` is then the largest number that
    may have reached a server (-1: none), and the next attempt is one above it.
    """

    __slots__ = ("_pending", "_top")

    def __init__(self) -> None:
        self._top = -1  # the largest number known to be possibly sent
        self._pending = -1  # the latest reservation, until a release names it (-1: none)

    def reserved(self, attempt: int) -> None:
        """Note a reservation: the one before it stays possibly sent."""
        if self._pending > self._top:
            self._top = self._pending
        self._pending = attempt

    def released(self, attempt: int) -> None:
        """Note a release: it takes back the latest reservation only if it names it."""
        if attempt == self._pending:
            self._pending = -1

    def sent(self, attempt: int) -> None:
        """Note a number an outcome row shows may have reached a server."""
        if attempt > self._top:
            self._top = attempt

    @property
    def largest(self) -> int:
        """The largest number that may have reached a server (-1: none)."""
        return max(self._top, self._pending)


def encode_reservation(attempts: Sequence[tuple[int, int, int]]) -> bytes:
    """Return the ledger line reserving ``(task, rollout, attempt)`` triples."""
    return orjson.dumps({_KEY: attempts}, option=orjson.OPT_APPEND_NEWLINE)


def encode_release(attempts: Sequence[tuple[int, int, int]]) -> bytes:
    """Return the ledger line releasing ``(task, rollout, attempt)`` triples never sent."""
    return orjson.dumps({_RELEASED: attempts}, option=orjson.OPT_APPEND_NEWLINE)


def encode_resend(task: int, rollout: int, attempt: int, retry: int) -> bytes:
    """Return the ledger line of re-send `retry` (1, 2, ...) within an attempt."""
    return orjson.dumps(
        {_RESENT: [[task, rollout, attempt, retry]]}, option=orjson.OPT_APPEND_NEWLINE
    )


def read_ledger(path: Path) -> Iterator[tuple[int, int, int]]:
    """Yield every reserved ``(task, rollout, attempt)``; a missing file yields nothing.

    Releases are skipped (`read_entries` has them). A torn last line (no newline, does not
    parse) is skipped: its attempts were never sent.

    Raises:
        RunFolderError: a line in the middle of the file is damaged.
    """
    for released, task, rollout, attempt in read_entries(path):
        if not released:
            yield task, rollout, attempt


def read_entries(path: Path) -> Iterator[tuple[bool, int, int, int]]:
    """Yield ``(released, task, rollout, attempt)`` for every number in file order.

    ``released`` is False for a reservation, True for a release. A missing file yields
    nothing; a torn last line is skipped.

    Raises:
        RunFolderError: a line in the middle of the file is damaged.
    """
    if not path.exists():
        return
    try:
        for number, _, row in jsonl.read_appended(path):
            entries = _entries(row)
            if entries is None:
                raise _damaged(f"{path!s}:{number}")
            yield from entries
    except InputError as exc:  # names the file and line
        raise _damaged(exc.problems[0]) from None


def _entries(row: dict[str, Any]) -> list[tuple[bool, int, int, int]] | None:
    if _RESENT in row:
        return []  # a retry within an attempt: no number reserved or released
    released = _RELEASED in row
    try:
        triples = row[_RELEASED] if released else row[_KEY]
        return [(released, int(t), int(r), int(a)) for t, r, a in triples]
    except (KeyError, TypeError, ValueError):
        return None


def _damaged(where: str) -> RunFolderError:
    return RunFolderError(
        f"{where}: the attempt ledger line is damaged; the run folder was changed by something "
        "other than trollout; restore it or collect into a new folder"
    )
