"""The settings of ``trollout aggregate``: defaults < ``+config_paths`` files < the command line.

The settings themselves (NeMo Gym's ``RolloutAggregationConfig`` keys and trollout's own, their
types and defaults) are rows of `trollout.settings` (`load_aggregate_settings`); this module maps
the command's options onto those keys, refuses unknown health check ids, and finds the inputs:
the command line's (INPUT, ``-i``, ``+input_glob``) or else a config file's ``input_glob``. The
command (`aggregate`) only calls `_settings`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from ..errors import ConfigError
from ..health import KEYS as HEALTH_KEYS
from ..health import HealthSettings
from ..metrics.server import Target
from ..settings import load_aggregate_settings
from ..text import visible

__all__ = ["_settings"]


def _settings(args: Sequence[str], opts: dict[str, Any]) -> dict[str, Any]:
    """Merge defaults, config_paths files and the command line (`load_aggregate_settings`)."""
    overrides = [token for token in args if token.startswith("+")]
    loaded = load_aggregate_settings(_given(opts), overrides, _LABELS)
    for note in loaded.notes:
        click.echo(f"trollout: note: {visible(note)}", err=True)
    HealthSettings.from_values(loaded.values)  # unknown health check ids: refused here
    inputs = _inputs(args, opts, loaded.tokens, loaded.files)
    return {**opts, **loaded.values, "inputs": inputs, "targets": _targets(opts)}


# How the options that set a setting are spelled, where it is not --the-key.
_LABELS: dict[str, str] = {
    "output_jsonl_fpath": "-o/--output",
    "served_config_env_allow": "--allow-env",
    "max_input_line_bytes": "--max-line-bytes",
}


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
        **{key: opts.get(key) for key in HEALTH_KEYS},
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


def _targets(opts: dict[str, Any]) -> list[Target]:
    out: list[Target] = []
    for kind, pairs in (("agent", opts["agent_urls"]), ("env", opts["env_urls"])):
        for pair in pairs:
            name, sep, url = pair.partition("=")
            if not sep or not name or not url.startswith(("http://", "https://")):
                raise ConfigError(f"expected NAME=http://host:port, got {pair!r}")
            out.append((name, None, url) if kind == "agent" else (None, name, url))
    return out
