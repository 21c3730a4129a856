"""Reading the run folder's append-only files for resume and status, streaming.

Each reader tolerates what a crash leaves (a torn last line: no newline, does not parse) and
refuses what a crash cannot leave (a damaged line in the middle), naming file and line.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from .. import jsonl, records
from ..errors import InputError, RunFolderError
from .status import rollout_key

__all__ = ["materialized_keys", "row_key", "run_rows"]


def row_key(row: dict[str, Any]) -> Any:
    """Return a row's `rollout_key`, or None when its identity stamps are not integers."""
    task, rollout = row.get(records.TASK_INDEX), row.get(records.ROLLOUT_INDEX)
    if type(task) is not int or type(rollout) is not int:
        return None
    return rollout_key(task, rollout)


def run_rows(path: Path) -> Iterator[dict[str, Any]]:
    """Yield the JSON objects of a run file; skip a torn tail; refuse a damaged middle line."""
    if not path.exists():
        return
    try:
        for _, _, row in jsonl.read_appended(path):
            yield row
    except InputError as exc:  # names the file and line
        raise _damaged(exc.problems[0]) from None


def materialized_keys(path: Path) -> Iterator[tuple[int, int, int]]:
    """Yield ``(byte offset, task, rollout)`` for every materialized row."""
    if not path.exists():
        raise RunFolderError(
            f"the materialized inputs {str(path)!r} are missing, so what remains to do cannot "
            "be known; the run's outcomes are kept; restore the file, or collect into a new "
            "output file"
        )
    with open(path, "rb") as f:
        offset = 0
        for number, line in enumerate(f, start=1):
            start, offset = offset, offset + len(line)
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
                yield start, row[records.TASK_INDEX], row[records.ROLLOUT_INDEX]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                raise _damaged(f"{os.fspath(path)}:{number}") from None


def _damaged(where: str) -> RunFolderError:
    return RunFolderError(
        f"{where}: this line of the run folder is damaged (not the torn tail a crash leaves); "
        "restore the file, or collect into a new output file"
    )
