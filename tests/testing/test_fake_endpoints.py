"""Loopback tests of every endpoint of the fake deployment."""

from __future__ import annotations

import json
from functools import partial

import httpx
import orjson
import pytest
import trio
import yaml

from builders import wait_until
from trollout.collector.deployment.discovery import Deployment
from trollout.testing import (
    FAKE_API_KEY,
    AgentSpec,
    DeploymentSpec,
    FakeDeployment,
    Generation,
    Latency,
    open_fake_deployment,
    task_row,
)

ENV_REPLY_KEYS = [
    "responses_create_params",
    "response",
    "reward",
    "mask_sample",
    "failure_kind",
    "failure_reason",
]


def _row(question: str = "What is 17 + 25?", task: int = 0, rollout: int = 0) -> dict[str, object]:
    return task_row(question) | {"_ng_task_index": task, "_ng_rollout_index": rollout}


async def _config(client: httpx.AsyncClient, fake: FakeDeployment) -> dict[str, object]:
    reply = await client.get(f"{fake.head_url}/global_config_dict_yaml")
    assert reply.status_code == 200
    text = reply.json()
    assert isinstance(text, str)
    config = yaml.safe_load(text)
    assert isinstance(config, dict)
    return config


async def test_head_config_is_yaml_inside_a_json_string(
    fake: FakeDeployment, client: httpx.AsyncClient
) -> None:
    """The head server's config decodes as JSON, then parses as YAML."""
    config = await _config(client, fake)
    assert config["head_server"] == {"host": "127.0.0.1", "port": fake.urls.ports["head_server"]}


async def test_head_config_lists_every_server_instance(
    fake: FakeDeployment, client: httpx.AsyncClient
) -> None:
    """Every instance has one type and one implementation with host and port (resolved)."""
    config = await _config(client, fake)
    urls = {s.name: s.url for s in Deployment.from_config(config).servers}
    types = {}
    for name, value in config.items():
        if not isinstance(value, dict) or name == "head_server":
            continue  # settings
        ((server_type, impls),) = value.items()
        assert len(impls) == 1
        assert urls[name] == f"http://127.0.0.1:{fake.urls.ports[name]}"
        types[name] = server_type
    assert types == {
        "policy_model": "responses_api_models",
        "math_agent_resources": "resources_servers",
        "math_agent": "responses_api_agents",
        "math_agent_environment_server": "environment_servers",
        "string_agent_resources": "resources_servers",
        "string_agent": "responses_api_agents",
        "string_agent_environment_server": "environment_servers",
    }


async def test_head_config_environment_server_fronts_its_agent(
    fake: FakeDeployment, client: httpx.AsyncClient
) -> None:
    """A 0.7.0 environment server names the agent it fronts and a resources server."""
    config = await _config(client, fake)
    block = config["math_agent_environment_server"]["environment_servers"]["legacy_agent"]  # type: ignore[index]
    assert block["agent_server"] == {"type": "responses_api_agents", "name": "math_agent"}
    assert block["resources_server"] == {
        "type": "resources_servers",
        "name": "math_agent_resources",
    }
    assert fake.run_urls["math_agent"] == f"http://127.0.0.1:{block['port']}"


async def test_head_config_carries_a_fake_secret(
    fake: FakeDeployment, client: httpx.AsyncClient
) -> None:
    """The model block reads an api_key through ${...}, so tests can check nobody logs it."""
    config = await _config(client, fake)
    block = config["policy_model"]["responses_api_models"]["vllm_model"]  # type: ignore[index]
    assert block["api_key"] == "${policy_api_key}"
    assert config["policy_api_key"] == FAKE_API_KEY


async def test_legacy_config_has_no_environment_servers(client: httpx.AsyncClient) -> None:
    """A legacy deployment routes /run to the agent servers themselves."""
    spec = DeploymentSpec(agents=(AgentSpec(name="a"),), generation=Generation.LEGACY)
    async with open_fake_deployment(spec) as fake:
        config = await _config(client, fake)
        assert "a_environment_server" not in config
        assert fake.run_urls == fake.agent_urls
        assert fake.urls.environment_servers == {}


async def test_every_server_answers_liveness(
    fake: FakeDeployment, client: httpx.AsyncClient
) -> None:
    """GET / answers {"status": "ok"} on every server."""
    for port in fake.urls.ports.values():
        reply = await client.get(f"http://127.0.0.1:{port}/")
        assert reply.json() == {"status": "ok"}


async def test_environment_run_replies_like_nemo_gym_0_7_0(
    fake: FakeDeployment, client: httpx.AsyncClient
) -> None:
    """A flat row gets exactly the 0.7.0 environment server's keys, no identity keys."""
    row = _row()
    reply = await client.post(f"{fake.run_urls['math_agent']}/run", json=row)
    body = reply.json()
    assert reply.status_code == 200
    assert list(body) == ENV_REPLY_KEYS
    assert body["responses_create_params"] == row["responses_create_params"]
    assert body["reward"] in (0.0, 1.0)
    assert body["mask_sample"] is False
    assert body["failure_kind"] is None
    assert body["failure_reason"] is None


async def test_run_response_is_responses_like(
    fake: FakeDeployment, client: httpx.AsyncClient
) -> None:
    """The response has an id, an output message with the answer and usage counts."""
    reply = await client.post(f"{fake.run_urls['math_agent']}/run", json=_row())
    response = reply.json()["response"]
    assert response["id"].startswith("resp_")
    (message,) = response["output"]
    assert message["role"] == "assistant"
    assert message["content"][0]["type"] == "output_text"
    usage = response["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    correct = message["content"][0]["text"] == "42"
    assert reply.json()["reward"] == (1.0 if correct else 0.0)


async def test_agent_run_echoes_request_fields(
    fake: FakeDeployment, client: httpx.AsyncClient
) -> None:
    """An agent server echoes every request field and adds response and reward."""
    row = _row(task=3, rollout=2) | {"extra_field": [1, 2]}
    reply = await client.post(f"{fake.agent_urls['math_agent']}/run", json=row)
    body = reply.json()
    assert {k: body[k] for k in row} == row
    assert set(body) == set(row) | {"response", "reward"}


@pytest.mark.parametrize(
    ("payload", "kind", "loc"),
    [
        (b"{}", "missing", ["body", "responses_create_params"]),
        (b"[1, 2]", "model_attributes_type", ["body"]),
        (b"{not json", "json_invalid", ["body", 0]),
        (
            b'{"responses_create_params": 3}',
            "model_attributes_type",
            ["body", "responses_create_params"],
        ),
    ],
)
async def test_run_invalid_body_is_422_like_fastapi(
    fake: FakeDeployment, client: httpx.AsyncClient, payload: bytes, kind: str, loc: list[object]
) -> None:
    """A body without a responses_create_params object is refused with FastAPI's 422 shape."""
    reply = await client.post(f"{fake.run_urls['math_agent']}/run", content=payload)
    assert reply.status_code == 422
    (detail,) = reply.json()["detail"]
    assert (detail["type"], detail["loc"]) == (kind, loc)
    assert fake.stats.runs_total == 0


async def test_unknown_path_is_404_and_wrong_method_405(
    fake: FakeDeployment, client: httpx.AsyncClient
) -> None:
    """Routing errors answer like FastAPI."""
    missing = await client.get(f"{fake.run_urls['math_agent']}/nope")
    wrong = await client.get(f"{fake.run_urls['math_agent']}/run")
    assert (missing.status_code, missing.json()) == (404, {"detail": "Not Found"})
    assert (wrong.status_code, wrong.json()) == (405, {"detail": "Method Not Allowed"})


async def test_aggregate_metrics_endpoint_returns_default_metrics(
    fake: FakeDeployment, client: httpx.AsyncClient
) -> None:
    """POST /aggregate_metrics answers NeMo Gym's default metrics of the given rows."""
    rows = [
        {"_ng_task_index": 0, "_ng_rollout_index": r, "reward": float(r), "response": {}}
        for r in range(2)
    ]
    reply = await client.post(
        f"{fake.run_urls['math_agent']}/aggregate_metrics", json={"verify_responses": rows}
    )
    body = reply.json()
    assert list(body) == [
        "group_level_metrics",
        "agent_metrics",
        "key_metrics",
        "perf_summary",
        "repeat_level_metrics",
    ]
    assert body["key_metrics"] == {"mean/reward": 0.5}
    assert body["agent_metrics"]["num_repeats"] == 2


async def test_aggregate_metrics_duplicate_rollout_is_500(
    fake: FakeDeployment, client: httpx.AsyncClient
) -> None:
    """Two rows with one (task, rollout) key fail as NeMo Gym does: 500 with a JSON string."""
    row = {"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0}
    reply = await client.post(
        f"{fake.agent_urls['math_agent']}/aggregate_metrics", json={"verify_responses": [row, row]}
    )
    assert reply.status_code == 500
    assert "Duplicate" in reply.json()


async def test_aggregate_metrics_without_rows_key_is_422(
    fake: FakeDeployment, client: httpx.AsyncClient
) -> None:
    """A body without verify_responses is a validation error."""
    reply = await client.post(f"{fake.run_urls['math_agent']}/aggregate_metrics", json={})
    assert reply.status_code == 422


def _gauges(text: str) -> dict[str, float]:
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name.split("{")[0]] = float(value)
    return values


async def test_model_metrics_count_runs_in_flight(
    client: httpx.AsyncClient, autojump_clock: trio.testing.MockClock
) -> None:
    """/metrics reports /run requests in flight as running, beyond max_running as waiting."""
    spec = DeploymentSpec(agents=("a",), latency=Latency(fixed_s=10.0), max_running=2)
    async with open_fake_deployment(spec) as fake, trio.open_nursery() as nursery:
        for task in range(3):
            post = partial(client.post, json=_row(task=task))
            nursery.start_soon(post, f"{fake.run_urls['a']}/run")
        # The fake clock stands still until the kernel has delivered all three requests.
        await wait_until(lambda: fake.stats.in_flight == 3, "three requests", poll_s=0)
        await trio.sleep(5.0)
        reply = await client.get(fake.urls.metrics_urls[0])
        assert reply.headers["content-type"].startswith("text/plain")
        assert _gauges(reply.text) == {
            "vllm:num_requests_running": 2.0,
            "vllm:num_requests_waiting": 1.0,
        }


async def test_stats_count_paths_statuses_and_runs(
    fake: FakeDeployment, client: httpx.AsyncClient
) -> None:
    """The stats record paths, statuses and the identity of every /run."""
    await client.post(f"{fake.run_urls['math_agent']}/run", json=_row(task=4, rollout=1))
    await client.post(
        f"{fake.run_urls['string_agent']}/run", json=_row(task=5) | {"_ng_attempt_index": 2}
    )
    await client.post(f"{fake.run_urls['math_agent']}/run", json={})
    stats = fake.stats
    assert stats.by_path["/run"] == 3
    assert stats.by_status == {200: 2, 422: 1}
    assert stats.run_keys() == {(4, 1, 0): 1, (5, 0, 2): 1}
    assert [s.server for s in stats.runs] == [
        "math_agent_environment_server",
        "string_agent_environment_server",
    ]
    assert (stats.in_flight, stats.max_in_flight, stats.runs_total) == (0, 1, 2)


async def test_stats_endpoint_serves_counters_and_runs(
    fake: FakeDeployment, client: httpx.AsyncClient
) -> None:
    """The head server exposes the counters and the /run log for out-of-process tests."""
    await client.post(f"{fake.run_urls['math_agent']}/run", json=_row(task=2, rollout=1))
    stats = (await client.get(f"{fake.head_url}/_fake/stats")).json()
    runs = (await client.get(f"{fake.head_url}/_fake/runs")).json()
    assert stats["runs_total"] == 1
    assert stats["by_status"] == {"200": 1}
    assert runs == [["math_agent_environment_server", "math_agent", 2, 1, 0, None]]


async def test_stats_without_detail_still_count(client: httpx.AsyncClient) -> None:
    """With record_runs off (argument or spec), runs are counted but not logged."""
    spec = DeploymentSpec(agents=("a",))
    for fake_spec, record in ((spec, False), (DeploymentSpec.for_benchmark(["a"]), None)):
        async with open_fake_deployment(fake_spec, record_runs=record) as fake:
            await client.post(f"{fake.run_urls['a']}/run", json=_row())
            assert (fake.stats.runs_total, fake.stats.runs) == (1, [])


async def test_max_in_flight_reaches_the_concurrency(
    client: httpx.AsyncClient, autojump_clock: trio.testing.MockClock
) -> None:
    """Concurrent /run requests are all in flight at once, and counted so."""
    spec = DeploymentSpec(agents=("a",), latency=Latency(fixed_s=1.0))
    async with open_fake_deployment(spec) as fake, trio.open_nursery() as nursery:
        for task in range(7):
            post = partial(client.post, json=_row(task=task))
            nursery.start_soon(post, f"{fake.run_urls['a']}/run")
        # The fake clock stands still until the kernel has delivered all seven requests.
        await wait_until(lambda: fake.stats.in_flight == 7, "seven requests", poll_s=0)
    assert (fake.stats.max_in_flight, fake.stats.in_flight) == (7, 0)
    assert fake.stats.max_in_flight_by_server["a_environment_server"] == 7


async def test_refused_agent_is_configured_but_closed(client: httpx.AsyncClient) -> None:
    """An agent marked refuse is in the config, but connecting to it is refused."""
    spec = DeploymentSpec(agents=(AgentSpec(name="a"), AgentSpec(name="dead", refuse=True)))
    async with open_fake_deployment(spec) as fake:
        config = await _config(client, fake)
        assert "dead_environment_server" in config
        with pytest.raises(httpx.ConnectError):
            await client.post(f"{fake.run_urls['dead']}/run", json=_row())
        ok = await client.post(f"{fake.run_urls['a']}/run", json=_row())
        assert ok.status_code == 200


async def test_port_base_assigns_ports_in_order(client: httpx.AsyncClient) -> None:
    """With a port base the head takes it and the other servers follow."""
    with trio.socket.socket() as probe:
        await probe.bind(("127.0.0.1", 0))
        base = probe.getsockname()[1]
    spec = DeploymentSpec(agents=("a",))
    try:
        async with open_fake_deployment(spec, port_base=base) as fake:
            assert list(fake.urls.ports.values()) == [base + i for i in range(5)]
            assert fake.head_url == f"http://127.0.0.1:{base}"
    except OSError:  # pragma: no cover - a neighbour took one of the ports meanwhile
        pytest.skip("a port after the probed one is in use")


async def test_fault_free_run_is_deterministic(
    fake: FakeDeployment, client: httpx.AsyncClient
) -> None:
    """The same row gets byte-identical replies."""
    row = _row("Reverse the string 'trollout'.", task=1, rollout=3)
    first = await client.post(f"{fake.run_urls['string_agent']}/run", json=row)
    second = await client.post(f"{fake.run_urls['string_agent']}/run", json=row)
    assert first.content == second.content
    assert json.loads(first.content) == orjson.loads(second.content)
