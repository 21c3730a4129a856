"""Tests of deployment discovery and routing (protocol.md section 1)."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from typing import Any

import attrs
import httpx
import pytest
import yaml

from trollout.collector.deployment import (
    AggregateTarget,
    Dataset,
    Deployment,
    Route,
    check_alive,
    discover,
    require_alive,
    validate_url,
)
from trollout.errors import ConfigError, DeploymentError, UnknownAgentError
from trollout.records import Identity
from trollout.testing import AgentSpec, DeploymentSpec, open_fake_deployment

SECRET = "sk-live-7f3a9c1e5b2d"
HEAD = "http://127.0.0.1:11000"

# A 0.7.0-shaped deployment: settings keys, an agent fronted by an environment server, a
# resources server, and a model server whose block holds a secret.
CONFIG_070_YAML = f"""
head_server: {{host: 127.0.0.1, port: 11000}}
default_host: 127.0.0.1
port_range_low: 10000
math_agent:
  responses_api_agents:
    simple_agent:
      host: 127.0.0.1
      port: 8001
      resources_server: {{type: resources_servers, name: math_rs}}
      model_server: {{type: responses_api_models, name: policy_model}}
      datasets:
        - name: math_train
          type: train
          jsonl_fpath: data/math_train.jsonl
          num_repeats: 4
          license: Apache 2.0
        - name: math_eval
          type: validation
          jsonl_fpath: data/math_eval.jsonl
          num_repeats: 1
          license: MIT
          allowed_agents: [math_agent, other_agent]
          taskset: math
other_agent:
  responses_api_agents:
    simple_agent:
      host: 127.0.0.1
      port: 8002
      model_server: {{type: responses_api_models, name: policy_model}}
math_rs:
  resources_servers:
    math_with_judge:
      host: 127.0.0.1
      port: 8003
      judge_api_key: {SECRET}
policy_model:
  responses_api_models:
    openai_model:
      host: 127.0.0.1
      port: 8004
      openai_api_key: {SECRET}
math_env:
  environment_servers:
    legacy_agent:
      host: 127.0.0.1
      port: 8005
      agent_server: {{type: responses_api_agents, name: math_agent}}
      resources_server: {{type: resources_servers, name: math_rs}}
"""


def config_070() -> dict[str, Any]:
    """Return a fresh copy of the 0.7.0-shaped config."""
    return copy.deepcopy(_CONFIG_070)


_CONFIG_070: dict[str, Any] = yaml.safe_load(CONFIG_070_YAML)


def config_earlier() -> dict[str, Any]:
    """Return the same deployment without environment servers (earlier generation)."""
    cfg = config_070()
    del cfg["math_env"]
    return cfg


def agent_block(port: int, **extra: Any) -> dict[str, Any]:
    """Return a one-implementation agent instance block."""
    return {"responses_api_agents": {"simple_agent": {"host": "127.0.0.1", "port": port, **extra}}}


def env_block(port: int, agent: str, impl: str = "legacy_agent") -> dict[str, Any]:
    """Return an environment server instance block fronting ``agent``."""
    ref = {"type": "responses_api_agents", "name": agent}
    return {"environment_servers": {impl: {"host": "127.0.0.1", "port": port, "agent_server": ref}}}


def head_client(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.AsyncClient:
    """Return an httpx client whose requests go to ``handler`` (no sockets)."""
    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


def serve_config(text: str, *, seen: list[str] | None = None) -> httpx.AsyncClient:
    """Return a client for a head server answering with ``text`` as a JSON string."""

    def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(str(request.url))
        return httpx.Response(200, json=text)

    return head_client(handler)


def assert_no_secret(exc: BaseException) -> None:
    """Assert that no message, repr or chained exception of ``exc`` holds the secret."""
    current: BaseException | None = exc
    while current is not None:
        assert SECRET not in str(current)
        assert SECRET not in repr(current)
        assert all(SECRET not in repr(arg) for arg in current.args)
        current = current.__cause__ or current.__context__


# --- discovery through the head server ---------------------------------------------------


async def test_discover_decodes_yaml_inside_a_json_string() -> None:
    """The head server's body is JSON-decoded, then YAML-parsed into servers."""
    seen: list[str] = []
    async with serve_config(CONFIG_070_YAML, seen=seen) as client:
        deployment = await discover(client, HEAD + "/")
    assert seen == [HEAD + "/global_config_dict_yaml"]
    assert deployment.head_url == HEAD
    assert deployment.known_agents == {"math_agent", "other_agent"}
    assert deployment == Deployment.from_config(config_070(), head_url=HEAD)


async def test_discover_unreachable_head_server_names_url_and_remedy() -> None:
    """A refused connection becomes one DeploymentError with context and a remedy."""

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    async with head_client(refuse) as client:
        with pytest.raises(DeploymentError) as info:
            await discover(client, HEAD)
    assert str(info.value) == (
        "cannot reach head server 'http://127.0.0.1:11000': connection refused; "
        "start the deployment or pass --agent-url NAME=URL"
    )
    assert isinstance(info.value.__cause__, httpx.ConnectError)


async def test_discover_timeout_is_reported_as_timed_out() -> None:
    """A head server that times out is named with the reason 'timed out'."""

    def hang(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    async with head_client(hang) as client:
        with pytest.raises(DeploymentError, match=r"'http://127\.0\.0\.1:11000': timed out; "):
            await discover(client, HEAD)


async def test_discover_non_200_names_status_without_body() -> None:
    """An HTTP error status is reported by number; the body (possibly secret) is not shown."""
    async with head_client(lambda request: httpx.Response(500, text=SECRET)) as client:
        with pytest.raises(DeploymentError, match="answered HTTP 500") as info:
            await discover(client, HEAD)
    assert_no_secret(info.value)


@pytest.mark.parametrize(
    ("body", "described"),
    [
        (b"not json " + SECRET.encode(), "a body that is not JSON"),
        (json.dumps({"api_key": SECRET}).encode(), "JSON a mapping of 1 key"),
        (json.dumps([SECRET]).encode(), "JSON a list"),
    ],
)
async def test_discover_refuses_body_that_is_not_a_json_string(body: bytes, described: str) -> None:
    """A body that is not a JSON string is described by its type only."""
    async with head_client(lambda request: httpx.Response(200, content=body)) as client:
        with pytest.raises(DeploymentError, match=described) as info:
            await discover(client, HEAD)
    assert_no_secret(info.value)
    assert info.value.__context__ is None


async def test_discover_invalid_yaml_names_position_not_text() -> None:
    """A YAML syntax error names line and column, never the text around it."""
    text = f"agent:\n  key: {SECRET}\n  bad: [unclosed {SECRET}\n"
    async with serve_config(text) as client:
        with pytest.raises(DeploymentError, match=r"is not valid YAML at line \d+") as info:
            await discover(client, HEAD)
    assert_no_secret(info.value)
    assert info.value.__context__ is None


async def test_discover_refuses_yaml_that_is_not_a_mapping() -> None:
    """A YAML document that is a list is refused, naming its type."""
    async with serve_config(f"- {SECRET}\n") as client:
        with pytest.raises(DeploymentError, match=r"\(it is a list, not a mapping\)") as info:
            await discover(client, HEAD)
    assert_no_secret(info.value)


async def test_discover_refuses_a_head_url_that_is_not_http() -> None:
    """The head server URL is validated before any request."""
    async with serve_config(CONFIG_070_YAML) as client:
        with pytest.raises(ConfigError, match="head server URL must be http"):
            await discover(client, "ftp://127.0.0.1:11000")


# --- parsing a config mapping -------------------------------------------------------------


def test_from_config_ignores_settings_keys() -> None:
    """Only keys shaped {server_type: {implementation: {...}}} become servers."""
    cfg = config_070()
    cfg["single_key_setting"] = {"not_a_server_type": {"impl": {"host": "h", "port": 1}}}
    cfg["list_setting"] = [1, 2]
    deployment = Deployment.from_config(cfg)
    names = [s.name for s in deployment.servers]
    assert names == ["math_agent", "other_agent", "math_rs", "policy_model", "math_env"]


def test_from_config_routes_agents_through_their_environment_server() -> None:
    """In a 0.7.0 deployment, /run for an agent goes to the environment server fronting it."""
    deployment = Deployment.from_config(config_070())
    assert deployment.uses_environment_servers
    assert deployment.route("math_agent") == Route(
        agent_name="math_agent",
        url="http://127.0.0.1:8005",
        environment_server="math_env",
        result_type="legacy_agent",
    )


def test_from_config_routes_an_unfronted_agent_directly() -> None:
    """An agent no environment server fronts is reached at its own URL."""
    deployment = Deployment.from_config(config_070())
    assert deployment.route("other_agent") == Route("other_agent", "http://127.0.0.1:8002")


def test_from_config_routes_earlier_generation_to_agents() -> None:
    """Without environment servers, every agent's /run goes to the agent itself."""
    deployment = Deployment.from_config(config_earlier())
    assert not deployment.uses_environment_servers
    assert deployment.route("math_agent") == Route("math_agent", "http://127.0.0.1:8001")


def test_from_config_keeps_references_and_datasets() -> None:
    """Agents keep their datasets and their resources/model server references."""
    agent = Deployment.from_config(config_070()).servers[0]
    assert (agent.resources_server, agent.model_server) == ("math_rs", "policy_model")
    assert agent.datasets == (
        Dataset("math_train", "train", "data/math_train.jsonl", 4, "Apache 2.0"),
        Dataset(
            "math_eval",
            "validation",
            "data/math_eval.jsonl",
            1,
            "MIT",
            frozenset({"math_agent", "other_agent"}),
            "math",
        ),
    )


def test_from_config_brackets_an_ipv6_host() -> None:
    """An IPv6 host is bracketed in the server URL."""
    cfg = {"a": {"responses_api_agents": {"x": {"host": "::1", "port": 9}}}}
    assert Deployment.from_config(cfg).route("a").url == "http://[::1]:9"


@pytest.mark.parametrize(
    ("block", "key_path"),
    [
        ({"responses_api_agents": {"a": {}, "b": {}}}, "'bad.responses_api_agents'"),
        ({"responses_api_agents": "x"}, "'bad.responses_api_agents'"),
        ({"responses_api_agents": {"impl": [1]}}, "'bad.responses_api_agents.impl'"),
        ({"responses_api_agents": {"impl": {"port": 1}}}, "'bad.responses_api_agents.impl.host'"),
        (
            {"responses_api_agents": {"impl": {"host": "h", "port": SECRET}}},
            "'bad.responses_api_agents.impl.port'",
        ),
        (
            {"responses_api_agents": {"impl": {"host": "h", "port": 70000}}},
            "'bad.responses_api_agents.impl.port'",
        ),
        (
            {"responses_api_agents": {"impl": {"host": "h", "port": True}}},
            "'bad.responses_api_agents.impl.port'",
        ),
        (
            {"responses_api_agents": {"impl": {"host": "h", "port": 1, "model_server": SECRET}}},
            "'bad.responses_api_agents.impl.model_server'",
        ),
        (
            {"responses_api_agents": {"impl": {"host": "h", "port": 1, "datasets": SECRET}}},
            "'bad.responses_api_agents.impl.datasets'",
        ),
        (
            {"responses_api_agents": {"impl": {"host": "h", "port": 1, "datasets": [{}]}}},
            "'bad.responses_api_agents.impl.datasets[0]'",
        ),
        (
            {
                "responses_api_agents": {
                    "impl": {"host": "h", "port": 1, "datasets": [{"name": "d", "license": 3}]}
                }
            },
            "'bad.responses_api_agents.impl.datasets[0].license'",
        ),
        (
            {
                "responses_api_agents": {
                    "impl": {
                        "host": "h",
                        "port": 1,
                        "datasets": [{"name": "d", "num_repeats": "2"}],
                    }
                }
            },
            "'bad.responses_api_agents.impl.datasets[0].num_repeats'",
        ),
        (
            {"resources_servers": {"impl": {"host": "h", "port": 1, "allowed_agents": SECRET}}},
            "'bad.resources_servers.impl.allowed_agents'",
        ),
    ],
)
def test_from_config_refuses_malformed_blocks_naming_the_key_path(
    block: dict[str, Any], key_path: str
) -> None:
    """A malformed server block is refused naming its key path, never its value."""
    cfg = {**config_070(), "bad": block}
    expected = re.escape(f"deployment config key {key_path} must be ")
    with pytest.raises(DeploymentError, match=expected) as info:
        Deployment.from_config(cfg)
    assert_no_secret(info.value)


def test_from_config_refuses_unresolved_interpolations_naming_key_paths() -> None:
    """Values left as ${...} are refused, every key path named, no value shown."""
    cfg = config_070()
    cfg["policy_model"]["responses_api_models"]["openai_model"]["openai_api_key"] = (
        "${oc.env:OPENAI_API_KEY}"
    )
    agent = cfg["math_agent"]["responses_api_agents"]["simple_agent"]
    agent["datasets"][1]["jsonl_fpath"] = "${data_dir}/eval.jsonl"
    with pytest.raises(DeploymentError) as info:
        Deployment.from_config(cfg)
    message = str(info.value)
    assert message.startswith(
        "deployment config has unresolved ${...} values at "
        "'math_agent.responses_api_agents.simple_agent.datasets[1].jsonl_fpath', "
        "'policy_model.responses_api_models.openai_model.openai_api_key'; "
    )
    assert "oc.env" not in message
    assert "data_dir" not in message


def test_from_config_refuses_a_config_that_is_not_a_mapping() -> None:
    """A config that is not a mapping is refused by type."""
    with pytest.raises(DeploymentError, match=r"must be a mapping \(got a list\)"):
        Deployment.from_config([SECRET])  # type: ignore[arg-type]


def test_deployment_repr_holds_no_secret() -> None:
    """The parsed deployment keeps no secret, so its repr cannot leak one."""
    deployment = Deployment.from_config(config_070())
    assert SECRET not in repr(deployment)
    assert SECRET not in repr(attrs.asdict(deployment))


def test_deployment_refuses_duplicate_server_names() -> None:
    """Two servers of one name cannot be told apart, so they are refused."""
    server = Deployment.from_agent_urls({"a": "http://h:1"}).servers[0]
    with pytest.raises(DeploymentError, match="server names must be unique"):
        Deployment((server, server))


def test_deployment_is_immutable() -> None:
    """A deployment cannot be changed after it is built."""
    deployment = Deployment.from_config(config_070())
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        deployment.head_url = "http://elsewhere:1"  # type: ignore[misc]


# --- routing errors -----------------------------------------------------------------------


def test_route_unknown_agent_names_it_and_lists_known_ones() -> None:
    """An unknown agent raises UnknownAgentError (a KeyError) with the known agents."""
    deployment = Deployment.from_config(config_070())
    with pytest.raises(KeyError) as info:
        deployment.route("math_agnet")
    assert isinstance(info.value, UnknownAgentError)
    assert str(info.value) == (
        "unknown agent 'math_agnet' (known: 'math_agent', 'other_agent'); did you mean "
        "'math_agent'? fix agent_ref.name in the rows, or route with +agent_map / --agent-url"
    )


def test_route_two_environment_servers_fronting_one_agent_is_a_lazy_error() -> None:
    """Routing by an agent fronted twice raises naming both servers; explicit names still work."""
    cfg = {**config_070(), "math_env_b": env_block(8006, "math_agent", impl="other_impl")}
    deployment = Deployment.from_config(cfg)
    assert "math_agent" in deployment.known_agents
    with pytest.raises(DeploymentError, match="'math_env', 'math_env_b'") as info:
        deployment.route("math_agent")
    assert not isinstance(info.value, UnknownAgentError)
    assert deployment.environment_server_url("math_env_b") == "http://127.0.0.1:8006"
    assert deployment.environment_server("math_env_b").implementation == "other_impl"
    assert deployment.route("other_agent").url == "http://127.0.0.1:8002"


def test_environment_server_unknown_name_lists_known_ones() -> None:
    """An unknown (or non-environment) server name is refused, listing the known ones."""
    deployment = Deployment.from_config(config_070())
    with pytest.raises(DeploymentError, match=r"unknown environment server 'math_rs' \(known: "):
        deployment.environment_server("math_rs")


# --- explicit agent URLs ------------------------------------------------------------------


def test_from_agent_urls_routes_to_the_agents() -> None:
    """Explicit URLs route each agent directly, trailing slashes dropped."""
    deployment = Deployment.from_agent_urls(
        {"a": "http://127.0.0.1:9001/", "b": "http://agents.example:8443/b"}
    )
    assert deployment.known_agents == {"a", "b"}
    assert deployment.route("a") == Route("a", "http://127.0.0.1:9001")
    assert deployment.route("b") == Route("b", "http://agents.example:8443/b")
    assert not deployment.uses_environment_servers
    assert deployment.head_url is None


@pytest.mark.parametrize(
    "url",
    [
        "ftp://127.0.0.1:9001",
        "127.0.0.1:9001",
        "http://:9001",
        "http://127.0.0.1:99999",
        "http://127.0.0.1:port",
        "http://127.0.0.1:0",
        "http://127.0.0.1:9001/?x=1",
        "http://[::1",
        "",
    ],
)
def test_from_agent_urls_refuses_invalid_urls(url: str) -> None:
    """A URL without http(s) scheme, host or a valid port is refused, naming agent and URL."""
    with pytest.raises(ConfigError, match=r"URL of agent 'a' must") as info:
        Deployment.from_agent_urls({"a": url})
    assert repr(url) in str(info.value)


def test_from_agent_urls_refuses_credentials_without_showing_them() -> None:
    """A URL carrying user:password is refused without echoing it."""
    with pytest.raises(ConfigError, match="must not carry credentials") as info:
        Deployment.from_agent_urls({"a": f"http://user:{SECRET}@127.0.0.1:9001"})
    assert_no_secret(info.value)


def test_from_agent_urls_refuses_no_agents_and_empty_names() -> None:
    """An empty mapping or an empty agent name is refused with the flag to use."""
    with pytest.raises(ConfigError, match="no agent URLs given"):
        Deployment.from_agent_urls({})
    with pytest.raises(ConfigError, match="agent name for 'http://h:1' is empty"):
        Deployment.from_agent_urls({" ": "http://h:1"})


def test_validate_url_returns_the_url_without_trailing_slash() -> None:
    """validate_url normalizes the trailing slash only."""
    assert validate_url("http://h:1/", what="x") == "http://h:1"


# --- fingerprint ----------------------------------------------------------------------------


def test_fingerprint_is_stable_across_key_order_and_ports() -> None:
    """Reordering the config or moving servers to new ports keeps the fingerprint."""
    cfg = config_070()
    moved = dict(reversed(list(config_070().items())))
    for name in ("math_agent", "math_env"):
        block = next(iter(next(iter(moved[name].values())).values()))
        block["port"] += 1000
        block["host"] = "10.0.0.9"
    assert Deployment.from_config(moved).fingerprint() == Deployment.from_config(cfg).fingerprint()
    assert len(Deployment.from_config(cfg).fingerprint()) == 64


def test_fingerprint_changes_with_agents_and_routes() -> None:
    """Adding an agent, or fronting an agent differently, changes the fingerprint."""
    base = Deployment.from_config(config_070()).fingerprint()
    more_agents = {**config_070(), "third": agent_block(8010)}
    earlier = config_earlier()
    refronted = {**config_070(), "math_env": env_block(8005, "other_agent")}
    others = [Deployment.from_config(c).fingerprint() for c in (more_agents, earlier, refronted)]
    assert len({base, *others}) == 4


def test_fingerprint_of_agent_urls_matches_an_earlier_generation_config() -> None:
    """The same agents reached directly fingerprint alike, however they were found."""
    cfg = {"a": agent_block(1), "b": agent_block(2)}
    urls = {"a": "http://elsewhere:7", "b": "http://elsewhere:8"}
    assert (
        Deployment.from_config(cfg).fingerprint() == Deployment.from_agent_urls(urls).fingerprint()
    )


# --- task sources and admission -----------------------------------------------------------


def test_agent_for_task_source_finds_the_declaring_agent() -> None:
    """A task_source resolves to the agent that declares a dataset of that name."""
    deployment = Deployment.from_config(config_070())
    assert deployment.agent_for_task_source("math_eval") == "math_agent"
    assert deployment.agent_for_task_source("unknown_dataset") is None


def test_agent_for_task_source_refuses_an_ambiguous_name() -> None:
    """A dataset declared by two agents cannot route rows; both agents are named."""
    cfg = config_070()
    other = cfg["other_agent"]["responses_api_agents"]["simple_agent"]
    other["datasets"] = [{"name": "math_train"}]
    with pytest.raises(DeploymentError, match="several agents \\('math_agent', 'other_agent'\\)"):
        Deployment.from_config(cfg).agent_for_task_source("math_train")


def test_admits_follows_dataset_allowed_agents() -> None:
    """A dataset's allowed_agents admits the listed agents only; others are unrestricted."""
    cfg = {**config_070(), "third": agent_block(8010)}
    deployment = Deployment.from_config(cfg)
    assert deployment.admits("other_agent", "math_eval")
    assert not deployment.admits("third", "math_eval")
    assert deployment.admits("third", "math_train")
    assert deployment.admits("third", None)
    assert deployment.admission_refusal("third", "math_eval") == (
        "dataset 'math_eval' does not admit agent 'third' (allowed_agents)"
    )


def test_admits_follows_a_resources_servers_allowed_agents() -> None:
    """A resources server that declares allowed_agents refuses agents that use it unlisted."""
    cfg = config_070()
    cfg["math_rs"]["resources_servers"]["math_with_judge"]["allowed_agents"] = ["other_agent"]
    deployment = Deployment.from_config(cfg)
    assert not deployment.admits("math_agent")
    assert deployment.admission_refusal("math_agent") == (
        "resources server 'math_rs' does not admit agent 'math_agent'"
    )
    assert deployment.admits("other_agent")


def test_admits_an_agent_its_resources_server_lists() -> None:
    """A resources server's allowed_agents admits the agents it lists."""
    cfg = config_070()
    cfg["math_rs"]["resources_servers"]["math_with_judge"]["allowed_agents"] = ["math_agent"]
    assert Deployment.from_config(cfg).admits("math_agent", "math_train")


def test_admits_refuses_an_unknown_agent() -> None:
    """An unknown agent is never admitted."""
    deployment = Deployment.from_config(config_070())
    assert not deployment.admits("nobody", "math_train")


# --- metrics targets and model servers ------------------------------------------------------


def test_aggregate_metrics_targets_follow_the_generation() -> None:
    """0.7.0: one target per environment server plus direct agents; earlier: one per agent."""
    assert Deployment.from_config(config_070()).aggregate_metrics_targets() == [
        AggregateTarget("math_agent", "math_env", "http://127.0.0.1:8005"),
        AggregateTarget("other_agent", None, "http://127.0.0.1:8002"),
    ]
    assert Deployment.from_config(config_earlier()).aggregate_metrics_targets() == [
        AggregateTarget("math_agent", None, "http://127.0.0.1:8001"),
        AggregateTarget("other_agent", None, "http://127.0.0.1:8002"),
    ]


def test_model_server_urls_lists_model_servers() -> None:
    """Model servers' URLs are listed for /metrics sampling."""
    assert Deployment.from_config(config_070()).model_server_urls() == ["http://127.0.0.1:8004"]


# --- liveness --------------------------------------------------------------------------------


def liveness_handler(request: httpx.Request) -> httpx.Response:
    """Answer GET / by port: 1 alive, 2 refuses, 3 answers 503, 4 fails DNS, 5 drops."""
    assert (request.method, request.url.path) == ("GET", "/")
    if request.url.port == 2:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
    if request.url.port == 4:
        raise httpx.ConnectError("[Errno -2] Name or service not known", request=request)
    if request.url.port == 5:
        raise httpx.RemoteProtocolError("peer closed connection", request=request)
    if request.url.port == 3:
        return httpx.Response(503)
    return httpx.Response(200, json={"status": "ok"})


async def test_check_alive_returns_dead_servers_with_reasons() -> None:
    """Servers that refuse or answer non-200 are returned in input order, once each."""
    urls = ["http://h:3", "http://h:1", "http://h:2", "http://h:3"]
    async with head_client(liveness_handler) as client:
        dead = await check_alive(client, urls)
    assert dead == {"http://h:3": "HTTP 503", "http://h:2": "connection refused"}
    assert list(dead) == ["http://h:3", "http://h:2"]


async def test_check_alive_describes_other_transport_errors() -> None:
    """DNS failures and dropped connections are described by their httpx error."""
    async with head_client(liveness_handler) as client:
        dead = await check_alive(client, ["http://h:4", "http://h:5"])
    assert dead == {
        "http://h:4": "cannot connect ([Errno -2] Name or service not known)",
        "http://h:5": "RemoteProtocolError (peer closed connection)",
    }


async def test_require_alive_lists_every_dead_server() -> None:
    """The pre-flight error lists each dead server with its reason and a remedy."""
    async with head_client(liveness_handler) as client:
        await require_alive(client, ["http://h:1"])
        with pytest.raises(DeploymentError) as info:
            await require_alive(client, ["http://h:1", "http://h:2", "http://h:3"])
    assert str(info.value) == (
        "2 servers did not answer GET /: 'http://h:2' (connection refused), "
        "'http://h:3' (HTTP 503); start the deployment (or check its logs) and try again"
    )


def test_deployment_run_url_resolver_routes_by_environment_server_then_agent() -> None:
    """Rows stamped with an environment server go there; others go to their agent's route."""
    deployment = Deployment.from_agent_urls({"a": "http://127.0.0.1:9001/"})
    resolve = deployment.run_url_resolver()
    assert resolve(Identity(0, 0, agent_name="a")) == "http://127.0.0.1:9001/run"
    with pytest.raises(UnknownAgentError):
        resolve(Identity(0, 0, agent_name="b"))


# --- validated once: YAML bombs, deep YAML, https (issue 8) --------------------------------

ANCHORED_SECRET = f"k: &{SECRET} [{SECRET}, {SECRET}]\n"  # anchor names are document text too
BOMB = f"a: &a [{SECRET}, {SECRET}, {SECRET}, {SECRET}]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True)
)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            CONFIG_070_YAML + BOMB,
            "uses an alias of a mapping or list at line {line}, column 8; write the value out",
        ),
        (
            CONFIG_070_YAML + ANCHORED_SECRET + f"copy: *{SECRET}\n",
            "uses an alias of a mapping or list at line {line}, column 7; write the value out",
        ),
        (CONFIG_070_YAML + "deep: " + "[" * 50_000, "nests deeper than 100 levels at line {line}"),
    ],
    ids=["billion-laughs", "named-anchor", "deep"],
)
async def test_discover_refuses_expanding_or_deep_yaml_by_line_only(
    text: str, message: str
) -> None:
    """A head server's YAML bomb or deep YAML: refused by line and column, no text quoted."""
    line = CONFIG_070_YAML.count("\n") + 2 - text.endswith("[" * 50_000)
    async with serve_config(text) as client:
        with pytest.raises(DeploymentError) as info:
            await discover(client, HEAD)
    assert str(info.value).startswith(
        f"head server {HEAD!r} sent a deployment config that " + message.format(line=line)
    )
    assert_no_secret(info.value)
    assert info.value.__context__ is None


def test_from_config_refuses_a_host_with_a_scheme_naming_the_key_only() -> None:
    """host: https://... (trollout speaks plain http:// to host:port) names the key, not value."""
    cfg = config_070()
    cfg["math_agent"]["responses_api_agents"]["simple_agent"]["host"] = f"https://{SECRET}"
    with pytest.raises(DeploymentError) as info:
        Deployment.from_config(cfg)
    assert str(info.value).startswith(
        "deployment config key 'math_agent.responses_api_agents.simple_agent.host' must be a "
        "bare host name"
    )
    assert "plain http://" in str(info.value)
    assert_no_secret(info.value)


def test_from_agent_urls_refuses_https() -> None:
    """An https:// agent URL is refused: every rollout would fail on the plain-HTTP transport."""
    with pytest.raises(ConfigError, match=r"URL of agent 'a' must be a plain http:// URL"):
        Deployment.from_agent_urls({"a": "https://127.0.0.1:1"})


async def test_discover_refuses_an_https_head_server_before_any_request() -> None:
    """An https:// head server URL is refused up front, nothing requested."""
    seen: list[str] = []
    async with serve_config(CONFIG_070_YAML, seen=seen) as client:
        with pytest.raises(ConfigError, match="head server URL must be a plain http:// URL"):
            await discover(client, "https://127.0.0.1:11000")
    assert seen == []


async def test_fake_deployment_config_has_no_aliases() -> None:
    """The fake head server writes its config out in full, as NeMo Gym's does."""
    spec = DeploymentSpec(agents=(AgentSpec(name="a"), AgentSpec(name="b")))
    async with open_fake_deployment(spec) as fake, httpx.AsyncClient() as client:
        deployment = await discover(client, fake.head_url)
    assert {"a", "b"} <= deployment.known_agents
