"""Shards held to the input line limit, and a shard that holds no row (issue 22).

A shard that is one huge line (no newline: a torn tail, or not JSONL at all) was read whole,
skipped as a torn last line, and reported as "0 of 0" with exit 0. Every shard line is now held
to the line limit (``--max-line-bytes``, no more than it is ever read for one line), and a
rollouts file from which no row at all was read, with nothing beside it, is an error naming it.
A run folder a collector wrote (its materialized inputs, manifest, batch status or attempt
ledger beside the rollouts file) is a run where nothing landed, never an error: its planned
rollouts are missing, or, with no plan left, the report says they are unknown.
"""

from __future__ import annotations

import shutil
import tracemalloc
from pathlib import Path

import orjson
import pytest

from builders import invoke, write_tasks_input
from trollout.errors import InputError
from trollout.jsonl import read_appended
from trollout.recovery.layout import RunLayout
from trollout.testing import AgentSpec, DeploymentSpec, spawn_fake_deployment

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


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory) -> RunLayout:
    """A real run folder: ``collect`` of 2 tasks x 2 repeats against the fake deployment.

    Its metrics and report too: files ``aggregate`` writes as well, so no evidence of a run.
    """
    folder = tmp_path_factory.mktemp("collected")
    source = write_tasks_input(folder / "tasks.jsonl", 2, seed=8)
    out = folder / "run" / "run.jsonl"
    spec = DeploymentSpec(agents=(AgentSpec(name="math_agent"),), record_runs=False)
    with spawn_fake_deployment(spec) as urls:
        result = invoke(
            "collect",
            str(source),
            "-o",
            str(out),
            "--head-server",
            urls.head_url,
            "--agent",
            "math_agent",
            "--num-repeats",
            "2",
            "--progress",
            "plain",
        )
    assert result.exit_code == 0, result.output
    return RunLayout.for_output(out)


def nothing_landed(run: RunLayout, folder: Path, kept: tuple[str, ...]) -> RunLayout:
    """Copy ``run`` to ``folder`` as a run where nothing landed, with only the ``kept`` files.

    ``kept`` names `RunLayout` properties (``lock``, ``manifest``, ...); the rollouts file is
    there and empty, as a run stopped before its first row (or handed no task) leaves it.
    """
    copy = RunLayout.for_output(folder / run.output.name)
    folder.mkdir()
    copy.rollouts.write_bytes(b"")
    for name in kept:
        shutil.copy(getattr(run, name), getattr(copy, name))
    return copy


@pytest.mark.parametrize(
    "kept",
    [("materialized_inputs",), ("materialized_inputs", "manifest", "batch_status", "attempts")],
    ids=["plan", "whole-folder"],
)
def test_a_run_where_nothing_landed_counts_its_plan_as_missing(
    tmp_path: Path, collected: RunLayout, kept: tuple[str, ...]
) -> None:
    """Rows in = rows out: 0 landed, its 4 planned rollouts missing, beside a run that landed."""
    empty = nothing_landed(collected, tmp_path / "empty", kept)
    out = tmp_path / "merged" / "merged.jsonl"
    result = invoke(
        "aggregate", f"{collected.output},{empty.output}", "-o", str(out), "--json", "--no-report"
    )
    assert result.exit_code == 0, result.output
    coverage = orjson.loads(result.stdout)["coverage"]
    assert (coverage["expected"], coverage["landed"], coverage["missing"]) == (4, 4, 0)
    alone = invoke("aggregate", str(empty.output), "--json", "--no-report")
    # Rows in, none out: written, said, and exit 75 (incomplete, a resume would run them).
    assert alone.exit_code == 75, alone.output
    assert "4 of 4 planned rollouts have no outcome" in alone.stderr
    coverage = orjson.loads(alone.stdout)["coverage"]
    assert (coverage["expected"], coverage["landed"], coverage["missing"]) == (4, 0, 4)


@pytest.mark.parametrize("kept", ["manifest", "batch_status", "attempts"])
def test_a_run_folder_without_its_plan_says_its_rollouts_are_unknown(
    tmp_path: Path, collected: RunLayout, kept: str
) -> None:
    """Nothing landed and no materialized inputs, but a collector's file: read, and said so."""
    empty = nothing_landed(collected, tmp_path / "empty", (kept, "lock"))
    out = tmp_path / "merged" / "merged.jsonl"
    shards = f"{collected.output},{empty.output}"
    result = invoke("aggregate", shards, "-o", str(out), "--json", "--no-report")
    assert result.exit_code == 0, result.output
    doc = orjson.loads(result.stdout)
    assert (doc["coverage"]["expected"], doc["coverage"]["landed"]) == (4, 4)
    assert doc["inputs"]["unplanned"] == [str(empty.output)]
    text = invoke("aggregate", shards, "-o", str(out), "--no-report")
    assert text.exit_code == 0, text.output
    said = (
        f"{str(empty.output)!r}: a run folder where nothing landed or failed, without "
        "materialized inputs: its planned rollouts are unknown, so coverage leaves them out"
    )
    assert "".join(said.split()) in "".join(text.output.split())  # the console wraps lines


@pytest.mark.parametrize("kept", [(), ("lock",), ("aggregate_metrics", "report")])
def test_an_empty_file_beside_no_run_file_is_refused(
    tmp_path: Path, collected: RunLayout, kept: tuple[str, ...]
) -> None:
    """No row, and nothing only a collector writes beside it (a lock proves nothing): exit 2."""
    empty = nothing_landed(collected, tmp_path / "empty", kept)
    out = tmp_path / "merged" / "merged.jsonl"
    result = invoke("aggregate", f"{collected.output},{empty.output}", "-o", str(out))
    assert result.exit_code == 2, result.output
    [error] = [line for line in result.stderr.splitlines() if line.strip()]
    assert f"{empty.output}: holds no rollout row, and no run folder beside it" in error
    assert not out.exists()
