"""The deployment: which servers a run talks to, and where each row's `/run` goes.

A `Deployment` is an immutable list of `Server` records plus the routes derived from them. It is
built in one of three ways (protocol.md section 1):

- `discover`: ``GET {head}/global_config_dict_yaml`` (YAML text inside a JSON string), then
  `Deployment.from_config` on the parsed mapping;
- `Deployment.from_config`: every top-level key shaped ``{server_type: {implementation: {host,
  port, ...}}}`` is a server instance; every other key is a setting and is ignored;
- `Deployment.from_agent_urls`: explicit ``--agent-url NAME=URL`` pairs, no head server.

Routing (generation detection): when the deployment has environment servers (NeMo Gym 0.7.0), an
agent's `/run` goes to the environment server that fronts it; an agent no environment server
fronts, and every agent of an earlier-generation deployment, is reached directly. An agent fronted
by two environment servers is recorded, not refused: `Deployment.route` raises for it, while rows
that name their environment server explicitly still work (`Deployment.environment_server`).

Secrets: the deployment config holds API keys. Parsing keeps only names, types, host and port,
references and dataset declarations, so a `Deployment` (and its repr) carries no secret. Error
messages name key paths and value *types*, never values, and errors raised while decoding the
config are raised outside the ``except`` block so no chained exception holds the text.

`Deployment.fingerprint` hashes names, types and routes, not hosts or ports: a deployment
restarted on new ports serves the same run, and resuming against it should not be refused.

Length: this module is longer than the house's ~400 lines on purpose: parsing, routing and
discovery share the secret-handling rules above, and splitting them would spread those rules over
two files. The parsing helpers (``_parse_*`` and below) are the part to move out if it grows.

Design note: the rejected alternative kept the raw config mapping and looked things up on demand.
It is less code, but it carries every secret into reprs, logs and manifests, and it turns a bad
shape into a failure in the middle of dispatch instead of one error before the run starts.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, Final, NamedTuple

import attrs
import httpx
import orjson
import trio
from attrs import frozen

from ..config import load_yaml, validate_url
from ..errors import ConfigError, DeploymentError, UnknownAgentError
from ..records import Identity

__all__ = [
    "AGENTS",
    "ENVIRONMENTS",
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

AGENTS: Final = "responses_api_agents"
RESOURCES: Final = "resources_servers"
MODELS: Final = "responses_api_models"
ENVIRONMENTS: Final = "environment_servers"
SERVER_TYPES: Final = frozenset({AGENTS, RESOURCES, MODELS, ENVIRONMENTS})
CONFIG_PATH: Final = "/global_config_dict_yaml"
_INTERPOLATION: Final = re.compile(r"\$\{[^}]*\}")
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
    url: str
    environment_server: str | None = None
    result_type: str | None = None


@frozen
class Dataset:
    """A dataset an agent declares (``datasets:`` in its block)."""

    name: str
    type: str | None = None
    jsonl_fpath: str | None = None
    num_repeats: int | None = None
    license: str | None = None
    allowed_agents: frozenset[str] | None = None  # None: no restriction
    taskset: str | None = None


@frozen
class Server:
    """One server instance; only non-secret fields of its block are kept.

    Attributes:
        name: the instance name (the top-level config key).
        server_type: one of `AGENTS`, `RESOURCES`, `MODELS`, `ENVIRONMENTS`.
        implementation: the implementation name (None for ``--agent-url`` agents).
        url: ``http://host:port`` (no trailing slash).
        agent_server: for an environment server, the agent it fronts.
        resources_server: the referenced resources server, if any.
        model_server: the referenced model server, if any.
        datasets: an agent's declared datasets.
        allowed_agents: a resources server's admitted agents (None: no restriction).
    """

    name: str
    server_type: str
    implementation: str | None
    url: str
    agent_server: str | None = None
    resources_server: str | None = None
    model_server: str | None = None
    datasets: tuple[Dataset, ...] = ()
    allowed_agents: frozenset[str] | None = None


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
    def from_config(cls, cfg: Mapping[str, Any], *, head_url: str | None = None) -> Deployment:
        """Build a deployment from a parsed NeMo Gym config mapping.

        Raises:
            DeploymentError: an unresolved ``${...}`` value or a malformed server block, naming
                the key path (never the value).
        """
        if not isinstance(cfg, Mapping):
            raise DeploymentError(f"deployment config must be a mapping (got {_kind(cfg)}); {_FIX}")
        unresolved = list(_unresolved_paths(cfg, ""))
        if unresolved:
            keys = ", ".join(repr(p) for p in unresolved)
            raise DeploymentError(
                f"deployment config has unresolved ${{...}} values at {keys}; "
                "set the variables they name and restart the deployment"
            )
        parsed = (_parse_instance(str(name), value) for name, value in cfg.items())
        return cls(tuple(s for s in parsed if s is not None), head_url=head_url)

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

    def agent_for_task_source(self, task_source: str) -> str | None:
        """Return the agent that declares a dataset named ``task_source``, or None.

        Raises:
            DeploymentError: several agents declare it.
        """
        owners = sorted(
            {a.name for a in self._agents() for d in a.datasets if d.name == task_source}
        )
        if len(owners) > 1:
            names = ", ".join(repr(o) for o in owners)
            raise DeploymentError(
                f"task_source {task_source!r} is a dataset of several agents ({names}); set "
                "agent_ref.name on the rows or pass +agent_map={" + task_source + ":<agent>}"
            )
        return owners[0] if owners else None

    def admits(self, agent_name: str, task_source: str | None = None) -> bool:
        """Return whether ``agent_name`` may run rows of ``task_source``.

        An unknown agent is not admitted (check `known_agents` first for a better message).
        """
        return self.admission_refusal(agent_name, task_source) is None

    def admission_refusal(self, agent_name: str, task_source: str | None = None) -> str | None:
        """Return why ``agent_name`` may not run rows of ``task_source``, or None if it may.

        A dataset's ``allowed_agents`` binds rows of that task source (any declaration of the
        dataset that lists the agent, or lists nothing, admits it); a resources server that
        declares ``allowed_agents`` binds the agents (and environment servers) that use it.
        """
        if agent_name not in self.known_agents:
            return _unknown_message("agent", agent_name, self.known_agents, _AGENT_REMEDY)
        decls = [d for a in self._agents() for d in a.datasets if d.name == task_source]
        if decls and not any(
            d.allowed_agents is None or agent_name in d.allowed_agents for d in decls
        ):
            return f"dataset {task_source!r} does not admit agent {agent_name!r} (allowed_agents)"
        for server in self._resources_of(agent_name):
            if server.allowed_agents is not None and agent_name not in server.allowed_agents:
                return f"resources server {server.name!r} does not admit agent {agent_name!r}"
        return None

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

    def _resources_of(self, agent_name: str) -> list[Server]:
        users = [
            self._by_name[agent_name],
            *(s for s in self._of_type(ENVIRONMENTS) if s.agent_server == agent_name),
        ]
        names = {u.resources_server for u in users if u.resources_server}
        return [s for s in self._of_type(RESOURCES) if s.name in names]


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
_ENV_REMEDY: Final = "fix _ng_environment_server in the rows or the environment server settings"


# --- parsing a config mapping (names and key paths only in messages) -----------------------


def _unresolved_paths(value: Any, path: str) -> Iterator[str]:
    if isinstance(value, str):
        if _INTERPOLATION.search(value):
            yield path
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _unresolved_paths(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _unresolved_paths(item, f"{path}[{index}]")


def _parse_instance(name: str, value: Any) -> Server | None:
    if not isinstance(value, Mapping) or len(value) != 1:
        return None
    [(server_type, impls)] = value.items()
    if server_type not in SERVER_TYPES:
        return None
    path = f"{name}.{server_type}"
    if not isinstance(impls, Mapping) or len(impls) != 1:
        raise _bad(path, "a mapping of exactly one implementation", impls)
    [(implementation, block)] = impls.items()
    path = f"{path}.{implementation}"
    if not isinstance(block, Mapping):
        raise _bad(path, "a mapping", block)
    return _server(name, server_type, str(implementation), block, path)


def _server(name: str, server_type: str, impl: str, block: Mapping[str, Any], path: str) -> Server:
    return Server(
        name=name,
        server_type=server_type,
        implementation=impl,
        url=_block_url(block, path),
        agent_server=_ref_name(block, "agent_server", path),
        resources_server=_ref_name(block, "resources_server", path),
        model_server=_ref_name(block, "model_server", path),
        datasets=_datasets(block, path) if server_type == AGENTS else (),
        allowed_agents=_names(block, "allowed_agents", path) if server_type == RESOURCES else None,
    )


def _block_url(block: Mapping[str, Any], path: str) -> str:
    host, port = block.get("host"), block.get("port")
    if not isinstance(host, str) or not host.strip():
        raise _bad(f"{path}.host", "a host name", host)
    if any(c in host for c in "/@?#") or any(c.isspace() for c in host.strip()):
        # "https://h" is the likely one; trollout speaks plain http:// to host:port.
        raise DeploymentError(
            f"deployment config key {path + '.host'!r} must be a bare host name (got a value "
            "with a scheme, path or credentials); trollout speaks plain http:// to host:port, "
            f"so give the host alone; {_FIX}"
        )
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise _bad(f"{path}.port", "a port 1..65535", port)
    host = host.strip()
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _ref_name(block: Mapping[str, Any], key: str, path: str) -> str | None:
    ref = block.get(key)
    if ref is None:
        return None
    name = ref.get("name") if isinstance(ref, Mapping) else None
    if not isinstance(name, str) or not name:
        raise _bad(f"{path}.{key}", "a mapping {type, name}", ref)
    return name


def _datasets(block: Mapping[str, Any], path: str) -> tuple[Dataset, ...]:
    entries = block.get("datasets") or []
    if not isinstance(entries, list):
        raise _bad(f"{path}.datasets", "a list", entries)
    return tuple(_dataset(entry, f"{path}.datasets[{i}]") for i, entry in enumerate(entries))


def _dataset(entry: Any, path: str) -> Dataset:
    if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
        raise _bad(path, "a mapping with a 'name'", entry)
    repeats = entry.get("num_repeats")
    if repeats is not None and (isinstance(repeats, bool) or not isinstance(repeats, int)):
        raise _bad(f"{path}.num_repeats", "an integer", repeats)
    return Dataset(
        name=entry["name"],
        type=_opt_str(entry, "type", path),
        jsonl_fpath=_opt_str(entry, "jsonl_fpath", path),
        num_repeats=repeats,
        license=_opt_str(entry, "license", path),
        allowed_agents=_names(entry, "allowed_agents", path),
        taskset=_opt_str(entry, "taskset", path),
    )


def _opt_str(entry: Mapping[str, Any], key: str, path: str) -> str | None:
    value = entry.get(key)
    if value is not None and not isinstance(value, str):
        raise _bad(f"{path}.{key}", "a string", value)
    return value


def _names(entry: Mapping[str, Any], key: str, path: str) -> frozenset[str] | None:
    value = entry.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _bad(f"{path}.{key}", "a list of names", value)
    return frozenset(value)


def _bad(path: str, expected: str, value: Any) -> DeploymentError:
    return DeploymentError(
        f"deployment config key {path!r} must be {expected} (got {_kind(value)}); {_FIX}"
    )


def _kind(value: Any) -> str:
    """Describe a value by its type only: config values may be secrets."""
    if value is None:
        return "nothing"
    if isinstance(value, Mapping):
        return f"a mapping of {len(value)} key{'s' if len(value) != 1 else ''}"
    return f"a {type(value).__name__}"


# --- the head server and liveness ----------------------------------------------------------


async def discover(client: httpx.AsyncClient, head_url: str) -> Deployment:
    """Fetch the deployment config from a head server and build the deployment.

    Raises:
        ConfigError: ``head_url`` is not an http:// URL.
        DeploymentError: the head server cannot be reached, answers badly, or its config is
            malformed (messages name keys, never values).

    Cancellation: a checkpoint; cancelling abandons one idempotent GET, so a retry is safe.
    """
    head_url = validate_url(head_url, what="head server URL")
    try:
        response = await client.get(head_url + CONFIG_PATH)
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
    return Deployment.from_config(cfg, head_url=head_url)


def _decode_body(content: bytes, head_url: str) -> str:
    # Raised outside `except`: a chained JSONDecodeError would hold the whole body (`.doc`).
    try:
        decoded: Any = orjson.loads(content)
    except orjson.JSONDecodeError:
        decoded = content
    if isinstance(decoded, str):
        return decoded
    got = "a body that is not JSON" if decoded is content else f"JSON {_kind(decoded)}"
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
            f"(it is {_kind(cfg)}, not a mapping); check the deployment's config files"
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
        listed = ", ".join(f"{url!r} ({reason})" for url, reason in dead.items())
        raise DeploymentError(
            f"{len(dead)} server{'s' if len(dead) > 1 else ''} did not answer GET /: {listed}; "
            "start the deployment (or check its logs) and try again"
        )


async def _probe(client: httpx.AsyncClient, url: str, reasons: dict[str, str]) -> None:
    try:
        response = await client.get(url + "/")
    except httpx.HTTPError as exc:
        reasons[url] = _reason(exc)
        return
    if response.status_code != 200:
        reasons[url] = f"HTTP {response.status_code}"
