"""OmegaConf under guards: the served config's values read safely, one at a time.

`served_config` finds the server blocks and asks this module for each value it reads
(`read`, `read_connection`), through a `Guard` made per config (`create`).

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
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final

from ...errors import DeploymentError

__all__ = [
    "ENV_ALLOW_SETTING",
    "FIX",
    "MAX_RESOLUTION_STEPS",
    "MAX_RESOLVED_CHARS",
    "Guard",
    "create",
    "is_list",
    "peek",
    "read",
    "read_connection",
    "strings",
]

FIX: Final = "fix the deployment config and restart it"
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


def create(cfg: Mapping[str, Any], guard: Guard) -> Any:
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
    raise DeploymentError(f"{subject} cannot be loaded: {category}; {FIX}")


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


def peek(node: Any, key: Any) -> Any:
    """Return ``node[key]`` when it is a plain value, None for an interpolation or ``???``."""
    from omegaconf import OmegaConf

    if OmegaConf.is_interpolation(node, key) or OmegaConf.is_missing(node, key):
        return None
    return node[key]


def read(node: Any, key: Any, path: str) -> Any:
    """Return ``node[key]`` resolved, or None when it is absent.

    Only a ``host`` or ``port`` may take its value from an (allowed) environment variable:
    `read_connection` reads those.

    Raises:
        DeploymentError: the value is ``???``, cannot be resolved, passes the bounds, reads an
            environment variable not allowed, or anything but a host or port reads an allowed
            one (key path and category, no value).
    """
    value, env_names = read_connection(node, key, path)
    if env_names:
        raise DeploymentError(
            f"deployment config key {path!r} takes its value from the environment (${{oc.env:"
            "...}); only a server's host and port may (names are written into every row); "
            f"{_RESOLVE_FIX}"
        )
    return value


def read_connection(node: Any, key: Any, path: str) -> tuple[Any, list[str]]:
    """Return ``node[key]`` resolved (None when absent) and the allowed variables it read."""
    from omegaconf.errors import OmegaConfBaseException

    if not _present(node, key):
        return None, []
    guard: Guard = vars(node)["_trollout_guard"]  # every config object here has one (hook)
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


def strings(node: Any) -> Iterator[str]:
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


class Guard:
    """The bounds and the environment rule, enforced while one value is read (module doc).

    ``start`` resets the count before each read; a hook that refuses records why
    (``refusal``, ``remedy``) and raises, and `read_connection` reports the record, since
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
            keys = range(len(container)) if is_list(container) else list(container.keys())
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
    """Raised by a hook; its reason is kept on the `Guard` (omegaconf wraps exceptions)."""


def _set(container: Any, name: str, value: Any) -> None:
    object.__setattr__(container, name, value)  # a DictConfig's setattr would set a key


def _present(node: Any, key: Any) -> bool:
    if is_list(node):
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


def is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)
