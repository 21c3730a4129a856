"""One test per preprocessing rule (docs/protocol.md section 5, and sections 2-3 for routing)."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
import socket
import stat
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from plan_router import EnvironmentServer, TableRouter, direct_router

from trollout import jsonl
from trollout.collector.deployment.discovery import Deployment
from trollout.collector.planning.plan import Plan, plan_rollouts, plan_rows, rollout_seed
from trollout.collector.planning.task_selection import STORED_ID_PLACES, stored_task_id
from trollout.errors import ConfigError, DeploymentError, InputError
from trollout.records import MaterializedRow
from trollout.settings import TASKSET_NEEDS_ROUTES, RunConfig, SeedMode

REFERENCE = Path(__file__).resolve().parents[4] / "shared" / "reference" / "nemo_gym_0.7.0"


def row(prompt: str = "q", agent: str | None = "alpha", **extra: Any) -> dict[str, Any]:
    """Return a flat input row asking ``prompt``, routed to ``agent``."""
    out: dict[str, Any] = {"responses_create_params": {"input": prompt}}
    if agent is not None:
        out["agent_ref"] = {"name": agent}
    out.update(extra)
    return out


def write(tmp_path: Path, lines: list[Any], name: str = "in.jsonl") -> Path:
    """Write lines (dicts as JSON, strings as written) to a JSONL file."""
    path = tmp_path / name
    text = "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines)
    path.write_text(text, encoding="utf-8")
    return path


def plan(tmp_path: Path, lines: list[Any], router: Any = None, **settings: Any) -> Plan:
    """Plan a file made of ``lines`` with a direct router to alpha, beta, gamma."""
    return plan_rollouts(write(tmp_path, lines), RunConfig(**settings), router or direct_router())


def keys(p: Plan) -> list[tuple[int, int, str | None]]:
    """Return (task, rollout, agent) of every planned row, in order."""
    return [
        (r.identity.task_index, r.identity.rollout_index, r.identity.agent_name) for r in p.rows()
    ]


def bodies(p: Plan) -> list[dict[str, Any]]:
    """Return every planned body, in order."""
    return [dict(r.body) for r in p.rows()]


def problems_of(exc: pytest.ExceptionInfo[InputError]) -> list[str]:
    """Return the problems an InputError carries."""
    return list(exc.value.problems)


def extra_body(r: MaterializedRow) -> dict[str, Any]:
    """Return the parsed extra_body of a materialized row."""
    return json.loads(r.body["responses_create_params"]["metadata"]["extra_body"])


# --- task identity ------------------------------------------------------------------------


def test_plan_identical_rows_are_one_task_with_rollouts_0_to_4(tmp_path: Path) -> None:
    """Five identical rows become task 0 with rollouts 0..4 (num_repeats 1)."""
    p = plan(tmp_path, [row()] * 5)
    assert (p.tasks, p.expected) == (1, 5)
    assert keys(p) == [(0, i, "alpha") for i in range(5)]


def test_plan_identity_follows_raw_line_text(tmp_path: Path) -> None:
    """Rows equal as JSON but written differently are different tasks (the raw line is the key)."""
    p = plan(
        tmp_path,
        ['{"responses_create_params": {}, "a": 1}', '{"a": 1, "responses_create_params": {}}'],
        agent_name="alpha",
    )
    assert keys(p) == [(0, 0, "alpha"), (1, 0, "alpha")]


def test_plan_rows_identity_uses_sorted_json(tmp_path: Path) -> None:
    """In-memory rows equal as JSON with sorted keys are one task."""
    a = {"responses_create_params": {"x": 1, "y": 2}, "agent_ref": {"name": "beta"}}
    b = {"agent_ref": {"name": "beta"}, "responses_create_params": {"y": 2, "x": 1}}
    p = plan_rows([a, b], RunConfig(), direct_router())
    assert keys(p) == [(0, 0, "beta"), (0, 1, "beta")]


def test_plan_prestamped_task_index_kept(tmp_path: Path) -> None:
    """A row's _ng_task_index is kept; rows stamped alike are one task, whatever they hold."""
    p = plan(tmp_path, [row("a", _ng_task_index=7), row("b", _ng_task_index=7)])
    assert keys(p) == [(7, 0, "alpha"), (7, 1, "alpha")]
    assert p.tasks == 1


def test_plan_unstamped_rows_take_next_free_index_skipping_later_stamps(tmp_path: Path) -> None:
    """Unstamped rows take the smallest indices no row is stamped with, even stamps found later."""
    lines = [row("a"), row("b"), row("c", _ng_task_index=0), row("d"), row("e", _ng_task_index=2)]
    p = plan(tmp_path, lines)
    assert [k[0] for k in keys(p)] == [1, 3, 0, 4, 2]
    assert p.tasks == 5


# --- limit and task_ids -------------------------------------------------------------------


def test_plan_limit_counts_tasks_not_lines(tmp_path: Path) -> None:
    """`limit 2` keeps every line of the first two tasks, duplicates included."""
    p = plan(tmp_path, [row("a"), row("a"), row("a"), row("b"), row("c"), row("a")], limit=2)
    assert (p.tasks, p.expected) == (2, 5)
    assert keys(p) == [
        (0, 0, "alpha"),
        (0, 1, "alpha"),
        (0, 2, "alpha"),
        (1, 0, "alpha"),
        (0, 3, "alpha"),
    ]


def test_plan_task_ids_keep_those_tasks_once_before_repetition(tmp_path: Path) -> None:
    """`task_ids` keeps only the tasks whose stored ids it lists, one line each, then repeats."""
    lines = [row("a", task_id="A"), row("b", task_id="B"), row("b", task_id="B")]
    lines += [row("c", task_id="C"), row("a", task_id="A")]
    p = plan(tmp_path, lines, task_ids=["B", "A"], num_repeats=2)
    assert (p.tasks, p.expected) == (2, 4)
    assert keys(p) == [(0, 0, "alpha"), (0, 1, "alpha"), (1, 0, "alpha"), (1, 1, "alpha")]


def test_plan_task_ids_select_by_the_id_each_row_stores(tmp_path: Path) -> None:
    """Ids are read from task_id, metadata.task_id (NeMo Gym's examples), problem_id, ..."""
    lines = [
        {"responses_create_params": {"input": "a", "metadata": {"task_id": "row-000000"}}},
        {"responses_create_params": {"input": "b", "metadata": {"task_id": "row-000001"}}},
        row("c", problem_id=7),
        row("d", instance_id="i-9"),
        {"task_id": {"taskset": "ts", "task_id": "t-1"}, "task_input": {}},
    ]
    stored = [stored_task_id(line) for line in lines]
    assert stored == ["row-000000", "row-000001", "7", "i-9", "t-1"]
    p = plan(tmp_path, lines[:4], agent_name="alpha", task_ids=["row-000001", 7])
    assert [t for t, _, _ in keys(p)] == [1, 2]


def test_plan_task_ids_not_in_input_refused(tmp_path: Path) -> None:
    """An id no row stores is refused, naming the key and where ids are read from."""
    with pytest.raises(InputError) as exc:
        plan(tmp_path, [row("a", task_id="A"), row("b", task_id="B")], task_ids=["B", "Z"])
    assert problems_of(exc) == [
        f"task_ids: 'Z' is the id of no row of the input (ids are read from "
        f"{STORED_ID_PLACES}); list ids the rows store"
    ]


def test_plan_limit_then_task_ids(tmp_path: Path) -> None:
    """With both, `limit` keeps the first N tasks, then `task_ids` picks among them."""
    lines = [row("a", task_id="A"), row("b", task_id="B"), row("c", task_id="C")]
    p = plan(tmp_path, lines, limit=2, task_ids=["B", "C"])
    assert keys(p) == [(1, 0, "alpha")]


# --- routing ------------------------------------------------------------------------------


def test_plan_agent_name_overrides_agent_ref(tmp_path: Path) -> None:
    """`agent_name` re-routes every row, whatever its agent_ref says."""
    p = plan(tmp_path, [row("a", "alpha"), row("b", "beta"), row("c", None)], agent_name="gamma")
    assert [k[2] for k in keys(p)] == ["gamma"] * 3
    assert bodies(p)[0]["agent_ref"] == {"name": "gamma"}


def test_plan_agent_ref_extra_fields_kept_only_for_same_agent(tmp_path: Path) -> None:
    """agent_ref keeps extra fields (type) when the agent is unchanged, not when re-routed."""
    ref = {"type": "responses_api_agents", "name": "alpha"}
    kept = plan(tmp_path, [row("a", None, agent_ref=ref)])
    assert bodies(kept)[0]["agent_ref"] == ref
    moved = plan(tmp_path, [row("a", None, agent_ref=ref)], agent_map={"alpha": "beta"})
    assert bodies(moved)[0]["agent_ref"] == {"name": "beta"}


def test_plan_agent_map_precedence(tmp_path: Path) -> None:
    """agent_map[agent] > agent_map[task_source] > agent_map._default > agent_ref."""
    router = direct_router(task_sources={"ds": ["alpha"]})
    lines = [
        row("1", "alpha", task_source="ds"),  # agent key wins over task_source key
        row("2", "beta", task_source="ds"),  # task_source key wins over _default
        row("3", "gamma"),  # only _default matches
    ]
    agent_map = {"alpha": "beta", "ds": "gamma", "_default": "alpha"}
    p = plan(tmp_path, lines, router, agent_map=agent_map)
    assert [k[2] for k in keys(p)] == ["beta", "gamma", "alpha"]
    p = plan(tmp_path, [row("3", "gamma")], router, agent_map={"alpha": "beta"})
    assert [k[2] for k in keys(p)] == ["gamma"]  # no key matches: the row's agent_ref


def test_plan_task_source_resolution(tmp_path: Path) -> None:
    """A row without agent_ref runs on the agent its task_source resolves to; else refused."""
    router = direct_router(task_sources={"math": ["beta"], "both": ["alpha", "gamma"]})
    p = plan(tmp_path, [row("a", None, task_source="math")], router)
    assert keys(p) == [(0, 0, "beta")]
    assert p.rows().__next__().identity.task_source == "math"
    with pytest.raises(InputError) as exc:
        plan(
            tmp_path,
            [
                row("a", None, task_source="both"),
                row("b", None, task_source="nope"),
                row("c", None),
            ],
            router,
        )
    path = tmp_path / "in.jsonl"
    assert problems_of(exc) == [
        f"{path}:1: task_source 'both' resolves to ['alpha', 'gamma']",
        f"{path}:2: task_source 'nope' resolves to []",
        f"{path}:3: no agent: no agent_ref.name, no task_source; add agent_ref.name to the "
        "rows, or pass +agent_name=<agent>",
    ]


def test_plan_allowed_agents_refusal(tmp_path: Path) -> None:
    """An agent the rows' allowed_agents leave out is refused before dispatch."""
    router = direct_router(allowed={"ds": {"alpha"}})
    assert plan(tmp_path, [row("a", "alpha", task_source="ds")], router).expected == 1
    with pytest.raises(InputError) as exc:
        plan(tmp_path, [row("a", "beta", task_source="ds")] * 2, router)
    assert problems_of(exc) == [
        f"2 rows, first at {tmp_path / 'in.jsonl'}:1: agent 'beta' (from agent_ref.name) is not "
        "admitted: 'ds' does not admit agent 'beta'; route these rows to an agent of an "
        "accepted type"
    ]


def test_plan_unknown_agents_all_in_one_error(tmp_path: Path) -> None:
    """Every unknown agent is reported once, with a count and its first line, in one error."""
    lines = [row("a", "zeta"), row("b", "alpha"), row("c", "omega"), row("d", "zeta"), "{oops"]
    with pytest.raises(InputError) as exc:
        plan(tmp_path, lines)
    path = tmp_path / "in.jsonl"
    problems = problems_of(exc)
    assert problems[0].startswith(f"{path}:5: not valid JSON (")
    assert problems[1:] == [
        f"2 rows, first at {path}:1: unknown agent 'zeta' (from agent_ref.name); known agents: "
        "alpha, beta, gamma; fix agent_ref.name, or map it with +agent_map={zeta:<agent>}",
        f"{path}:3: unknown agent 'omega' (from agent_ref.name); known agents: alpha, beta, "
        "gamma; fix agent_ref.name, or map it with +agent_map={omega:<agent>}",
    ]
    assert str(exc.value).endswith("(and 2 more problems)")


def test_plan_unknown_agent_from_settings_names_the_key(tmp_path: Path) -> None:
    """An unknown agent chosen by agent_name or fan_out names that setting as the fix."""
    with pytest.raises(InputError) as exc:
        plan(tmp_path, [row("a")], fan_out={"alpha": ["beta", "nobody"]})
    assert problems_of(exc)[0].endswith("known agents: alpha, beta, gamma; fix fan_out.alpha")
    with pytest.raises(InputError) as exc:
        plan(tmp_path, [row("a")], agent_name="nobody")
    assert problems_of(exc)[0].endswith("; fix agent_name")


def test_plan_fan_out_times_repeats_numbering(tmp_path: Path) -> None:
    """fan_out {x: [a, b]} with 2 repeats: a gets rollouts 0, 1 and b gets 2, 3."""
    p = plan(tmp_path, [row("q", "x")], fan_out={"x": ["alpha", "beta"]}, num_repeats=2)
    assert keys(p) == [(0, 0, "alpha"), (0, 1, "alpha"), (0, 2, "beta"), (0, 3, "beta")]


def test_plan_fan_out_by_task_source_and_across_identical_rows(tmp_path: Path) -> None:
    """A fan-out keyed by task_source matches, and numbering continues across identical rows."""
    lines = [row("q", None, task_source="ds")] * 2
    p = plan(tmp_path, lines, fan_out={"ds": ["gamma", "alpha"]})
    assert keys(p) == [(0, 0, "gamma"), (0, 1, "alpha"), (0, 2, "gamma"), (0, 3, "alpha")]


def test_plan_per_agent_num_repeats_with_default(tmp_path: Path) -> None:
    """num_repeats {agent: n, _default: m}: listed agents get n, others m."""
    lines = [row("a", "alpha"), row("b", "beta")]
    p = plan(tmp_path, lines, num_repeats={"alpha": 3, "_default": 2})
    assert keys(p) == [
        (0, 0, "alpha"),
        (0, 1, "alpha"),
        (0, 2, "alpha"),
        (1, 0, "beta"),
        (1, 1, "beta"),
    ]
    assert plan(tmp_path, lines, num_repeats={"alpha": 2}).expected == 3  # no _default: 1


def test_plan_num_repeats_below_one_refused_per_agent(tmp_path: Path) -> None:
    """A per-agent num_repeats below 1 is refused naming its key, with the row problems."""
    config = RunConfig(num_repeats={"alpha": 0, "_default": 2, "beta": -1})
    with pytest.raises(InputError) as exc:
        plan_rollouts(write(tmp_path, [row()]), config, direct_router())
    assert problems_of(exc) == [
        "num_repeats.alpha must be an integer >= 1 (got 0); use 1 or more",
        "num_repeats.beta must be an integer >= 1 (got -1); use 1 or more",
    ]
    with pytest.raises(ConfigError):
        RunConfig(num_repeats=0).validate()


def test_plan_routing_agent_mode_stamps_fronting_environment_server(tmp_path: Path) -> None:
    """In agent mode a flat row goes to the environment server fronting its agent."""
    router = TableRouter(
        agents={"alpha": "env_a", "beta": None}, environments={"env_a": "legacy_agent"}
    )
    [a, b] = plan(tmp_path, [row("a", "alpha"), row("b", "beta")], router).rows()
    assert a.body["_ng_environment_server"] == "env_a"
    assert (a.identity.environment_server, a.identity.result_type) == ("env_a", "legacy_agent")
    assert a.body["_ng_result_type"] == "legacy_agent"
    assert "_ng_environment_server" not in b.body
    assert b.identity.environment_server is None


def test_plan_routing_legacy_mode_sends_flat_rows_to_named_server(tmp_path: Path) -> None:
    """In legacy mode every flat row goes to environment_server_name, keeping its agent."""
    router = TableRouter(
        agents={"alpha": "env_a"}, environments={"env_a": "x", "old": "legacy_agent"}
    )
    p = plan(
        tmp_path, [row()], router, environment_routing_mode="legacy", environment_server_name="old"
    )
    [r] = p.rows()
    assert (r.identity.agent_name, r.identity.environment_server, r.identity.result_type) == (
        "alpha",
        "old",
        "legacy_agent",
    )
    with pytest.raises(InputError) as exc:
        plan(
            tmp_path,
            [row()],
            router,
            environment_routing_mode="legacy",
            environment_server_name="gone",
        )
    assert problems_of(exc) == ["environment_server_name: unknown environment server 'gone'"]


def test_plan_routing_taskset_mode_refuses_flat_rows(tmp_path: Path) -> None:
    """In taskset mode flat rows are refused (once, with a count); task rows still route."""
    task = {"task_id": {"taskset": "ts", "task_id": "1"}, "task_input": {"q": 1}}
    router = TableRouter(agents={"alpha": None}, environments={"env_t": "episode"})
    settings = {"environment_routing_mode": "taskset", "environment_server_routes": {"ts": "env_t"}}
    assert plan(tmp_path, [task], router, **settings).expected == 1
    with pytest.raises(InputError) as exc:
        plan(tmp_path, [task, row(), row("b")], router, **settings)
    assert problems_of(exc) == [
        f"2 rows, first at {tmp_path / 'in.jsonl'}:2: flat rows (no task_id), but "
        "environment_routing_mode is 'taskset'; convert them to task rows, or pass "
        "+environment_routing_mode=agent"
    ]


def test_plan_task_rows_routed_by_taskset(tmp_path: Path) -> None:
    """A task row names no agent and goes to environment_server_routes[taskset]."""
    task = {
        "task_id": {"taskset": "ts", "task_id": "7"},
        "task_input": {"q": 1},
        "agent_ref": {"name": "alpha"},
    }
    router = TableRouter(agents={"alpha": "env_a"}, environments={"env_a": "x", "env_t": "episode"})
    p = plan(
        tmp_path,
        [task],
        router,
        environment_server_routes={"ts": "env_t"},
        num_repeats={"alpha": 5, "_default": 2},
    )
    [r0, r1] = p.rows()
    assert r0.identity.agent_name is None
    assert (r0.identity.environment_server, r0.identity.result_type) == ("env_t", "episode")
    assert "agent_ref" not in r0.body
    assert r0.body == {
        "task_id": task["task_id"],
        "task_input": {"q": 1},
        "_ng_task_index": 0,
        "_ng_rollout_index": 0,
        "_ng_environment_server": "env_t",
        "_ng_result_type": "episode",
    }
    assert r1.identity.rollout_index == 1


def test_plan_task_rows_missing_route_refused(tmp_path: Path) -> None:
    """A task row whose taskset has no route is refused, once per taskset, with the fix."""
    task = {"task_id": {"taskset": "ts", "task_id": "1"}, "task_input": {}}
    with pytest.raises(InputError) as exc:
        plan(tmp_path, [task, task], environment_server_routes={"other": "env"})
    assert problems_of(exc) == [
        f"2 rows, first at {tmp_path / 'in.jsonl'}:1: task rows of taskset 'ts' have no route "
        "in environment_server_routes; pass +environment_server_routes={ts:<environment server>}"
    ]


def test_plan_task_row_shape_checked(tmp_path: Path) -> None:
    """A task row needs a non-empty taskset and a task_input."""
    with pytest.raises(InputError) as exc:
        plan(tmp_path, [{"task_id": {"taskset": ""}}])
    path = tmp_path / "in.jsonl"
    assert problems_of(exc) == [
        f"{path}:1: task_id.taskset must be a non-empty string (got ''); fix the task row",
        f"{path}:1: task row has task_id but no task_input; add task_input",
    ]


def task(taskset: str = "ts", task_id: str = "1") -> dict[str, Any]:
    """Return a materialized task row of ``taskset``."""
    return {"task_id": {"taskset": taskset, "task_id": task_id}, "task_input": {"q": task_id}}


def test_plan_task_rows_repeat_by_taskset_before_default(tmp_path: Path) -> None:
    """num_repeats keyed by a task row's taskset wins over _default; agents' keys do not apply."""
    router = TableRouter(agents={"alpha": None}, environments={"env_t": "episode"})
    routes = {"ts": "env_t", "ts2": "env_t"}
    repeats = {"ts": 3, "alpha": 5, "_default": 2}
    p = plan(
        tmp_path,
        [task("ts"), task("ts2"), row()],
        router,
        environment_server_routes=routes,
        num_repeats=repeats,
    )
    assert [(k[0], k[2]) for k in keys(p)] == [(0, None)] * 3 + [(1, None)] * 2 + [(2, "alpha")] * 5


def test_plan_task_rows_ignore_agent_map_and_fan_out(tmp_path: Path) -> None:
    """agent_name, agent_map and fan_out re-route flat rows only; a task row names no agent."""
    router = TableRouter(agents={"alpha": None, "beta": None}, environments={"env_t": "episode"})
    settings = {"environment_server_routes": {"ts": "env_t"}, "fan_out": {"ts": ["alpha", "beta"]}}
    p = plan(tmp_path, [task(), row()], router, agent_name="beta", **settings)
    assert keys(p) == [(0, 0, None), (1, 0, "beta")]
    assert "agent_ref" not in bodies(p)[0]


def test_plan_task_rows_are_paired_with_the_agent_their_server_binds(tmp_path: Path) -> None:
    """A task row's pairing check uses its server's bound agent, verifier and the taskset."""
    bound = EnvironmentServer("episode", agent_server="beta", resources_server="rs")
    routes = {"environment_server_routes": {"ts": "env_t", "free": "env_u"}}
    environments = {"env_t": bound, "env_u": EnvironmentServer("episode")}
    admitted = TableRouter(
        agents={"beta": None}, environments=environments, allowed={"ts": {"beta"}}
    )
    assert plan(tmp_path, [task()], admitted, **routes).expected == 1
    for allowed in ({"ts": {"alpha"}}, {"rs": {"alpha"}}):
        router = TableRouter(agents={"beta": None}, environments=environments, allowed=allowed)
        with pytest.raises(InputError) as exc:
            plan(tmp_path, [task(), task(task_id="2"), task("free")], router, **routes)
        key = next(iter(allowed))
        assert problems_of(exc) == [
            f"2 rows, first at {tmp_path / 'in.jsonl'}:1: task rows of taskset 'ts' go to "
            f"environment server 'env_t', whose agent is not admitted: {key!r} does not admit "
            "agent 'beta'; route these rows to an agent of an accepted type"
        ]


def test_plan_taskset_mode_needs_routes(tmp_path: Path) -> None:
    """environment_routing_mode=taskset without environment_server_routes is refused."""
    router = TableRouter(agents={"alpha": None}, environments={"env_t": "episode"})
    with pytest.raises(InputError) as exc:
        plan(tmp_path, [task()], router, environment_routing_mode="taskset")
    assert problems_of(exc)[0] == TASKSET_NEEDS_ROUTES


def legacy_router(bound: str | None = "beta", **tables: Any) -> TableRouter:
    """Return a router whose environment server 'old' binds ``bound`` and verifier 'rs'."""
    server = EnvironmentServer("legacy_agent", agent_server=bound, resources_server="rs")
    return TableRouter(
        agents=dict.fromkeys(("alpha", "beta")), environments={"old": server}, **tables
    )


LEGACY = {"environment_routing_mode": "legacy", "environment_server_name": "old"}


def test_plan_legacy_mode_stamps_the_servers_agent_on_rows_naming_none(tmp_path: Path) -> None:
    """A flat row naming no agent runs on the agent the server binds; task_source unresolved."""
    lines = [row("a", None), row("b", None, task_source="rs"), row("c", "beta")]
    lines.append(row("d", None, task_source="beta"))  # the agent may have declared the dataset
    p = plan(tmp_path, lines, legacy_router(), **LEGACY)
    assert [(r.identity.agent_name, r.identity.environment_server) for r in p.rows()] == [
        ("beta", "old")
    ] * 4
    assert [b["agent_ref"] for b in bodies(p)] == [{"name": "beta"}] * 4


def test_plan_legacy_mode_refuses_rows_the_server_cannot_run(tmp_path: Path) -> None:
    """Another agent, another task_source, an unpaired agent or no agent at all: refused."""
    path = tmp_path / "in.jsonl"
    lines = [row("a", "alpha"), row("b", None, task_source="other_rs")]
    with pytest.raises(InputError) as exc:
        plan(tmp_path, lines, legacy_router(), **LEGACY)
    assert problems_of(exc) == [
        f"{path}:1: agent 'alpha' (from agent_ref.name) is not the agent environment server "
        "'old' fronts ('beta'); drop agent_ref from these rows to run them on 'beta', or pass "
        "+environment_server_name=<the server fronting the agent>",
        f"{path}:2: task_source 'other_rs' names neither the resources server environment "
        "server 'old' runs against ('rs') nor the agent running them ('beta'); fix task_source "
        "in the rows, or choose another environment_server_name",
    ]
    with pytest.raises(InputError) as exc:
        plan(tmp_path, [row("a", None)], legacy_router(allowed={"rs": {"alpha"}}), **LEGACY)
    assert problems_of(exc) == [
        f"{path}:1: agent 'beta' (from environment server 'old') is not admitted: 'rs' does not "
        "admit agent 'beta'; route these rows to an agent of an accepted type"
    ]
    with pytest.raises(InputError) as exc:
        plan(tmp_path, [row("a", None)], legacy_router(bound=None), **LEGACY)
    assert problems_of(exc) == [
        f"{path}:1: no agent: no agent_ref.name, and environment server 'old' binds none (no "
        "agent_server); add agent_ref.name to the rows, or pass +agent_name=<agent>"
    ]


# --- line checks --------------------------------------------------------------------------


def test_plan_malformed_line_names_file_and_line(tmp_path: Path) -> None:
    """A malformed line and a non-object line are errors naming file:line."""
    with pytest.raises(InputError) as exc:
        plan(tmp_path, [row(), '{"responses_create_params": ', "[1, 2]"])
    path = tmp_path / "in.jsonl"
    [bad, array] = problems_of(exc)
    assert re.fullmatch(
        rf"{re.escape(str(path))}:2: not valid JSON \(.+\); fix or remove the line", bad
    )
    assert array == f"{path}:3: expected a JSON object, got list; each line must be one object"


def test_plan_blank_lines_skipped(tmp_path: Path) -> None:
    """Blank and whitespace-only lines are skipped; line numbers still count them."""
    p = plan(tmp_path, ["", json.dumps(row("a")), "   ", "\t", json.dumps(row("b"))])
    assert keys(p) == [(0, 0, "alpha"), (1, 0, "alpha")]
    with pytest.raises(InputError) as exc:
        plan(tmp_path, ["", "", "nope"])
    assert problems_of(exc)[0].startswith(f"{tmp_path / 'in.jsonl'}:3: not valid JSON")


def test_plan_missing_responses_create_params_refused(tmp_path: Path) -> None:
    """A flat row without responses_create_params (or with a non-object) is refused."""
    with pytest.raises(InputError) as exc:
        plan(tmp_path, [{"agent_ref": {"name": "alpha"}}, row(), {"responses_create_params": [1]}])
    path = tmp_path / "in.jsonl"
    assert problems_of(exc) == [
        f"{path}:1: missing responses_create_params (every server answers 422 without it); "
        "add it or remove the line",
        f"{path}:3: responses_create_params must be an object (got list); fix the row",
    ]


def test_plan_rollout_id_with_attempt_suffix_refused(tmp_path: Path) -> None:
    """An explicit _ng_rollout_id ending in -a<digits> (or malformed) is refused at load."""
    lines = [
        row("a", _ng_rollout_id="my-a3"),
        row("b", _ng_rollout_id="-bad"),
        row("c", _ng_rollout_id="a-ab"),
    ]
    with pytest.raises(InputError) as exc:
        plan(tmp_path, lines)
    path = tmp_path / "in.jsonl"
    assert problems_of(exc) == [
        f"{path}:1: _ng_rollout_id 'my-a3' ends in '-a<digits>', which is reserved for attempt "
        "numbers; rename it",
        f"{path}:2: _ng_rollout_id must match ^[A-Za-z0-9][A-Za-z0-9._-]*$ (got '-bad'); use "
        "letters, digits, '.', '_' and '-'",
    ]


def test_plan_explicit_rollout_id_kept_on_row_and_identity(tmp_path: Path) -> None:
    """An explicit _ng_rollout_id travels on the body and in the Identity."""
    [r] = plan(tmp_path, [row(_ng_rollout_id="run.7_x")]).rows()
    assert r.body["_ng_rollout_id"] == "run.7_x"
    assert r.identity.rollout_id == "run.7_x"
    assert r.identity.rollout_id_for(2) == "run.7_x-a2"


def test_plan_bad_task_index_refused(tmp_path: Path) -> None:
    """A pre-stamped _ng_task_index must be a non-negative integer."""
    with pytest.raises(InputError) as exc:
        plan(tmp_path, [row(_ng_task_index=-1), row(_ng_task_index="3"), row(_ng_task_index=True)])
    assert [p.split(": ", 1)[1] for p in problems_of(exc)] == [
        "_ng_task_index must be an integer >= 0 (got -1); fix it or remove the key",
        "_ng_task_index must be an integer >= 0 (got '3'); fix it or remove the key",
        "_ng_task_index must be an integer >= 0 (got True); fix it or remove the key",
    ]


def test_plan_missing_input_file_refused(tmp_path: Path) -> None:
    """A missing input file is an InputError naming the path."""
    with pytest.raises(InputError, match=r"cannot read the input file"):
        plan_rollouts(tmp_path / "absent.jsonl", RunConfig(), direct_router())


def test_plan_every_problem_names_a_place_and_a_remedy(tmp_path: Path) -> None:
    """Every problem line names file:line or a setting, and ends with what to do."""
    lines = [
        "{",
        "3",
        {"agent_ref": {"name": "alpha"}},
        row(agent="nobody"),
        row(_ng_rollout_id="x-a1"),
    ]
    with pytest.raises(InputError) as exc:
        plan(tmp_path, lines, num_repeats={"beta": 0}, fan_out={"x": []})
    path = str(tmp_path / "in.jsonl")
    for problem in problems_of(exc):
        place = (
            problem.startswith((path + ":", "num_repeats.", "fan_out.")) or f"at {path}:" in problem
        )
        assert place, problem
        assert re.search(r"; [a-z].*$", problem), problem
    assert len(problems_of(exc)) == 7


def test_plan_rows_in_memory_problems_named_by_index() -> None:
    """In-memory rows that are not JSON objects are named rows[i]."""
    with pytest.raises(InputError) as exc:
        plan_rows(
            [row(), "text", {"responses_create_params": {"x": {1, 2}}}],
            RunConfig(),
            direct_router(),
        )
    [a, b] = problems_of(exc)
    assert a == "rows[1]: expected a mapping, got str; pass dicts"
    assert b.startswith("rows[2]: not JSON-serializable (")


# --- seeds and overrides ------------------------------------------------------------------


def test_plan_seed_extra_body_string_keeps_existing_json(tmp_path: Path) -> None:
    """The seed joins an existing extra_body (string or object) as a JSON string."""
    as_text = row(
        "a",
        responses_create_params={
            "input": "a",
            "metadata": {"extra_body": '{"top_k": 5, "seed": 99}', "tag": "t"},
        },
    )
    as_obj = row("b", responses_create_params={"input": "b", "metadata": {"extra_body": {"n": 2}}})
    none = row("c")
    [a, b, c] = plan(tmp_path, [as_text, as_obj, none], num_repeats_add_seed=True).rows()
    assert isinstance(a.body["responses_create_params"]["metadata"]["extra_body"], str)
    assert extra_body(a) == {"top_k": 5, "seed": 0}
    assert a.body["responses_create_params"]["metadata"]["tag"] == "t"
    assert extra_body(b) == {"n": 2, "seed": 0}
    assert extra_body(c) == {"seed": 0}
    assert c.body["responses_create_params"]["metadata"]["extra_body"] == json.dumps({"seed": 0})


def test_plan_rows_seed_extra_body_with_a_date_is_encoded_as_orjson_would() -> None:
    """In-memory rows may hold values only orjson encodes (a date): seeding encodes them alike.

    Planning accepts the row (orjson writes a date as ISO text); the seeded extra_body string
    must hold the same text rather than fail with TypeError while rows are materialized.
    """
    params = {"input": "a", "metadata": {"extra_body": {"day": datetime.date(2024, 1, 2)}}}
    rows = [{"responses_create_params": params, "agent_ref": {"name": "beta"}}]
    config = RunConfig(num_repeats=2, num_repeats_add_seed=True)
    seeded = list(plan_rows(rows, config, direct_router()).rows())
    assert [extra_body(r) for r in seeded] == [{"day": "2024-01-02", "seed": i} for i in range(2)]


def test_plan_seed_unusable_extra_body_refused(tmp_path: Path) -> None:
    """With seeds on, an extra_body that is not a JSON object is refused (off: left alone)."""
    bad = row(responses_create_params={"input": "a", "metadata": {"extra_body": "[1]"}})
    assert plan(tmp_path, [bad]).expected == 1
    with pytest.raises(InputError) as exc:
        plan(tmp_path, [bad], num_repeats_add_seed=True)
    assert problems_of(exc) == [
        f"{tmp_path / 'in.jsonl'}:1: responses_create_params.metadata.extra_body must be an "
        "object (extra_body: or a string holding a JSON object) to add the seed (got '[1]'); "
        "fix it, or turn num_repeats_add_seed off"
    ]


def test_plan_seeds_are_nemo_gyms_rollout_index_by_default(tmp_path: Path) -> None:
    """By default the seed is NeMo Gym's, the rollout index, the same on every task (issue 25);
    seed_mode rollout-index says so explicitly."""
    for settings in ({}, {"seed_mode": SeedMode.ROLLOUT_INDEX}):
        p = plan(
            tmp_path, [row("a"), row("b")], num_repeats=3, num_repeats_add_seed=True, **settings
        )
        assert [extra_body(r)["seed"] for r in p.rows()] == [0, 1, 2, 0, 1, 2]


def test_plan_seeds_differ_across_tasks_in_hash_mode(tmp_path: Path) -> None:
    """Hash seeds (opt-in) hash (run seed, task, rollout): distinct across tasks and run seeds."""
    hashed = {"num_repeats_add_seed": True, "seed_mode": SeedMode.HASH}
    p = plan(tmp_path, [row(str(i)) for i in range(20)], num_repeats=3, **hashed)
    seeds = [extra_body(r)["seed"] for r in p.rows()]
    assert len(set(seeds)) == 60
    assert all(0 <= s < 2**31 for s in seeds)
    other = plan(tmp_path, [row("0")], seed=1, **hashed)
    assert extra_body(next(other.rows()))["seed"] != seeds[0]


def test_plan_seed_function_is_the_documented_formula() -> None:
    """rollout_seed is sha256 of 'trollout-seed:{seed}:{task}:{rollout}', 8 bytes, mod 2**31."""
    digest = hashlib.sha256(b"trollout-seed:-4:12:3").digest()
    assert rollout_seed(-4, 12, 3) == int.from_bytes(digest[:8], "big") % 2**31
    assert rollout_seed(0, 0, 0) == 2054350858  # pinned: part of every run's identity


def test_plan_overrides_shallow_merged(tmp_path: Path) -> None:
    """Run-level responses_create_params win per top-level key; other keys stay."""
    r = row(responses_create_params={"input": "x", "temperature": 0.1, "metadata": {"a": 1}})
    overrides = {"temperature": 0.7, "metadata": {"b": 2}, "max_output_tokens": 64}
    [m] = plan(tmp_path, [r], responses_create_params=overrides).rows()
    assert m.body["responses_create_params"] == {
        "input": "x",
        "temperature": 0.7,
        "metadata": {"b": 2},
        "max_output_tokens": 64,
    }


def test_plan_overrides_then_seed(tmp_path: Path) -> None:
    """The seed is added after the override, so it survives an overriding metadata."""
    overrides = {"metadata": {"extra_body": '{"k": 1}'}}
    [m] = plan(
        tmp_path, [row()], responses_create_params=overrides, num_repeats_add_seed=True
    ).rows()
    assert extra_body(m) == {"k": 1, "seed": 0}


# --- orders -------------------------------------------------------------------------------


def test_plan_default_order_is_aabbcc(tmp_path: Path) -> None:
    """By default every rollout of a row comes before the next row."""
    p = plan(tmp_path, [row("a"), row("b"), row("c")], num_repeats=2)
    assert [k[:2] for k in keys(p)] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]


def test_plan_interleave_order_is_abcabc(tmp_path: Path) -> None:
    """interleave_repeats emits repeat 0 of every row, then repeat 1, with the same numbering."""
    lines = [row("a"), row("b", "beta"), row("c")]
    p = plan(tmp_path, lines, num_repeats={"beta": 1, "_default": 2}, interleave_repeats=True)
    assert [k[:2] for k in keys(p)] == [(0, 0), (1, 0), (2, 0), (0, 1), (2, 1)]


def test_plan_round_robin_by_agent_in_order_of_first_appearance(tmp_path: Path) -> None:
    """round_robin_agents alternates agents in order of first appearance, then drains the rest."""
    lines = [
        row("1", "beta"),
        row("2", "beta"),
        row("3", "alpha"),
        row("4", "beta"),
        row("5", "gamma"),
    ]
    p = plan(tmp_path, lines, round_robin_agents=True)
    assert keys(p) == [
        (0, 0, "beta"),
        (2, 0, "alpha"),
        (4, 0, "gamma"),
        (1, 0, "beta"),
        (3, 0, "beta"),
    ]


def test_plan_orders_never_change_numbering(tmp_path: Path) -> None:
    """Every ordering yields the same (task, rollout) -> body rows, only permuted."""
    lines = [row("a"), row("b", "beta"), row("a"), row("c", "gamma")]
    base = {"num_repeats": 2, "num_repeats_add_seed": True, "fan_out": {"gamma": ["alpha", "beta"]}}
    runs = [
        {
            json.dumps(dict(r.body), sort_keys=True)
            for r in plan(
                tmp_path, lines, interleave_repeats=i, round_robin_agents=rr, **base
            ).rows()
        }
        for i in (False, True)
        for rr in (False, True)
    ]
    assert all(run == runs[0] for run in runs)
    assert len(runs[0]) == 10


def test_plan_rows_is_reiterable_and_refuses_a_changed_file(tmp_path: Path) -> None:
    """rows() streams the same rows on every call; a changed input file is refused."""
    p = plan(tmp_path, [row("a"), row("b")])
    assert keys(p) == keys(p)
    path = tmp_path / "in.jsonl"
    with path.open("a") as f:
        f.write(json.dumps(row("c")) + "\n")
    os.utime(path, ns=(1, 1))
    with pytest.raises(InputError, match="changed after it was planned"):
        list(p.rows())


# --- stale keys ---------------------------------------------------------------------------


def test_plan_stale_collector_keys_stripped(tmp_path: Path) -> None:
    """Every _ng_* key except _ng_task_index and _ng_rollout_id is stripped from input rows."""
    stale = row(
        _ng_failure_class="transient",
        _ng_no_persist=True,
        _ng_attempt_index=2,
        _ng_environment_server="old_env",
        _ng_result_type="old",
        _ng_task_index=4,
        _ng_rollout_id="keep-me",
    )
    [r] = plan(tmp_path, [stale]).rows()
    assert sorted(k for k in r.body if k.startswith("_ng_")) == [
        "_ng_rollout_id",
        "_ng_rollout_index",
        "_ng_task_index",
    ]
    assert (r.identity.task_index, r.identity.environment_server) == (4, None)


def test_plan_stale_reward_and_response_stripped_only_from_output_rows(tmp_path: Path) -> None:
    """reward/response are dropped from rows an earlier run wrote (_ng_rollout_index), else kept."""
    output_row = row("a", reward=1.0, response={"id": "r"}, _ng_task_index=0, _ng_rollout_index=3)
    dataset_row = row("b", reward=0.5, response="reference answer")
    [a, b] = plan(tmp_path, [output_row, dataset_row]).rows()
    assert "reward" not in a.body
    assert "response" not in a.body
    assert a.identity.key == (0, 0)  # the old rollout index is not reused
    assert (b.body["reward"], b.body["response"]) == (0.5, "reference answer")


def test_plan_body_identity_round_trips(tmp_path: Path) -> None:
    """Reading a materialized body back gives exactly its Identity (resume relies on it)."""
    router = TableRouter(agents={"alpha": "env_a"}, environments={"env_a": "legacy_agent"})
    lines = [row("a", task_source="ds", _ng_rollout_id="r1"), row("b")]
    for r in plan(tmp_path, lines, router, num_repeats=2).rows():
        back = MaterializedRow.from_body(r.body).identity
        assert back == r.identity
        assert r.identity.result_type == "legacy_agent"


# --- compatibility ------------------------------------------------------------------------


@pytest.mark.skipif(not REFERENCE.is_dir(), reason="NeMo Gym reference files are absent")
def test_plan_matches_nemo_gym_materialized_inputs() -> None:
    """NeMo Gym 0.7.0's own input file plans to its materialized rows, key by key."""
    agent = "example_single_tool_call_simple_agent"
    p = plan_rollouts(
        REFERENCE / "inputs.jsonl", RunConfig(agent_name=agent), direct_router([agent])
    )
    expected = [
        json.loads(line)
        for line in (REFERENCE / "rollouts_materialized_inputs.jsonl").read_text().splitlines()
    ]
    got = bodies(p)
    assert got == expected
    assert [list(g) for g in got] == [list(e) for e in expected]  # same key order


def test_plan_routes_with_the_real_deployment() -> None:
    """`Deployment` serves as the router: task_source instance, environment server, admission."""
    rs = {"type": "resources_servers", "name": "rs"}
    agent = {"host": "127.0.0.1", "port": 1, "resources_server": rs, "datasets": [{"name": "m"}]}
    env = {
        "host": "127.0.0.1",
        "port": 3,
        "agent_server": {"type": "responses_api_agents", "name": "simple"},
    }
    verifier = {"host": "127.0.0.1", "port": 4, "allowed_agents": ["simple_agent"]}
    deployment = Deployment.from_config(
        {
            "simple": {"responses_api_agents": {"simple_agent": agent}},
            "other": {"responses_api_agents": {"other_agent": {"host": "127.0.0.1", "port": 2}}},
            "env": {"environment_servers": {"legacy_agent": env}},
            "rs": {"resources_servers": {"verifier": verifier}},
        }
    )
    rows = [
        {"responses_create_params": {}, "task_source": "rs"},
        {"responses_create_params": {}, "task_source": "simple"},
        {"responses_create_params": {}, "agent_ref": {"name": "other"}},
        {"task_id": {"taskset": "ts", "task_id": "1"}, "task_input": {}},
    ]
    p = plan_rows(rows, RunConfig(environment_server_routes={"ts": "env"}), deployment)
    assert [
        (r.identity.agent_name, r.identity.environment_server, r.identity.result_type)
        for r in p.rows()
    ] == [
        ("simple", "env", "legacy_agent"),
        ("simple", "env", "legacy_agent"),
        ("other", None, None),
        (None, "env", "legacy_agent"),
    ]
    with pytest.raises(InputError, match="their task_source 'rs' accepts only 'simple_agent'"):
        plan_rows([{**rows[0], "agent_ref": {"name": "other"}}], RunConfig(), deployment)


def test_plan_legacy_routing_with_the_real_deployment() -> None:
    """A real 0.7.0 shape in legacy mode: rows naming no agent get the server's bound agent."""
    env = {
        "host": "127.0.0.1",
        "port": 3,
        "agent_server": {"type": "responses_api_agents", "name": "simple"},
    }
    deployment = Deployment.from_config(
        {
            "simple": {"responses_api_agents": {"simple_agent": {"host": "127.0.0.1", "port": 1}}},
            "env": {"environment_servers": {"legacy_agent": env}},
        }
    )
    config = RunConfig(environment_routing_mode="legacy", environment_server_name="env")
    [r] = plan_rows([{"responses_create_params": {}}], config, deployment).rows()
    assert (r.identity.agent_name, r.identity.environment_server) == ("simple", "env")
    assert r.body["agent_ref"] == {"name": "simple"}


def test_plan_agent_map_disambiguates_a_task_source_of_the_real_deployment(
    tmp_path: Path,
) -> None:
    """Every unresolvable task_source is one line of one error; +agent_map picks the agent."""
    rs = {"type": "resources_servers", "name": "rs"}

    def agent(port: int) -> dict[str, Any]:
        block = {"host": "127.0.0.1", "port": port, "resources_server": rs}
        return {"responses_api_agents": {"simple_agent": block}}

    deployment = Deployment.from_config(
        {
            "a": agent(1),
            "b": agent(2),
            "rs": {"resources_servers": {"verifier": {"host": "127.0.0.1", "port": 3}}},
        }
    )
    lines = [row("1", None, task_source="rs"), row("2", None, task_source="nope")]
    with pytest.raises(InputError) as exc:
        plan(tmp_path, lines, deployment)
    path = tmp_path / "in.jsonl"
    assert problems_of(exc) == [
        f"{path}:1: task_source 'rs': 2 agents reference resources server 'rs' ('a', 'b'); pin "
        "one with an agent: key on the dataset, or pass +agent_map={rs:<agent>}",
        f"{path}:2: unknown task_source instance 'nope' (known: 'a', 'b', 'rs'); name the agent "
        "or resources server whose config declares the rows' dataset, or set agent_ref.name on "
        "the rows",
    ]
    p = plan(tmp_path, lines[:1], deployment, agent_map={"rs": "b"})
    assert keys(p) == [(0, 0, "b")]


# --- edges --------------------------------------------------------------------------------


def test_plan_rows_refuses_in_memory_rows_changed_after_planning() -> None:
    """A row mutated after planning is refused on the next pass, naming it."""
    rows = [row("a"), row("b")]
    p = plan_rows(rows, RunConfig(), direct_router())
    rows[1]["expected_answer"] = 3
    with pytest.raises(InputError, match=r"rows\[1\]: this row changed after planning"):
        list(p.rows())


def test_plan_round_robin_stream_closes_cleanly_when_abandoned(tmp_path: Path) -> None:
    """Closing a round-robin stream early closes every reader (no unclosed file warnings)."""
    p = plan(
        tmp_path, [row("a", "alpha"), row("b", "beta"), row("c", "gamma")], round_robin_agents=True
    )
    stream = p.rows()
    assert next(stream).identity.agent_name == "alpha"
    stream.close()


def test_plan_routing_keys_shape_checked(tmp_path: Path) -> None:
    """agent_ref must be an object with a string name; task_source must be a string."""
    with pytest.raises(InputError) as exc:
        plan(tmp_path, [row(agent=None, agent_ref="alpha"), row(task_source=3)])
    assert [p.split(": ", 1)[1] for p in problems_of(exc)] == [
        "agent_ref must be an object with a string name (got 'alpha'); fix it",
        "task_source must be a string (got 3); fix it",
    ]


def test_plan_line_problems_listed_up_to_a_cap(tmp_path: Path) -> None:
    """Past 100 bad lines the rest are counted, not listed."""
    with pytest.raises(InputError) as exc:
        plan(tmp_path, ["nope"] * 130)
    problems = problems_of(exc)
    assert len(problems) == 101
    assert problems[-1] == "... and 30 more line problems like the above; fix those first"


def test_plan_task_ids_may_name_prestamped_tasks(tmp_path: Path) -> None:
    """task_ids finds stamped and unstamped tasks; a repeated missing id is reported once."""
    lines = [row("a", task_id="A"), row("b", task_id="B", _ng_task_index=9)]
    p = plan(tmp_path, lines, task_ids=["B", "A"])
    assert keys(p) == [(0, 0, "alpha"), (9, 0, "alpha")]
    with pytest.raises(InputError) as exc:
        plan(tmp_path, lines, task_ids=["X", "X", "B"])
    assert len(problems_of(exc)) == 1


def test_plan_agent_fronted_by_two_environment_servers_refused(tmp_path: Path) -> None:
    """A router that cannot route an agent (DeploymentError) refuses its rows before dispatch."""

    class Ambiguous(TableRouter):
        def route(self, agent_name: str) -> Any:
            raise DeploymentError(f"agent {agent_name!r} is fronted by env_1 and env_2; name one")

    with pytest.raises(InputError) as exc:
        plan(tmp_path, [row("a"), row("b")], Ambiguous(agents={"alpha": None}))
    assert problems_of(exc) == [
        f"2 rows, first at {tmp_path / 'in.jsonl'}:1: agent 'alpha' is fronted by env_1 and "
        "env_2; name one"
    ]


def test_plan_task_row_route_to_unknown_server_refused(tmp_path: Path) -> None:
    """A taskset routed to an environment server the deployment lacks is refused."""
    task = {"task_id": {"taskset": "ts", "task_id": "1"}, "task_input": {}}
    with pytest.raises(InputError) as exc:
        plan(tmp_path, [task], environment_server_routes={"ts": "ghost"})
    assert problems_of(exc) == [
        f"{tmp_path / 'in.jsonl'}:1: environment_server_routes.ts: unknown environment server "
        "'ghost'"
    ]


def test_plan_routing_mode_settings_checked(tmp_path: Path) -> None:
    """An unknown routing mode, or legacy mode without a server name, is refused by key."""
    with pytest.raises(InputError) as exc:
        plan(tmp_path, [row()], environment_routing_mode="nearest")
    assert problems_of(exc) == [
        "environment_routing_mode must be one of agent, legacy, taskset (got 'nearest'); pass "
        "+environment_routing_mode=agent"
    ]
    with pytest.raises(InputError) as exc:
        plan(tmp_path, [row()], environment_routing_mode="legacy")
    assert problems_of(exc) == [
        "environment_routing_mode 'legacy' needs environment_server_name; pass "
        "+environment_server_name=<environment server>"
    ]


@pytest.mark.parametrize(
    ("metadata", "ok"),
    [
        ({"extra_body": "  "}, True),
        ({"extra_body": None}, True),
        ({"extra_body": "{not json"}, False),
        ({"extra_body": 5}, False),
        ("text", False),
    ],
)
def test_plan_seed_extra_body_shapes(tmp_path: Path, metadata: Any, ok: bool) -> None:
    """Blank or null extra_body takes the seed; malformed text, numbers or a bad metadata refuse."""
    r = row(responses_create_params={"input": "x", "metadata": metadata})
    if ok:
        [m] = plan(tmp_path, [r], num_repeats_add_seed=True).rows()
        assert extra_body(m) == {"seed": 0}
    else:
        with pytest.raises(InputError, match="to add the seed"):
            plan(tmp_path, [r], num_repeats_add_seed=True)


# --- validated once: nesting, line length, special files, empty plans (issue 8) -----------


def nested_row(depth: int, **extra: Any) -> str:
    """Return a row line whose deepest value sits ``depth`` levels down (the row is level 1)."""
    inner = "[" * (depth - 1) + "]" * (depth - 1)
    return json.dumps(row(**extra))[:-1] + f', "deep": {inner}}}'


def test_plan_row_of_128_levels_plans_seeds_and_writes(tmp_path: Path) -> None:
    """A row at the limit plans, takes its seed (metadata.extra_body) and serializes."""
    p = plan(tmp_path, [nested_row(128)], num_repeats=2, num_repeats_add_seed=True)
    for r in p.rows():
        assert jsonl.loads(jsonl.dumps(r.body)) == r.body
        assert "seed" in extra_body(r)


@pytest.mark.parametrize("depth", [129, 254, 255, 1023])
def test_plan_row_deeper_than_128_levels_refused_in_the_first_pass(
    tmp_path: Path, depth: int
) -> None:
    """Rows orjson reads but a run cannot write back (255-1023 crashed materialization)."""
    with pytest.raises(InputError) as info:
        plan(tmp_path, [row("a"), nested_row(depth)])
    assert problems_of(info) == [
        f"{tmp_path / 'in.jsonl'}:2: the row nests deeper than 128 levels of objects and arrays, "
        "more than a run can write back; flatten it or remove the line"
    ]


def test_plan_rows_in_memory_deeper_than_128_levels_refused() -> None:
    """In-memory rows are held to the same limit, named by index."""
    deep: Any = []
    for _ in range(150):
        deep = [deep]
    with pytest.raises(InputError, match=r"^rows\[1\]: the row nests deeper than 128"):
        plan_rows([row("a"), row("b", deep=deep)], RunConfig(), direct_router())


def test_plan_brackets_inside_strings_are_not_nesting(tmp_path: Path) -> None:
    """A row whose strings hold thousands of brackets is shallow and plans."""
    assert plan(tmp_path, [row("[{" * 5000)]).expected == 1


def test_plan_override_too_deep_for_rows_refused() -> None:
    """A responses_create_params override that would push rows past the limit is refused."""
    deep: Any = {}
    for _ in range(127):
        deep = {"k": deep}
    config = RunConfig(responses_create_params={"tools": deep})
    with pytest.raises(InputError, match=r"^responses_create_params nests deeper than 127 levels"):
        plan_rows([row()], config, direct_router())


def test_nested_deeper_than_counts_levels_exactly() -> None:
    """A scalar is 0 levels, [] one, {"a": [1]} two; the walk stops at the limit."""
    assert not jsonl.nested_deeper_than(3, 0)
    assert jsonl.nested_deeper_than([], 0)
    assert not jsonl.nested_deeper_than([], 1)
    assert jsonl.nested_deeper_than({"a": [1]}, 1)
    assert not jsonl.nested_deeper_than({"a": [1]}, 2)
    assert not jsonl.row_too_deep(b"[" * 128, None)  # the count alone settles it


def test_plan_line_longer_than_the_limit_refused_naming_file_and_line(tmp_path: Path) -> None:
    """A line past max_input_line_bytes stops the read at file:line, whatever follows."""
    lines = [row("a"), row("x" * 200), "{not json"]
    with pytest.raises(InputError) as info:
        plan(tmp_path, lines, max_input_line_bytes=100)
    assert problems_of(info) == [
        f"{tmp_path / 'in.jsonl'}:2: line is longer than 100 bytes (the input line limit); fix "
        "the file (is it JSONL?), or raise the limit with --max-line-bytes / "
        "+max_input_line_bytes"
    ]


def test_plan_line_exactly_at_the_limit_plans(tmp_path: Path) -> None:
    """The limit counts the line's bytes without its newline, last line unterminated too."""
    text = json.dumps(row("a"))
    path = tmp_path / "in.jsonl"
    path.write_text(text + "\n" + text)
    config = RunConfig(max_input_line_bytes=len(text))
    assert plan_rollouts(path, config, direct_router()).expected == 2


@pytest.mark.parametrize("ending", [b"\n", b"\r\n"])
def test_plan_line_at_the_limit_plans_with_lf_or_crlf_one_byte_more_refused(
    tmp_path: Path, ending: bytes
) -> None:
    """The newline is not counted, whether LF or CRLF; one byte of content more is refused."""
    text = json.dumps(row("a")).encode()
    path = tmp_path / "in.jsonl"
    path.write_bytes(text + ending + text + ending)
    config = RunConfig(max_input_line_bytes=len(text))
    assert plan_rollouts(path, config, direct_router()).expected == 2
    path.write_bytes(text + ending + text + b" " + ending)
    with pytest.raises(InputError, match=r"in\.jsonl:2: line is longer than"):
        plan_rollouts(path, config, direct_router())


@pytest.mark.parametrize(
    "number", [str(2**70), str(2**64), str(-(2**63) - 1), "1" + "0" * 300], ids=str.__len__
)
def test_plan_integer_beyond_64_bits_refused_naming_file_and_line(
    tmp_path: Path, number: str
) -> None:
    """An integer orjson would turn into a float is refused, never passed on changed."""
    text = '{"responses_create_params": {"input": "q"}, "expected_answer": ' + number + "}"
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps(row("a")) + "\n" + text + "\n")
    with pytest.raises(InputError) as info:
        plan_rollouts(path, RunConfig(), direct_router())
    shown = number if len(number) <= 40 else number[:40] + "..."
    assert problems_of(info) == [
        f"{path}:2: integer {shown} is outside the 64-bit range (-2**63 to 2**64-1) and would "
        "not be passed on exactly; quote it (make it a string) or remove the line"
    ]


def test_plan_64_bit_edges_and_long_digit_runs_elsewhere_are_kept_exactly(
    tmp_path: Path,
) -> None:
    """The range's ends, long digit runs in strings and long decimals plan unchanged."""
    values = [2**64 - 1, -(2**63), "123456789012345678901234567890", 0.1234567890123456789012]
    p = plan(tmp_path, [row("a", v=v) for v in values])
    assert [body["v"] for body in bodies(p)] == values
    assert type(bodies(p)[0]["v"]) is int


def test_plan_file_with_no_newline_reads_at_most_the_limit(tmp_path: Path) -> None:
    """A 64 MiB sparse file of zeros (a /dev/zero stand-in) costs the limit, not the file."""
    path = tmp_path / "zeros.jsonl"
    with path.open("wb") as f:
        f.truncate(64 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match=r"zeros\.jsonl:1: line is longer than 1,048,576"):
            plan_rollouts(path, RunConfig(max_input_line_bytes=1 << 20), direct_router())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20


@pytest.mark.parametrize("kind", ["fifo", "socket", "directory", "character device"])
def test_plan_refuses_special_files_without_opening_them(tmp_path: Path, kind: str) -> None:
    """Only a regular file can be read several times; nothing else is opened (no FIFO hang)."""
    path = tmp_path / "input"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(path))
    elif kind == "directory":
        path.mkdir()
    else:
        try:  # a private node (the numbers of /dev/null); needs privileges
            os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("creating a device node needs privileges")
    with pytest.raises(InputError) as info:
        plan_rollouts(path, RunConfig(), direct_router())
    message = problems_of(info)[0]
    assert message.startswith(f"{path}: the input is ")
    if kind == "directory":
        assert message.endswith("a directory; pass a JSONL file")
    else:
        assert f"is a {kind}" in message or "is a pipe or FIFO" in message
        assert "save it to a file first" in message


@pytest.mark.parametrize(
    ("lines", "settings", "reason"),
    [
        ([], {}, "holds no rows (it is empty or blank); nothing to collect"),
        (["", "  ", "\t"], {}, "holds no rows (it is empty or blank); nothing to collect"),
        ([row("a")], {"limit": 0}, "limit 0 keeps no task"),
        ([row("a")], {"task_ids": []}, "task_ids [] keep no task of the 1 in "),
        (
            [row("a", task_id=0), row("b", task_id=1)],
            {"limit": 1, "task_ids": [1]},
            "(limit 1 keeps the first 1)",
        ),
    ],
    ids=["empty", "blank", "limit-0", "task-ids-empty", "task-ids-outside-limit"],
)
def test_plan_with_no_rollout_is_an_input_error(
    tmp_path: Path, lines: list[Any], settings: dict[str, Any], reason: str
) -> None:
    """An empty plan names the input and why it is empty, instead of an empty run."""
    with pytest.raises(InputError) as info:
        plan(tmp_path, lines, **settings)
    assert reason in str(info.value)
    if "task_ids" not in settings:
        assert "input file" in str(info.value) or "limit 0" in str(info.value)


def test_plan_seed_at_the_top_of_its_range_materializes(tmp_path: Path) -> None:
    """A run seed of 2**64 - 1 (the largest accepted) seeds rows that serialize."""
    p = plan(tmp_path, [row("a")], seed=2**64 - 1, num_repeats_add_seed=True, seed_mode="hash")
    [r] = list(p.rows())
    assert extra_body(r)["seed"] == rollout_seed(2**64 - 1, 0, 0)
    assert jsonl.loads(jsonl.dumps(r.body)) == r.body


def test_plan_input_changed_during_a_pass_refused(tmp_path: Path) -> None:
    """A line appended while rows() reads the input fails the pass at its end (a copy of a
    planned row would otherwise be materialized as one rollout more than the plan has)."""
    path = write(tmp_path, [row("a"), row("b")])
    p = plan_rollouts(path, RunConfig(), direct_router())
    rows = p.rows()
    next(rows)
    with open(path, "a") as f:
        f.write(json.dumps(row("b")) + "\n")
    with pytest.raises(InputError) as info:
        list(rows)
    assert problems_of(info) == [
        f"{path}: the input file changed while it was read; plan the run again"
    ]
