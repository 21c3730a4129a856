"""The deployment config as a head server serves it: only the values trollout reads, resolved.

A head server serves its merged config before OmegaConf resolves it (protocol.md section 1), so a
real config holds ``${policy_base_url}``, ``${oc.env:VAR,default}`` and the like, mostly in
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

Secrets: omegaconf's exceptions hold the node they were raised in (its repr shows sibling values
such as API keys), and some of their messages quote the value. So no omegaconf exception is ever
put in a message, kept, or chained: the `DeploymentError` is raised after the ``except`` block.

omegaconf is imported on first use, so a run given ``--agent-url`` never loads it.

Design note: the rejected alternative resolved ``${...}`` with a hand-written resolver. It would
have to match OmegaConf's grammar (nesting, quoting, escapes, relative keys, typed whole-value
interpolations but strings from ``oc.env``), and every difference is a wrong refusal or a wrong
host.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from attrs import frozen

from ..errors import DeploymentError

__all__ = [
    "AGENTS",
    "ENVIRONMENTS",
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
_FIX: Final = "fix the deployment config and restart it"
_RESOLVE_FIX: Final = (
    "set what it references (${oc.env:...} reads trollout's own environment) or fix the "
    "deployment config"
)


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
    url: str
    agent_server: str | None = None
    resources_server: str | None = None
    model_server: str | None = None
    datasets: tuple[Dataset, ...] = ()
    allowed_agents: frozenset[str] | None = None


def parse_servers(cfg: Mapping[str, Any]) -> tuple[Server, ...]:
    """Return the server instances of a served config, in config order.

    Args:
        cfg: the parsed YAML mapping (or an omegaconf ``DictConfig``), interpolations unresolved.

    Raises:
        DeploymentError: a malformed server block, or a value trollout reads that cannot be
            resolved; the message names the key path, never the value.
    """
    root = _create(cfg)
    parsed = (_instance(root, key) for key in list(root.keys()))
    return tuple(server for server in parsed if server is not None)


def kind(value: Any) -> str:
    """Describe a value by its type only: config values may be secrets."""
    if value is None:
        return "nothing"
    if isinstance(value, Mapping):
        return f"a mapping of {len(value)} key{'s' if len(value) != 1 else ''}"
    if _is_list(value):
        return "a list"
    return f"a {type(value).__name__}"


# --- OmegaConf access (lazy import; errors by key path and category) -------------------------


def _create(cfg: Mapping[str, Any]) -> Any:
    from omegaconf import DictConfig, OmegaConf  # lazy: see the module doc
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(cfg, DictConfig):
        return cfg
    try:
        return OmegaConf.create(_plain(cfg))
    except OmegaConfBaseException as exc:
        # Only names survive the block: the exception holds the config (see the module doc).
        where, category = getattr(exc, "full_key", None), _category(exc)
    subject = f"deployment config key {str(where)!r}" if where else "the deployment config"
    raise DeploymentError(f"{subject} cannot be loaded: {category}; {_FIX}")


def _plain(value: Any) -> Any:
    """Return a copy OmegaConf can hold: keys it cannot hold dropped, odd leaves as strings.

    YAML builds dates, sets and ``null`` keys that OmegaConf refuses; none is a value trollout
    reads, and a config NeMo Gym served cannot hold one, so they must not refuse the config.
    """
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items() if isinstance(k, str | int | float)}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if value is None or isinstance(value, str | int | float | bytes):
        return value
    return str(value)


def _peek(node: Any, key: Any) -> Any:
    """Return ``node[key]`` when it is a plain value, None for an interpolation or ``???``."""
    from omegaconf import OmegaConf

    if OmegaConf.is_interpolation(node, key) or OmegaConf.is_missing(node, key):
        return None
    return node[key]


def _read(node: Any, key: Any, path: str) -> Any:
    """Return ``node[key]`` resolved, or None when it is absent.

    Raises:
        DeploymentError: the value is ``???`` or cannot be resolved (key path and category,
            no value).
    """
    from omegaconf.errors import OmegaConfBaseException

    if not _present(node, key):
        return None
    try:
        return node[key]
    except OmegaConfBaseException as exc:
        category = _category(exc)
    raise DeploymentError(
        f"deployment config key {path!r} cannot be resolved: {category}; {_RESOLVE_FIX}"
    )


def _present(node: Any, key: Any) -> bool:
    if _is_list(node):
        return bool(0 <= key < len(node))
    return key in node.keys()  # noqa: SIM118  (`key in node` would resolve the value)


def _category(exc: BaseException) -> str:
    """Say what went wrong from the exception's class; its text is never shown (secrets)."""
    from omegaconf import errors

    if isinstance(exc, errors.GrammarParseError):
        return "it holds a malformed ${...} interpolation"
    if isinstance(exc, errors.InterpolationKeyError):
        return "it references a key that is not set"
    if isinstance(exc, errors.InterpolationToMissingValueError):
        return "it references a key whose value is ??? (not set)"
    if isinstance(exc, errors.UnsupportedInterpolationType):
        return "it uses a resolver trollout does not know"
    if isinstance(exc, errors.MissingMandatoryValue):
        return "it is ??? (not set)"
    text = str(exc)  # only matched against omegaconf's own wording, never shown
    if text.startswith('KeyError raised while resolving interpolation: "Environment variable'):
        return "an environment variable it references is not set"
    if text.startswith("Recursive interpolation"):
        return "it refers to itself (a circular interpolation)"
    return "its interpolation fails"


def _is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)


# --- server blocks -----------------------------------------------------------------------------


def _instance(root: Any, key: Any) -> Server | None:
    node = _peek(root, key)
    if not isinstance(node, Mapping) or len(node) != 1:
        return None
    [server_type] = node.keys()
    if server_type not in SERVER_TYPES:
        return None
    name = str(key)
    path = f"{name}.{server_type}"
    impls = _read(node, server_type, path)
    if not isinstance(impls, Mapping) or len(impls) != 1:
        raise _bad(path, "a mapping of exactly one implementation", impls)
    [implementation] = impls.keys()
    path = f"{path}.{implementation}"
    block = _read(impls, implementation, path)
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
    host, port = _read(block, "host", f"{path}.host"), _port(block, f"{path}.port")
    if not isinstance(host, str) or not host.strip():
        raise _bad(f"{path}.host", "a host name", host)
    if any(c in host for c in "/@?#") or any(c.isspace() for c in host.strip()):
        # "https://h" is the likely one; trollout speaks plain http:// to host:port.
        raise DeploymentError(
            f"deployment config key {path + '.host'!r} must be a bare host name (got a value "
            "with a scheme, path or credentials); trollout speaks plain http:// to host:port, "
            f"so give the host alone; {_FIX}"
        )
    host = host.strip()
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _port(block: Any, path: str) -> int:
    port = _read(block, "port", path)
    if isinstance(port, str) and port.isascii() and port.isdigit():
        port = int(port)  # ${oc.env:PORT,12047} is a string; NeMo Gym's int field takes it too
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise _bad(path, "a port 1..65535", port)
    return port


def _ref_name(block: Any, key: str, path: str) -> str | None:
    path = f"{path}.{key}"
    ref = _read(block, key, path)
    if ref is None:
        return None
    name = _read(ref, "name", f"{path}.name") if isinstance(ref, Mapping) else None
    if not isinstance(name, str) or not name:
        raise _bad(path, "a mapping {type, name}", ref)
    return name


def _datasets(block: Any, path: str) -> tuple[Dataset, ...]:
    from omegaconf import OmegaConf

    path = f"{path}.datasets"
    if OmegaConf.is_missing(block, "datasets"):
        return ()
    entries = _read(block, "datasets", path)
    if not _is_list(entries):
        return ()  # missing, a placeholder or not a list: declares nothing (as NeMo Gym reads it)
    return tuple(_dataset(entries, i, f"{path}[{i}]") for i in range(len(entries)))


def _dataset(entries: Any, index: int, path: str) -> Dataset:
    entry = _read(entries, index, path)
    name = _read(entry, "name", f"{path}.name") if isinstance(entry, Mapping) else None
    if not isinstance(name, str) or not name:
        raise _bad(path, "a mapping with a 'name'", entry)
    return Dataset(
        name=name,
        taskset=_opt_str(entry, "taskset", path),
        agent=_opt_str(entry, "agent", path),
        allowed_agents=_names(entry, "allowed_agents", path),
    )


def _opt_str(entry: Any, key: str, path: str) -> str | None:
    value = _read(entry, key, f"{path}.{key}")
    if value is not None and not isinstance(value, str):
        raise _bad(f"{path}.{key}", "a string", value)
    return value


def _names(entry: Any, key: str, path: str) -> frozenset[str] | None:
    """Read an ``allowed_agents`` list: a bare string is one entry, an empty list no limit."""
    path = f"{path}.{key}"
    value = _read(entry, key, path)
    if value is None:
        return None
    if isinstance(value, str):
        return frozenset({value})
    if not _is_list(value):
        raise _bad(path, "a list of agent types", value)
    names = [_read(value, i, f"{path}[{i}]") for i in range(len(value))]
    if not all(isinstance(n, str) for n in names):
        raise _bad(path, "a list of agent types", value)
    return frozenset(names) or None


def _bad(path: str, expected: str, value: Any) -> DeploymentError:
    return DeploymentError(
        f"deployment config key {path!r} must be {expected} (got {kind(value)}); {_FIX}"
    )
