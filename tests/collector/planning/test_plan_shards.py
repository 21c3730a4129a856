"""``shard I/N``: a selection on the whole plan that partitions it exactly and stably."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from plan_router import strategies_router

from strategies import plan_settings, row_lists, rows
from trollout.collector.planning.plan import Plan, plan_rows
from trollout.collector.planning.task_selection import task_shard
from trollout.errors import ConfigError, InputError
from trollout.settings import RunConfig


def planned(rows_: list[dict[str, Any]], settings: dict[str, Any], shard: str | None) -> Plan:
    """Plan in-memory rows, as shard ``shard`` (None: the whole plan)."""
    return plan_rows(rows_, RunConfig(**settings, shard=shard), strategies_router())


def canonical(plan: Plan) -> list[str]:
    """Return every planned row (identity, agent and body, seed included) as sorted JSON."""
    return [
        json.dumps([r.identity.key, r.identity.agent_name, dict(r.body)], sort_keys=True)
        for r in plan.rows()
    ]


def shard_rows(
    rows_: list[dict[str, Any]], settings: dict[str, Any], index: int, n: int
) -> list[str]:
    """Return the canonical rows of shard index/n (none when the shard is empty)."""
    try:
        return canonical(planned(rows_, settings, f"{index}/{n}"))
    except InputError:  # only a whole plan that is empty is refused
        assert not canonical(planned(rows_, settings, None))
        raise


@given(row_lists(min_size=1), plan_settings(), st.integers(1, 6), st.sampled_from([None, 1, 2]))
def test_shards_partition_the_plan_exactly(
    rows_: list[dict[str, Any]], settings: dict[str, Any], n: int, limit: int | None
) -> None:
    """The N shards hold every row of the one-machine plan once, numbered and seeded alike."""
    settings = {**settings, "limit": limit}
    whole = canonical(planned(rows_, settings, None))
    parts = [shard_rows(rows_, settings, i, n) for i in range(n)]
    union = [row for part in parts for row in part]
    assert sorted(union) == sorted(whole)
    tasks = [{json.loads(r)[0][0] for r in part} for part in parts]
    assert sum(len(t) for t in tasks) == len(set().union(*tasks))  # a task in one shard only


@given(
    row_lists(min_size=1, stamped=False),
    st.lists(rows(), min_size=1, max_size=4),
    st.integers(1, 6),
)
def test_a_tasks_shard_is_stable_when_tasks_are_added(
    rows_: list[dict[str, Any]], more: list[dict[str, Any]], n: int
) -> None:
    """Adding other tasks anywhere in the input never moves a task to another shard."""
    settings = {"num_repeats": 2}
    known = {json.dumps(r, sort_keys=True) for r in rows_}
    more = [r for r in more if json.dumps(r, sort_keys=True) not in known]

    def shard_by_content(input_rows: list[dict[str, Any]]) -> dict[str, int]:
        found = {}
        for i in range(n):
            for r in planned(input_rows, settings, f"{i}/{n}").rows():
                body = {k: v for k, v in r.body.items() if not k.startswith("_ng_")}
                found[json.dumps(body, sort_keys=True)] = i
        return found

    before = shard_by_content(rows_)
    after = shard_by_content(more + rows_ + more[::-1])
    assert {k: after[k] for k in before} == before


def test_task_shard_ignores_collector_keys_and_order_of_keys() -> None:
    """A task's shard is its content's: stale _ng_* keys and key order do not move it."""
    row = {"responses_create_params": {"input": "q", "metadata": {"a": 1}}, "x": [1, 2]}
    stamped = {"x": [1, 2], "_ng_task_index": 9, "_ng_failure_class": "stale", **row}
    assert all(task_shard(row, n) == task_shard(stamped, n) for n in range(1, 50))
    assert len({task_shard({"q": i}, 4) for i in range(40)}) == 4  # every shard gets tasks


def test_an_empty_shard_is_an_empty_plan_not_an_error() -> None:
    """More shards than tasks: the shards without a task plan nothing, and that is no error."""
    one = [{"responses_create_params": {"input": "only"}, "agent_ref": {"name": "alpha"}}]
    plans = [planned(one, {}, f"{i}/5") for i in range(5)]
    assert sorted(p.expected for p in plans) == [0, 0, 0, 0, 1]
    with pytest.raises(InputError, match="limit 0 keeps no task"):
        planned(one, {"limit": 0}, "0/5")


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("5/4", "has no shard 5 of 4"),
        ("4/4", "runs from 0 to 3"),
        ("0/0", "must be at least 1"),
        ("-1/4", "two integers such as 0/4"),
        ("1 of 4", "two integers such as 0/4"),
        (3, "got 3"),
    ],
)
def test_shard_setting_refuses_what_is_not_i_of_n(value: Any, needle: str) -> None:
    """A shard outside 0..N-1, a count of 0 or a malformed value is refused, named."""
    with pytest.raises(ConfigError, match=needle):
        RunConfig(shard=value)
