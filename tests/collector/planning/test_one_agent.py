"""A deployment with exactly one agent runs the rows that name none: no ``+agent_name`` needed."""

from __future__ import annotations

from pathlib import Path

import pytest
from plan_router import direct_router

from trollout.collector.planning.plan import plan_rollouts
from trollout.errors import InputError
from trollout.settings import RunConfig

ROW = '{"responses_create_params": {"input": "q"}}\n'


def test_rows_naming_no_agent_run_on_the_only_agent(tmp_path: Path) -> None:
    """No agent_ref, no task_source, one agent: the row runs there, stamped with it."""
    source = tmp_path / "in.jsonl"
    source.write_text(ROW * 2)
    plan = plan_rollouts(source, RunConfig(num_repeats=2), direct_router(["solo"]))
    rows = list(plan.rows())
    assert {row.identity.agent_name for row in rows} == {"solo"}
    assert {row.body["agent_ref"]["name"] for row in rows} == {"solo"}
    assert len(rows) == 4  # two lines of one task, each repeated twice


def test_rows_naming_no_agent_among_several_agents_are_still_refused(tmp_path: Path) -> None:
    """Two agents: which one is the user's to say, and the hint says how."""
    source = tmp_path / "in.jsonl"
    source.write_text(ROW)
    with pytest.raises(InputError, match=r"no agent: .*pass \+agent_name=<agent>"):
        plan_rollouts(source, RunConfig(), direct_router(["a", "b"]))
