"""Tests of deployment discovery and routing (docs/protocol.md section 1)."""

from __future__ import annotations

import copy
import datetime
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio
import yaml
from omegaconf import OmegaConf

from trollout.collector.deployment.discovery import (
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
from trollout.testing import (
    FAKE_API_KEY,
    AgentSpec,
    DeploymentSpec,
    open_fake_deployment,
    spawn_fake_deployment,
)

SECRET = "sk-live-7f3a9c1e5b2d"
HEAD = "http://127.0.0.1:11000"
SERVED_FIXTURE = (
    Path(__file__).resolve().parents[3] / "fixtures" / "nemo_gym_0.7.0_served_config.yaml"
)
FIXTURE_SECRET = "sk-fixture-9c2e71d04b5a-SECRET"
REFERENCE = Path(__file__).resolve().parents[4] / "shared" / "reference" / "nemo_gym_0.7.0"

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
          allowed_agents: [simple_agent, other_type]
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
    """Agents keep their references and the dataset fields routing reads, nothing else."""
    agent = Deployment.from_config(config_070()).servers[0]
    assert (agent.resources_server, agent.model_server) == ("math_rs", "policy_model")
    assert agent.datasets == (
        Dataset("math_train"),
        Dataset("math_eval", "math", None, frozenset({"simple_agent", "other_type"})),
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
            {"responses_api_agents": {"impl": {"host": "h", "port": 1, "datasets": [{}]}}},
            "'bad.responses_api_agents.impl.datasets[0]'",
        ),
        (
            {
                "responses_api_agents": {
                    "impl": {"host": "h", "port": 1, "datasets": [{"name": "d", "taskset": 3}]}
                }
            },
            "'bad.responses_api_agents.impl.datasets[0].taskset'",
        ),
        (
            {
                "responses_api_agents": {
                    "impl": {"host": "h", "port": 1, "datasets": [{"name": "d", "agent": [SECRET]}]}
                }
            },
            "'bad.responses_api_agents.impl.datasets[0].agent'",
        ),
        (
            {"resources_servers": {"impl": {"host": "h", "port": SECRET + "1"}}},
            "'bad.resources_servers.impl.port'",
        ),
        (
            {
                "resources_servers": {
                    "impl": {"host": "h", "port": 1, "allowed_agents": {"k": SECRET}}
                }
            },
            "'bad.resources_servers.impl.allowed_agents'",
        ),
        (
            {
                "resources_servers": {
                    "impl": {"host": "h", "port": 1, "allowed_agents": [SECRET, 1]}
                }
            },
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


# --- configs as served: interpolations resolved only where read (issue 9) -----------------


def served_fixture() -> dict[str, Any]:
    """Return the served-config fixture (the real 0.7.0 shape, interpolations unresolved)."""
    loaded: dict[str, Any] = yaml.safe_load(SERVED_FIXTURE.read_text())
    return loaded


def agent_070(**fields: Any) -> dict[str, Any]:
    """Return a config of one agent whose block has ``fields`` (host and port by default)."""
    block = {"host": "127.0.0.1", "port": 1, **fields}
    return {"a": {"responses_api_agents": {"simple_agent": block}}}


def test_from_config_reads_the_served_fixture(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real shape: read values resolve (oc.env default, ${key} port), the rest is ignored."""
    monkeypatch.delenv("TROLLOUT_FIXTURE_AGENT_HOST", raising=False)
    monkeypatch.delenv("TROLLOUT_FIXTURE_NEVER_SET", raising=False)
    deployment = Deployment.from_config(served_fixture())
    agent = "example_single_tool_call_simple_agent"
    env = "example_single_tool_call_environment_server"
    assert deployment.known_agents == {agent}
    assert deployment.route(agent) == Route(agent, "http://127.0.0.1:12047", env, "legacy_agent")
    assert deployment.servers[1].url == "http://127.0.0.1:12293"
    assert deployment.servers[1].model_server == "policy_model"
    assert deployment.servers[1].datasets == (Dataset("example"),)
    assert deployment.environment_server(env).agent_server == agent
    assert deployment.model_server_urls() == ["http://127.0.0.1:12238"]
    assert FIXTURE_SECRET not in repr(deployment)


def test_from_config_resolves_oc_env_from_trollouts_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """${oc.env:VAR,default} takes an allowed variable from the collector's own environment.

    Not allowed (the default), the variable reads as unset and the default is taken.
    """
    monkeypatch.setenv("TROLLOUT_FIXTURE_AGENT_HOST", "10.1.2.3")
    allowed = ["TROLLOUT_FIXTURE_AGENT_HOST"]
    deployment = Deployment.from_config(served_fixture(), env_allow=allowed)
    assert deployment.servers[1].url == "http://10.1.2.3:12293"
    assert "10.1.2.3" not in repr(deployment)  # shown by its interpolation text
    assert Deployment.from_config(served_fixture()).servers[1].url == "http://127.0.0.1:12293"


async def test_discover_reads_the_served_fixture_through_a_head_server() -> None:
    """Discovery of the fixture's text gives what parsing its mapping gives."""
    async with serve_config(SERVED_FIXTURE.read_text()) as client:
        deployment = await discover(client, HEAD)
    assert deployment == Deployment.from_config(served_fixture(), head_url=HEAD)


@pytest.mark.skipif(not REFERENCE.is_dir(), reason="NeMo Gym reference files are absent")
async def test_discover_reads_a_real_head_servers_reply() -> None:
    """The body a real 0.7.0 head server sent discovers: agent, environment server, routes."""
    body = (REFERENCE / "global_config_dict_yaml.json").read_bytes()
    async with head_client(lambda request: httpx.Response(200, content=body)) as client:
        deployment = await discover(client, HEAD)
    agent = "example_single_tool_call_simple_agent"
    env = "example_single_tool_call_environment_server"
    assert deployment.known_agents == {agent}
    assert deployment.route(agent) == Route(agent, "http://127.0.0.1:12047", env, "legacy_agent")
    assert deployment.environment_server(env).agent_server == agent
    assert deployment.agent_for_task_source("example_single_tool_call") == agent
    assert deployment.admits(agent, "example_single_tool_call")
    assert deployment.model_server_urls() == ["http://127.0.0.1:12238"]
    assert "dummy-key" not in repr(deployment)


@pytest.mark.parametrize(
    ("extra", "fields", "url"),
    [
        ({"b": {"p": 1234}}, {"port": "${b.p}"}, "http://127.0.0.1:1234"),
        ({}, {"port": "${.q}", "q": 5}, "http://127.0.0.1:5"),
        ({}, {"port": "${oc.env:TROLLOUT_TEST_UNSET_PORT,12047}"}, "http://127.0.0.1:12047"),
        ({}, {"port": "${oc.env:TROLLOUT_TEST_PORT}"}, "http://127.0.0.1:9999"),
        ({}, {"port": "${oc.decode:${oc.env:TROLLOUT_TEST_PORT}}"}, "http://127.0.0.1:9999"),
        ({"net": "10.0"}, {"host": "${net}.0.7"}, "http://10.0.0.7:1"),
        ({"h": {"host": "::1"}}, {"host": "${h.host}"}, "http://[::1]:1"),
    ],
    ids=["key", "sibling", "env-default", "env", "decode", "string", "ipv6"],
)
def test_from_config_resolves_read_values_as_omegaconf_does(
    monkeypatch: pytest.MonkeyPatch, extra: dict[str, Any], fields: dict[str, Any], url: str
) -> None:
    """Host and port resolve like OmegaConf (typed refs, relative keys, oc.env strings)."""
    monkeypatch.setenv("TROLLOUT_TEST_PORT", "9999")
    monkeypatch.delenv("TROLLOUT_TEST_UNSET_PORT", raising=False)
    allowed = ["TROLLOUT_TEST_PORT", "TROLLOUT_TEST_UNSET_PORT"]
    cfg = {**agent_070(**fields), **extra}
    assert Deployment.from_config(cfg, env_allow=allowed).route("a").url == url


def test_from_config_resolves_references_and_datasets() -> None:
    """References, dataset fields and allowed_agents resolve; a ${...} escape stays text."""
    cfg = {
        **agent_070(
            resources_server={"type": "resources_servers", "name": "${names.rs}"},
            datasets="${declared}",
        ),
        "names": {"rs": "my_rs"},
        "declared": [{"name": "\\${literal}", "taskset": "${names.rs}", "allowed_agents": "x"}],
    }
    [agent] = Deployment.from_config(cfg).servers
    assert agent.resources_server == "my_rs"
    assert agent.datasets == (Dataset("${literal}", "my_rs", None, frozenset({"x"})),)


SECRET_SIBLING = {"api_key": SECRET}


@pytest.mark.parametrize(
    ("fields", "extra", "category"),
    [
        ({"port": "${oc.env:TROLLOUT_TEST_UNSET_PORT}"}, {}, "an environment variable it "),
        ({"port": "${nowhere.port}"}, {}, "it references a key that is not set"),
        ({"port": "???"}, {}, "it is ??? (not set)"),
        ({"port": "${m}"}, {"m": "???"}, "it references a key whose value is ??? (not set)"),
        ({"port": "${.port}"}, {}, "it refers to itself (a circular interpolation)"),
        ({"port": "${mul:2,3}"}, {}, "it uses a resolver trollout does not know"),
        ({"port": "${oc.decode:'[1'}"}, {}, "its interpolation fails"),
    ],
    ids=["env", "key", "placeholder", "to-placeholder", "circular", "resolver", "failing"],
)
def test_from_config_refuses_a_read_value_that_cannot_be_resolved(
    monkeypatch: pytest.MonkeyPatch, fields: dict[str, Any], extra: dict[str, Any], category: str
) -> None:
    """An unresolvable port is refused by key path and category: no value, no chained error."""
    monkeypatch.delenv("TROLLOUT_TEST_UNSET_PORT", raising=False)
    cfg = {**agent_070(**fields, **SECRET_SIBLING), **extra, "policy_api_key": SECRET}
    with pytest.raises(DeploymentError) as info:
        Deployment.from_config(cfg, env_allow=["TROLLOUT_TEST_UNSET_PORT"])
    message = str(info.value)
    assert message.startswith(
        "deployment config key 'a.responses_api_agents.simple_agent.port' cannot be resolved: "
        + category
    )
    assert message.endswith("fix the deployment config")
    assert info.value.__cause__ is None
    assert info.value.__context__ is None
    assert_no_secret(info.value)


def test_from_config_refuses_a_malformed_interpolation_anywhere_by_key_path() -> None:
    """OmegaConf checks the grammar of the whole config: a malformed ${ is named by key."""
    cfg = {**agent_070(), "policy_api_key": f"{SECRET}${{bad"}
    with pytest.raises(DeploymentError) as info:
        Deployment.from_config(cfg)
    assert str(info.value) == (
        "deployment config key 'policy_api_key' cannot be loaded: it holds a malformed ${...} "
        "interpolation; fix the deployment config and restart it"
    )
    assert info.value.__context__ is None
    assert_no_secret(info.value)


def test_from_config_ignores_unresolvable_values_it_does_not_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Values trollout never reads may hold anything: unset variables, ???, odd types."""
    monkeypatch.delenv("TROLLOUT_TEST_UNSET", raising=False)
    unset = "${oc.env:TROLLOUT_TEST_UNSET}"
    dataset = {
        "name": "d",
        "type": unset,
        "jsonl_fpath": f"{unset}/x.jsonl",
        "num_repeats": "${nowhere}",
        "license": ["not", "a", "string"],
    }
    cfg = {
        **agent_070(datasets=[dataset], api_key=unset, tools="???", judge="${mul:1,2}"),
        "setting": "${nowhere}",
        "placeholder": "???",
        "when": datetime.date(2026, 1, 2),
        None: "a null key",
        "tags": {"a", "b"},
    }
    [agent] = Deployment.from_config(cfg).servers
    assert agent.datasets == (Dataset("d"),)


@pytest.mark.parametrize("datasets", [None, "???", "${nowhere_optional}", SECRET, {"name": "d"}])
def test_from_config_datasets_that_are_not_a_list_declare_nothing(datasets: Any) -> None:
    """Missing, ??? or not a list: the server declares no dataset (no error)."""
    cfg = {**agent_070(datasets=datasets), "nowhere_optional": None}
    assert Deployment.from_config(cfg).servers[0].datasets == ()


def test_from_config_accepts_a_port_given_as_digits_only() -> None:
    """A digit string is a port (oc.env yields strings); other strings are refused."""
    assert Deployment.from_config(agent_070(port="8080")).route("a").url == "http://127.0.0.1:8080"
    for bad in (" 80", "80a", "0", "99999", "٣"):
        with pytest.raises(DeploymentError, match=r"must be a port 1\.\.65535"):
            Deployment.from_config(agent_070(port=bad))


def test_omegaconf_is_loaded_only_to_read_a_served_config() -> None:
    """Importing trollout and --agent-url deployments never load omegaconf (start-up CPU)."""
    script = (
        "import sys, trollout.cli.main\n"
        "from trollout.collector.deployment.discovery import Deployment\n"
        "Deployment.from_agent_urls({'a': 'http://127.0.0.1:1'})\n"
        "print('omegaconf' in sys.modules)\n"
        "Deployment.from_config({'a': {'responses_api_agents': {'x': {'host': 'h', 'port': 1}}}})\n"
        "print('omegaconf' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["False", "True"]


def test_from_config_accepts_an_omegaconf_config() -> None:
    """A DictConfig (what NeMo Gym code holds) is read as it is, interpolations included."""
    cfg = OmegaConf.create({**agent_070(port="${p}"), "p": 7})
    assert Deployment.from_config(cfg).route("a").url == "http://127.0.0.1:7"


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


# sha256 of config_070()'s deployment, computed before configs were read as served (issue 9):
# runs made then must still resume against the same deployment.
FINGERPRINT_070 = "4ab9a6604c9564138585d895714e956a4b7345f128495249e263574fc6276b57"


def test_fingerprint_is_unchanged_for_existing_runs_and_by_interpolations() -> None:
    """The fingerprint is what it was before issue 9, and ${...} that resolve alike keep it."""
    assert Deployment.from_config(config_070()).fingerprint() == FINGERPRINT_070
    cfg = config_070()
    env = cfg["math_env"]["environment_servers"]["legacy_agent"]
    env["port"] = "${ports.env}"
    env["agent_server"]["name"] = "${names.agent}"
    cfg["math_agent"]["responses_api_agents"]["simple_agent"]["host"] = "${oc.env:TROLLOUT_X,h}"
    cfg |= {"ports": {"env": 9}, "names": {"agent": "math_agent"}, "key": "${oc.env:UNSET_X}"}
    assert Deployment.from_config(cfg).fingerprint() == FINGERPRINT_070


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


def rs_block(port: int, **extra: Any) -> dict[str, Any]:
    """Return a resources server instance block."""
    return {"resources_servers": {"verifier": {"host": "127.0.0.1", "port": port, **extra}}}


def using(rs: str, port: int, impl: str = "simple_agent", **extra: Any) -> dict[str, Any]:
    """Return an agent block of type ``impl`` running against resources server ``rs``."""
    ref = {"type": "resources_servers", "name": rs}
    block = {"host": "127.0.0.1", "port": port, "resources_server": ref, **extra}
    return {"responses_api_agents": {impl: block}}


def test_agent_for_task_source_is_the_declaring_instance() -> None:
    """task_source names the instance that declared the dataset, not the dataset."""
    deployment = Deployment.from_config(config_070())
    assert deployment.agent_for_task_source("math_agent") == "math_agent"  # an agent: itself
    assert deployment.agent_for_task_source("math_rs") == "math_agent"  # its one user
    with pytest.raises(DeploymentError) as info:
        deployment.agent_for_task_source("math_eval")  # a dataset name is not an instance
    assert str(info.value) == (
        "unknown task_source instance 'math_eval' (known: 'math_agent', 'math_rs', "
        "'other_agent'); did you mean 'math_agent'? name the agent or resources server whose "
        "config declares the rows' dataset, or set agent_ref.name on the rows"
    )


def test_agent_for_task_source_follows_a_dataset_pin() -> None:
    """A resources server whose datasets pin an agent routes to that agent."""
    cfg = {
        "rs": rs_block(1, datasets=[{"name": "d", "agent": "b"}, {"name": "e"}]),
        "a": using("rs", 2),
        "b": using("rs", 3),
    }
    assert Deployment.from_config(cfg).agent_for_task_source("rs") == "b"


@pytest.mark.parametrize(
    ("cfg", "task_source", "message"),
    [
        (
            {"rs": rs_block(1), "a": using("rs", 2), "b": using("rs", 3)},
            "rs",
            "task_source 'rs': 2 agents reference resources server 'rs' ('a', 'b'); pin one "
            "with an agent: key on the dataset, or pass +agent_map={rs:<agent>}",
        ),
        (
            {"rs": rs_block(1), "a": agent_block(2)},
            "rs",
            "task_source 'rs': no agent references resources server 'rs'; point an agent's "
            "resources_server at it, or set agent_ref.name on the rows",
        ),
        (
            {
                "rs": rs_block(
                    1, datasets=[{"name": "d", "agent": "a"}, {"name": "e", "agent": "b"}]
                ),
                "a": using("rs", 2),
                "b": using("rs", 3),
            },
            "rs",
            "task_source 'rs': its datasets pin conflicting agents ('a', 'b'), which task_source "
            "alone cannot tell apart; pass +agent_map={rs:<agent>} to pick one",
        ),
        (
            {"rs": rs_block(1, datasets=[{"name": "d", "agent": "b"}]), "a": using("rs", 2)},
            "rs",
            "task_source 'rs': its datasets pin agent 'b', but no agent of that name references "
            "resources server 'rs' (agents that do: 'a'); fix the dataset's agent: key, or pass "
            "+agent_map={rs:<agent>}",
        ),
        (
            {"a": agent_block(2, datasets=[{"name": "d", "agent": "b"}]), "b": agent_block(3)},
            "a",
            "task_source 'a' is an agent, but its dataset pins agent 'b': an agent's datasets "
            "run on that agent, so the pin cannot apply; remove the pin, or pass "
            "+agent_map={a:b}",
        ),
        (
            config_070(),
            "policy_model",
            "task_source 'policy_model' is a responses_api_models instance, not an agent or "
            "resources server, so no dataset routes from it; name the agent or resources server "
            "whose config declares the rows' dataset, or set agent_ref.name on the rows",
        ),
        (
            config_070(),
            "math_agnet",
            "unknown task_source instance 'math_agnet' (known: 'math_agent', 'math_rs', "
            "'other_agent'); did you mean 'math_agent'? name the agent or resources server whose "
            "config declares the rows' dataset, or set agent_ref.name on the rows",
        ),
    ],
    ids=["several", "none", "conflicting-pins", "pin-not-a-user", "agent-pin", "model", "typo"],
)
def test_agent_for_task_source_refuses_what_it_cannot_resolve(
    cfg: dict[str, Any], task_source: str, message: str
) -> None:
    """Each way a task_source fails to name one agent has its own message and remedy."""
    with pytest.raises(DeploymentError) as info:
        Deployment.from_config(cfg).agent_for_task_source(task_source)
    assert str(info.value) == message


def test_admission_compares_allowed_agents_with_the_agents_type() -> None:
    """allowed_agents lists agent types: an instance name does not admit, its type does."""
    cfg = config_070()
    rs = cfg["math_rs"]["resources_servers"]["math_with_judge"]
    rs["allowed_agents"] = ["math_agent"]  # an instance name, not a type
    deployment = Deployment.from_config(cfg)
    assert deployment.admission_refusal("math_agent") == (
        "agent 'math_agent' runs 'simple_agent', but the resources server it runs against "
        "'math_rs' accepts only 'math_agent'"
    )
    rs["allowed_agents"] = "simple_agent"  # a bare string is one entry
    assert Deployment.from_config(cfg).admits("math_agent", "math_rs", taskset="math")
    rs["allowed_agents"] = []  # empty: no restriction
    assert Deployment.from_config(cfg).admits("math_agent", "math_rs", taskset="math")


def test_admission_checks_the_task_source_and_the_agents_resources_server() -> None:
    """Both verifiers' allowed_agents bind: the rows' task_source and the agent's own."""
    cfg = {
        "strict": rs_block(1, allowed_agents=["other_type"]),
        "open": rs_block(2),
        "a": using("open", 3),
        "b": using("strict", 4),
    }
    deployment = Deployment.from_config(cfg)
    assert deployment.admits("a", "open")
    assert deployment.admission_refusal("a", "strict") == (
        "agent 'a' runs 'simple_agent', but their task_source 'strict' accepts only 'other_type'"
    )
    assert deployment.admission_refusal("b") == (
        "agent 'b' runs 'simple_agent', but the resources server it runs against 'strict' "
        "accepts only 'other_type'"
    )


def test_admission_of_flat_rows_meets_every_dataset_the_agent_declares() -> None:
    """A flat row names no dataset, so every entry the executing agent declares binds it."""
    deployment = Deployment.from_config(config_070())
    assert deployment.admits("math_agent")  # math_eval admits simple_agent
    datasets = [{"name": "x", "allowed_agents": ["simple_agent"]}, {"name": "y"}]
    third = {"responses_api_agents": {"third_type": {"host": "h", "port": 1, "datasets": datasets}}}
    assert Deployment.from_config({**config_070(), "third": third}).admission_refusal("third") == (
        "agent 'third' runs 'third_type', but the dataset 'x' that declares them accepts only "
        "'simple_agent'"
    )


def test_admission_of_task_rows_uses_the_entries_declaring_the_taskset() -> None:
    """A taskset's entries bind wherever declared; an unrelated entry on the agent does not."""
    harbor = [
        {"name": "ts", "allowed_agents": ["simple_agent"]},  # named after its taskset
        {"name": "x", "taskset": "ts2", "allowed_agents": ["harbor"]},
    ]
    cfg = {
        "a": agent_block(1, datasets=[{"name": "other", "allowed_agents": ["nobody"]}]),
        "gen": {"responses_api_agents": {"harbor": {"host": "h", "port": 2, "datasets": harbor}}},
    }
    deployment = Deployment.from_config(cfg)
    assert deployment.admits("a", taskset="ts")  # 'other' (no taskset) does not hold ts rows
    assert deployment.admission_refusal("a", taskset="ts2") == (
        "agent 'a' runs 'simple_agent', but the dataset 'x' that declares them accepts only "
        "'harbor'"
    )
    # no entry anywhere declares ts3: the agent's own entries without a taskset count
    assert deployment.admission_refusal("a", taskset="ts3") == (
        "agent 'a' runs 'simple_agent', but the dataset 'other' that declares them accepts "
        "only 'nobody'"
    )
    assert not deployment.admits("a")  # a flat row meets 'other' too


def test_admission_skips_agents_without_a_type() -> None:
    """--agent-url agents have no config, so nothing can refuse them; unknown ones are."""
    deployment = Deployment.from_agent_urls({"a": "http://127.0.0.1:1"})
    assert deployment.admits("a", "anything", "ts")
    assert not deployment.admits("nobody")


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


def fake_urls_of(deployment: Deployment) -> dict[str, str]:
    """Return {server name: URL} of a discovered deployment."""
    return {server.name: server.url for server in deployment.servers}


async def test_fake_head_server_serves_interpolations_like_a_real_one() -> None:
    """In process: the fake serves ${...} (the secret only at top level); discovery resolves."""
    spec = DeploymentSpec(agents=(AgentSpec(name="a"),))
    async with open_fake_deployment(spec) as fake, httpx.AsyncClient() as client:
        text = (await client.get(fake.head_url + "/global_config_dict_yaml")).json()
        deployment = await discover(client, fake.head_url)
    served = yaml.safe_load(text)
    model = served["policy_model"]["responses_api_models"]["vllm_model"]
    assert model["api_key"] == "${policy_api_key}"
    assert model["port"] == "${policy_model_port}"
    assert model["host"] == "${oc.env:TROLLOUT_FAKE_HOST,127.0.0.1}"
    assert served["policy_api_key"] == FAKE_API_KEY
    assert text.count(FAKE_API_KEY) == 1
    assert fake_urls_of(deployment) == {
        name: f"http://127.0.0.1:{port}"
        for name, port in fake.urls.ports.items()
        if name != "head_server"
    }
    assert FAKE_API_KEY not in repr(deployment)


def test_subprocess_fake_head_server_discovers_with_interpolations() -> None:
    """The fake in its own process serves the same config; discovery resolves it alike."""
    spec = DeploymentSpec(agents=(AgentSpec(name="a"),))
    with spawn_fake_deployment(spec) as urls:
        deployment = trio.run(discover_at, urls.head_url)
    assert fake_urls_of(deployment) == {
        name: f"http://127.0.0.1:{port}"
        for name, port in urls.ports.items()
        if name != "head_server"
    }
    assert deployment.route("a").url == urls.run_urls["a"]


async def discover_at(head_url: str) -> Deployment:
    """Discover the deployment behind ``head_url`` with a fresh client."""
    async with httpx.AsyncClient() as client:
        return await discover(client, head_url)


async def test_fake_deployment_config_has_no_aliases() -> None:
    """The fake head server writes its config out in full, as NeMo Gym's does."""
    spec = DeploymentSpec(agents=(AgentSpec(name="a"), AgentSpec(name="b")))
    async with open_fake_deployment(spec) as fake, httpx.AsyncClient() as client:
        deployment = await discover(client, fake.head_url)
    assert {"a", "b"} <= deployment.known_agents
