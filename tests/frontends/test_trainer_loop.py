"""A training loop's batches on one long-lived `Rollouts`: what a trainer does step after step.

Each test is one friction a trainer met (issue 25): the dispatch budget counts per batch, a
batch opened in a cancelled scope gives up at once, fed-back and fresh rows plan together, and
every front end can stop admission. Timing runs on Trio's fake clock with a scripted transport
(`builders.ScriptedTransport`) wherever only the engine's behaviour matters; files are checked
on disk.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

import trollout
from builders import AGENT, URLS, ScriptedTransport
from trollout.collector.engine.sink import ListSink
from trollout.collector.http.transport import RawResponse
from trollout.errors import InputError
from trollout.records import Landed, Omitted
from trollout.testing import task_rows


def budget_config(budget_s: float, **settings: Any) -> trollout.RunConfig:
    return trollout.RunConfig(
        agent_name=AGENT, dispatch_budget_s=budget_s, drain_margin_s=0.0, **settings
    )


# --- (a) the dispatch budget counts per batch ------------------------------------------------


async def test_dispatch_budget_counts_from_each_batch_not_from_the_front_end(
    autojump_clock: Any,
) -> None:
    """A batch opened after the first batch's budget has passed still runs all its rows."""
    transport = ScriptedTransport(delay=lambda row: 1.0)
    async with trollout.open_rollouts(
        URLS, config=budget_config(10.0), transport=transport
    ) as rollouts:
        rows = rollouts.plan(list(task_rows(4, seed=3)))
        first = await rollouts.run_batch(rows)
        await trio.sleep(60.0)  # the trainer learns for a minute: far past the first budget
        second = await rollouts.run_batch(rows)
        third = await rollouts.run_batch(rows)
    assert [len(first), len(second), len(third)] == [4, 4, 4]
    assert all(item.landed for item in [*first, *second, *third])


async def test_each_batch_stops_starting_rows_budget_seconds_after_it_opened(
    autojump_clock: Any,
) -> None:
    """A 10 s budget with 4 s rollouts two at a time: each batch starts rows at 0, 4 and 8 s
    after its own opening, however late it opens."""
    transport = ScriptedTransport(delay=lambda row: 4.0)
    config = budget_config(10.0, num_samples_in_parallel=2)
    async with trollout.open_rollouts(URLS, config=config, transport=transport) as rollouts:
        rows = rollouts.plan(list(task_rows(20, seed=3)))
        counts = []
        for _ in range(3):
            sink = ListSink()
            opened = trio.current_time()
            async with rollouts.collector.open_batch(rows, sink=sink) as batch:
                landed = [item async for item in batch]
            counts.append((len(landed), trio.current_time() - opened))
            assert all(type(o) is Landed for o in sink.outcomes)
            await trio.sleep(30.0)
    assert counts == [(6, 12.0)] * 3


async def test_a_batch_budget_spent_leaves_the_next_batch_and_the_collector_open(
    autojump_clock: Any,
) -> None:
    """One batch's spent budget closes that batch's admission only."""
    transport = ScriptedTransport(delay=lambda row: 4.0)
    config = budget_config(5.0, num_samples_in_parallel=1)
    async with trollout.open_rollouts(URLS, config=config, transport=transport) as rollouts:
        rows = rollouts.plan(list(task_rows(3, seed=3)))
        cut = await rollouts.run_batch(rows)  # starts rows at 0 and 4 s only
        after = await rollouts.run_batch(rows[:1])
        assert rollouts.collector.window.closed_reason is None
    assert (len(cut), len(after)) == (2, 1)
    assert not any(isinstance(item.outcome, Omitted) for item in [*cut, *after])


# --- (b) opening a recorded batch in a cancelled scope -----------------------------------------


async def test_recorded_batch_opened_in_a_cancelled_scope_touches_nothing(
    autojump_clock: Any, tmp_path: Path
) -> None:
    """Entering is a checkpoint: a cancelled scope raises there, before the shard's folder (its
    lock file included) is touched; the label opens normally afterwards."""
    transport = ScriptedTransport(delay=lambda row: 1.0)
    config = trollout.RunConfig(agent_name=AGENT)
    folder = tmp_path / "shards"
    async with trollout.open_rollouts(
        URLS, config=config, transport=transport, record_output_dir=folder
    ) as rollouts:
        rows = rollouts.plan(list(task_rows(3, seed=3)))
        with trio.CancelScope() as scope:
            scope.cancel()
            async with rollouts.open_batch(rows, record_shard="step-1"):
                pytest.fail("a cancelled scope entered the batch")
        assert scope.cancelled_caught
        assert not folder.exists() or sorted(folder.iterdir()) == []
        assert transport.requests == []
        outcomes = await rollouts.run_batch(rows, record_shard="step-1")
    assert len(outcomes) == 3
    assert (folder / "rollouts-step-1.jsonl").exists()


# --- (c) fed-back rows and fresh rows in one batch ---------------------------------------------


def needs_another_turn(item: Any) -> bool:
    """The trainer's choice of rollouts to continue next step: the odd tasks (scripted reward 1)."""
    return bool(item.reward)


async def test_a_step_mixes_fed_back_rollouts_with_freshly_planned_tasks(
    autojump_clock: Any,
) -> None:
    """batch = rollouts fed back from earlier steps + tasks planned now: every step runs every
    row once, and no two rows planned by one Rollouts share a task and rollout."""
    transport = ScriptedTransport(delay=lambda row: 1.0)
    config = trollout.RunConfig(agent_name=AGENT, num_repeats=2)
    carry: list[dict[str, Any]] = []
    seen: set[tuple[int, int]] = set()
    async with trollout.open_rollouts(URLS, config=config, transport=transport) as rollouts:
        for step in range(4):
            fresh = rollouts.plan(list(task_rows(3, seed=step)))
            outcomes = await rollouts.run_batch([*carry, *fresh], run_id=f"s{step}")
            assert len(outcomes) == len(carry) + 6
            keys = {(o.row["_ng_task_index"], o.row["_ng_rollout_index"]) for o in outcomes}
            assert {(r["_ng_task_index"], r["_ng_rollout_index"]) for r in carry} <= keys
            seen |= {(r.identity.task_index, r.identity.rollout_index) for r in fresh}
            carry = [o.row for o in outcomes if needs_another_turn(o)]
        assert len(seen) == 4 * 6  # fresh rows of four steps: never the same numbers twice
        assert rollouts.next_task_index == 4 * 3


async def test_plan_numbers_from_start_task_index_when_given(autojump_clock: Any) -> None:
    """start_task_index numbers a call's tasks from there (0: as a run's own planning does)."""
    config = trollout.RunConfig(agent_name=AGENT)
    async with trollout.open_rollouts(URLS, config=config, transport=ScriptedTransport()) as ro:
        rows = list(task_rows(2, seed=1))
        assert [r.identity.task_index for r in ro.plan(rows)] == [0, 1]
        assert [r.identity.task_index for r in ro.plan(rows)] == [2, 3]
        assert [r.identity.task_index for r in ro.plan(rows, start_task_index=10)] == [10, 11]
        assert ro.next_task_index == 12
        assert [r.identity.task_index for r in ro.plan(rows, start_task_index=0)] == [0, 1]
        assert ro.next_task_index == 12  # a lower start never moves the numbering back


def test_plan_rows_takes_a_start_task_index() -> None:
    """The functional planner numbers unstamped tasks from start_task_index too, skipping a
    task index a row carries."""
    config = trollout.RunConfig(agent_name=AGENT)
    deployment = trollout.Deployment.from_agent_urls(URLS)
    rows = [*task_rows(2, seed=1), {**next(iter(task_rows(1, seed=9))), "_ng_task_index": 6}]
    plan = trollout.plan_rows(rows, config, deployment, start_task_index=5)
    assert sorted(r.identity.task_index for r in plan.rows()) == [5, 6, 7]


async def test_numbers_shared_by_a_fed_back_row_and_a_fresh_one_get_a_hint_that_applies(
    autojump_clock: Any,
) -> None:
    """Fresh rows numbered over a fed-back one (planned apart from this Rollouts) are refused
    with a hint naming both rows and start_task_index."""
    config = trollout.RunConfig(agent_name=AGENT)
    deployment = trollout.Deployment.from_agent_urls(URLS)
    async with trollout.open_rollouts(URLS, config=config, transport=ScriptedTransport()) as ro:
        (item,) = await ro.run_batch(ro.plan(list(task_rows(1, seed=1))), run_id="s0")
        fresh = list(trollout.plan_rows(list(task_rows(1, seed=2)), config, deployment).rows())
        with pytest.raises(InputError) as refused:
            await ro.run_batch([item.row, *fresh])
    message = str(refused.value)
    assert "rows[1]" in message
    assert "rows[0]" in message
    assert "fed back from batch 's0'" in message
    assert "start_task_index" in message
    assert "num_repeats" not in message


class BodyTransport(ScriptedTransport):
    """A scripted transport that keeps every body it was sent."""

    def __init__(self) -> None:
        super().__init__(delay=lambda row: 1.0)
        self.bodies: list[dict[str, Any]] = []

    async def post(self, url: str, body: bytes, **options: Any) -> RawResponse:
        self.bodies.append(orjson.loads(body))
        return await super().post(url, body, **options)


async def test_a_recorded_shard_holds_what_was_sent_and_still_refuses_a_repeated_rollout(
    autojump_clock: Any, tmp_path: Path
) -> None:
    """A shard's rows are stamped once (`run.shards`): the materialized inputs are exactly the
    rows sent and the rows delivered. A repeated (task, rollout) is still refused before the
    folder is touched, even a returned row fed back twice under the run id it carries."""
    transport = BodyTransport()
    config = trollout.RunConfig(agent_name=AGENT)
    async with trollout.open_rollouts(
        URLS, config=config, transport=transport, record_output_dir=tmp_path
    ) as ro:
        outcomes = await ro.run_batch(
            ro.plan(list(task_rows(3, seed=1))), record_shard="step-1", run_id="s1"
        )
        with pytest.raises(InputError, match="the same returned row was given twice") as refused:
            await ro.run_batch(
                [outcomes[0].row, outcomes[0].row], record_shard="step-2", run_id="s1"
            )
        (fed,) = await ro.run_batch([outcomes[0].row], record_shard="step-3", run_id="s1")
    lines = (tmp_path / "rollouts-step-1_materialized_inputs.jsonl").read_bytes().splitlines()
    inputs = [orjson.loads(line) for line in lines]
    by_task = {row["_ng_task_index"]: row for row in inputs}
    assert sorted(by_task) == [0, 1, 2]
    assert sorted(transport.bodies[:3], key=lambda body: body["_ng_task_index"]) == inputs
    assert all(item.row == by_task[item.row["_ng_task_index"]] for item in outcomes)
    assert "rows[1]" in str(refused.value)
    assert not any(name.startswith("rollouts-step-2") for name in os.listdir(tmp_path))
    assert fed.row["_ng_rollout_id"] == f"s1-{outcomes[0].row['_ng_task_index']}-0"


# --- (e) stop_admission on every front end -----------------------------------------------------


class GateTransport:
    """Answers task 0 at once and every other task when `open` is called (from any thread)."""

    def __init__(self) -> None:
        self.sent: list[int] = []
        self._gate: trio.Event | None = None
        self._token: trio.lowlevel.TrioToken | None = None

    async def post(self, url: str, body: bytes, **_: Any) -> RawResponse:
        if self._gate is None:
            self._gate, self._token = trio.Event(), trio.lowlevel.current_trio_token()
        task = orjson.loads(body)["_ng_task_index"]
        self.sent.append(task)
        if task != 0:
            await self._gate.wait()
        return RawResponse(status=200, headers=[], body=b'{"reward": 1.0}', truncated=False)

    def open(self) -> None:
        assert self._token is not None
        assert self._gate is not None
        self._token.run_sync_soon(self._gate.set)  # after the stop scheduled before it

    async def aclose(self) -> None:
        pass


STOP_CONFIG = trollout.RunConfig(agent_name=AGENT, num_samples_in_parallel=1)


def test_sync_batch_stop_admission_lets_the_rollout_in_flight_finish() -> None:
    """Stopping admission after the first outcome: the rollout in flight (task 1) finishes and
    is yielded; tasks 2-7 never start; the iteration ends."""
    transport = GateTransport()
    with (
        trollout.sync.open_rollouts(URLS, config=STOP_CONFIG, transport=transport) as ro,
        ro.open_batch(ro.plan(list(task_rows(8, seed=3)))) as batch,
    ):
        first = next(batch)
        batch.stop_admission()
        transport.open()
        rest = list(batch)
    assert [item.row["_ng_task_index"] for item in [first, *rest]] == [0, 1]
    assert all(item.landed for item in [first, *rest])
    assert transport.sent == [0, 1]


def test_aio_batch_stop_admission_lets_the_rollout_in_flight_finish() -> None:
    """As the blocking front end, from asyncio.run."""
    transport = GateTransport()

    async def main() -> list[Any]:
        async with (
            trollout.aio.open_rollouts(URLS, config=STOP_CONFIG, transport=transport) as ro,
            ro.open_batch(ro.plan(list(task_rows(8, seed=3)))) as batch,
        ):
            first = await anext(batch)
            batch.stop_admission("enough for this step")
            transport.open()
            return [first, *[item async for item in batch]]

    items = asyncio.run(main())
    assert [item.row["_ng_task_index"] for item in items] == [0, 1]
    assert all(item.landed for item in items)
    assert transport.sent == [0, 1]


async def test_trio_batch_stop_admission_lets_the_rollout_in_flight_finish() -> None:
    """The Trio API's batch, for parity."""
    transport = GateTransport()
    async with (
        trollout.open_rollouts(URLS, config=STOP_CONFIG, transport=transport) as ro,
        ro.open_batch(ro.plan(list(task_rows(8, seed=3)))) as batch,
    ):
        first = await anext(batch)
        batch.stop_admission()
        transport.open()
        items = [first, *[item async for item in batch]]
    assert [item.row["_ng_task_index"] for item in items] == [0, 1]
    assert transport.sent == [0, 1]
