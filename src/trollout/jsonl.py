"""JSON Lines at the edges: line-numbered streaming reads, torn-tail repair, appends.

Reading streams: memory follows the longest line, never the file. Every row read carries its
1-based line number so an error can name ``file:line``. Blank lines are skipped. A line that is
not a JSON object raises `InputError` naming the file and line, unless the caller asks to
collect problems instead (preprocessing reports every bad line in one error).

Torn tails: a hard kill can leave the last line of an appended file cut short. `repair_tail`
drops a final line that does not parse, and adds the missing newline to one that does
(protocol.md section 8). Only the *last* line is ever repaired; a bad line in the middle is an
error, because it means something other than a crash damaged the file.

Rows are serialized with orjson (compact, UTF-8, no NaN): the writer runs once per rollout, and
orjson is several times faster than the standard library on the rows NeMo Gym produces.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import orjson

from .errors import InputError

__all__ = [
    "dumps",
    "iter_lines",
    "iter_rows",
    "loads",
    "parse_line",
    "read_rows",
    "repair_tail",
    "try_parse_line",
    "write_rows",
]

_OPTIONS = orjson.OPT_NON_STR_KEYS


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


def iter_lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, bytes]]:
    """Yield ``(line_number, line)`` for every non-blank line, surrounding whitespace stripped.

    Raises:
        FileNotFoundError: the file does not exist.
    """
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            text = line.strip()
            if text:
                yield number, text


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


def parse_line(path: str | os.PathLike[str], number: int, line: bytes) -> dict[str, Any]:
    """Parse one JSONL line into an object, or raise `InputError` naming file and line."""
    row, problem = try_parse_line(line)
    if row is None:
        raise InputError([f"{os.fspath(path)}:{number}: {problem}"])
    return row


def read_appended(
    path: str | os.PathLike[str], *, torn: list[str] | None = None
) -> Iterator[tuple[int, bytes, dict[str, Any]]]:
    """Yield ``(line number, line, row)`` of a file a writer appends to, tolerating a crash.

    Blank lines are skipped. The last line may be torn by a hard kill (no newline): when it
    still parses it is yielded with its newline added; when it does not, it is skipped and its
    ``file:line`` appended to ``torn``. Resume and aggregation read run files this way, without
    changing them (`repair_tail` is for the writer that reopens them).

    Raises:
        InputError: a line other than a torn last line is not a JSON object (names file, line).
        FileNotFoundError: the file does not exist.
    """
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
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
