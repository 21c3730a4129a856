"""Hypothesis strategies shared by the test suite (plural nouns, docs/style.md).

Input rows: `rows()` draws one NeMo Gym dataset row routed by ``agent_ref`` or ``task_source``
(from `AGENTS` and `TASK_SOURCES`, dataset ``TASK_SOURCES[i]`` declared by ``AGENTS[i]``);
`row_lists()` draws a small input with identical rows repeated and, optionally, pre-stamped
``_ng_task_index`` values; `plan_settings()` draws the preprocessing settings of `RunConfig`
that change numbering and order.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

__all__ = [
    "AGENTS",
    "TASK_SOURCES",
    "agent_names",
    "plan_settings",
    "prompts",
    "repeat_settings",
    "row_lists",
    "rows",
]

AGENTS = ("alpha", "beta", "gamma")
TASK_SOURCES = ("ds_alpha", "ds_beta")


def agent_names() -> st.SearchStrategy[str]:
    """Draw an agent name of `AGENTS`."""
    return st.sampled_from(AGENTS)


def prompts() -> st.SearchStrategy[str]:
    """Draw a short user prompt (any text, including quotes and non-ASCII)."""
    return st.text(max_size=12)


@st.composite
def rows(draw: st.DrawFn, *, stamped: bool = False) -> dict[str, Any]:
    """Draw one flat input row (routed by agent_ref or by task_source).

    Args:
        stamped: sometimes carry a pre-stamped ``_ng_task_index`` in 0..7.
    """
    params: dict[str, Any] = {"input": [{"role": "user", "content": draw(prompts())}]}
    if draw(st.booleans()):
        params["metadata"] = {"extra_body": draw(st.sampled_from(['{"top_k": 5}', {"n": 1}]))}
    row: dict[str, Any] = {"responses_create_params": params}
    if draw(st.booleans()):
        row["agent_ref"] = {"name": draw(agent_names())}
    else:
        row["task_source"] = draw(st.sampled_from(TASK_SOURCES))
    if draw(st.booleans()):
        row["expected_answer"] = draw(st.integers(-5, 5))
    if stamped and draw(st.integers(0, 3)) == 0:
        row["_ng_task_index"] = draw(st.integers(0, 7))
    return row


@st.composite
def row_lists(
    draw: st.DrawFn, *, min_size: int = 0, max_size: int = 10, stamped: bool = True
) -> list[dict[str, Any]]:
    """Draw an input: a few distinct rows, each used on one or more lines (identical rows)."""
    distinct = draw(st.lists(rows(stamped=stamped), min_size=1, max_size=5))
    picks = draw(st.lists(st.integers(0, len(distinct) - 1), min_size=min_size, max_size=max_size))
    return [copy.deepcopy(distinct[i]) for i in picks]


def repeat_settings() -> st.SearchStrategy[int | dict[str, int]]:
    """Draw ``num_repeats``: an int, or a per-agent dict with or without ``_default``."""
    counts = st.integers(1, 3)
    per_agent = st.dictionaries(st.sampled_from((*AGENTS, "_default")), counts, max_size=3)
    return st.one_of(counts, per_agent)


@st.composite
def plan_settings(draw: st.DrawFn) -> dict[str, Any]:
    """Draw `RunConfig` keyword arguments for numbering: repeats, fan-out, seeds (not order)."""
    settings: dict[str, Any] = {"num_repeats": draw(repeat_settings())}
    if draw(st.booleans()):
        key = draw(st.sampled_from((*AGENTS, *TASK_SOURCES)))
        settings["fan_out"] = {key: draw(st.lists(agent_names(), min_size=1, max_size=3))}
    settings["num_repeats_add_seed"] = draw(st.booleans())
    settings["seed"] = draw(st.integers(0, 6))  # a run seed is 0 .. 2**64 - 1
    return settings
