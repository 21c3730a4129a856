"""Server metrics: one ``POST /aggregate_metrics`` per agent or environment server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import orjson
from run_folders import failed, landed, plan_for, read_metrics, write_run

from trollout.metrics import AggregateOptions, AggregateResult, aggregate_shards
from trollout.metrics.server import target_for
from trollout.testing.aggregate import aggregate_metrics as fake_aggregate_metrics

TARGETS = [
    ("agent_a", "env_a", "http://env-a.test"),
    ("agent_b", None, "http://agent-b.test"),
]


def write_two_agents(tmp_path: Path) -> Path:
    """Write a run with agent_a behind env_a (one failure) and agent_b direct."""
    rows = [
        landed(1, 0, 1.0, agent="agent_a", env="env_a", tokens=(90, 10), ng_model_call_capture=[1]),
        landed(0, 1, 0.0, agent="agent_a", env="env_a"),
        landed(0, 0, 1.0, agent="agent_a", env="env_a", terminated=True),
        landed(2, 0, 1.0, agent="agent_b"),
    ]
    failures = [failed(1, 1, "agent_run_error", agent="agent_a", env="env_a")]
    plan = plan_for(2, 2, agent="agent_a") + plan_for(1, 1, agent="agent_b")
    plan[-1]["_ng_task_index"] = 2
    return write_run(tmp_path / "run.jsonl", rows, failures=failures, plan=plan).output


class FakeServers:
    """A MockTransport handler answering like a default NeMo Gym server, with scripted faults."""

    def __init__(self, broken: dict[str, Any] | None = None) -> None:
        self.bodies: dict[str, list[dict[str, Any]]] = {}
        self.broken = broken or {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        assert request.method == "POST"
        assert request.url.path == "/aggregate_metrics"
        fault = self.broken.get(host)
        if isinstance(fault, Exception):
            raise fault
        if fault is not None:
            return httpx.Response(fault[0], content=fault[1])
        rows = orjson.loads(request.content)["verify_responses"]
        self.bodies[host] = rows
        return httpx.Response(200, json=fake_aggregate_metrics(rows))


async def aggregate(tmp_path: Path, servers: FakeServers, **options: Any) -> AggregateResult:
    """Aggregate the two-agent run against the fake servers."""
    output = write_two_agents(tmp_path)
    async with httpx.AsyncClient(transport=httpx.MockTransport(servers)) as client:
        return await aggregate_shards(
            [output], options=AggregateOptions(**options), targets=TARGETS, client=client
        )


async def test_rows_are_reduced_sorted_and_grouped(tmp_path: Path) -> None:
    """Each server gets its group's rows sorted, response cut to usage, no capture keys."""
    servers = FakeServers()
    await aggregate(tmp_path, servers, count_failure_classes_as_zero=frozenset({"agent_run_error"}))
    rows = servers.bodies["env-a.test"]
    assert [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows] == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
    ]
    assert rows[0]["response"] == {
        "usage": {"input_tokens": 100, "output_tokens": 20, "total_tokens": 120}
    }
    assert all(
        "responses_create_params" not in r and "ng_model_call_capture" not in r for r in rows
    )
    assert rows[3]["reward"] == 0.0
    assert not any(k.startswith("_ng_failure_") for k in rows[3])
    assert [r["_ng_task_index"] for r in servers.bodies["agent-b.test"]] == [2]


async def test_local_metrics_equal_the_servers_on_the_same_rows(tmp_path: Path) -> None:
    """The default server's agent_metrics equal the ones computed locally (imputed zeros too)."""
    result = await aggregate(
        tmp_path, FakeServers(), count_failure_classes_as_zero=frozenset({"agent_run_error"})
    )
    entries = read_metrics(result_layout(result))
    for group, entry in zip(result.groups, entries, strict=True):
        assert group.metrics_source == "server"
        assert entry["agent_metrics"] == group.local_metrics
        assert entry["trollout"]["local_agent_metrics"] == group.local_metrics
    assert entries[0]["agent_metrics"]["mean/reward"] == 0.5
    assert entries[0]["_ng_environment_server"] == "env_a"
    assert entries[0]["repeat_level_metrics"] == []


def result_layout(result: AggregateResult) -> Any:
    """Return the layout whose metrics file the result wrote."""
    from trollout.recovery.layout import RunLayout

    return RunLayout.for_output(result.metrics_path.with_name("run.jsonl"))


async def test_failed_call_keeps_empty_collections_and_the_error(tmp_path: Path) -> None:
    """A 500 becomes an entry with empty collections and aggregation_error; others are written."""
    servers = FakeServers(broken={"agent-b.test": (500, b'"boom"')})
    result = await aggregate(tmp_path, servers)
    assert not result.ok
    assert result.server_errors == (
        "POST http://agent-b.test/aggregate_metrics answered HTTP 500: '\"boom\"'",
    )
    a, b = read_metrics(result_layout(result))
    assert a["agent_metrics"]["mean/reward"] == 2 / 3
    assert (b["agent_metrics"], b["key_metrics"], b["group_level_metrics"]) == ({}, {}, [])
    assert "HTTP 500" in b["aggregation_error"]
    assert b["trollout"]["local_agent_metrics"]["mean/reward"] == 1.0
    assert result.report_path is not None
    assert result.report_path.is_file()


async def test_unreachable_server_and_bad_reply_are_recorded(tmp_path: Path) -> None:
    """No reply, or a reply without the three collections, is an aggregation error."""
    servers = FakeServers(
        broken={
            "env-a.test": httpx.ConnectError("refused"),
            "agent-b.test": (200, b'{"agent_metrics": {}}'),
        }
    )
    result = await aggregate(tmp_path, servers)
    errors = result.server_errors
    assert "ConnectError: refused" in errors[0]
    assert "without key_metrics, group_level_metrics" in errors[1]


def test_target_for_prefers_the_environment_server() -> None:
    """A group goes to its environment server's target, else to its agent's, else nowhere."""
    targets = [("x", None, "http://agent"), ("x", "env", "http://env"), (None, "env2", "http://e2")]
    assert target_for(("x", None), "env", targets) == targets[1]
    assert target_for(("x", None), None, targets) == targets[0]
    assert target_for((None, "env2"), None, targets) == targets[2]
    assert target_for(("y", None), None, targets) is None
