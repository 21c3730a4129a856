"""JSON Lines at the edges: line-numbered streaming reads, torn-tail repair, appends.

Reading streams: memory follows the longest line, never the file, and a reader of untrusted input
passes ``max_line_bytes`` so that even one line cannot grow without bound (a file with no newline
is refused once the limit is read, not loaded whole). Every row read carries its 1-based line
number so an error can name ``file:line``. Blank lines are skipped. A line that is not a JSON
object raises `InputError` naming the file and line, unless the caller asks to collect problems
instead (preprocessing reports every bad line in one error).

Nesting: orjson parses 1024 levels but serializes at most 254, so a row between the two would
parse, then fail when written. Rows are held to `MAX_DEPTH` (128, the default limit of serde_json
and so of many servers' parsers), which leaves room for what a collector or a server wraps around
a row. `nested_deeper_than` checks it; `row_too_deep` first counts brackets, which is cheap and
settles almost every row, and walks the parsed row only when the count could exceed the limit.

Torn tails: a hard kill can leave the last line of an appended file cut short. `repair_tail`
drops a final line that does not parse, and adds the missing newline to one that does
(docs/protocol.md section 8). Only the *last* line is ever repaired; a bad line in the middle is an
error, because it means something other than a crash damaged the file.

Wide integers: orjson keeps integers from -2**63 to 2**64-1 exact, parses any other as a float
(``2**70`` would become ``1.1805916207174113e+21``) and cannot write them. A row holding one is
refused by planning, naming ``file:line``: a user's value is never changed silently, and never
passed on inexactly (NeMo Gym's stdlib json would keep it; quoting it keeps it exact for both).
`wide_integer_problem` parses a line a second time, by the standard library, only when it holds
a run of 19 or more digits (one C-speed translate and find); planning calls it once per input
line, in its checking pass, never on files trollout wrote (orjson cannot write such integers).

Rows are serialized with orjson (compact, UTF-8, no NaN): the writer runs once per rollout, and
orjson is several times faster than the standard library on the rows NeMo Gym produces.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import orjson

from .errors import InputError

__all__ = [
    "MAX_DEPTH",
    "dumps",
    "iter_lines",
    "iter_rows",
    "loads",
    "nested_deeper_than",
    "parse_line",
    "read_rows",
    "repair_tail",
    "row_too_deep",
    "try_parse_line",
    "wide_integer_problem",
    "write_rows",
]

_OPTIONS = orjson.OPT_NON_STR_KEYS
MAX_DEPTH = 128  # levels of nested objects and arrays in one row (module doc)
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1  # what orjson parses and writes as exact integers
_SHORTEST_WIDE = 19  # digits of the shortest integer outside that range (-2**63 - 1)
_DIGITS = bytes(48 if 48 <= b <= 57 else 32 for b in range(256))  # every digit -> b"0"
_LONG_RUN = b"0" * _SHORTEST_WIDE


def dumps(row: Mapping[str, Any]) -> bytes:
    """Serialize one row as a compact JSON line, newline included."""
    return orjson.dumps(row, option=_OPTIONS | orjson.OPT_APPEND_NEWLINE)


def loads(data: bytes | str) -> Any:
    """Parse JSON text (a thin alias so callers need not import orjson)."""
    return orjson.loads(data)


def iter_rows(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, row)`` for every non-blank line of a JSONL file.

    Raises:
        InputError: a line is not a JSON object (names file and line).
        FileNotFoundError: the file does not exist.
    """
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            yield number, parse_line(path, number, line)


def iter_lines(
    path: str | os.PathLike[str], *, max_line_bytes: int | None = None
) -> Iterator[tuple[int, bytes]]:
    """Yield ``(line_number, line)`` for every non-blank line, surrounding whitespace stripped.

    Args:
        path: the file.
        max_line_bytes: refuse a line longer than this (LF or CRLF excluded) once that many bytes
            are read; None reads lines of any length (files trollout wrote itself).

    Raises:
        InputError: a line is longer than ``max_line_bytes`` (names file and line).
        FileNotFoundError: the file does not exist.
    """
    with open(path, "rb") as f:
        lines = iter(f) if max_line_bytes is None else _bounded(f, path, max_line_bytes)
        for number, line in enumerate(lines, start=1):
            text = line.strip()
            if text:
                yield number, text


def _bounded(f: IO[bytes], path: str | os.PathLike[str], limit: int) -> Iterator[bytes]:
    number = 0
    while line := f.readline(limit + 2):  # the limit plus a CRLF, never more
        number += 1
        if len(line) > limit and _content_length(line) > limit:
            raise InputError(
                [
                    f"{os.fspath(path)}:{number}: line is longer than {limit:,} bytes (the "
                    "input line limit); fix the file (is it JSONL?), or raise the limit with "
                    "--max-line-bytes / +max_input_line_bytes"
                ]
            )
        yield line


def _content_length(line: bytes) -> int:
    """Return a line's length without its line ending (LF or CRLF)."""
    if line.endswith(b"\r\n"):
        return len(line) - 2
    return len(line) - 1 if line.endswith(b"\n") else len(line)


def nested_deeper_than(value: Any, limit: int) -> bool:
    """Return whether objects and arrays in ``value`` nest more than ``limit`` levels.

    A scalar is 0 levels, ``[]`` one, ``{"a": [1]}`` two. The walk stops at the first branch
    that passes the limit, so its recursion is bounded by ``limit``.
    """
    if type(value) is not dict and type(value) is not list:
        return False
    if limit <= 0:
        return True
    children = value.values() if type(value) is dict else value
    for child in children:
        kind = type(child)
        if (kind is dict or kind is list) and nested_deeper_than(child, limit - 1):
            return True
    return False


def row_too_deep(text: bytes, row: Any, limit: int = MAX_DEPTH) -> bool:
    """Return whether a parsed line nests more than ``limit`` levels (``text`` is the line).

    A row cannot nest deeper than it has opening brackets; most rows have far fewer than the
    limit, so two byte counts settle them and only the rest are walked.
    """
    if text.count(b"[") + text.count(b"{") <= limit:
        return False
    return nested_deeper_than(row, limit)


def try_parse_line(line: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """Parse one JSONL line into ``(row, None)``, or return ``(None, problem)`` (collect mode)."""
    try:
        row = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return None, f"not valid JSON ({exc}); fix or remove the line"
    if not isinstance(row, dict):
        kind = type(row).__name__
        return None, f"expected a JSON object, got {kind}; each line must be one object"
    return row, None


def wide_integer_problem(line: bytes) -> str | None:
    """Return why a parsed line holds an integer orjson cannot keep exact, or None.

    Checked once per input line, by planning's first pass (the module doc): a line is parsed a
    second time, by the standard library, only when it holds a run of 19 or more digits.
    """
    if line.translate(_DIGITS).find(_LONG_RUN) < 0:
        return None
    try:
        json.loads(line, parse_int=_int64)
    except _WideIntError as exc:
        shown = exc.text if len(exc.text) <= 40 else exc.text[:40] + "..."
        return (
            f"integer {shown} is outside the 64-bit range (-2**63 to 2**64-1) and would not be "
            "passed on exactly; quote it (make it a string) or remove the line"
        )
    return None


class _WideIntError(Exception):
    def __init__(self, text: str) -> None:
        self.text = text


def _int64(text: str) -> int:
    """Parse an integer literal of the range orjson keeps exact, or raise `_WideIntError`."""
    if len(text) > 20:  # 2**64 - 1 has 20 digits, -2**63 has 19 and a sign
        raise _WideIntError(text)
    value = int(text)
    if not _INT_MIN <= value <= _INT_MAX:
        raise _WideIntError(text)
    return value


def parse_line(path: str | os.PathLike[str], number: int, line: bytes) -> dict[str, Any]:
    """Parse one JSONL line into an object, or raise `InputError` naming file and line."""
    row, problem = try_parse_line(line)
    if row is None:
        raise InputError([f"{os.fspath(path)}:{number}: {problem}"])
    return row


def read_appended(
    path: str | os.PathLike[str],
    *,
    torn: list[str] | None = None,
    max_line_bytes: int | None = None,
) -> Iterator[tuple[int, bytes, dict[str, Any]]]:
    """Yield ``(line number, line, row)`` of a file a writer appends to, tolerating a crash.

    Blank lines are skipped. The last line may be torn by a hard kill (no newline): when it
    still parses it is yielded with its newline added; when it does not, it is skipped and its
    ``file:line`` appended to ``torn``. Resume and aggregation read run files this way, without
    changing them (`repair_tail` is for the writer that reopens them).

    ``max_line_bytes`` bounds every line, a torn one too, as `iter_lines` does: no more than
    the limit (and a line ending) is read into memory for one line.

    Raises:
        InputError: a line other than a torn last line is not a JSON object, or a line is
            longer than ``max_line_bytes`` (names file and line).
        FileNotFoundError: the file does not exist.
    """
    with open(path, "rb") as f:
        lines = iter(f) if max_line_bytes is None else _bounded(f, path, max_line_bytes)
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            row, problem = try_parse_line(line)
            complete = line.endswith(b"\n")
            if row is not None:
                yield number, line if complete else line + b"\n", row
            elif not complete:  # the torn tail of a killed writer
                if torn is not None:
                    torn.append(f"{os.fspath(path)}:{number}")
                return
            else:
                raise InputError([f"{os.fspath(path)}:{number}: {problem}"])


def read_rows(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Yield the rows of a JSONL file (`iter_rows` without line numbers)."""
    for _, row in iter_rows(path):
        yield row


def write_rows(f: IO[bytes], rows: Iterator[Mapping[str, Any]] | list[Mapping[str, Any]]) -> int:
    """Write rows to a binary file object; return how many were written."""
    n = 0
    for row in rows:
        f.write(dumps(row))
        n += 1
    return n


def repair_tail(path: str | os.PathLike[str]) -> bool:
    """Repair a torn last line in place; return whether the file changed.

    A last line without its newline that parses as a JSON object gets the newline; one that
    does not parse is truncated away. A missing file is left alone; a symlink is refused
    (``OSError``), never followed.
    """
    p = Path(path)
    try:
        size = p.stat().st_size
    except FileNotFoundError:
        return False
    if size == 0:
        return False
    with open(os.open(p, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC), "r+b") as f:
        start = _last_line_start(f, size)
        f.seek(start)
        tail = f.read()
        if tail.endswith(b"\n"):
            return False
        if _parses_as_object(tail):
            f.seek(size)
            f.write(b"\n")
        else:
            f.truncate(start)
        f.flush()
        os.fsync(f.fileno())
    return True


def _last_line_start(f: IO[bytes], size: int) -> int:
    """Return the offset where the file's last line begins (just after the newline before it)."""
    f.seek(size - 1)
    pos = size - 1 if f.read(1) == b"\n" else size  # the final newline belongs to the last line
    while pos > 0:
        low = max(0, pos - (1 << 16))
        f.seek(low)
        newline = f.read(pos - low).rfind(b"\n")
        if newline >= 0:
            return low + newline + 1
        pos = low
    return 0


def _parses_as_object(data: bytes) -> bool:
    try:
        return isinstance(orjson.loads(data), dict)
    except orjson.JSONDecodeError:
        return False
