"""Batches recorded as shards: resumable by the CLI, replaced by label, one writer at a time.

The fake runs in its own process, so the CLI (which runs its own Trio loop) can resume what a
driver recorded, against the same servers.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import trio

import trollout
from builders import invoke, read_jsonl
from trollout.errors import ConfigError, RunFolderLockedError, RunFolderWriteError
from trollout.recovery.layout import RunLayout
from trollout.recovery.ledger import read_ledger
from trollout.testing import FakeUrls, task_rows

CONFIG = trollout.RunConfig(agent_name="math_agent", num_samples_in_parallel=8)
FAIL_FIRST = {"kind": "status", "status": 500, "attempts": [0]}


def dataset(n: int, *, failing: frozenset[int] = frozenset(), seed: int = 3) -> list[Any]:
    """n dataset rows; the rows in `failing` answer 500 on their first attempt."""
    rows = list(task_rows(n, seed=seed))
    for i in failing:
        rows[i]["fake_fault"] = FAIL_FIRST
    return rows


def runs_total(fake: FakeUrls) -> int:
    """Every /run the fake has received so far."""
    return int(httpx.get(f"{fake.head_url}/_fake/stats").json()["runs_total"])


async def record(fake: FakeUrls, folder: Path, steps: dict[str, list[Any]]) -> dict[str, str]:
    """Record one shard per label (in order); return each label's run id."""
    run_ids = {}
    async with trollout.open_rollouts(
        fake.run_urls, config=CONFIG, record_output_dir=folder
    ) as rollouts:
        for label, rows in steps.items():
            async with rollouts.open_batch(rollouts.plan(rows), record_shard=label) as batch:
                outcomes = [item async for item in batch]
            assert len(outcomes) == len(rows)
            run_ids[label] = batch.run_id
    return run_ids


def test_shard_is_a_run_folder_that_trollout_resume_finishes(
    fake: FakeUrls, tmp_path: Path
) -> None:
    """A recorded shard resumes with `trollout resume`, which sends only what it lacks."""
    (run_id,) = trio.run(
        record, fake, tmp_path, {"step-0001": dataset(6, failing=frozenset({1, 3}))}
    ).values()
    layout = RunLayout.for_output(tmp_path / "rollouts-step-0001.jsonl")
    inputs = read_jsonl(layout.materialized_inputs)
    assert [row["_ng_rollout_id"] for row in inputs] == [f"{run_id}-{t}-0" for t in range(6)]
    manifest = orjson.loads(layout.manifest.read_bytes())
    assert manifest["run_id"] == run_id
    assert manifest["settings"]["input_jsonl_fpath"] == str(layout.materialized_inputs)
    assert sorted(read_ledger(layout.attempts)) == [(t, 0, 0) for t in range(6)]
    assert len(read_jsonl(layout.rollouts)) == 4
    assert {row["_ng_run_id"] for row in read_jsonl(layout.rollouts)} == {run_id}
    assert len(read_jsonl(layout.failures)) == 2
    assert orjson.loads(layout.batch_status.read_bytes())["finished"] is True
    before = runs_total(fake)
    result = invoke("resume", str(layout.output), "--progress", "plain", "--no-aggregate")
    assert result.exit_code == 0, result.output
    assert "dispatched 2" in result.output
    assert runs_total(fake) - before == 2
    landed = Counter(row["_ng_task_index"] for row in read_jsonl(layout.rollouts))
    assert landed == Counter(range(6))


def test_reopening_a_shard_label_replaces_it(fake: FakeUrls, tmp_path: Path) -> None:
    """A replayed step rewrites its shard: no row of the earlier run remains."""
    first = trio.run(record, fake, tmp_path, {"step-1": dataset(3)})["step-1"]
    second = trio.run(record, fake, tmp_path, {"step-1": dataset(2, seed=9)})["step-1"]
    layout = RunLayout.for_output(tmp_path / "rollouts-step-1.jsonl")
    rows = read_jsonl(layout.rollouts)
    assert len(rows) == 2
    assert {row["_ng_run_id"] for row in rows} == {second} != {first}


@pytest.mark.parametrize("label", ["", "-x", "a/b", "step 1", "x_failures", "../up"])
def test_shard_label_must_name_a_file_of_the_folder(tmp_path: Path, label: str) -> None:
    """Labels outside [A-Za-z0-9][A-Za-z0-9_.-]*, or ending like a sibling, are refused."""

    async def main() -> None:
        async with trollout.open_rollouts({"math_agent": "http://127.0.0.1:1"}) as rollouts:
            await rollouts.run_batch(
                [{"_ng_task_index": 0, "_ng_rollout_index": 0}],
                record_shard=label,
                record_output_dir=tmp_path,
            )

    with pytest.raises(ConfigError, match="record_shard"):
        trio.run(main)
    assert os.listdir(tmp_path) == []


async def test_two_writers_of_one_shard_are_kept_apart(fake: FakeUrls, tmp_path: Path) -> None:
    """A second batch recording the same label while the first runs fails, naming the owner."""
    rows = dataset(2)
    async with trollout.open_rollouts(fake.run_urls, config=CONFIG) as rollouts:
        planned = rollouts.plan(rows)
        async with rollouts.open_batch(planned, record_shard="s", record_output_dir=tmp_path):
            with pytest.raises(RunFolderLockedError, match=r"another trollout \(pid"):
                await rollouts.run_batch(planned, record_shard="s", record_output_dir=tmp_path)


async def test_a_writer_whose_lock_was_replaced_stops_writing(
    fake: FakeUrls, tmp_path: Path
) -> None:
    """If the shard's lock file is replaced under a writer, its next write stops the batch."""
    layout = RunLayout.for_output(tmp_path / "rollouts-s.jsonl")

    async def replace_lock_then_consume(batch: Any) -> None:
        layout.lock.unlink()
        layout.lock.write_text('{"pid": 1, "host": "elsewhere", "started_at": 0}')
        async for _ in batch:
            pass

    async with trollout.open_rollouts(fake.run_urls, config=CONFIG) as rollouts:
        planned = rollouts.plan(dataset(4))
        with pytest.raises(RunFolderWriteError, match="was replaced while this writer held it"):
            await record_with(rollouts, planned, tmp_path, replace_lock_then_consume)
    assert read_jsonl(layout.rollouts) == []


async def record_with(rollouts: Any, rows: Any, folder: Path, body: Any) -> None:
    """Record shard "s" of `rows`, running `body(batch)` inside the batch."""
    async with rollouts.open_batch(rows, record_shard="s", record_output_dir=folder) as batch:
        await body(batch)


def test_aggregate_over_step_shards_counts_every_rollout(fake: FakeUrls, tmp_path: Path) -> None:
    """Five steps of the same N rows (RL epochs) aggregate to 5 x N rollouts, no duplicates."""
    n = 6
    steps = {f"step-{step}": dataset(n) for step in range(5)}
    trio.run(record, fake, tmp_path, steps)
    out = tmp_path / "merged" / "merged.jsonl"
    result = invoke("aggregate", str(tmp_path / "rollouts-*.jsonl"), "-o", str(out), "--json")
    assert result.exit_code == 0, result.output
    assert len(read_jsonl(out)) == 5 * n
    assert orjson.loads(result.output)["inputs"]["duplicates"] == {}
