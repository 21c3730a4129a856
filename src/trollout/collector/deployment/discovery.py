# Stays whole: routing, task_source resolution and admission all read the same server tables
# and share their messages; reading the served config lives in `served_config`.
"""The deployment: which servers a run talks to, and where each row's `/run` goes.

A `Deployment` is an immutable list of `Server` records plus the routes derived from them. It is
built in one of three ways (docs/protocol.md section 1):

- `discover`: ``GET {head}/global_config_dict_yaml`` (YAML text inside a JSON string), then
  `Deployment.from_config` on the parsed mapping;
- `Deployment.from_config`: every top-level key shaped ``{server_type: {implementation: {host,
  port, ...}}}`` is a server instance; every other key is a setting and is ignored. The config is
  read as served, interpolations unresolved: `served_config` resolves only the values trollout
  reads;
- `Deployment.from_agent_urls`: explicit ``--agent-url NAME=URL`` pairs, no head server.

Routing (generation detection): when the deployment has environment servers (NeMo Gym 0.7.0), an
agent's `/run` goes to the environment server that fronts it; an agent no environment server
fronts, and every agent of an earlier-generation deployment, is reached directly. An agent fronted
by two environment servers is recorded, not refused: `Deployment.route` raises for it, while rows
that name their environment server explicitly still work (`Deployment.environment_server`).

Task sources and admission follow NeMo Gym 0.7.0 (``resolve_task_sources``,
``_validate_agent_pairings``): a ``task_source`` names the config instance that declared the
rows' dataset, and ``allowed_agents`` lists agent *types* (implementation names).

Secrets: the deployment config holds API keys. Parsing keeps only names, types, host and port,
references and dataset declarations, so a `Deployment` (and its repr) carries no secret. Error
messages name key paths and value *types*, never values, and errors raised while decoding the
config are raised outside the ``except`` block so no chained exception holds the text.

`Deployment.fingerprint` hashes names, types and routes, not hosts or ports: a deployment
restarted on new ports serves the same run, and resuming against it should not be refused.

Bounded reads: the config is read up to `MAX_HEAD_CONFIG_BYTES` (a real 0.7.0 config is a few
KB), a liveness probe's body up to `MAX_PROBE_REPLY_BYTES` (only its status matters); a longer
reply is one `DeploymentError` naming the URL and the bound (`transport.read_bounded`).


Design note: the rejected alternative kept the raw config mapping and looked things up on demand.
It is less code, but it carries every secret into reprs, logs and manifests, and it turns a bad
shape into a failure in the middle of dispatch instead of one error before the run starts.
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, Final, NamedTuple

import attrs
import httpx
import orjson
import trio
from attrs import frozen

from ...errors import ConfigError, DeploymentError, UnknownAgentError
from ...records import Identity
from ...settings import load_yaml, validate_url
from ...text import concealed, public_url
from ..http.transport import ReplyTooLargeError, read_bounded
from .served_config import (
    AGENTS,
    ENVIRONMENTS,
    MODELS,
    RESOURCES,
    Dataset,
    Server,
    kind,
    parse_servers,
)

__all__ = [
    "AGENTS",
    "ENVIRONMENTS",
    "MAX_HEAD_CONFIG_BYTES",
    "MAX_PROBE_REPLY_BYTES",
    "MODELS",
    "RESOURCES",
    "AggregateTarget",
    "Dataset",
    "Deployment",
    "Route",
    "Server",
    "check_alive",
    "discover",
    "require_alive",
    "validate_url",
]

CONFIG_PATH: Final = "/global_config_dict_yaml"
MAX_HEAD_CONFIG_BYTES: Final = 16 * 1024 * 1024
"""The longest ``GET /global_config_dict_yaml`` reply read (a real config is a few KB)."""
MAX_PROBE_REPLY_BYTES: Final = 1024 * 1024
"""The longest ``GET /`` reply a liveness probe reads (only its status matters)."""
_FIX: Final = "fix the deployment config and restart it"


@frozen
class Route:
    """Where one agent's rollouts go.

    Attributes:
        agent_name: the agent (``agent_ref.name``).
        url: base URL (``http://host:port``) that receives ``POST /run`` for this agent: the
            environment server fronting it in a 0.7.0 deployment, else the agent server.
        environment_server: the 0.7.0 environment server's instance name, or None.
        result_type: that server's implementation name (``_ng_result_type``), or None.
    """

    agent_name: str
    url: str = attrs.field(repr=lambda url: repr(public_url(url)))
    environment_server: str | None = None
    result_type: str | None = None


class AggregateTarget(NamedTuple):
    """One ``POST /aggregate_metrics`` call: for an agent, or for an environment server."""

    agent_name: str | None
    environment_server: str | None
    url: str


@frozen
class Deployment:
    """The servers of one run and the routes derived from them (immutable, secret-free).

    Attributes:
        servers: every server instance, in config order.
        head_url: the head server it was discovered through, or None.
    """

    servers: tuple[Server, ...]
    head_url: str | None = None
    _by_name: Mapping[str, Server] = attrs.field(init=False, repr=False, eq=False)
    _routes: Mapping[str, Route] = attrs.field(init=False, repr=False, eq=False)
    _conflicts: Mapping[str, tuple[str, ...]] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        by_name = {server.name: server for server in self.servers}
        if len(by_name) != len(self.servers):
            raise DeploymentError(
                f"server names must be unique (got {len(self.servers)} servers "
                f"with {len(by_name)} names); give each server its own name"
            )
        routes, conflicts = _derive_routes(self.servers)
        object.__setattr__(self, "_by_name", MappingProxyType(by_name))
        object.__setattr__(self, "_routes", MappingProxyType(routes))
        object.__setattr__(self, "_conflicts", MappingProxyType(conflicts))

    @classmethod
    def from_config(
        cls,
        cfg: Mapping[str, Any],
        *,
        head_url: str | None = None,
        env_allow: Collection[str] = (),
    ) -> Deployment:
        """Build a deployment from a NeMo Gym config mapping as its head server serves it.

        Interpolations (``${...}``) are resolved only in the values trollout reads (see
        `served_config`); the rest of the config is never touched. ``${oc.env:NAME}`` reads
        only the variables in ``env_allow`` (``served_config_env_allow``); any other is unset.

        Raises:
            DeploymentError: a malformed server block, or a value trollout reads that cannot be
                resolved, naming the key path (never the value).
        """
        if not isinstance(cfg, Mapping):
            raise DeploymentError(f"deployment config must be a mapping (got {kind(cfg)}); {_FIX}")
        return cls(parse_servers(cfg, env_allow), head_url=head_url)

    @classmethod
    def from_agent_urls(cls, urls: Mapping[str, str]) -> Deployment:
        """Build an earlier-generation deployment from ``{agent name: base URL}``.

        Raises:
            ConfigError: no agents, an empty name, or a URL that is not http://host[:port]
                (trollout speaks plain HTTP, so https:// is refused too).
        """
        if not urls:
            raise ConfigError("no agent URLs given; pass --agent-url NAME=URL or a head server")
        servers = []
        for name, url in urls.items():
            if not name or not name.strip():
                raise ConfigError(f"agent name for {url!r} is empty; pass --agent-url NAME=URL")
            url = validate_url(url, what=f"URL of agent {name!r}")
            servers.append(Server(name=name, server_type=AGENTS, implementation=None, url=url))
        return cls(tuple(servers))

    # --- the router protocol the planner and engine use ---------------------------------------

    @property
    def known_agents(self) -> frozenset[str]:
        """Return the names of every agent instance."""
        return frozenset(s.name for s in self.servers if s.server_type == AGENTS)

    @property
    def uses_environment_servers(self) -> bool:
        """Return True for a 0.7.0 deployment (it has environment servers)."""
        return any(s.server_type == ENVIRONMENTS for s in self.servers)

    def route(self, agent_name: str) -> Route:
        """Return where rows routed by ``agent_name`` go.

        Raises:
            UnknownAgentError: no such agent (the message lists the known ones).
            DeploymentError: two or more environment servers front the agent.
        """
        route = self._routes.get(agent_name)
        if route is not None:
            return route
        if agent_name in self._conflicts:
            servers = ", ".join(repr(s) for s in self._conflicts[agent_name])
            raise DeploymentError(
                f"agent {agent_name!r} is fronted by several environment servers ({servers}), "
                "so rows routed by agent are ambiguous; name the server on each row "
                "(_ng_environment_server) or pass +environment_routing_mode=legacy "
                "+environment_server_name=<server>"
            )
        raise UnknownAgentError(
            _unknown_message("agent", agent_name, self.known_agents, _AGENT_REMEDY)
        )

    def agent_for_task_source(self, task_source: str) -> str:
        """Return the agent that runs rows whose only route is ``task_source``.

        ``task_source`` names the config instance that declared the rows' dataset (NeMo Gym
        0.7.0's ``resolve_task_sources``): an agent runs its own datasets; a resources server's
        rows run on the one agent referencing it, or on the agent its datasets pin
        (``agent:``). ``+agent_map={task_source: agent}`` is the disambiguator: the planner
        applies it first, so a mapped task_source never reaches this.

        Raises:
            DeploymentError: an unknown instance, one datasets cannot route from, conflicting
                pins, a pin no agent matches, or no agent or several agents to choose from.
        """
        server = self._by_name.get(task_source)
        if server is None:
            known = frozenset(s.name for s in self.servers if s.server_type in (AGENTS, RESOURCES))
            raise DeploymentError(
                _unknown_message("task_source instance", task_source, known, _SOURCE_REMEDY)
            )
        if server.server_type not in (AGENTS, RESOURCES):
            raise DeploymentError(
                f"task_source {task_source!r} is a {server.server_type} instance, not an agent "
                f"or resources server, so no dataset routes from it; {_SOURCE_REMEDY}"
            )
        pin = _dataset_pin(server)
        if server.server_type == AGENTS:
            if pin is not None and pin != task_source:
                raise DeploymentError(
                    f"task_source {task_source!r} is an agent, but its dataset pins agent "
                    f"{pin!r}: an agent's datasets run on that agent, so the pin cannot apply; "
                    f"remove the pin, or pass +agent_map={{{task_source}:{pin}}}"
                )
            return task_source
        return self._agent_for_resources_server(task_source, pin)

    def _agent_for_resources_server(self, name: str, pin: str | None) -> str:
        users = sorted(a.name for a in self._agents() if a.resources_server == name)
        pick = f"pass +agent_map={{{name}:<agent>}}"
        if pin is not None and pin not in users:
            raise DeploymentError(
                f"task_source {name!r}: its datasets pin agent {pin!r}, but no agent of that "
                f"name references resources server {name!r} (agents that do: "
                f"{_listing(users)}); fix the dataset's agent: key, or {pick}"
            )
        if pin is not None or len(users) == 1:
            return pin or users[0]
        if not users:
            raise DeploymentError(
                f"task_source {name!r}: no agent references resources server {name!r}; point "
                "an agent's resources_server at it, or set agent_ref.name on the rows"
            )
        raise DeploymentError(
            f"task_source {name!r}: {len(users)} agents reference resources server {name!r} "
            f"({_listing(users)}); pin one with an agent: key on the dataset, or {pick}"
        )

    def admits(
        self, agent_name: str, task_source: str | None = None, taskset: str | None = None
    ) -> bool:
        """Return whether ``agent_name`` may run these rows (see `admission_refusal`).

        An unknown agent is not admitted (check `known_agents` first for a better message).
        """
        return self.admission_refusal(agent_name, task_source, taskset) is None

    def admission_refusal(
        self, agent_name: str, task_source: str | None = None, taskset: str | None = None
    ) -> str | None:
        """Return why ``agent_name`` may not run these rows, or None if it may.

        As NeMo Gym 0.7.0's ``_validate_agent_pairings``: the agent's *type* (implementation)
        must be in the ``allowed_agents`` of the rows' task_source and of the resources server
        the agent runs against (when they are resources servers that list any), and of every
        dataset entry declaring the rows. For a task row (``taskset``) those are the entries
        declaring its taskset on any agent block, or, when none does, the agent's own entries
        that name no taskset; a flat row meets every entry the agent declares. Agents without
        a type (``--agent-url``) are not checked.
        """
        agent = self._by_name.get(agent_name)
        if agent is None or agent.server_type != AGENTS:
            return _unknown_message("agent", agent_name, self.known_agents, _AGENT_REMEDY)
        if agent.implementation is None:
            return None
        refusals = [
            *self._verifier_refusals(agent, task_source),
            *(
                f"the dataset {d.name!r} that declares them accepts only "
                f"{_listing(d.allowed_agents)}"
                for d in self._datasets_of_rows(agent, taskset)
                if d.allowed_agents and agent.implementation not in d.allowed_agents
            ),
        ]
        if not refusals:
            return None
        return f"agent {agent_name!r} runs {agent.implementation!r}, but " + "; ".join(refusals)

    def _verifier_refusals(self, agent: Server, task_source: str | None) -> Iterator[str]:
        verifiers = {
            task_source: "their task_source",
            agent.resources_server: "the resources server it runs against",
        }
        for name, relation in verifiers.items():
            server = self._by_name.get(name) if name else None
            if server is None or server.server_type != RESOURCES:
                continue
            allowed = server.allowed_agents
            if allowed and agent.implementation not in allowed:
                yield f"{relation} {name!r} accepts only {_listing(allowed)}"

    def _datasets_of_rows(self, agent: Server, taskset: str | None) -> list[Dataset]:
        if taskset is None:
            return list(agent.datasets)
        declaring = [
            d
            for a in self._agents()
            for d in a.datasets
            if (d.taskset if d.taskset is not None else d.name) == taskset
        ]
        return declaring or [d for d in agent.datasets if d.taskset is None]

    def environment_server(self, name: str) -> Server:
        """Return the environment server ``name`` (explicit or taskset routing).

        Raises:
            DeploymentError: no environment server of that name.
        """
        server = self._by_name.get(name)
        if server is None or server.server_type != ENVIRONMENTS:
            known = frozenset(s.name for s in self._of_type(ENVIRONMENTS))
            raise DeploymentError(_unknown_message("environment server", name, known, _ENV_REMEDY))
        return server

    def environment_server_url(self, name: str) -> str:
        """Return the base URL of the environment server ``name``."""
        return self.environment_server(name).url

    def run_url_resolver(self) -> Callable[[Identity], str]:
        """Return a function from a rollout's identity to its ``/run`` URL (cached per route).

        A row stamped with an environment server goes to that server; any other row to the
        route of its agent. This is what `open_collector(resolve=...)` takes.
        """
        cache: dict[tuple[str | None, str | None], str] = {}

        def resolve(identity: Identity) -> str:
            key = (identity.environment_server, identity.agent_name)
            url = cache.get(key)
            if url is None:
                if identity.environment_server is not None:
                    base = self.environment_server_url(identity.environment_server)
                else:
                    base = self.route(identity.agent_name or "").url
                url = cache[key] = base.rstrip("/") + "/run"
            return url

        return resolve

    def aggregate_metrics_targets(self) -> list[AggregateTarget]:
        """Return one ``/aggregate_metrics`` target per environment server or direct agent."""
        fronted = {s.agent_server for s in self._of_type(ENVIRONMENTS)}
        targets = [
            AggregateTarget(s.agent_server, s.name, s.url) for s in self._of_type(ENVIRONMENTS)
        ]
        direct = (a for a in self._agents() if a.name not in fronted)
        return targets + [AggregateTarget(a.name, None, a.url) for a in direct]

    def model_server_urls(self) -> list[str]:
        """Return the model servers' base URLs (for vLLM ``/metrics`` sampling), de-duplicated."""
        return list(dict.fromkeys(s.url for s in self._of_type(MODELS)))

    def policy_model_servers(self) -> dict[str, str]:
        """Return agent or environment server name -> the model server of the agent it runs."""
        agents = {a.name: a.model_server for a in self._agents() if a.model_server is not None}
        fronts = self._of_type(ENVIRONMENTS)
        return agents | {e.name: agents[e.agent_server] for e in fronts if e.agent_server in agents}

    def agent_set(self) -> dict[str, Any]:
        """Return the names a manifest keeps to explain a changed deployment fingerprint."""
        envs = sorted(s.name for s in self._of_type(ENVIRONMENTS))
        return {"agents": sorted(self.known_agents), "environment_servers": envs}

    def fingerprint(self) -> str:
        """Return sha256 of the agent set and routes: names and types, never hosts or ports."""
        doc = {
            "agents": {n: [r.environment_server, r.result_type] for n, r in self._routes.items()},
            "ambiguous": {n: list(envs) for n, envs in self._conflicts.items()},
            "environment_servers": {
                s.name: [s.implementation, s.agent_server] for s in self._of_type(ENVIRONMENTS)
            },
        }
        return hashlib.sha256(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)).hexdigest()

    def _of_type(self, server_type: str) -> Iterator[Server]:
        return (s for s in self.servers if s.server_type == server_type)

    def _agents(self) -> Iterator[Server]:
        return self._of_type(AGENTS)


def _derive_routes(
    servers: tuple[Server, ...],
) -> tuple[dict[str, Route], dict[str, tuple[str, ...]]]:
    fronts: dict[str, list[Server]] = {}
    for env in (s for s in servers if s.server_type == ENVIRONMENTS and s.agent_server):
        fronts.setdefault(env.agent_server or "", []).append(env)
    routes: dict[str, Route] = {}
    conflicts: dict[str, tuple[str, ...]] = {}
    for agent in (s for s in servers if s.server_type == AGENTS):
        front = fronts.get(agent.name, [])
        if len(front) > 1:
            conflicts[agent.name] = tuple(sorted(e.name for e in front))
        elif front:
            routes[agent.name] = Route(
                agent.name, front[0].url, front[0].name, front[0].implementation
            )
        else:
            routes[agent.name] = Route(agent.name, agent.url)
    return routes, conflicts


def _unknown_message(what: str, name: str, known: frozenset[str], remedy: str) -> str:
    listed = ", ".join(repr(k) for k in sorted(known)) or "none"
    close = difflib.get_close_matches(name, sorted(known), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown {what} {name!r} (known: {listed}); {hint}{remedy}"


_AGENT_REMEDY: Final = "fix agent_ref.name in the rows, or route with +agent_map / --agent-url"
_SOURCE_REMEDY: Final = (
    "name the agent or resources server whose config declares the rows' dataset, or set "
    "agent_ref.name on the rows"
)


def _dataset_pin(server: Server) -> str | None:
    """Return the one agent a server's datasets pin, None if none; refuse conflicting pins."""
    pins = list(dict.fromkeys(d.agent for d in server.datasets if d.agent is not None))
    if len(pins) > 1:
        raise DeploymentError(
            f"task_source {server.name!r}: its datasets pin conflicting agents "
            f"({_listing(pins)}), which task_source alone cannot tell apart; pass "
            f"+agent_map={{{server.name}:<agent>}} to pick one"
        )
    return pins[0] if pins else None


def _listing(names: Iterable[str]) -> str:
    return ", ".join(repr(n) for n in sorted(names)) or "none"


_ENV_REMEDY: Final = "fix _ng_environment_server in the rows or the environment server settings"


# --- the head server and liveness ----------------------------------------------------------


async def discover(
    client: httpx.AsyncClient, head_url: str, *, env_allow: Collection[str] = ()
) -> Deployment:
    """Fetch the deployment config from a head server and build the deployment.

    ``env_allow`` names the environment variables the config may read (`served_config`).

    Raises:
        ConfigError: ``head_url`` is not an http:// URL.
        DeploymentError: the head server cannot be reached, answers badly, or its config is
            malformed (messages name keys, never values).

    Cancellation: a checkpoint; cancelling abandons one idempotent GET, so a retry is safe.
    """
    head_url = validate_url(head_url, what="head server URL")
    try:
        response = await read_bounded(
            client,
            "GET",
            head_url + CONFIG_PATH,
            limit=MAX_HEAD_CONFIG_BYTES,
            bound="MAX_HEAD_CONFIG_BYTES",
        )
    except ReplyTooLargeError as exc:
        raise DeploymentError(f"head server {public_url(head_url)!r}: {exc}") from None
    except httpx.HTTPError as exc:
        raise DeploymentError(
            f"cannot reach head server {head_url!r}: {_reason(exc)}; "
            "start the deployment or pass --agent-url NAME=URL"
        ) from exc
    if response.status_code != 200:
        raise DeploymentError(
            f"head server {head_url!r} answered HTTP {response.status_code} to GET {CONFIG_PATH} "
            "(expected 200); check it is a NeMo Gym head server, or pass --agent-url NAME=URL"
        )
    cfg = _load_yaml(_decode_body(response.content, head_url), head_url)
    return Deployment.from_config(cfg, head_url=head_url, env_allow=env_allow)


def _decode_body(content: bytes, head_url: str) -> str:
    # Raised outside `except`: a chained JSONDecodeError would hold the whole body (`.doc`).
    try:
        decoded: Any = orjson.loads(content)
    except orjson.JSONDecodeError:
        decoded = content
    if isinstance(decoded, str):
        return decoded
    got = "a body that is not JSON" if decoded is content else f"JSON {kind(decoded)}"
    raise DeploymentError(
        f"head server {head_url!r} answered GET {CONFIG_PATH} with {got}; expected a JSON string "
        "holding YAML (NeMo Gym's head server); check the URL or pass --agent-url NAME=URL"
    )


def _load_yaml(text: str, head_url: str) -> Mapping[str, Any]:
    # quote=False: the text holds API keys, so messages name the line and column only; and the
    # DeploymentError is raised outside `except`, so no chained error carries the text.
    try:
        source = f"head server {head_url!r} sent a deployment config that"
        cfg = load_yaml(text, source=source, quote=False)
    except ConfigError as exc:
        problem = str(exc)
    else:
        if isinstance(cfg, Mapping):
            return cfg
        problem = (
            f"head server {head_url!r} sent a deployment config that is not a YAML mapping "
            f"(it is {kind(cfg)}, not a mapping); check the deployment's config files"
        )
    raise DeploymentError(problem)


def _reason(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return "timed out"
    if isinstance(exc, httpx.ConnectError):
        return "connection refused" if "refused" in str(exc).lower() else f"cannot connect ({exc})"
    return f"{type(exc).__name__} ({exc})" if str(exc) else type(exc).__name__


async def check_alive(client: httpx.AsyncClient, urls: Iterable[str]) -> dict[str, str]:
    """Return ``{url: reason}`` for the servers that do not answer ``GET /`` with 200.

    The probes run concurrently; bound them with `trio.fail_after` or the client's timeouts.

    Cancellation: a checkpoint; cancelling abandons the probes in flight (idempotent GETs, so
    a retry is safe) and returns nothing.
    """
    unique = list(dict.fromkeys(urls))
    reasons: dict[str, str] = {}
    async with trio.open_nursery() as nursery:
        for url in unique:
            nursery.start_soon(_probe, client, url, reasons)
    return {url: reasons[url] for url in unique if url in reasons}


async def require_alive(client: httpx.AsyncClient, urls: Iterable[str]) -> None:
    """Raise `DeploymentError` listing every server that does not answer ``GET /``.

    Cancellation: as `check_alive`.
    """
    dead = await check_alive(client, urls)
    if dead:
        listed = ", ".join(
            f"{public_url(url)!r} ({concealed(reason)})" for url, reason in dead.items()
        )
        raise DeploymentError(
            f"{len(dead)} server{'s' if len(dead) > 1 else ''} did not answer GET /: {listed}; "
            "start the deployment (or check its logs) and try again"
        )


async def _probe(client: httpx.AsyncClient, url: str, reasons: dict[str, str]) -> None:
    try:
        response = await read_bounded(
            client, "GET", url + "/", limit=MAX_PROBE_REPLY_BYTES, bound="MAX_PROBE_REPLY_BYTES"
        )
    except httpx.HTTPError as exc:
        reasons[url] = _reason(exc)
        return
    if response.status_code != 200:
        reasons[url] = f"HTTP {response.status_code}"
