"""Batches on a long-lived collector: completion order, row copies, run ids, early closes.

Scripted transports under Trio's fake clock, so every time is exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import trio

from builders import ScriptedTransport, materialized_row, row_body, scripted_collector
from trollout.collector.engine.batch import RowStamper, shard_rollout_id
from trollout.collector.engine.sink import ListSink
from trollout.errors import ConfigError, InputError, RunFolderWriteError, UnknownAgentError
from trollout.records import MaterializedRow, OmitReason, Omitted, Outcome


def slow_rows(delays: Sequence[float]) -> ScriptedTransport:
    """A transport answering task i after delays[i] seconds."""
    return ScriptedTransport(delay=lambda row: delays[row["_ng_task_index"]])


async def consume(collector: Any, rows: Any, **options: Any) -> list[Any]:
    """Run one batch to its end and return its outcomes."""
    async with collector.open_batch(rows, **options) as batch:
        return [item async for item in batch]


async def test_batch_yields_completion_order_with_row_copies_and_run_id(
    autojump_clock: Any,
) -> None:
    """Outcomes come as they finish, each with its stamped row and the batch's run id."""
    rows = [row_body(task) for task in range(3)]
    async with (
        scripted_collector(slow_rows([3.0, 1.0, 2.0])) as collector,
        collector.open_batch(rows, run_id="step7") as batch,
    ):
        items = [item async for item in batch]
    assert [item.row["_ng_task_index"] for item in items] == [1, 2, 0]
    assert {item.run_id for item in items} == {"step7"}
    assert items[0].row["_ng_rollout_id"] == "step7-1-0"
    assert items[0].row["_ng_run_id"] == "step7"
    assert items[0].landed
    assert items[0].reward == 1.0
    assert all("_ng_rollout_id" not in row for row in rows)  # the caller's rows are untouched


async def test_batch_rows_are_the_callers_to_keep(autojump_clock: Any) -> None:
    """A returned row is a copy: changing it changes neither the input nor another outcome."""
    rows = [row_body(0)]
    async with scripted_collector() as collector, collector.open_batch(rows) as batch:
        (item,) = [item async for item in batch]
    item.row["responses_create_params"]["input"].clear()
    assert rows[0]["responses_create_params"]["input"] != []


def test_shard_rollout_id_prefixes_and_replaces_rather_than_nests() -> None:
    """A fed-back row's old prefix is replaced; an explicit id is the row's own."""
    row = row_body(3, 1)
    assert shard_rollout_id(row, "a") == "a-3-1"
    returned = {**row, "_ng_rollout_id": "a-3-1", "_ng_run_id": "a"}
    assert shard_rollout_id(returned, "b") == "b-3-1"
    assert shard_rollout_id({**row, "_ng_rollout_id": "my-id"}, "c") == "c-my-id"


async def test_batch_fed_back_rows_get_new_ids_never_nested(autojump_clock: Any) -> None:
    """Rows a batch returned, fed to the next batch, are dispatched under its run id."""
    async with scripted_collector() as collector:
        async with collector.open_batch([row_body(0), row_body(1)], run_id="s1") as batch:
            first = [item.row async for item in batch]
        async with collector.open_batch(first, run_id="s2") as batch:
            second = [item.row async for item in batch]
    assert sorted(r["_ng_rollout_id"] for r in second) == ["s2-0-0", "s2-1-0"]


async def test_batch_early_close_cancels_only_its_own_rollouts(autojump_clock: Any) -> None:
    """Closing one batch early leaves the other batch and the caller's code running."""
    transport = slow_rows([1.0, 50.0, 2.0, 3.0])
    after_close: list[float] = []
    async with scripted_collector(transport) as collector, trio.open_nursery() as nursery:
        other: list[int] = []

        async def run_other() -> None:
            async with collector.open_batch([row_body(2), row_body(3)]) as batch:
                other.extend([item.row["_ng_task_index"] async for item in batch])

        nursery.start_soon(run_other)
        async with collector.open_batch([row_body(0), row_body(1)]) as batch:
            async for item in batch:
                assert item.row["_ng_task_index"] == 0
                break
        await trio.sleep(5)  # the caller's own code goes on after the close
        after_close.append(trio.current_time())
    assert other == [2, 3]
    assert after_close == [6.0]
    assert transport.in_flight == 0


async def test_batch_close_settles_interrupted_rollouts_in_the_sink(autojump_clock: Any) -> None:
    """What a close interrupts reaches the sink as Omitted; nothing of it is yielded."""
    sink = ListSink()
    async with (
        scripted_collector(slow_rows([1.0, 50.0, 50.0]), sink=sink) as collector,
        collector.open_batch([row_body(t) for t in range(3)]) as batch,
    ):
        first = await batch.__anext__()
        await batch.aclose()
        assert [item async for item in batch] == []
    assert first.row["_ng_task_index"] == 0
    omitted = sorted(o.identity.task_index for o in sink.outcomes if isinstance(o, Omitted))
    assert omitted == [1, 2]
    assert all(o.reason is OmitReason.INTERRUPTED for o in sink.outcomes if type(o) is Omitted)


async def test_batch_drain_returns_settled_but_unconsumed(autojump_clock: Any) -> None:
    """aclose_and_drain returns what settled unconsumed, never what it interrupted."""
    async with (
        scripted_collector(slow_rows([1.0, 2.0, 50.0])) as collector,
        collector.open_batch([row_body(t) for t in range(3)]) as batch,
    ):
        await trio.sleep(3)
        drained = await batch.aclose_and_drain()
        again = await batch.aclose_and_drain()
    assert sorted(item.row["_ng_task_index"] for item in drained) == [0, 1]
    assert again == []


async def test_batch_stop_admission_lets_rollouts_in_flight_finish(autojump_clock: Any) -> None:
    """After stop_admission the rollouts in flight still finish and are yielded; no more start."""
    transport = slow_rows([2.0, 2.0, 1.0, 1.0])
    async with (
        scripted_collector(transport, num_samples_in_parallel=2) as collector,
        collector.open_batch([row_body(t) for t in range(4)]) as batch,
    ):
        await trio.sleep(1)
        batch.stop_admission()
        items = [item async for item in batch]
    assert sorted(item.row["_ng_task_index"] for item in items) == [0, 1]
    assert all(item.landed for item in items)
    assert sorted(transport.requests) == [(0, 0), (1, 0)]


async def test_cancel_in_flight_never_cancels_the_drivers_code(autojump_clock: Any) -> None:
    """A collector kept across steps: cancel_in_flight in step 2 skips none of steps 3-5."""
    steps: list[int] = []
    async with scripted_collector(slow_rows([1.0] * 5)) as collector:
        for step in range(5):
            async with collector.open_batch([row_body(step)]) as batch:
                async for _ in batch:
                    pass
            if step == 1:
                collector.cancel_in_flight("nothing is in flight")
            steps.append(step)
    assert steps == [0, 1, 2, 3, 4]


async def test_batch_unknown_agent_raises_in_that_batch_only(autojump_clock: Any) -> None:
    """A row for an unknown agent fails its batch; the collector and the next batch go on."""
    async with scripted_collector() as collector:
        with pytest.raises(UnknownAgentError, match="nobody"):
            await consume(collector, [row_body(0), row_body(1, agent="nobody")])
        async with collector.open_batch([row_body(2)]) as batch:
            assert [item.row["_ng_task_index"] async for item in batch] == [2]


@pytest.mark.parametrize(
    ("rows", "needle"),
    [
        ([{"responses_create_params": {}}], r"rows\[0\] has no _ng_task_index.*plan_rows"),
        (
            [row_body(0), row_body(0)],
            r"rows\[1\] \(planned anew\) has the task and rollout numbers of rows\[0\]",
        ),
        ([{**row_body(0), "bad": object()}], r"rows\[0\] is not JSON"),
    ],
)
async def test_batch_refuses_rows_it_cannot_dispatch(
    autojump_clock: Any, rows: list[Any], needle: str
) -> None:
    """Unplanned, repeated or non-JSON rows raise one InputError naming the row."""
    async with scripted_collector() as collector:
        with pytest.raises(InputError, match=needle):
            await consume(collector, rows)


async def test_batch_run_id_must_fit_rollout_ids() -> None:
    """A run id that cannot prefix rollout ids is refused before anything starts."""
    async with scripted_collector() as collector:
        with pytest.raises(ConfigError, match=r"run_id must match.*got 'a b'"):
            await consume(collector, [row_body(0)], run_id="a b")


async def test_batch_of_stamped_rows_dispatches_those_very_copies(autojump_clock: Any) -> None:
    """StampedRows of the batch's run id (a recorded shard's rows, `run_ids`): the batch sends
    and yields the copies its run's RowStamper made, without copying or stamping them again."""
    stamped = RowStamper("step7").stamp_all([row_body(t) for t in range(3)])
    transport = ScriptedTransport()
    async with scripted_collector(transport) as collector:
        items = await consume(collector, stamped, run_id="step7")
    delivered = {item.row["_ng_task_index"]: item.row for item in items}
    assert all(delivered[row.identity.task_index] is row.body for row in stamped)
    assert delivered[1]["_ng_rollout_id"] == "step7-1-0"
    assert sorted(transport.requests) == [(0, 0), (1, 0), (2, 0)]


@pytest.mark.parametrize(
    "rows",
    [
        lambda: RowStamper("other").stamp_all([row_body(0)]),  # stamped for another run
        lambda: list(RowStamper("step7").stamp_all([row_body(0)])),  # not the stamper's tuple
        lambda: [MaterializedRow.from_body({**row_body(0), "_ng_run_id": "step7"})],  # made up
        lambda: None,  # no run id given: a fresh one, never the rows'
    ],
)
async def test_only_the_stampers_own_rows_of_the_batchs_run_skip_the_copy(
    autojump_clock: Any, rows: Any
) -> None:
    """Anything but `StampedRows` of the batch's run id is copied and stamped anew: the rows
    delivered are new objects carrying the batch's run id."""
    given = rows() or RowStamper("step7").stamp_all([row_body(0)])
    run_id = None if rows() is None else "step7"
    transport = ScriptedTransport()
    async with scripted_collector(transport) as collector:
        (item,) = await consume(collector, given, run_id=run_id)
    assert item.row is not given[0].body
    assert item.row["_ng_run_id"] == (run_id or item.row["_ng_run_id"])
    assert item.row["_ng_rollout_id"] == f"{item.row['_ng_run_id']}-0-0"
    assert transport.requests == [(0, 0)]


async def test_replayed_rows_with_the_same_run_id_are_checked_for_repeats(
    autojump_clock: Any,
) -> None:
    """Rows a batch of run ``step7`` returned, fed back twice to another batch of ``step7``,
    are copied and checked like any rows: the repeat is refused, nothing of it sent twice."""
    transport = ScriptedTransport()
    async with scripted_collector(transport) as collector:
        first = await consume(collector, [row_body(t) for t in range(2)], run_id="step7")
        again = [MaterializedRow.from_body(item.row) for item in first]
        with pytest.raises(InputError, match="rows\\[2\\]"):
            await consume(collector, again + again, run_id="step7")
    assert sorted(transport.requests).count((0, 0)) <= 2


class FailingSink(ListSink):
    """A batch's own sink whose disk fills after the first write."""

    async def write(self, outcomes: Sequence[Outcome]) -> None:
        if self.outcomes:
            raise RunFolderWriteError("cannot append to 'shard.jsonl': No space left on device")
        await super().write(outcomes)


async def test_batch_sink_failure_ends_that_batch_only(autojump_clock: Any) -> None:
    """A batch's own sink failing raises from that batch; the collector keeps serving."""
    async with scripted_collector(slow_rows([1.0, 2.0, 3.0, 1.0])) as collector:
        with pytest.raises(RunFolderWriteError, match="No space"):
            await consume(collector, [row_body(t) for t in range(3)], sink=FailingSink())
        async with collector.open_batch([row_body(3)]) as batch:
            assert [item.landed async for item in batch] == [True]


async def test_submit_after_admission_closed_settles_at_the_door(autojump_clock: Any) -> None:
    """A row submitted after stop_admission is accepted and settles once, as drained."""
    sink = ListSink()
    async with scripted_collector(sink=sink) as collector:
        collector.stop_admission("the driver stops")
        await collector.submit(materialized_row(0))
    (outcome,) = sink.outcomes
    assert isinstance(outcome, Omitted)
    assert outcome.reason is OmitReason.DRAINED


async def test_batches_share_the_collectors_concurrency(autojump_clock: Any) -> None:
    """Two batches at once never exceed the collector's num_samples_in_parallel."""
    transport = ScriptedTransport()
    async with scripted_collector(transport, num_samples_in_parallel=3) as collector:
        async with trio.open_nursery() as nursery:
            for first in (0, 10):

                async def one(first: int = first) -> None:
                    rows = [row_body(t) for t in range(first, first + 6)]
                    async with collector.open_batch(rows) as batch:
                        assert len([item async for item in batch]) == 6

                nursery.start_soon(one)
        assert trio.current_time() == pytest.approx(4.0)
    assert transport.max_in_flight == 3


async def test_batches_with_the_same_task_indices_are_timed_apart(autojump_clock: Any) -> None:
    """Two batches both dispatching task 0 count as two rollouts in flight for the timer."""
    async with scripted_collector(slow_rows([5.0])) as collector:
        async with trio.open_nursery() as nursery:
            for run_id in ("a", "b"):

                async def one(run_id: str = run_id) -> None:
                    await consume(collector, [row_body(0)], run_id=run_id)

                nursery.start_soon(one)
            await trio.sleep(1)
            assert collector.timer.running == 2
        assert collector.timer.running == 0


async def test_batch_input_error_is_raised_once_and_the_rows_before_it_go_out(
    autojump_clock: Any,
) -> None:
    """A bad third row raises once; iterating on yields the two rows read before it."""
    rows = [row_body(0), row_body(1), {"responses_create_params": {}}]
    errors: list[Exception] = []
    async with scripted_collector() as collector, collector.open_batch(rows) as batch:
        tasks = []
        while len(errors) < 3:  # an error raised on every call would loop here
            try:
                item = await batch.__anext__()
            except StopAsyncIteration:
                break
            except InputError as exc:
                errors.append(exc)
                continue
            tasks.append(item.row["_ng_task_index"])
    assert len(errors) == 1
    assert "rows[2] has no _ng_task_index" in str(errors[0])
    assert sorted(tasks) == [0, 1]
