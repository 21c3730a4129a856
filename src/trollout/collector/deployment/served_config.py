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

The collector's environment: a served config comes from whoever runs the head server, and
``${oc.env:NAME}`` would read NAME from trollout's own environment, where API keys and tokens
live; the value would then be looked up in DNS, printed and written into the run folder. So a
served config reads only the variables the user allows (`parse_servers`'s ``env_allow``: the
setting ``served_config_env_allow``, ``--allow-env NAME``; none by default). A variable not
allowed is treated as unset: ``${oc.env:X,default}`` takes its default, ``${oc.env:X}`` is
refused naming the key path and the setting. NeMo Gym's own server-side variables are resolved
on the servers, never here. An allowed variable may feed only a server's ``host`` and ``port``
(names, references and datasets are written into every row): elsewhere it is refused. A URL
built from one is shown by the interpolation text (`text.conceal`): ``http://${oc.env:H}:8000``
in every message, file and span, while trollout still connects to the real host.

Only omegaconf's own resolvers run (``oc.env`` under the rule above, ``oc.decode``,
``oc.select``, ...): a resolver some other code registered in this process (it might read files
or the environment) is refused as unknown.

Bounds: omegaconf resolves ``x1: ${x0}${x0}`` ... ``x40: ${x39}${x39}`` without memoising, so a
40-line config is 2**40 steps and a terabyte string. Reading one value may take at most
`MAX_RESOLUTION_STEPS` node interpolations and resolver calls, and no string it resolves through
may exceed `MAX_RESOLVED_CHARS`; past either it is refused naming the key path. The hooks are set
on the config objects this module creates (instance attributes over omegaconf's
``_resolve_node_interpolation`` and ``_evaluate_custom_resolver``), never on omegaconf's classes
or its global resolver table, so other users of omegaconf in the process are untouched.
``--config`` files and ``config_paths`` are read by `config.load_yaml`, not omegaconf: they
interpolate nothing.

Secrets: omegaconf's exceptions hold the node they were raised in (its repr shows sibling values
such as API keys), and some of their messages quote the value. So no omegaconf exception is ever
put in a message, kept, or chained: the `DeploymentError` is raised after the ``except`` block.

omegaconf is imported on first use, so a run given ``--agent-url`` never loads it.

Design note: the rejected alternative resolved ``${...}`` with a hand-written resolver. It would
have to match OmegaConf's grammar (nesting, quoting, escapes, relative keys, typed whole-value
interpolations but strings from ``oc.env``), and every difference is a wrong refusal or a wrong
host. Replacing ``oc.env`` in omegaconf's global resolver table was rejected too: it changes
every other user's configs in the process. Running resolution under a timer was rejected for the
bounds: a time limit depends on the machine's load; a count of steps does not.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any, Final

import attrs
from attrs import frozen

from ...errors import DeploymentError
from ...text import conceal, public_url

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
_FIX: Final = "fix the deployment config and restart it"
_RESOLVE_FIX: Final = "fix the deployment config"
_UNSET_ENV: Final = "an environment variable it references is not set"
MAX_RESOLUTION_STEPS: Final = 1_000  # interpolations and resolver calls to read one value
MAX_RESOLVED_CHARS: Final = 16_384  # the longest string resolved on the way (a host is < 256)
ENV_ALLOW_SETTING: Final = "served_config_env_allow"
# omegaconf's own resolvers; oc.env is read under the environment rule (module doc).
_RESOLVERS: Final = frozenset(
    {
        "oc.coerce",
        "oc.create",
        "oc.decode",
        "oc.deprecated",
        "oc.dict.keys",
        "oc.dict.values",
        "oc.env",
        "oc.select",
    }
)
_UNSET_NAME: Final = "=trollout: not allowed="  # no environment holds a name with "="
_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
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
    guard = _Guard(frozenset(env_allow))
    root = _create(cfg, guard)
    guard.texts = frozenset(_strings(root))
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


def _create(cfg: Mapping[str, Any], guard: _Guard) -> Any:
    from omegaconf import DictConfig, OmegaConf  # lazy: see the module doc
    from omegaconf.errors import OmegaConfBaseException

    try:
        # A DictConfig given is copied: the hooks go on this module's own objects only.
        plain = OmegaConf.to_container(cfg, resolve=False) if isinstance(cfg, DictConfig) else cfg
        root = OmegaConf.create(_plain(plain))
    except OmegaConfBaseException as exc:
        # Only names survive the block: the exception holds the config (see the module doc).
        where, category = getattr(exc, "full_key", None), _category(exc)
    else:
        guard.hook(root)
        return root
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

    Only a ``host`` or ``port`` may take its value from an (allowed) environment variable:
    `_read_connection` reads those.

    Raises:
        DeploymentError: the value is ``???``, cannot be resolved, passes the bounds, reads an
            environment variable not allowed, or anything but a host or port reads an allowed
            one (key path and category, no value).
    """
    value, env_names = _read_connection(node, key, path)
    if env_names:
        raise DeploymentError(
            f"deployment config key {path!r} takes its value from the environment (${{oc.env:"
            "...}); only a server's host and port may (names are written into every row); "
            f"{_RESOLVE_FIX}"
        )
    return value


def _read_connection(node: Any, key: Any, path: str) -> tuple[Any, list[str]]:
    """Return ``node[key]`` resolved (None when absent) and the allowed variables it read."""
    from omegaconf.errors import OmegaConfBaseException

    if not _present(node, key):
        return None, []
    guard: _Guard = vars(node)["_trollout_guard"]  # every config object here has one (hook)
    guard.start()
    try:
        value = node[key]
    except OmegaConfBaseException as exc:
        category = guard.refusal or _category(exc)
    else:
        if guard.refusal is None and not _too_long(value):
            return value, guard.env_read
        category = guard.refusal or guard.too_long()
    remedy = guard.remedy or ("set it, or " if category == _UNSET_ENV else "") + _RESOLVE_FIX
    raise DeploymentError(
        f"deployment config key {path!r} cannot be resolved: {category}; {remedy}"
    )


def _too_long(value: Any) -> bool:
    return isinstance(value, str) and len(value) > MAX_RESOLVED_CHARS


def _strings(node: Any) -> Iterator[str]:
    """Yield the config's string values as written (interpolations unresolved)."""
    from omegaconf import OmegaConf

    plain = OmegaConf.to_container(node, resolve=False)
    todo = [plain]
    while todo:
        item = todo.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, Mapping):
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)


class _Guard:
    """The bounds and the environment rule, enforced while one value is read (module doc).

    ``start`` resets the count before each read; a hook that refuses records why
    (``refusal``, ``remedy``) and raises, and `_read_connection` reports the record, since
    omegaconf may wrap or swallow what a hook raises.
    """

    def __init__(self, allow: frozenset[str]) -> None:
        self.allow = allow
        self.texts: frozenset[str] = frozenset()
        self.start()

    def start(self) -> None:
        self.steps = 0
        self.env_read: list[str] = []
        self.refusal: str | None = None
        self.remedy: str | None = None

    def hook(self, root: Any) -> None:
        """Set the counting hooks on every config object under ``root``."""
        from omegaconf import Container

        todo = [root]
        while todo:
            container = todo.pop()
            if "_trollout_guard" in vars(container):
                continue
            _set(container, "_trollout_guard", self)
            _set(container, "_resolve_node_interpolation", self._node_hook(container))
            _set(container, "_evaluate_custom_resolver", self._resolver_hook(container))
            keys = range(len(container)) if _is_list(container) else list(container.keys())
            for key in keys:
                child = container._get_node(key)
                if isinstance(child, Container):
                    todo.append(child)

    def _node_hook(self, container: Any) -> Callable[..., Any]:
        original = type(container)._resolve_node_interpolation

        def resolve_node(*args: Any, **kwargs: Any) -> Any:
            self._step()
            node = original(container, *args, **kwargs)
            self._check(node)
            return node

        return resolve_node

    def _resolver_hook(self, container: Any) -> Callable[..., Any]:
        original = type(container)._evaluate_custom_resolver

        def evaluate(**kwargs: Any) -> Any:  # omegaconf calls it with keywords only
            self._step()
            inter_type = kwargs["inter_type"]
            if inter_type not in _RESOLVERS:
                self._refuse("it uses a resolver trollout does not know")
            if inter_type == "oc.env":
                kwargs["inter_args"] = self._env_args(tuple(kwargs["inter_args"]))
            result = original(container, **kwargs)
            self._check(result)
            return result

        return evaluate

    def _env_args(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        name = args[0] if args else None
        if name in self.allow:
            self.env_read.append(name)
            return args
        if len(args) > 1:  # not allowed reads as unset: omegaconf's own default rule applies
            return (_UNSET_NAME, *args[1:])
        shown = self._shown_name(name)
        self.remedy = (
            f"allow it with --allow-env {shown} (+{ENV_ALLOW_SETTING}=[{shown}]) if the head "
            "server may read it, or give the interpolation a default"
        )
        said = f"environment variable {shown!r}" if shown != "NAME" else "an environment variable"
        self._refuse(
            f"it reads {said} of trollout's own environment, and a served config may read "
            "only the variables you allow"
        )
        raise AssertionError("unreachable")  # pragma: no cover

    def _shown_name(self, name: Any) -> str:
        """Name a variable only when the config spells it out (a computed name may be data)."""
        spelled = isinstance(name, str) and _ENV_NAME.fullmatch(name) is not None
        if spelled and any(f"oc.env:{name}" in text for text in self.texts):
            return str(name)
        return "NAME"

    def _step(self) -> None:
        self.steps += 1
        if self.steps > MAX_RESOLUTION_STEPS:
            self._refuse(
                f"it takes more than {MAX_RESOLUTION_STEPS:,} interpolation steps to resolve "
                "(an exponential chain such as x1: ${x0}${x0})"
            )
        if self.refusal is not None:  # omegaconf swallowed a refusal (oc.select): stop again
            raise _RefusedError(self.refusal)

    def _check(self, result: Any) -> None:
        from omegaconf import Container

        value = result._value() if hasattr(result, "_value") else result
        if _too_long(value):
            self._refuse(self.too_long())
        if isinstance(result, Container):
            self.hook(result)  # made by a resolver (oc.create): bounded like the rest

    def too_long(self) -> str:
        return (
            f"a string it resolves to or through is longer than {MAX_RESOLVED_CHARS:,} characters"
        )

    def _refuse(self, why: str) -> None:
        if self.refusal is None:
            self.refusal = why
        raise _RefusedError(why)


class _RefusedError(Exception):
    """Raised by a hook; its reason is kept on the `_Guard` (omegaconf wraps exceptions)."""


def _set(container: Any, name: str, value: Any) -> None:
    object.__setattr__(container, name, value)  # a DictConfig's setattr would set a key


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
        return _UNSET_ENV
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
    """Return the block's ``http://host:port``; one read from the environment is concealed."""
    host, host_env = _read_connection(block, "host", f"{path}.host")
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
            f"so give the host alone; {_FIX}"
        )
    host = host.strip()
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _port(block: Any, path: str) -> tuple[int, list[str]]:
    port, env_names = _read_connection(block, "port", path)
    if isinstance(port, str) and port.isascii() and port.isdigit():
        port = int(port)  # ${oc.env:PORT,12047} is a string; NeMo Gym's int field takes it too
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise _bad(path, "a port 1..65535", port)
    return port, env_names


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
