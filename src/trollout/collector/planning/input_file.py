"""The plan's input side: re-iterable row sources, row checks, problem lists.

A *source* yields the rows of the input one at a time, each with a label for error messages
(``path:line`` for a file, ``rows[i]`` for in-memory rows) and its canonical text (the raw line;
for in-memory rows, JSON with sorted keys). Sources are re-iterable: orderings that need several
passes read the input again rather than buffering rows (docs/protocol.md section 5).

Task identity and selection (`TaskTable`, `Selection`) live in `tasks`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import Any, Final, NamedTuple

import orjson

from ... import jsonl
from ...errors import InputError
from ...paths import regular_file
from ...records import ROLLOUT_ID, ROLLOUT_ID_PATTERN, TASK_INDEX, is_mapping
from ...settings import DEFAULT_MAX_INPUT_LINE_BYTES

__all__ = [
    "FileSource",
    "Problems",
    "RowsSource",
    "SourceLine",
    "check_row",
    "check_write_back",
    "is_task_row",
]

PARAMS: Final = "responses_create_params"
_RESERVED_SUFFIX: Final = re.compile(r"-a[0-9]+\Z")
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
