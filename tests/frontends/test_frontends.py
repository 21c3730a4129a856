"""The asyncio and blocking front ends: the Trio API's semantics, from asyncio.run and threads.

The fake runs in its own process; teardown is checked on disk (a shard recorded with
``record_omitted_rollouts`` holds a row for every rollout a close interrupted), so a test knows
the Trio side finished closing without looking inside it. Wall-clock figures (stalls, teardown
time) are printed, never asserted: the bounds below are hang guards.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import trollout
from builders import HANG_GUARD_S, read_jsonl
from trollout.errors import ConfigError, UnknownAgentError
from trollout.recovery.layout import RunLayout
from trollout.testing import FakeUrls, task_rows

CONFIG = trollout.RunConfig(
    agent_name="math_agent", num_samples_in_parallel=8, record_omitted_rollouts=True
)
HANG = {"kind": "hang"}


def dataset(n: int, *, hanging: frozenset[int] = frozenset()) -> list[dict[str, Any]]:
    """n dataset rows; the rows in `hanging` never get an answer."""
    rows = list(task_rows(n, seed=11))
    for i in hanging:
        rows[i]["fake_fault"] = HANG
    return rows


def interrupted(folder: Path, label: str) -> list[int]:
    """Tasks of shard `label` recorded as interrupted (omitted) rollouts."""
    failures = read_jsonl(RunLayout.for_output(folder / f"rollouts-{label}.jsonl").failures)
    return sorted(row["_ng_task_index"] for row in failures if row.get("_ng_omitted_rollout"))


# --- blocking ------------------------------------------------------------------------------------


def test_sync_batches_settle_every_rollout_once(fake: FakeUrls) -> None:
    """Several batches on one blocking Rollouts: each row once, in completion order; each
    step's tasks numbered after the last step's."""
    with trollout.sync.open_rollouts(fake.run_urls, config=CONFIG) as rollouts:
        for step in range(3):
            outcomes = rollouts.run_batch(rollouts.plan(dataset(5)), run_id=f"s{step}")
            tasks = sorted(o.row["_ng_task_index"] for o in outcomes)
            assert tasks == list(range(5 * step, 5 * step + 5))
            assert {o.row["_ng_rollout_id"].split("-")[0] for o in outcomes} == {f"s{step}"}
            assert all(o.landed for o in outcomes)


def test_sync_close_cancels_the_rest_and_waits_for_it(fake: FakeUrls, tmp_path: Path) -> None:
    """Closing early returns once the interrupted rollouts are on disk as omitted."""
    with trollout.sync.open_rollouts(
        fake.run_urls, config=CONFIG, record_output_dir=tmp_path
    ) as rollouts:
        rows = rollouts.plan(dataset(4, hanging=frozenset({1, 2, 3})))
        with rollouts.open_batch(rows, record_shard="a") as batch:
            first = next(batch)
            batch.close()
            assert interrupted(tmp_path, "a") == [1, 2, 3]
            assert list(batch) == []
    assert first.row["_ng_task_index"] == 0


def test_sync_close_and_drain_partitions_the_batch(fake: FakeUrls, tmp_path: Path) -> None:
    """Consumed, drained and interrupted rollouts are the batch's rows, each exactly once."""
    with trollout.sync.open_rollouts(
        fake.run_urls, config=CONFIG, record_output_dir=tmp_path
    ) as rollouts:
        rows = rollouts.plan(dataset(6, hanging=frozenset({5})))
        with rollouts.open_batch(rows, record_shard="d") as batch:
            consumed = [next(batch).row["_ng_task_index"]]
            drained = [o.row["_ng_task_index"] for o in batch.close_and_drain()]
            assert batch.close_and_drain() == []
    cut = interrupted(tmp_path, "d")
    assert 5 in cut
    assert sorted(consumed + drained + cut) == list(range(6)), (consumed, drained, cut)


def test_sync_front_end_is_usable_from_any_thread(fake: FakeUrls) -> None:
    """Two threads run batches on one blocking Rollouts at once (their plans numbered apart)."""
    results: dict[int, list[int]] = {}
    with trollout.sync.open_rollouts(fake.run_urls, config=CONFIG) as rollouts:

        def worker(n: int) -> None:
            outcomes = rollouts.run_batch(rollouts.plan(dataset(n)))
            results[n] = sorted(o.row["_ng_task_index"] for o in outcomes)

        threads = [threading.Thread(target=worker, args=(n,)) for n in (3, 6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(HANG_GUARD_S)
    assert sorted(map(len, results.values())) == [3, 6]
    assert sorted(results[3] + results[6]) == list(range(9))


def test_sync_errors_reach_the_caller(fake: FakeUrls, tmp_path: Path) -> None:
    """A bad label and an unknown agent raise in the caller; the Rollouts stays usable."""
    with trollout.sync.open_rollouts(fake.run_urls, config=CONFIG) as rollouts:
        rows = rollouts.plan(dataset(2))
        with pytest.raises(ConfigError, match="record_shard"):
            rollouts.run_batch(rows, record_shard="bad label", record_output_dir=tmp_path)
        stray = {**rows[1].body, "agent_ref": {"name": "nobody"}}
        with pytest.raises(UnknownAgentError, match="nobody"):
            rollouts.run_batch([rows[0], stray])
        assert len(rollouts.run_batch(rows)) == 2


# --- asyncio -------------------------------------------------------------------------------------


def test_aio_batches_under_asyncio_run(fake: FakeUrls) -> None:
    """asyncio.run drives batches with async with / async for, like the Trio API."""

    async def main() -> list[list[int]]:
        steps = []
        async with trollout.aio.open_rollouts(fake.run_urls, config=CONFIG) as rollouts:
            for _ in range(3):
                async with rollouts.open_batch(rollouts.plan(dataset(4))) as batch:
                    steps.append(sorted([o.row["_ng_task_index"] async for o in batch]))
        return steps

    assert asyncio.run(main()) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


def test_aio_cancelling_the_task_tears_its_batch_down(fake: FakeUrls, tmp_path: Path) -> None:
    """Cancelling the asyncio task that holds a batch cancels the batch's rollouts; when the
    task has ended, every interrupted rollout is on disk."""

    async def main() -> float:
        async with trollout.aio.open_rollouts(
            fake.run_urls, config=CONFIG, record_output_dir=tmp_path
        ) as rollouts:
            rows = rollouts.plan(dataset(5, hanging=frozenset({1, 2, 3, 4})))
            first = asyncio.Event()

            async def hold() -> None:
                async with rollouts.open_batch(rows, record_shard="t") as batch:
                    async for _ in batch:
                        first.set()

            task = asyncio.create_task(hold())
            await asyncio.wait_for(first.wait(), HANG_GUARD_S)
            started = time.monotonic()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            took = time.monotonic() - started
            assert interrupted(tmp_path, "t") == [1, 2, 3, 4]
            return took

    took = asyncio.run(main())
    print(f"\nteardown after cancelling the asyncio task: {took * 1000:.1f} ms")  # a figure only


def test_aio_loop_keeps_ticking_while_batches_run(fake: FakeUrls) -> None:
    """Another asyncio task ticking every 10 ms keeps its pace: the worst gap is a figure."""

    async def main() -> tuple[float, int]:
        gaps: list[float] = []
        stop = asyncio.Event()

        async def tick() -> None:
            last = time.monotonic()
            while not stop.is_set():
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        ticker = asyncio.create_task(tick())
        settled = 0
        async with trollout.aio.open_rollouts(fake.run_urls, config=CONFIG) as rollouts:
            rows = rollouts.plan(dataset(64))
            for _ in range(10):
                settled += len(await rollouts.run_batch(rows))
        stop.set()
        await ticker
        return max(gaps), settled

    worst, settled = asyncio.run(main())
    print(f"\nworst gap of a 10 ms asyncio ticker over {settled} rollouts: {worst * 1000:.1f} ms")
    assert settled == 640
    assert worst < HANG_GUARD_S / 24  # 5 s: a hang guard (the loop stalled), not a speed claim


# --- arguments of the wrong type --------------------------------------------------------------

WRONG_ARGUMENTS = [
    ("http://user:hunter2@127.0.0.1:1", {}, "deployment", "a str"),
    ({"math_agent": "http://127.0.0.1:1"}, {"config": {"num_repeats": 2}}, "config", "a mapping"),
    ({"math_agent": "http://127.0.0.1:1"}, {"config": "num_repeats=2"}, "config", "a str"),
]


def check_wrong_argument(exc: trollout.ArgumentTypeError, parameter: str, given: str) -> None:
    """One line naming the parameter, the type given and what to pass; no value shown."""
    text = str(exc)
    assert "\n" not in text
    assert f"{parameter} must be" in text
    assert f"(got {given}" in text
    assert "hunter2" not in text
    assert ("trollout.RunConfig" if parameter == "config" else "mapping of agent name") in text
    assert isinstance(exc, TypeError)
    assert isinstance(exc, trollout.ConfigError)


@pytest.mark.parametrize(("deployment", "options", "parameter", "given"), WRONG_ARGUMENTS)
def test_open_rollouts_names_a_wrong_argument_type_trio(
    deployment: Any, options: dict[str, Any], parameter: str, given: str
) -> None:
    """A URL string instead of {agent: URL}, a dict instead of RunConfig: a TrolloutError
    that says what to pass (an AttributeError from deep inside before)."""
    import trio

    async def main() -> None:
        async with trollout.open_rollouts(deployment, **options):
            raise AssertionError("opened")  # pragma: no cover

    with pytest.raises(trollout.ArgumentTypeError) as caught:
        trio.run(main)
    check_wrong_argument(caught.value, parameter, given)


@pytest.mark.parametrize(("deployment", "options", "parameter", "given"), WRONG_ARGUMENTS)
def test_open_rollouts_names_a_wrong_argument_type_sync_and_asyncio(
    deployment: Any, options: dict[str, Any], parameter: str, given: str
) -> None:
    """The blocking and asyncio front ends raise the same error in the caller's thread."""
    with (
        pytest.raises(trollout.ArgumentTypeError) as caught,
        trollout.sync.open_rollouts(deployment, **options),
    ):
        raise AssertionError("opened")  # pragma: no cover
    check_wrong_argument(caught.value, parameter, given)

    async def main() -> None:
        async with trollout.aio.open_rollouts(deployment, **options):
            raise AssertionError("opened")  # pragma: no cover

    with pytest.raises(trollout.ArgumentTypeError) as caught:
        asyncio.run(main())
    check_wrong_argument(caught.value, parameter, given)
