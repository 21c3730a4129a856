"""The settings of ``trollout aggregate``: defaults < ``+config_paths`` files < the command line.

NeMo Gym's ``RolloutAggregationConfig`` keys and trollout's own, each with its expected type
(`_SETTINGS`); keys trollout handles its own way, or lacks, are taken by `nemo_keys.translate`
first. A setting given twice on the command line (an option and its ``+key``) is refused, as
for collect (`nemo_keys.command_line`). The inputs are the command line's (INPUT, ``-i``,
``+input_glob``) or else a config file's ``input_glob``. Settings knowledge: the settings
package may take this table over; the command (`aggregate`) only calls `_settings`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from ..config import DEFAULT_MAX_INPUT_LINE_BYTES, parse_override
from ..errors import ConfigError
from ..metrics.server import Target
from ..nemo_keys import AGGREGATE, BY_NAME, command_line, merge_config_paths, translate
from ..text import visible

__all__ = ["_settings"]


def _strs(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _bool(value: Any) -> bool:
    return isinstance(value, bool)


# The settings `aggregate` takes as +key=value (NeMo Gym's RolloutAggregationConfig and more),
# each with its expected type; NeMo Gym keys trollout handles its own way, or lacks, are
# taken by `nemo_keys.translate` first.
_SETTINGS: dict[str, tuple[str, Any]] = {
    "input_glob": ("a glob, or a list of globs", lambda v: isinstance(v, str) or _strs(v)),
    "output_jsonl_fpath": ("a path", lambda v: v is None or isinstance(v, str)),
    "count_failure_classes_as_zero": (
        "a list of failure classes",
        lambda v: v is None or isinstance(v, str) or _strs(v),
    ),
    "count_missing_rollouts_as_zero": ("true or false", lambda v: v is None or _bool(v)),
    "merge_shards": ("true or false", _bool),
    "materialized_inputs_jsonl_fpath": ("a path", lambda v: v is None or isinstance(v, str)),
    "retry_terminal_timeouts": ("true or false", _bool),
    "batch_manifest_fpath": ("a path", lambda v: v is None or isinstance(v, str)),
    "head_server": ("a URL or {host, port}", lambda v: v is None or isinstance(v, str | dict)),
    "served_config_env_allow": ("a list of environment variable names", _strs),
    "seed": ("an integer", lambda v: v is None or (type(v) is int and v >= 0)),
    "max_input_line_bytes": ("an integer >= 1", lambda v: type(v) is int and v >= 1),
    "overwrite": ("true or false", _bool),
}
_PATH_KEYS = frozenset(
    {"input_glob", "output_jsonl_fpath", "materialized_inputs_jsonl_fpath", "batch_manifest_fpath"}
)


def _settings(args: Sequence[str], opts: dict[str, Any]) -> dict[str, Any]:
    """Merge defaults, config_paths files and the command line, later winning.

    A setting given twice on the command line (an option and its ``+key``) is refused, as for
    collect (`nemo_keys.command_line`).
    """
    overrides = [token for token in args if token.startswith("+")]
    line = command_line(_given(opts), overrides, _LABELS, parse=_override)
    tokens = {key: value for key, (value, label) in line.items() if label == f"+{key}"}
    found = _config_files(tokens)
    values = _DEFAULTS | found | {key: value for key, (value, _) in line.items()}
    values, notes = translate(values, AGGREGATE)
    values.pop("config_paths", None)
    for note in notes:
        click.echo(f"trollout: note: {visible(note)}", err=True)
    unknown = sorted(values.keys() - _SETTINGS.keys())
    if unknown:
        raise ConfigError(f"unknown aggregate setting {unknown[0]!r}; known: {sorted(_SETTINGS)}")
    for key, (expected, accepts) in _SETTINGS.items():
        if key in values and not accepts(values[key]):
            _refuse(key, values[key], expected)
    inputs = _inputs(args, opts, tokens, found)
    return {**opts, **values, "inputs": inputs, "targets": _targets(opts)}


_DEFAULTS: dict[str, Any] = {
    "count_failure_classes_as_zero": None,
    "count_missing_rollouts_as_zero": None,
    "output_jsonl_fpath": None,
    "head_server": None,
    "served_config_env_allow": [],
    "max_input_line_bytes": DEFAULT_MAX_INPUT_LINE_BYTES,
    "seed": None,
    "merge_shards": True,
    "materialized_inputs_jsonl_fpath": None,
    "retry_terminal_timeouts": False,
    "batch_manifest_fpath": None,
    "overwrite": False,
}


# How the options that set a setting are spelled, where it is not --the-key.
_LABELS: dict[str, str] = {
    "output_jsonl_fpath": "-o/--output",
    "served_config_env_allow": "--allow-env",
    "max_input_line_bytes": "--max-line-bytes",
}


def _config_files(tokens: dict[str, Any]) -> dict[str, Any]:
    """Return the aggregate settings of the ``+config_paths`` files (none without it)."""
    if "config_paths" not in tokens:
        return {}
    paths = tokens["config_paths"]
    if not BY_NAME["config_paths"].accepts(paths):
        _refuse("config_paths", paths, BY_NAME["config_paths"].expected)
    return merge_config_paths(paths, AGGREGATE)


def _given(opts: dict[str, Any]) -> dict[str, Any]:
    """Return the settings given as command-line options (an option not given sets nothing)."""
    classes = [c.strip() for text in opts["zero_classes"] for c in text.split(",") if c.strip()]
    given = {
        "count_failure_classes_as_zero": classes or None,
        "count_missing_rollouts_as_zero": opts["zero_missing"],
        "output_jsonl_fpath": opts["output"],
        "head_server": opts["head_server"],
        "served_config_env_allow": list(opts.get("allow_env", ())) or None,
        "seed": opts["seed"],
        "max_input_line_bytes": opts.get("max_line_bytes"),
        "overwrite": opts["overwrite"],
    }
    return {k: v for k, v in given.items() if v is not None}


def _inputs(
    args: Sequence[str], opts: dict[str, Any], tokens: dict[str, Any], found: dict[str, Any]
) -> list[str]:
    """Return the command line's inputs, or else a config file's ``input_glob``."""
    inputs = [a for a in args if not a.startswith("+")] + list(opts["inputs"])
    inputs += _globs(tokens.get("input_glob"))
    if not inputs:
        inputs = _globs(found.get("input_glob"))
    elif "input_glob" in found and "input_glob" not in tokens:
        click.echo(
            f"trollout: note: the config_paths input_glob {visible(repr(found['input_glob']))} "
            "is not used: INPUT on the command line replaces it",
            err=True,
        )
    if not inputs:
        raise ConfigError("no INPUT given; pass a glob such as 'shards/*.jsonl' or +input_glob=...")
    return inputs


def _globs(value: Any) -> list[str]:
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]


def _refuse(key: str, value: Any, expected: str) -> None:
    raise ConfigError(f"{key} must be {expected} (got {value!r}); fix the value or drop it")


def _override(token: str) -> tuple[str, Any]:
    """Parse ``+key=value``; a path or glob is taken as written (it may hold commas)."""
    key, _, raw = token.lstrip("+").partition("=")
    if key.strip() in _PATH_KEYS and raw and raw[0] not in "[{'\"":
        return key.strip(), raw
    return parse_override(token)


def _targets(opts: dict[str, Any]) -> list[Target]:
    out: list[Target] = []
    for kind, pairs in (("agent", opts["agent_urls"]), ("env", opts["env_urls"])):
        for pair in pairs:
            name, sep, url = pair.partition("=")
            if not sep or not name or not url.startswith(("http://", "https://")):
                raise ConfigError(f"expected NAME=http://host:port, got {pair!r}")
            out.append((name, None, url) if kind == "agent" else (None, name, url))
    return out
