"""Shards held to the input line limit, and a shard that holds no row (issue 22).

A shard that is one huge line (no newline: a torn tail, or not JSONL at all) was read whole,
skipped as a torn last line, and reported as "0 of 0" with exit 0. Every shard line is now held
to the line limit (``--max-line-bytes``, no more than it is ever read for one line), and a
rollouts file from which no row at all was read, with nothing beside it, is an error naming it.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from builders import invoke
from trollout.errors import InputError
from trollout.jsonl import read_appended

LIMIT = 1_000


def big_line(path: Path, size: int, *, newline: bool = False) -> Path:
    """Write one line of ``size`` bytes (a JSON string's worth of text) to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b'{"x": "' + b"a" * (size - 9) + b'"}' + (b"\n" if newline else b""))
    return path


@pytest.mark.parametrize("newline", [False, True], ids=["torn", "whole"])
def test_aggregate_refuses_a_shard_line_over_the_limit(tmp_path: Path, newline: bool) -> None:
    """One line over --max-line-bytes: exit 2, one line naming file:line and the setting."""
    shard = big_line(tmp_path / "shards" / "big.jsonl", 50 * LIMIT, newline=newline)
    out = tmp_path / "merged" / "merged.jsonl"
    result = invoke("aggregate", str(shard), "-o", str(out), "--max-line-bytes", str(LIMIT))
    assert result.exit_code == 2, result.output
    [error] = [line for line in result.stderr.splitlines() if line.strip()]
    assert f"{shard}:1: line is longer than 1,000 bytes (the input line limit)" in error
    assert "--max-line-bytes" in error
    assert "Traceback" not in result.output
    assert not out.exists()


def test_aggregate_refuses_a_shard_that_holds_no_row(tmp_path: Path) -> None:
    """A file whose only line is torn (within the limit), nothing beside it: exit 2 naming it."""
    shard = tmp_path / "shards" / "torn.jsonl"
    shard.parent.mkdir()
    shard.write_bytes(b'{"_ng_task_index": 0, "rew')
    out = tmp_path / "merged" / "merged.jsonl"
    result = invoke("aggregate", str(shard), "-o", str(out))
    assert result.exit_code == 2, result.output
    [error] = [line for line in result.stderr.splitlines() if line.strip()]
    assert f"{shard}: holds no rollout row (its only line is torn" in error
    assert "0 of 0" not in result.output
    assert not out.exists()


def test_the_shard_reader_never_holds_more_than_the_limit(tmp_path: Path) -> None:
    """Reading a 20 MB line with a 1 KB limit allocates about the limit, not the line."""
    path = big_line(tmp_path / "big.jsonl", 20 * 1024 * 1024)
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match="line is longer than 1,000 bytes"):
            list(read_appended(path, torn=[], max_line_bytes=LIMIT))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 256 * 1024, peak  # the line is 20 MB; the reader held about 1 KB of it
