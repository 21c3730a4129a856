"""Hypothesis properties of the plan: numbering is complete, unique, and order-independent."""

from __future__ import annotations

import itertools
import json
import re
import tempfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import attrs
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from plan_router import strategies_router

from strategies import AGENTS, TASK_SOURCES, plan_settings, row_lists
from trollout.collector.planning.plan import Plan, plan_rollouts, plan_rows
from trollout.errors import InputError
from trollout.records import MaterializedRow
from trollout.recovery.files import write_materialized
from trollout.settings import RunConfig

ORDERS = [
    {"interleave_repeats": i, "round_robin_agents": r} for i in (False, True) for r in (False, True)
]


def agents_of(row: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    """Model: the agents that run a row (fan-out, else agent_ref, else the dataset's owner)."""
    agent = row.get("agent_ref", {}).get("name")
    source = row.get("task_source")
    fan_out = settings.get("fan_out", {})
    for key in (agent, source):
        if key in fan_out:
            return list(fan_out[key])
    return [agent or AGENTS[TASK_SOURCES.index(source)]]


def repeats_of(agent: str, settings: dict[str, Any]) -> int:
    """Model: num_repeats for one agent."""
    repeats = settings["num_repeats"]
    if isinstance(repeats, int):
        return repeats
    return int(repeats.get(agent, repeats.get("_default", 1)))


def model_rollouts(rows: list[dict[str, Any]], settings: dict[str, Any]) -> Counter[int]:
    """Model: rollouts per task, with identity by stamp or by sorted JSON (next free index)."""
    stamps = {r["_ng_task_index"] for r in rows if "_ng_task_index" in r}
    free = (i for i in itertools.count() if i not in stamps)
    by_text: dict[bytes, int] = {}
    counts: Counter[int] = Counter()
    for row in rows:
        if "_ng_task_index" in row:
            task = row["_ng_task_index"]
        else:
            text = orjson.dumps(row, option=orjson.OPT_SORT_KEYS)
            if text not in by_text:
                by_text[text] = next(free)
            task = by_text[text]
        counts[task] += sum(repeats_of(a, settings) for a in agents_of(row, settings))
    return counts


def planned(rows: list[dict[str, Any]], settings: dict[str, Any], **order: bool) -> Plan:
    """Plan in-memory rows with the strategies' router."""
    return plan_rows(rows, RunConfig(**settings, **order), strategies_router())


def canonical_rows(p: Plan) -> list[str]:
    """Return every planned row (identity and body) as sorted JSON, in order."""
    return [
        json.dumps([r.identity.key, r.identity.agent_name, dict(r.body)], sort_keys=True)
        for r in p.rows()
    ]


@given(row_lists(min_size=1), plan_settings(), st.sampled_from(ORDERS))
def test_plan_every_task_rollout_appears_exactly_once(
    rows: list[dict[str, Any]], settings: dict[str, Any], order: dict[str, bool]
) -> None:
    """Every (task, rollout) pair is planned exactly once, and `expected` counts them."""
    p = planned(rows, settings, **order)
    keys = [r.identity.key for r in p.rows()]
    assert len(keys) == len(set(keys)) == p.expected
    assert len({task for task, _ in keys}) == p.tasks


@given(row_lists(min_size=1), plan_settings(), st.sampled_from(ORDERS))
def test_plan_counted_in_the_checking_pass_equals_the_counting_pass(
    rows: list[dict[str, Any]], settings: dict[str, Any], order: dict[str, bool]
) -> None:
    """A plan keeping every task is counted while it is checked (one pass); a `limit` that
    keeps them all too makes planning count in a second pass: the plans are the same
    (rollouts, bytes, and the dispatch order the round-robin groups decide)."""
    one = planned(rows, settings, **order)
    two = planned(rows, {**settings, "limit": len(rows)}, **order)
    assert (one.tasks, one.expected, one.materialized_bytes) == (
        two.tasks,
        two.expected,
        two.materialized_bytes,
    )
    assert canonical_rows(one) == canonical_rows(two)


@given(row_lists(min_size=1), plan_settings(), st.sampled_from(ORDERS))
def test_plan_bodies_written_and_read_back_are_the_plans_rows(
    rows: list[dict[str, Any]], settings: dict[str, Any], order: dict[str, bool]
) -> None:
    """A fresh run writes the plan's bodies (no identity built) and dispatches them read back:
    those rows are the plan's rows, every identity field included (task_id, provenance,
    routing), in the same order."""
    p = planned(rows, settings, **order)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "m.jsonl"
        assert write_materialized(path, p.bodies()) == p.expected
        read = [
            MaterializedRow.from_body(orjson.loads(line)) for line in path.read_bytes().splitlines()
        ]
    planned_rows = list(p.rows())
    assert [attrs.astuple(r.identity) for r in read] == [
        attrs.astuple(r.identity) for r in planned_rows
    ]
    assert [r.body for r in read] == [dict(r.body) for r in planned_rows]


@given(row_lists(min_size=1), plan_settings())
def test_plan_rollouts_per_task_equal_sum_of_repeats(
    rows: list[dict[str, Any]], settings: dict[str, Any]
) -> None:
    """A task's rollouts are 0..n-1, n = its rows' repeats summed over agents and lines."""
    by_task: defaultdict[int, list[int]] = defaultdict(list)
    for r in planned(rows, settings).rows():
        by_task[r.identity.task_index].append(r.identity.rollout_index)
    model = model_rollouts(rows, settings)
    assert {t: sorted(rs) for t, rs in by_task.items()} == {
        t: list(range(n)) for t, n in model.items()
    }


@given(row_lists(min_size=1), plan_settings())
def test_plan_orders_are_permutations_of_each_other(
    rows: list[dict[str, Any]], settings: dict[str, Any]
) -> None:
    """Every ordering plans the same rows (bodies, seeds, identities), only permuted."""
    runs = [sorted(canonical_rows(planned(rows, settings, **order))) for order in ORDERS]
    assert all(run == runs[0] for run in runs[1:])


@given(row_lists(min_size=1), plan_settings())
def test_plan_default_order_keeps_rollouts_of_a_line_together(
    rows: list[dict[str, Any]], settings: dict[str, Any]
) -> None:
    """In the default order, rollout indices of one task rise monotonically."""
    last: dict[int, int] = {}
    for r in planned(rows, settings).rows():
        task, rollout = r.identity.key
        assert rollout == last.get(task, -1) + 1
        last[task] = rollout


@given(row_lists(min_size=1, stamped=False), plan_settings(), st.integers(1, 4))
def test_plan_limit_keeps_the_first_tasks_in_order_of_appearance(
    rows: list[dict[str, Any]], settings: dict[str, Any], limit: int
) -> None:
    """`limit N` plans exactly the rows of the first N tasks of the unlimited plan."""
    full = canonical_rows(planned(rows, settings))
    first_tasks = list(dict.fromkeys(json.loads(r)[0][0] for r in full))[:limit]
    limited = canonical_rows(planned(rows, {**settings, "limit": limit}))
    assert limited == [r for r in full if json.loads(r)[0][0] in first_tasks]


@given(row_lists(min_size=1), plan_settings(), st.sampled_from(ORDERS))
def test_plan_file_and_in_memory_rows_agree(
    rows: list[dict[str, Any]], settings: dict[str, Any], order: dict[str, bool]
) -> None:
    """A file of sorted-key JSON lines plans exactly like the same rows in memory."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "in.jsonl"
        path.write_bytes(
            b"".join(orjson.dumps(r, option=orjson.OPT_SORT_KEYS) + b"\n" for r in rows)
        )
        from_file = plan_rollouts(path, RunConfig(**settings, **order), strategies_router())
        assert canonical_rows(from_file) == canonical_rows(planned(rows, settings, **order))


@given(row_lists(min_size=1), plan_settings(), st.sampled_from(["empty", "limit", "task_ids"]))
def test_plan_with_no_rollout_is_refused_saying_why(
    rows: list[dict[str, Any]], settings: dict[str, Any], why: str
) -> None:
    """No rows, `limit 0` or an empty `task_ids` is an InputError saying so, never a plan."""
    rows = [] if why == "empty" else rows
    extra = {"limit": {"limit": 0}, "task_ids": {"task_ids": []}}.get(why, {})
    expected = {"empty": "holds no rows", "limit": "limit 0", "task_ids": "task_ids []"}[why]
    with pytest.raises(InputError, match=re.escape(expected)):
        planned(rows, {**settings, **extra})
