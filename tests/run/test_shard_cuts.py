"""A recorded batch cut early leaves a trace of every row, through each public front end.

64 rows at concurrency 4, where rows 8 and later never get an answer: the consumer takes the 8
outcomes it can get and leaves (``break``, ``close()``), so at most 4 rows are in flight (they are
interrupted) and the rest never start. The shard must then say so everywhere: its status counts
the rows never started and does not say finished, its sidecar holds NeMo Gym's omitted-rollout
row for each (``record_omitted_rollouts``), its ledger reserved no number for them, ``trollout
status`` shows them, ``trollout aggregate`` says which rows did not come out and exits 75, and
``trollout resume`` runs them.

The Trio front end records against the bundled fake in process (`open_fake_deployment`); the
asyncio and blocking front ends, whose Trio side runs in a thread of its own, against the same
fake in its own process (`spawn_fake_deployment`), which the resume uses too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

import trollout
import trollout.aio
import trollout.sync
from builders import invoke, read_jsonl
from trollout.cli.failures import EXIT_INCOMPLETE_RETRYABLE
from trollout.recovery.layout import RunLayout
from trollout.recovery.ledger import read_entries
from trollout.testing import (
    AgentSpec,
    DeploymentSpec,
    FakeUrls,
    Fault,
    FaultKind,
    open_fake_deployment,
    spawn_fake_deployment,
    task_rows,
    write_fault_script,
)

ROWS = 64
ANSWERED = 8  # rows 0-7 answer; the others hang until the batch closes
CONCURRENCY = 4
SPEC = DeploymentSpec(agents=(AgentSpec(name="math_agent"),))
CONFIG = trollout.RunConfig(
    agent_name="math_agent", num_samples_in_parallel=CONCURRENCY, record_omitted_rollouts=True
)


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fault script the spawned fake follows (each test writes its own)."""
    return tmp_path_factory.mktemp("faults") / "faults.jsonl"


@pytest.fixture(scope="module")
def scripted_fake(script: Path) -> Iterator[FakeUrls]:
    """Unlike the shared `fake`: it follows the fault script `script`."""
    with spawn_fake_deployment(SPEC, fault_script=script) as urls:
        yield urls


def hang_first_attempts(script: Path) -> None:
    """Script the spawned fake: the first attempt of rows 8 and later never gets an answer."""
    hang = Fault(kind=FaultKind.HANG)
    write_fault_script(script, {(None, task, 0, 0, 0): hang for task in range(ANSWERED, ROWS)})


def dataset(*, hang: bool = False) -> list[dict[str, Any]]:
    """64 dataset rows; with `hang`, rows 8 and later never get an answer (the row's fault)."""
    rows = list(task_rows(ROWS, seed=5))
    for row in rows[ANSWERED:] if hang else ():
        row["fake_fault"] = {"kind": "hang"}
    return rows


def check_cut_shard(folder: Path, label: str) -> None:
    """Check that the shard a cut batch recorded accounts for every row (module docstring)."""
    layout = RunLayout.for_output(folder / f"rollouts-{label}.jsonl")
    landed = {row["_ng_task_index"] for row in read_jsonl(layout.rollouts)}
    assert landed == set(range(ANSWERED))
    status = orjson.loads(layout.batch_status.read_bytes())
    counts = ("completed", "failed", "no_persist", "omitted", "not_started")
    assert sum(status[k] for k in counts) == status["expected"] == ROWS
    assert status["omitted"] <= CONCURRENCY  # the rows in flight at the cut
    assert status["not_started"] == ROWS - ANSWERED - status["omitted"]
    assert (status["closed"], status["finished"]) == (True, False)

    omitted = [row for row in read_jsonl(layout.failures) if row.get("_ng_omitted_rollout")]
    drained = {r["_ng_task_index"] for r in omitted if r.get("_ng_dispatch_drained")}
    interrupted = {r["_ng_task_index"] for r in omitted if not r.get("_ng_dispatch_drained")}
    assert len(drained) == status["not_started"]
    assert len(interrupted) == status["omitted"]
    assert landed | drained | interrupted == set(range(ROWS))
    assert all(r.get("_ng_attempt_index", 0) == 0 for r in omitted)

    reserved: set[int] = set()  # a number reserved and never released may have been sent
    for released, task, _, _ in read_entries(layout.attempts):
        (reserved.discard if released else reserved.add)(task)
    assert reserved == landed | interrupted  # never a number for a row never sent

    shown = invoke("status", str(layout.output), "--json")
    assert shown.exit_code == 0, shown.output
    doc = orjson.loads(shown.output)
    assert (doc["missing"], doc["not_started"]) == (ROWS - ANSWERED, status["not_started"])
    human = invoke("status", str(layout.output))
    assert f"    never started     {status['not_started']}" in human.output

    merged = folder / "merged" / "all.jsonl"
    result = invoke("aggregate", str(layout.output), "-o", str(merged))
    assert result.exit_code == EXIT_INCOMPLETE_RETRYABLE, result.output
    lost = ROWS - ANSWERED
    assert f"Metrics cover: {ANSWERED} of {ROWS} rollouts" in result.output
    assert f"{lost} of {ROWS} planned rollouts have no outcome" in result.output
    assert len(read_jsonl(merged)) == ANSWERED


def test_trio_batch_left_early_records_the_rows_it_never_started(tmp_path: Path) -> None:
    """trollout.open_rollouts: ``break`` out of a recorded batch after 8 outcomes."""

    async def record() -> None:
        async with (
            open_fake_deployment(SPEC) as deployment,
            trollout.open_rollouts(
                deployment.run_urls, config=CONFIG, record_output_dir=tmp_path
            ) as rollouts,
            rollouts.open_batch(rollouts.plan(dataset(hang=True)), record_shard="step-1") as batch,
        ):
            seen = 0
            async for _ in batch:
                seen += 1
                if seen == ANSWERED:
                    break

    trio.run(record)
    check_cut_shard(tmp_path, "step-1")


def test_sync_batch_closed_early_records_the_rows_it_never_started(
    scripted_fake: FakeUrls, script: Path, tmp_path: Path
) -> None:
    """trollout.sync: ``close()`` a recorded batch after 8 outcomes."""
    hang_first_attempts(script)
    with (
        trollout.sync.open_rollouts(
            scripted_fake.run_urls, config=CONFIG, record_output_dir=tmp_path
        ) as rollouts,
        rollouts.open_batch(rollouts.plan(dataset()), record_shard="step-1") as batch,
    ):
        for _ in range(ANSWERED):
            next(batch)
        batch.close()
    check_cut_shard(tmp_path, "step-1")


def test_aio_batch_left_early_is_counted_then_resumed_to_completion(
    scripted_fake: FakeUrls, script: Path, tmp_path: Path
) -> None:
    """trollout.aio: ``break`` after 8 outcomes; then ``trollout resume`` of the shard runs
    exactly the rows without an outcome, and its status says finished."""
    hang_first_attempts(script)

    async def record() -> None:
        async with (
            trollout.aio.open_rollouts(
                scripted_fake.run_urls, config=CONFIG, record_output_dir=tmp_path
            ) as rollouts,
            rollouts.open_batch(rollouts.plan(dataset()), record_shard="step-1") as batch,
        ):
            seen = 0
            async for _ in batch:
                seen += 1
                if seen == ANSWERED:
                    break

    asyncio.run(record())
    check_cut_shard(tmp_path, "step-1")
    layout = RunLayout.for_output(tmp_path / "rollouts-step-1.jsonl")
    write_fault_script(script, {})  # the deployment is fixed: every row now gets its answer
    result = invoke("resume", str(layout.output), "--progress", "plain")
    assert result.exit_code == 0, result.output
    assert f"dispatched {ROWS - ANSWERED}" in result.output
    tasks = sorted(row["_ng_task_index"] for row in read_jsonl(layout.rollouts))
    assert tasks == list(range(ROWS))
    status = orjson.loads(layout.batch_status.read_bytes())
    assert (status["completed"], status["not_started"], status["finished"]) == (ROWS, 0, True)
