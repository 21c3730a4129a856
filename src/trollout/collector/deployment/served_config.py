"""The deployment config as a head server serves it: only the values trollout reads, resolved.

A head server serves its merged config before OmegaConf resolves it (docs/protocol.md section
1), so a real config holds ``${policy_base_url}``, ``${oc.env:VAR,default}`` and the like, mostly in
model-server blocks trollout never reads. `parse_servers` builds the `Server` records from it:

- Servers are found on the unresolved structure, by keys only: a top-level value is a server
  instance when it is a mapping of one known server type to a mapping of one implementation. A
  top-level value that is itself an interpolation is a setting.
- Only the values trollout reads are resolved, each when it is read, by OmegaConf itself (the
  library NeMo Gym uses, so ``${a.b}``, relative keys, ``oc.env`` defaults, escapes and nested
  interpolations mean what they mean there): ``host`` and ``port``; the names of
  ``agent_server``, ``resources_server`` and ``model_server``; a resources server's
  ``allowed_agents``; and the ``name``, ``taskset``, ``agent`` and ``allowed_agents`` of each
  dataset an agent or resources server declares. Nothing else is touched, so a value nobody reads
  may hold an interpolation that cannot be resolved.
- A value trollout reads that cannot be resolved is refused, naming its key path and what went
  wrong (a category taken from the exception's class), never the value.

How a value is read (the environment allow-list, omegaconf's own resolvers only, the bounds,
no omegaconf exception in any message, the lazy import) is `guarded_omegaconf`'s job.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Final

import attrs
from attrs import frozen

from ...errors import DeploymentError
from ...text import conceal, public_url
from .guarded_omegaconf import (
    ENV_ALLOW_SETTING,
    FIX,
    MAX_RESOLUTION_STEPS,
    MAX_RESOLVED_CHARS,
    Guard,
    create,
    is_list,
    peek,
    read,
    read_connection,
    strings,
)

__all__ = [
    "AGENTS",
    "ENVIRONMENTS",
    "ENV_ALLOW_SETTING",
    "MAX_RESOLUTION_STEPS",
    "MAX_RESOLVED_CHARS",
    "MODELS",
    "RESOURCES",
    "SERVER_TYPES",
    "Dataset",
    "Server",
    "kind",
    "parse_servers",
]

AGENTS: Final = "responses_api_agents"
RESOURCES: Final = "resources_servers"
MODELS: Final = "responses_api_models"
ENVIRONMENTS: Final = "environment_servers"
SERVER_TYPES: Final = frozenset({AGENTS, RESOURCES, MODELS, ENVIRONMENTS})
_DECLARING: Final = frozenset({AGENTS, RESOURCES})  # server types whose blocks declare datasets
_CONNECTION_KEYS: Final = frozenset({"host", "port"})


@frozen
class Dataset:
    """A dataset a server declares (an entry of ``datasets:`` in its block).

    Attributes:
        name: the dataset's name.
        taskset: the taskset its rows are materialized as, if it names one.
        agent: the agent it pins (``agent:``), if any.
        allowed_agents: the agent types (implementation names) it admits; None admits any.
    """

    name: str
    taskset: str | None = None
    agent: str | None = None
    allowed_agents: frozenset[str] | None = None


@frozen
class Server:
    """One server instance; only non-secret fields of its block are kept.

    Attributes:
        name: the instance name (the top-level config key).
        server_type: one of `AGENTS`, `RESOURCES`, `MODELS`, `ENVIRONMENTS`.
        implementation: the implementation name (an agent's type; None for ``--agent-url``).
        url: ``http://host:port`` (no trailing slash).
        agent_server: for an environment server, the agent it fronts (binds): legacy routing
            stamps it on rows that name no agent, and task rows are paired with it.
        resources_server: the referenced resources server, if any.
        model_server: for an agent, its policy model server, if any.
        datasets: the datasets an agent or resources server declares.
        allowed_agents: a resources server's admitted agent types (None: no restriction).
    """

    name: str
    server_type: str
    implementation: str | None
    url: str = attrs.field(repr=lambda url: repr(public_url(url)))  # shown concealed
    agent_server: str | None = None
    resources_server: str | None = None
    model_server: str | None = None
    datasets: tuple[Dataset, ...] = ()
    allowed_agents: frozenset[str] | None = None


def parse_servers(cfg: Mapping[str, Any], env_allow: Collection[str] = ()) -> tuple[Server, ...]:
    """Return the server instances of a served config, in config order.

    Args:
        cfg: the parsed YAML mapping (or an omegaconf ``DictConfig``), interpolations unresolved.
        env_allow: the environment variables ``${oc.env:...}`` may read (module doc); any
            other reads as unset.

    Raises:
        DeploymentError: a malformed server block, a value trollout reads that cannot be
            resolved or passes the bounds, or an environment variable not allowed; the message
            names the key path, never the value.
    """
    guard = Guard(frozenset(env_allow))
    root = create(cfg, guard)
    guard.texts = frozenset(strings(root))
    parsed = (_instance(root, key) for key in list(root.keys()))
    return tuple(server for server in parsed if server is not None)


def kind(value: Any) -> str:
    """Describe a value by its type only: config values may be secrets."""
    if value is None:
        return "nothing"
    if isinstance(value, Mapping):
        return f"a mapping of {len(value)} key{'s' if len(value) != 1 else ''}"
    if is_list(value):
        return "a list"
    return f"a {type(value).__name__}"


# --- server blocks -----------------------------------------------------------------------------


def _instance(root: Any, key: Any) -> Server | None:
    node = peek(root, key)
    if not isinstance(node, Mapping) or len(node) != 1:
        return None
    [server_type] = node.keys()
    if server_type not in SERVER_TYPES:
        return None
    name = str(key)
    path = f"{name}.{server_type}"
    impls = read(node, server_type, path)
    if not isinstance(impls, Mapping) or len(impls) != 1:
        raise _bad(path, "a mapping of exactly one implementation", impls)
    [implementation] = impls.keys()
    path = f"{path}.{implementation}"
    block = read(impls, implementation, path)
    if not isinstance(block, Mapping):
        raise _bad(path, "a mapping", block)
    return _server(name, server_type, str(implementation), block, path)


def _server(name: str, server_type: str, impl: str, block: Any, path: str) -> Server:
    return Server(
        name=name,
        server_type=server_type,
        implementation=impl,
        url=_block_url(block, path),
        agent_server=_ref_name(block, "agent_server", path),
        resources_server=_ref_name(block, "resources_server", path),
        model_server=_ref_name(block, "model_server", path),
        datasets=_datasets(block, path) if server_type in _DECLARING else (),
        allowed_agents=_names(block, "allowed_agents", path) if server_type == RESOURCES else None,
    )


def _block_url(block: Any, path: str) -> str:
    """Return the block's ``http://host:port``; one read from the environment is concealed."""
    host, host_env = read_connection(block, "host", f"{path}.host")
    port, port_env = _port(block, f"{path}.port")
    url = _url(host, port, path)
    if host_env or port_env:
        shown_host = _written(block, "host") if host_env else None
        shown_port = _written(block, "port") if port_env else None
        conceal(url, shown_host, shown_port)
    return url


def _written(block: Any, key: str) -> str:
    """Return a value as the config writes it (its interpolation text)."""
    return str(block._get_node(key)._value())


def _url(host: Any, port: int, path: str) -> str:
    if not isinstance(host, str) or not host.strip():
        raise _bad(f"{path}.host", "a host name", host)
    if any(c in host for c in "/@?#") or any(c.isspace() for c in host.strip()):
        # "https://h" is the likely one; trollout speaks plain http:// to host:port.
        raise DeploymentError(
            f"deployment config key {path + '.host'!r} must be a bare host name (got a value "
            "with a scheme, path or credentials); trollout speaks plain http:// to host:port, "
            f"so give the host alone; {FIX}"
        )
    host = host.strip()
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _port(block: Any, path: str) -> tuple[int, list[str]]:
    port, env_names = read_connection(block, "port", path)
    if isinstance(port, str) and port.isascii() and port.isdigit():
        port = int(port)  # ${oc.env:PORT,12047} is a string; NeMo Gym's int field takes it too
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise _bad(path, "a port 1..65535", port)
    return port, env_names


def _ref_name(block: Any, key: str, path: str) -> str | None:
    path = f"{path}.{key}"
    ref = read(block, key, path)
    if ref is None:
        return None
    name = read(ref, "name", f"{path}.name") if isinstance(ref, Mapping) else None
    if not isinstance(name, str) or not name:
        raise _bad(path, "a mapping {type, name}", ref)
    return name


def _datasets(block: Any, path: str) -> tuple[Dataset, ...]:
    from omegaconf import OmegaConf

    path = f"{path}.datasets"
    if OmegaConf.is_missing(block, "datasets"):
        return ()
    entries = read(block, "datasets", path)
    if not is_list(entries):
        return ()  # missing, a placeholder or not a list: declares nothing (as NeMo Gym reads it)
    return tuple(_dataset(entries, i, f"{path}[{i}]") for i in range(len(entries)))


def _dataset(entries: Any, index: int, path: str) -> Dataset:
    entry = read(entries, index, path)
    name = read(entry, "name", f"{path}.name") if isinstance(entry, Mapping) else None
    if not isinstance(name, str) or not name:
        raise _bad(path, "a mapping with a 'name'", entry)
    return Dataset(
        name=name,
        taskset=_opt_str(entry, "taskset", path),
        agent=_opt_str(entry, "agent", path),
        allowed_agents=_names(entry, "allowed_agents", path),
    )


def _opt_str(entry: Any, key: str, path: str) -> str | None:
    value = read(entry, key, f"{path}.{key}")
    if value is not None and not isinstance(value, str):
        raise _bad(f"{path}.{key}", "a string", value)
    return value


def _names(entry: Any, key: str, path: str) -> frozenset[str] | None:
    """Read an ``allowed_agents`` list: a bare string is one entry, an empty list no limit."""
    path = f"{path}.{key}"
    value = read(entry, key, path)
    if value is None:
        return None
    if isinstance(value, str):
        return frozenset({value})
    if not is_list(value):
        raise _bad(path, "a list of agent types", value)
    names = [read(value, i, f"{path}[{i}]") for i in range(len(value))]
    if not all(isinstance(n, str) for n in names):
        raise _bad(path, "a list of agent types", value)
    return frozenset(names) or None


def _bad(path: str, expected: str, value: Any) -> DeploymentError:
    return DeploymentError(
        f"deployment config key {path!r} must be {expected} (got {kind(value)}); {FIX}"
    )
