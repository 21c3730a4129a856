"""Run a whole fake NeMo Gym deployment in one Trio nursery.

``async with open_fake_deployment(spec) as fake:`` binds one loopback socket per server (port 0
unless a port base is given), writes the deployment config the head server hands out, serves
every server until the block ends, and exposes the URLs and the live `FakeStats`.

Servers, in port order: the head, the model server, then per agent its resources server, its
agent server and (generation "0.7.0") the environment server fronting it, then the episode
environment servers. An agent or episode server marked ``refuse`` is in the config, but its
agent and environment ports are closed: connecting to them is refused.
"""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import trio
import yaml
from attrs import evolve, frozen

from ..httpserver import listen, serve_connection, serve_listener
from .faults import FaultFn, FaultPlan
from .policy import MODEL_ID
from .servers import DeploymentState, FakeServer, Role
from .spec import DeploymentSpec, Generation, load_spec
from .stats import FakeStats

__all__ = ["FAKE_API_KEY", "FakeDeployment", "FakeUrls", "build_config", "open_fake_deployment"]

HOST = "127.0.0.1"
# A fake secret in the model server's block: tests check that no log or file ever shows it.
FAKE_API_KEY = "sk-fake-0123456789-DO-NOT-LOG"
_IMPLEMENTATIONS = {
    Role.AGENT: "simple_agent",
    Role.ENVIRONMENT: "legacy_agent",
    Role.RESOURCES: "fake_verifier",
    Role.MODEL: "vllm_model",
}


@frozen(kw_only=True)
class FakeUrls:
    """Where a fake deployment listens (what the subprocess prints as its ready line).

    Attributes:
        head_url: the head server's base URL.
        agent_urls: agent name -> base URL of its agent server.
        run_urls: agent name -> base URL that receives its ``/run`` (the fronting environment
            server in a 0.7.0 deployment, else the agent server).
        environment_servers: agent name -> instance name of its environment server (0.7.0).
        metrics_urls: the model servers' ``/metrics`` URLs.
        ports: instance name -> port, every server (refused ones included).
        pid: the serving process (set in the subprocess's ready line), or None.
    """

    head_url: str
    agent_urls: dict[str, str]
    run_urls: dict[str, str]
    environment_servers: dict[str, str]
    metrics_urls: tuple[str, ...]
    ports: dict[str, int]
    pid: int | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the URLs as a JSON-able mapping."""
        return {
            "head_url": self.head_url,
            "agent_urls": self.agent_urls,
            "run_urls": self.run_urls,
            "environment_servers": self.environment_servers,
            "metrics_urls": list(self.metrics_urls),
            "ports": self.ports,
            "pid": self.pid,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FakeUrls:
        """Rebuild the URLs from `to_json`'s mapping."""
        return cls(
            head_url=data["head_url"],
            agent_urls=dict(data["agent_urls"]),
            run_urls=dict(data["run_urls"]),
            environment_servers=dict(data["environment_servers"]),
            metrics_urls=tuple(data["metrics_urls"]),
            ports=dict(data["ports"]),
            pid=data.get("pid"),
        )


def _servers(spec: DeploymentSpec) -> list[tuple[str, Role, Any]]:
    """Return (instance name, role, agent spec or None) in port order."""
    servers: list[tuple[str, Role, Any]] = [
        ("head_server", Role.HEAD, None),
        (spec.model_name, Role.MODEL, None),
    ]
    for agent in spec.agents:
        servers.append((agent.resources_server, Role.RESOURCES, agent))
        servers.append((agent.name, Role.AGENT, agent))
        if spec.generation is Generation.V0_7_0:
            servers.append((agent.environment_server, Role.ENVIRONMENT, agent))
    servers.extend((episode.name, Role.ENVIRONMENT, episode) for episode in spec.episode_servers)
    return servers


def _url(port: int) -> str:
    return f"http://{HOST}:{port}"


def _block(role: Role, port: int | str, **extra: Any) -> dict[str, Any]:
    body = {"entrypoint": "app.py", "host": HOST, "port": port, **extra}
    return {role.value: {_IMPLEMENTATIONS[role]: body}}


def _agent_blocks(spec: DeploymentSpec, ports: Mapping[str, int]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for agent in spec.agents:
        resources = {"type": Role.RESOURCES.value, "name": agent.resources_server}
        dataset = {
            "name": f"{agent.name}_tasks",
            "type": "example",
            "jsonl_fpath": "fixtures/example_tasks.jsonl",
            "num_repeats": 1,
            "license": "Apache 2.0",
        }
        config[agent.resources_server] = _block(Role.RESOURCES, ports[agent.resources_server])
        config[agent.name] = _block(
            Role.AGENT,
            ports[agent.name],
            resources_server=resources,
            model_server={"type": Role.MODEL.value, "name": spec.model_name},
            datasets=[dataset],
        )
        if spec.generation is Generation.V0_7_0:
            config[agent.environment_server] = _block(
                Role.ENVIRONMENT,
                ports[agent.environment_server],
                agent_server={"type": Role.AGENT.value, "name": agent.name},
                resources_server=resources,
            )
    return config


def _episode_blocks(spec: DeploymentSpec, ports: Mapping[str, int]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for episode in spec.episode_servers:
        block: dict[str, Any] = {"entrypoint": "app.py", "host": HOST, "port": ports[episode.name]}
        if episode.agent is not None:
            block["agent_server"] = {"type": Role.AGENT.value, "name": episode.agent}
        config[episode.name] = {Role.ENVIRONMENT.value: {episode.implementation: block}}
    return config


def build_config(spec: DeploymentSpec, ports: Mapping[str, int]) -> dict[str, Any]:
    """Return the merged deployment config the head server hands out (docs/protocol.md section 1).

    Like a real NeMo Gym head server's, it is served before OmegaConf resolves it: the model
    server block reads its URL, key (`FAKE_API_KEY`, the top-level ``policy_api_key``) and model
    through ``${...}``, has an ``${oc.env:...,default}`` and a value nobody can resolve (a
    collector reads none of them), and its own host and port, which a collector does read, are
    an ``oc.env`` with a default and a reference to another key.
    """
    model_port = ports[spec.model_name]
    model = _block(
        Role.MODEL,
        "${policy_model_port}",
        base_url="${policy_base_url}",
        api_key="${policy_api_key}",
        model="${policy_model_name}",
        drop_input_reasoning_items="${oc.env:POLICY_DROP_REASONING_ITEMS,false}",
        extra_headers="${oc.env:TROLLOUT_FAKE_NEVER_SET}",
        host=f"${{oc.env:TROLLOUT_FAKE_HOST,{HOST}}}",
    )
    return {
        spec.model_name: model,
        **_agent_blocks(spec, ports),
        **_episode_blocks(spec, ports),
        "head_server": {"host": HOST, "port": ports["head_server"]},
        "policy_base_url": f"{_url(model_port)}/v1",
        "policy_api_key": FAKE_API_KEY,
        "policy_model_name": MODEL_ID,
        "policy_model_port": model_port,
    }


def _urls(spec: DeploymentSpec, ports: Mapping[str, int]) -> FakeUrls:
    agents = {a.name: _url(ports[a.name]) for a in spec.agents}
    if spec.generation is Generation.V0_7_0:
        envs = {a.name: a.environment_server for a in spec.agents}
        runs = {a.name: _url(ports[a.environment_server]) for a in spec.agents}
    else:
        envs, runs = {}, dict(agents)
    return FakeUrls(
        head_url=_url(ports["head_server"]),
        agent_urls=agents,
        run_urls=runs,
        environment_servers=envs,
        metrics_urls=(f"{_url(ports[spec.model_name])}/metrics",),
        ports=dict(ports),
    )


class FakeDeployment:
    """A running fake deployment: its URLs, config, live stats and tweakable faults."""

    def __init__(self, state: DeploymentState, urls: FakeUrls, config: dict[str, Any]) -> None:
        self.state = state
        self.urls = urls
        self.config = config

    @property
    def spec(self) -> DeploymentSpec:
        """Return the spec the deployment runs."""
        return self.state.spec

    @property
    def stats(self) -> FakeStats:
        """Return the live counters shared by every server."""
        return self.state.stats

    @property
    def head_url(self) -> str:
        """Return the head server's base URL."""
        return self.urls.head_url

    @property
    def agent_urls(self) -> dict[str, str]:
        """Return agent name -> agent server base URL."""
        return self.urls.agent_urls

    @property
    def run_urls(self) -> dict[str, str]:
        """Return agent name -> base URL that receives its ``/run``."""
        return self.urls.run_urls

    @property
    def fault_fn(self) -> FaultFn | None:
        """Return the in-process fault callable (consulted after row overrides)."""
        return self.state.fault_fn

    @fault_fn.setter
    def fault_fn(self, fn: FaultFn | None) -> None:
        self.state.fault_fn = fn

    def set_fault_plan(self, plan: FaultPlan) -> None:
        """Replace the deployment-wide fault plan (agents' own plans still win)."""
        self.state.spec = evolve(self.state.spec, faults=plan)


class _NoAliasDumper(yaml.SafeDumper):
    """Write shared values out in full, as NeMo Gym's head server does (OmegaConf.to_yaml).

    trollout refuses a deployment config with aliases of mappings or lists (YAML bombs), and
    `build_config` shares blocks between servers, which `yaml.safe_dump` would alias.
    """

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _resolve(spec: DeploymentSpec | str | os.PathLike[str] | None) -> DeploymentSpec:
    if spec is None:
        return DeploymentSpec()
    if isinstance(spec, DeploymentSpec):
        return spec
    return load_spec(spec)


def _closed_port() -> int:
    # A port that was free a moment ago and is closed now; nothing of ours will listen there.
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
    return port


def _listen(
    spec: DeploymentSpec, port_base: int | None
) -> tuple[dict[str, int], dict[str, socket.socket]]:
    ports: dict[str, int] = {}
    listeners: dict[str, socket.socket] = {}
    try:
        for i, (name, role, agent) in enumerate(_servers(spec)):
            wanted = 0 if port_base is None else port_base + i
            if agent is not None and agent.refuse and role in (Role.AGENT, Role.ENVIRONMENT):
                ports[name] = wanted or _closed_port()
                continue
            listeners[name] = listen(wanted, host=HOST)
            ports[name] = listeners[name].getsockname()[1]
    except BaseException:
        for sock in listeners.values():
            sock.close()
        raise
    return ports, listeners


@asynccontextmanager
async def open_fake_deployment(
    spec: DeploymentSpec | str | os.PathLike[str] | None = None,
    *,
    port_base: int | None = None,
    record_runs: bool | None = None,
    fault_fn: FaultFn | None = None,
) -> AsyncIterator[FakeDeployment]:
    """Serve a fake deployment on loopback for the duration of the block.

    Args:
        spec: a `DeploymentSpec`, a path to a spec YAML file, or None for the default spec.
        port_base: give the servers ports ``port_base``, ``port_base + 1``, ... (head first);
            by default every server binds port 0.
        record_runs: keep the detailed log of every ``/run``; None: as the spec says.
        fault_fn: an in-process fault callable, consulted after a row's own override.

    Cancellation:
        Entering binds every socket without a checkpoint, then starts the servers (a
        cancellation there closes every socket). Leaving the block cancels every server and
        closes every connection, including hung ones.
    """
    resolved = _resolve(spec)
    detail = resolved.record_runs if record_runs is None else record_runs
    state = DeploymentState(resolved, FakeStats(record_runs=detail), fault_fn=fault_fn)
    ports, listeners = _listen(resolved, port_base)
    config = build_config(resolved, ports)
    state.config_yaml = yaml.dump(config, Dumper=_NoAliasDumper, sort_keys=False)
    servers = {
        name: FakeServer(name, role, state, agent) for name, role, agent in _servers(resolved)
    }
    # Each serve_listener closes its socket when it ends, even if cancelled before it ran.
    async with trio.open_nursery() as nursery:
        for name, sock in listeners.items():
            # start_soon is enough: the socket already listens, the kernel queues connections.
            serve = partial(serve_listener, connection=serve_connection)
            nursery.start_soon(serve, sock, servers[name].handle)
        try:
            yield FakeDeployment(state, _urls(resolved, ports), config)
        finally:
            nursery.cancel_scope.cancel(reason="fake deployment closed")
