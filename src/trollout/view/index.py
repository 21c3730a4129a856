# Stays whole: one index class; its tailing and its summaries update the same slots.
"""One run's rollouts as compact summaries plus byte offsets, kept current by tailing.

`RunIndex` holds one slot per rollout (a (shard, task, rollout) seen in the materialized
inputs, the rollouts file, the failures sidecar or the verdicts file) in parallel arrays, a few
dozen bytes each, and where its rows are: the offset and length of its materialized row, of its
landed row, of each failed attempt's row and of its verdict. `refresh` reads only what was
appended since the last call (`Tail`); a rollout page reads its rows by seek (`read_row`).

Outcome of a rollout: ``landed`` once a row of it is in the rollouts file; else ``failed``
with the class of its latest failure row (file order, as resume reads it); else ``pending``
(planned, no outcome yet). Attempts count its rows (each failed attempt, plus the landing).
"""

from __future__ import annotations

import math
import os
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import orjson

from ..errors import RunFolderError
from ..metrics.reader import group_key
from ..records import ELAPSED, FAILURE_CLASS, ROLLOUT_INDEX, TASK_INDEX
from .runs import Run, open_run_file, verdicts_paths

__all__ = ["HEALTH", "OUTCOMES", "RunIndex", "Tail"]

OUTCOMES: Final = ("pending", "landed", "failed")
PENDING, LANDED, FAILED = 0, 1, 2
HEALTH: Final = ("", "healthy", "unhealthy", "unobserved")
KINDS: Final = ("input", "landed", "failure", "verdict")
INPUT, LANDED_ROW, FAILURE_ROW, VERDICT = range(4)
_CHUNK: Final = 4 << 20  # bytes read at a time while indexing or searching
MAX_ROW_BYTES: Final = 64 << 20  # a rollout page parses no row longer than this
NAN: Final = math.nan

Key = tuple[int, int, int]  # (shard, task, rollout)
Loc = tuple[int, int]  # (offset, length)


class _ReplacedError(Exception):
    """A tailed file shrank or was replaced: the index starts afresh."""


class Tail:
    """The complete lines appended to one file since the last look.

    A line without its newline is being written: it is left for the next look. A file that
    shrank, or whose inode changed, raises `_ReplacedError` (a new run, or ``--overwrite``).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.lines = 0  # complete lines read, for naming a damaged one
        self.ident: tuple[int, int] | None = None
        self.behind = False  # the last read stopped at its budget, before the end

    def read(self, consume: Callable[[int, bytes], None], budget: int | None = None) -> bool:
        """Call ``consume(offset, line)`` for each new complete line; return whether any.

        ``budget`` stops the read at the first line end past that many bytes (`behind` then
        says more is there): a big file is indexed in steps, so requests are answered between.
        """
        f = open_run_file(self.path)
        if f is None:
            if self.ident is not None:
                raise _ReplacedError
            return False
        with f:
            st = os.fstat(f.fileno())
            ident = (st.st_dev, st.st_ino)
            if (self.ident is not None and ident != self.ident) or st.st_size < self.offset:
                raise _ReplacedError
            self.ident = ident
            self.behind = False
            if st.st_size == self.offset:
                return False
            f.seek(self.offset)
            start = self.offset
            pending = b""
            any_line = False
            while chunk := f.read(_CHUNK):
                data = pending + chunk if pending else chunk
                end = data.rfind(b"\n")
                if end < 0:
                    pending = data
                    continue
                pos = 0
                while pos <= end:
                    nl = data.index(b"\n", pos)
                    self.lines += 1
                    if nl > pos:
                        consume(start + pos, data[pos : nl + 1])
                    pos = nl + 1
                start += end + 1
                pending = data[end + 1 :]
                any_line = True
                if budget is not None and start - self.offset >= budget:
                    self.behind = start < st.st_size
                    break
            self.offset = start
            return any_line


class RunIndex:
    """Every rollout of one run, summarised; see the module doc."""

    def __init__(self, number: int, run: Run) -> None:
        self.number = number
        self.run = run
        self.version = 0  # bumped whenever anything changed
        self._reset()

    def _reset(self) -> None:
        self.keys: dict[Key, int] = {}
        self.shard = array("H")
        self.task = array("q")
        self.rollout = array("q")
        self.agent = array("H")
        self.reward = array("d")
        self.outcome = array("B")
        self.cls = array("H")
        self.attempts = array("H")
        self.latency = array("d")
        self.health = array("B")
        self.input_loc = array("q")
        self.input_len = array("q")
        self.landed_loc = array("q")
        self.landed_len = array("q")
        self.failures: dict[int, list[Loc]] = {}
        self.verdicts: dict[int, Loc] = {}
        self.names: list[str] = [""]
        self._name_ids: dict[str, int] = {"": 0}
        self.problems: list[str] = []
        self.tails: list[list[Tail | None]] = []
        for layout in self.run.shards:
            self.tails.append(
                [
                    Tail(layout.materialized_inputs),
                    Tail(layout.rollouts),
                    Tail(layout.failures),
                    None,  # the verdicts file, once one appears
                ]
            )
        self.version += 1

    def __len__(self) -> int:
        return len(self.task)

    def name(self, i: int) -> str:
        """The interned string ``i`` (agent or class names)."""
        return self.names[i]

    def _intern(self, text: str) -> int:
        found = self._name_ids.get(text)
        if found is None:
            found = self._name_ids[text] = len(self.names)
            self.names.append(text)
        return found

    # --- reading -------------------------------------------------------------------------

    def refresh(self, budget: int | None = None) -> bool:
        """Read what the run's files gained since the last call; return whether anything did.

        With a ``budget``, at most about that many bytes of each file are read (`behind`).
        """
        try:
            changed = self._refresh_once(budget)
        except _ReplacedError:
            self._reset()
            changed = self._refresh_once(budget)
        if changed:
            self.version += 1
        return changed

    @property
    def behind(self) -> bool:
        """Whether a file holds lines not indexed yet (a budgeted refresh stopped early)."""
        return any(t is not None and t.behind for tails in self.tails for t in tails)

    def _refresh_once(self, budget: int | None) -> bool:
        changed = False
        for shard, tails in enumerate(self.tails):
            if tails[VERDICT] is None:
                tails[VERDICT] = next(
                    (Tail(p) for p in verdicts_paths(self.run.shards[shard]) if p.exists()), None
                )
            for kind, tail in enumerate(tails):
                if tail is None:
                    continue
                try:
                    changed |= tail.read(self._consumer(shard, kind, tail), budget)
                except RunFolderError as exc:
                    if str(exc) not in self.problems:
                        self.problems.append(str(exc))
        return changed

    def _consumer(self, shard: int, kind: int, tail: Tail) -> Callable[[int, bytes], None]:
        def consume(offset: int, line: bytes) -> None:
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError:
                row = None
            if not isinstance(row, dict):
                if line.strip():
                    self._problem(f"{tail.path}:{tail.lines}: not a JSON object; skipped")
                return
            task, rollout = row.get(TASK_INDEX), row.get(ROLLOUT_INDEX)
            if type(task) is not int or type(rollout) is not int:
                if kind != VERDICT:  # an unreadable record's verdict has a string index
                    self._problem(f"{tail.path}:{tail.lines}: no integer task/rollout; skipped")
                return
            self._add(kind, self._slot((shard, task, rollout), row), row, (offset, len(line)))

        return consume

    def _problem(self, text: str) -> None:
        if len(self.problems) < 50:
            self.problems.append(text)

    def _slot(self, key: Key, row: dict[str, Any]) -> int:
        i = self.keys.get(key)
        if i is not None:
            if not self.agent[i]:
                self.agent[i] = self._agent_of(row)
            return i
        i = self.keys[key] = len(self.task)
        self.shard.append(key[0])
        self.task.append(key[1])
        self.rollout.append(key[2])
        self.agent.append(self._agent_of(row))
        self.reward.append(NAN)
        self.outcome.append(PENDING)
        self.cls.append(0)
        self.attempts.append(0)
        self.latency.append(NAN)
        self.health.append(0)
        for column in (self.input_loc, self.input_len, self.landed_loc, self.landed_len):
            column.append(-1)
        return i

    def _agent_of(self, row: dict[str, Any]) -> int:
        agent, env = group_key(row)
        name = agent or env
        return self._intern(name) if name else 0

    def _add(self, kind: int, i: int, row: dict[str, Any], loc: Loc) -> None:
        if kind == INPUT:
            self.input_loc[i], self.input_len[i] = loc
        elif kind == LANDED_ROW:
            if self.outcome[i] == LANDED:
                return  # a second landed row (the store refuses them; a copied file may not)
            self.landed_loc[i], self.landed_len[i] = loc
            self.outcome[i] = LANDED
            self.attempts[i] = min(self.attempts[i] + 1, 65535)
            reward = row.get("reward")
            number = isinstance(reward, int | float) and not isinstance(reward, bool)
            self.reward[i] = float(reward) if number and reward is not None else NAN
            cls = row.get(FAILURE_CLASS)
            self.cls[i] = self._intern(cls) if isinstance(cls, str) else 0
            self.latency[i] = _seconds(row.get(ELAPSED))
        elif kind == FAILURE_ROW:
            self.failures.setdefault(i, []).append(loc)
            self.attempts[i] = min(self.attempts[i] + 1, 65535)
            if self.outcome[i] != LANDED:
                self.outcome[i] = FAILED
                cls = row.get(FAILURE_CLASS)
                self.cls[i] = self._intern(cls if isinstance(cls, str) else "unknown")
                self.latency[i] = _seconds(row.get(ELAPSED))
        else:
            verdict = row.get("verdict")
            self.health[i] = HEALTH.index(verdict) if verdict in HEALTH[1:] else 0
            self.verdicts[i] = loc

    def read_row(self, i: int, kind: int, which: int = 0) -> tuple[dict[str, Any] | None, str]:
        """Read one row of rollout ``i`` by seek: ``(row, "")``, or ``(None, why not)``.

        ``which`` picks the failed attempt (file order) for `FAILURE_ROW`.
        """
        if kind == INPUT:
            loc = (self.input_loc[i], self.input_len[i])
        elif kind == LANDED_ROW:
            loc = (self.landed_loc[i], self.landed_len[i])
        elif kind == FAILURE_ROW:
            rows = self.failures.get(i, [])
            loc = rows[which] if 0 <= which < len(rows) else (-1, -1)
        else:
            loc = self.verdicts.get(i, (-1, -1))
        if loc[0] < 0:
            return None, ""
        if loc[1] > MAX_ROW_BYTES:
            return None, f"the row is {loc[1]:,} bytes: too large to show here (raw JSON only)"
        data = self.read_bytes(i, kind, loc, loc[1])
        if data is None:
            return None, "the file changed; reload the page"
        try:
            row = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None, "the row no longer parses (the file changed); reload the page"
        return (row, "") if isinstance(row, dict) else (None, "not a JSON object")

    def read_bytes(self, i: int, kind: int, loc: Loc, limit: int) -> bytes | None:
        """Read at most ``limit`` bytes of the row at ``loc`` of rollout ``i``'s shard."""
        tail = self.tails[self.shard[i]][kind]
        if tail is None:
            return None
        try:
            f = open_run_file(tail.path)
        except RunFolderError:
            return None
        if f is None:
            return None
        with f:
            f.seek(loc[0])
            return f.read(min(loc[1], limit))

    def locs(self, i: int, kind: int) -> list[Loc]:
        """Where rollout ``i``'s rows of one kind are (failed attempts: one per attempt)."""
        if kind == FAILURE_ROW:
            return list(self.failures.get(i, []))
        if kind == VERDICT:
            return [self.verdicts[i]] if i in self.verdicts else []
        column = (self.input_loc, self.input_len) if kind == INPUT else None
        column = column or (self.landed_loc, self.landed_len)
        return [(column[0][i], column[1][i])] if column[0][i] >= 0 else []

    # --- search --------------------------------------------------------------------------

    def search(self, text: str) -> set[int]:
        """Return the rollouts whose rows hold ``text`` in a string value (case folded)."""
        needle = text.casefold()
        raw = orjson.dumps(text.lower())[1:-1]
        found: set[int] = set()
        for shard, tails in enumerate(self.tails):
            for tail in tails:
                if tail is None or tail.offset == 0:
                    continue
                for line in _lines_holding(tail.path, raw, tail.offset):
                    try:
                        row = orjson.loads(line)
                    except orjson.JSONDecodeError:
                        continue
                    if not isinstance(row, dict) or not _holds(row, needle):
                        continue
                    key = (shard, row.get(TASK_INDEX), row.get(ROLLOUT_INDEX))
                    i = self.keys.get(key)  # type: ignore[arg-type]
                    if i is not None:
                        found.add(i)
        return found


def _seconds(value: Any) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
    return float(value) if ok else NAN


def _lines_holding(path: Path, needle: bytes, limit: int) -> Iterator[bytes]:
    """Yield the lines of ``path`` (its first ``limit`` bytes) whose lowercased bytes hold
    ``needle``."""
    try:
        f = open_run_file(path)
    except RunFolderError:
        return
    if f is None:
        return
    with f:
        pending = b""
        left = limit
        while left > 0 and (chunk := f.read(min(_CHUNK, left))):
            left -= len(chunk)
            data = pending + chunk if pending else chunk
            end = data.rfind(b"\n")
            if end < 0:
                pending = data
                continue
            pending = data[end + 1 :]
            data = data[: end + 1]
            lowered = data.lower()
            pos = lowered.find(needle)
            while pos >= 0:
                start = data.rfind(b"\n", 0, pos) + 1
                stop = data.index(b"\n", pos)
                yield data[start:stop]
                pos = lowered.find(needle, stop)


def _holds(value: Any, needle: str) -> bool:
    """Whether a string value anywhere in ``value`` holds ``needle`` (case folded)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if needle in item.casefold():
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False
