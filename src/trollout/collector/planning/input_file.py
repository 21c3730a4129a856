"""The plan's input side: re-iterable row sources, row checks, task identity, problem lists.

A *source* yields the rows of the input one at a time, each with a label for error messages
(``path:line`` for a file, ``rows[i]`` for in-memory rows) and its canonical text (the raw line;
for in-memory rows, JSON with sorted keys). Sources are re-iterable: orderings that need several
passes read the input again rather than buffering rows (docs/protocol.md section 5).

Task identity (`TaskTable`): a row that carries ``_ng_task_index`` keeps it; otherwise identical
rows are one task, keyed by a 16-byte blake2b digest of the canonical text. Memory is one digest
per distinct row, never the rows. Indices are assigned in two steps, because a pre-stamped index
may appear after the rows that must avoid it: the first pass numbers distinct unstamped rows
0, 1, 2, ... in order of first occurrence (ordinals); `TaskTable.finish` then gives ordinal ``k``
the ``k``-th smallest non-negative integer that no row of the input is stamped with. So with rows
stamped 0 and 2, the unstamped rows take 1, 3, 4, ... in order of first occurrence.

Selection (`Selection`): ``limit N`` keeps every line of the first N distinct tasks in order of
first appearance (duplicates included); ``task_ids`` then keeps the listed tasks among those, each
on its first line only, so its repeats come from ``num_repeats`` alone. ``task_ids`` names tasks
by the id each row stores (`task_selection`), as NeMo Gym selects them; a listed id that no row
of the input has is refused. ``shard I/N`` then keeps the tasks of shard I among those
(`task_selection.task_shard`, by the content of each task's first row): a selection on the
whole plan, so every shard numbers and seeds its tasks as one machine would.

Design note: the rejected alternative numbered unstamped rows from ``max(stamped) + 1``, which
needs no second step but leaves holes, and a single stamped row with a large index (a shard of
an earlier run) would push every other task far away from 0.
"""

from __future__ import annotations

import bisect
import hashlib
import os
import re
from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import Any, Final, NamedTuple

import orjson
from attrs import frozen

from ... import jsonl
from ...errors import InputError
from ...paths import regular_file
from ...records import ROLLOUT_ID_PATTERN, is_mapping
from ...settings import DEFAULT_MAX_INPUT_LINE_BYTES
from .task_selection import STORED_ID_PLACES, StoredIds, task_shard

__all__ = [
    "FileSource",
    "Problems",
    "RowsSource",
    "Selection",
    "SourceLine",
    "TaskTable",
    "check_row",
    "check_write_back",
    "is_task_row",
]

TASK_INDEX: Final = "_ng_task_index"
ROLLOUT_ID: Final = "_ng_rollout_id"
PARAMS: Final = "responses_create_params"
_RESERVED_SUFFIX: Final = re.compile(r"-a[0-9]+\Z")
_DIGEST_SIZE: Final = 16
_MAX_LISTED: Final = 100

Row = dict[str, Any]


class SourceLine(NamedTuple):
    """One non-blank line (or in-memory row) of the input."""

    number: int  # 1-based line number, or 0-based index for in-memory rows
    text: bytes  # canonical text: the raw line, or sorted-key JSON
    row: Row | None  # None when the line is not a JSON object
    problem: str | None  # why `row` is None


class FileSource:
    """A JSONL file, read again on every pass; refuses a file that changed since planning.

    Only a regular file will do: the input is read several times, and a FIFO or a pipe (a piped
    ``/dev/stdin``) would be consumed by the first pass, a device never ends, and opening a FIFO
    blocks. The kind is checked with ``stat`` before every open, so none of them is opened.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_line_bytes: int = DEFAULT_MAX_INPUT_LINE_BYTES,
    ) -> None:
        self.path = os.fspath(path)
        self.max_line_bytes = max_line_bytes
        self._stamp: tuple[int, int] | None = None

    @property
    def name(self) -> str:
        """Return how messages name the whole input."""
        return f"input file {self.path!r}"

    def label(self, number: int) -> str:
        """Return ``path:line`` for error messages."""
        return f"{self.path}:{number}"

    def lines(self) -> Iterator[SourceLine]:
        """Yield every non-blank line, parsed.

        Raises:
            InputError: the file cannot be read, is not a regular file, has a line longer than
                ``max_line_bytes``, or changed since the first pass or during this one (its
                size and modification time are checked when the pass starts and ends).
        """
        self._check_unchanged("after it was planned")
        try:
            for number, text in jsonl.iter_lines(self.path, max_line_bytes=self.max_line_bytes):
                row, problem = jsonl.try_parse_line(text)
                yield SourceLine(number, text, row, problem)
        except OSError as exc:
            raise _unreadable(self.path, exc) from exc
        # A change while the pass read the file (a line appended) would reach this pass's
        # rows but not the plan's counts, so a whole pass is only good if nothing changed.
        self._check_unchanged("while it was read")

    def check_readable(self) -> None:
        """Refuse an input that is missing, unreadable or not a regular file, reading nothing.

        What the first pass would refuse about the file itself, for checks that must run
        before the deployment is known (`cli.collect.check_before_writing`).

        Raises:
            InputError: one line naming the file and the remedy.
        """
        self._check_unchanged("after it was planned")
        try:
            os.close(os.open(self.path, os.O_RDONLY | os.O_CLOEXEC))  # a regular file: no wait
        except OSError as exc:
            raise _unreadable(self.path, exc) from exc

    def _check_unchanged(self, when: str) -> None:
        st = regular_file(
            self.path,
            "the input",
            "it is read several times, so save it to a file first (e.g. `cat ... > tasks.jsonl`) "
            "and pass that",
        )
        if st is None:
            return  # reading reports it
        stamp = (st.st_size, st.st_mtime_ns)
        if self._stamp is None:
            self._stamp = stamp
        elif stamp != self._stamp:
            raise InputError([f"{self.path}: the input file changed {when}; plan the run again"])


def _unreadable(path: str, exc: OSError) -> InputError:
    return InputError([f"{path}: cannot read the input file ({exc.strerror}); check the path"])


class RowsSource:
    """In-memory rows (an embedding driver's sequence of dicts); never copied, never mutated."""

    name = "the row sequence"

    def __init__(self, rows: Sequence[object]) -> None:
        self.rows = rows

    def label(self, number: int) -> str:
        """Return ``rows[i]`` for error messages."""
        return f"rows[{number}]"

    def lines(self) -> Iterator[SourceLine]:
        """Yield every row with its canonical text (JSON with sorted keys)."""
        for index, row in enumerate(self.rows):
            if not isinstance(row, Mapping):
                kind = type(row).__name__
                yield SourceLine(index, b"", None, f"expected a mapping, got {kind}; pass dicts")
                continue
            try:
                text = orjson.dumps(row, option=orjson.OPT_SORT_KEYS)
            except TypeError as exc:
                yield SourceLine(index, b"", None, f"not JSON-serializable ({exc}); fix the row")
                continue
            yield SourceLine(index, text, dict(row), None)


def check_write_back(line: SourceLine) -> str | None:
    """Return why a parsed line cannot be written back exactly, or None.

    It nests deeper than a run can write, or holds an integer outside the 64-bit range
    (`jsonl.wide_integer_problem`).
    """
    if line.row is None:
        return None
    if jsonl.row_too_deep(line.text, line.row):
        return (
            f"the row nests deeper than {jsonl.MAX_DEPTH} levels of objects and arrays, more "
            "than a run can write back; flatten it or remove the line"
        )
    return jsonl.wide_integer_problem(line.text)


def is_task_row(row: Mapping[str, Any]) -> bool:
    """Return whether a row is a 0.7.0 task row (``task_id`` is an object)."""
    return is_mapping(row.get("task_id"))


def check_row(row: Mapping[str, Any]) -> list[str]:
    """Return the shape problems of one input row (empty when it is fine)."""
    problems = _check_identity_keys(row)
    if is_task_row(row):
        task_id = row["task_id"]
        taskset = task_id.get("taskset")
        if not isinstance(taskset, str) or not taskset:
            problems.append(
                f"task_id.taskset must be a non-empty string (got {taskset!r}); fix the task row"
            )
        if "task_input" not in row:
            problems.append("task row has task_id but no task_input; add task_input")
        return problems
    params = row.get(PARAMS)
    if params is None:
        problems.append(
            f"missing {PARAMS} (every server answers 422 without it); add it or remove the line"
        )
    elif not isinstance(params, dict):
        kind = type(params).__name__
        problems.append(f"{PARAMS} must be an object (got {kind}); fix the row")
    return problems + _check_routing_keys(row)


def _check_identity_keys(row: Mapping[str, Any]) -> list[str]:
    problems = []
    index = row.get(TASK_INDEX)
    if TASK_INDEX in row and (type(index) is not int or index < 0):
        problems.append(
            f"{TASK_INDEX} must be an integer >= 0 (got {index!r}); fix it or remove the key"
        )
    if ROLLOUT_ID in row:
        problem = _rollout_id_problem(row[ROLLOUT_ID])
        if problem:
            problems.append(problem)
    return problems


def _rollout_id_problem(value: Any) -> str | None:
    if not isinstance(value, str) or not ROLLOUT_ID_PATTERN.match(value):
        return (
            f"{ROLLOUT_ID} must match {ROLLOUT_ID_PATTERN.pattern} (got {value!r}); "
            "use letters, digits, '.', '_' and '-'"
        )
    if _RESERVED_SUFFIX.search(value):
        return (
            f"{ROLLOUT_ID} {value!r} ends in '-a<digits>', which is reserved for attempt "
            "numbers; rename it"
        )
    return None


def _check_routing_keys(row: Mapping[str, Any]) -> list[str]:
    problems = []
    ref = row.get("agent_ref")
    if "agent_ref" in row and not (isinstance(ref, Mapping) and isinstance(ref.get("name"), str)):
        problems.append(f"agent_ref must be an object with a string name (got {ref!r}); fix it")
    source = row.get("task_source")
    if "task_source" in row and not isinstance(source, str):
        problems.append(f"task_source must be a string (got {source!r}); fix it")
    return problems


class Problems:
    """Every problem found before dispatch, raised together as one `InputError`.

    Per-line problems are listed up to a cap (then counted); routing problems are grouped, one
    line per key with a count and the first place they occur.
    """

    def __init__(self) -> None:
        self._config: list[str] = []
        self._lines: list[str] = []
        self._unlisted = 0
        self._groups: dict[Hashable, list[Any]] = {}

    def __bool__(self) -> bool:
        return bool(self._config or self._lines or self._groups)

    def config(self, message: str) -> None:
        """Record a problem with a setting (the message names the key)."""
        if message not in self._config:
            self._config.append(message)

    def line(self, label: str, message: str) -> None:
        """Record a problem with one line."""
        if len(self._lines) < _MAX_LISTED:
            self._lines.append(f"{label}: {message}")
        else:
            self._unlisted += 1

    def group(self, key: Hashable, label: str, what: str, remedy: str) -> None:
        """Record one occurrence of a problem reported once per key (count, first place)."""
        entry = self._groups.get(key)
        if entry is None:
            self._groups[key] = [label, 1, what, remedy]
        else:
            entry[1] += 1

    def raise_if_any(self) -> None:
        """Raise `InputError` with every problem recorded so far.

        Raises:
            InputError: when any problem was recorded.
        """
        if self:
            raise InputError(self.messages())

    def messages(self) -> list[str]:
        """Return every problem, one line each."""
        out = self._config + self._lines
        if self._unlisted:
            out.append(
                f"... and {self._unlisted} more line problems like the above; fix those first"
            )
        for label, count, what, remedy in self._groups.values():
            rows = f"{count} rows, first at {label}" if count > 1 else f"{label}"
            out.append(f"{rows}: {what}; {remedy}" if remedy else f"{rows}: {what}")
        return out


@frozen
class Selection:
    """Which tasks a plan keeps (`limit`, `task_ids`).

    Attributes:
        tasks: the kept task indices, or None for all.
        each_once: keep only the first line of each task (`task_ids`).
        sharded_out: the shard kept none of the tasks `limit` and `task_ids` kept (a small
            input split into many shards: an empty shard, not a mistake).
    """

    tasks: frozenset[int] | None = None
    each_once: bool = False
    sharded_out: bool = False

    def includes(self, task: int) -> bool:
        """Return whether rows of ``task`` are kept."""
        return self.tasks is None or task in self.tasks


class TaskTable:
    """Task indices of the input's rows: recorded in a first pass, fixed by `finish`."""

    def __init__(
        self,
        *,
        limit: int | None = None,
        task_ids: Sequence[str | int] | None = None,
        shard: tuple[int, int] | None = None,
    ) -> None:
        self._by_digest: dict[bytes, int] = {}  # ordinals until finish(), then task indices
        self._ids = StoredIds(task_ids)  # the tasks `task_ids` names, by the id rows store
        self._stamped: set[int] = set()
        self._stamped_sorted: list[int] = []
        self.repeated: set[int] = set()  # tasks on more than one line (keys, then indices)
        self._limit = limit
        self._first: dict[int, None] = {}  # the first `limit` distinct task keys, in order
        self._shard = shard
        self._in_shard: set[int] = set()  # task keys whose first row hashes to `shard`
        self._finished = False

    @property
    def count(self) -> int:
        """Return how many distinct tasks the input holds."""
        return len(self._by_digest) + len(self._stamped)

    def record(self, line: SourceLine) -> None:
        """Record one valid row of the first pass."""
        stamped = line.row.get(TASK_INDEX) if line.row is not None else None
        if stamped is not None:
            key, seen = stamped, stamped in self._stamped
            self._stamped.add(stamped)
        else:
            digest = _digest(line.text)
            ordinal = self._by_digest.get(digest)
            seen = ordinal is not None
            if ordinal is None:
                ordinal = self._by_digest[digest] = len(self._by_digest)
            key = ~ordinal  # negative keys are ordinals until finish()
        if seen:
            self.repeated.add(key)
        elif self._shard is not None and line.row is not None:
            index, count = self._shard
            if task_shard(line.row, count) == index:
                self._in_shard.add(key)
        if line.row is not None:
            self._ids.record(line.row, key)
        if self._limit is not None and len(self._first) < self._limit:
            self._first.setdefault(key, None)

    def finish(self) -> None:
        """Turn ordinals into task indices (the rule in the module docstring)."""
        self._stamped_sorted = sorted(self._stamped)
        finals = self._finals(len(self._by_digest))
        for digest, ordinal in self._by_digest.items():
            self._by_digest[digest] = finals[ordinal]
        self.repeated = {finals[~k] if k < 0 else k for k in self.repeated}
        self._first = {(finals[~k] if k < 0 else k): None for k in self._first}
        self._in_shard = {finals[~k] if k < 0 else k for k in self._in_shard}
        self._ids.renumber(lambda k: finals[~k] if k < 0 else k)
        self._finished = True

    def _finals(self, n: int) -> list[int]:
        finals: list[int] = []
        stamped, j, candidate = self._stamped_sorted, 0, 0
        while len(finals) < n:
            while j < len(stamped) and stamped[j] < candidate:
                j += 1
            if not (j < len(stamped) and stamped[j] == candidate):
                finals.append(candidate)
            candidate += 1
        return finals

    def index_of(self, row: Mapping[str, Any], text: bytes) -> int | None:
        """Return the task index of a row recorded in the first pass (None: not recorded)."""
        assert self._finished, "index_of() before finish()"
        stamped = row.get(TASK_INDEX)
        if stamped is not None:
            return int(stamped)
        return self._by_digest.get(_digest(text))

    def contains(self, task: int) -> bool:
        """Return whether some row of the input has task index ``task``."""
        if task in self._stamped:
            return True
        rank = task - bisect.bisect_left(self._stamped_sorted, task)
        return 0 <= rank < len(self._by_digest)

    def selection(self, task_ids: Sequence[str | int] | None, problems: Problems) -> Selection:
        """Return the tasks kept by `limit` (the first N), then `task_ids`, then `shard`."""
        kept: set[int] | None = set(self._first) if self._limit is not None else None
        if task_ids is not None:
            for missing in self._ids.missing():
                problems.config(
                    f"task_ids: {missing!r} is the id of no row of the input (ids are read "
                    f"from {STORED_ID_PLACES}); list ids the rows store"
                )
            wanted = self._ids.tasks()
            kept = wanted if kept is None else wanted & kept
        each_once = task_ids is not None
        if self._shard is None:
            return Selection(None if kept is None else frozenset(kept), each_once=each_once)
        before = self.count if kept is None else len(kept)
        kept = self._in_shard if kept is None else kept & self._in_shard
        emptied = before > 0 and not kept
        return Selection(frozenset(kept), each_once=each_once, sharded_out=emptied)


def _digest(text: bytes) -> bytes:
    return hashlib.blake2b(text, digest_size=_DIGEST_SIZE).digest()
