"""The one loader of a run's settings, for the command line and the public API alike.

`load_run_config` is what ``trollout collect`` (and resume, resubmit, demo, sbatch, Ray) and
`trollout.load_config` call: the same arguments give the same `RunConfig` or the same
`ConfigError`, NeMo Gym keys (`keys.translate`), ``config_paths`` and
``materialized_jsonl_fpath`` included. `load_aggregate_settings` is ``trollout aggregate``'s,
over the same sources and NeMo Gym keys, checked against `aggregation.AGGREGATE_SETTINGS`.
A resumed run's saved settings are read by the caller (the run folder's manifest) and passed
in as ``saved``: this package reads no run folder.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from attrs import frozen

from ..errors import ConfigError
from .aggregation import AGGREGATE_BY_NAME, AGGREGATE_DEFAULTS, AGGREGATE_PATH_KEYS
from .build import build_config
from .keys import AGGREGATE, BY_NAME, COLLECT, check_type, translate
from .record import FIELD_NAMES, RunConfig
from .syntax import parse_override, read_settings_file

__all__ = [
    "ALTERNATIVES",
    "NEEDS",
    "AggregateSettings",
    "command_line",
    "load_aggregate_settings",
    "load_config",
    "load_run_config",
    "merge_config_paths",
]

# --- collect: config_paths and the sources ------------------------------------------------------
#
# Design note: the sources of a run's settings meet here, once, for every command that builds a
# `RunConfig` (collect, resume, resubmit, demo, sbatch, Ray). They are layers, lowest first:
# `defaults`, the ``config_paths`` files, the ``--config`` file, a resumed run's saved settings,
# the command line. The rule (docs/user-guide.md, "Collecting") is that two sources for one
# setting are an error unless the docs say which wins, and they say exactly this:
#
# - across layers, the higher wins, key by key, and a higher layer's key also replaces a lower
#   layer's other spelling of the same setting (`ALTERNATIVES`), with one note line saying so
#   (``--agent-url`` on the command line replaces a ``head_server`` from ``config_paths``);
# - within a layer, one setting given twice is an error naming both: an option and its
#   ``+key`` (``-o`` and ``+output_jsonl_fpath``), a ``+key`` twice, two spellings of one
#   setting (``--agent`` and ``+agent_map``, ``--agent-url`` and ``--head-server``); a YAML file
#   cannot hold a key twice (`syntax.load_yaml`), and ``--agent-url`` cannot name an agent twice;
# - a setting that does nothing without another (`NEEDS`: ``--drain-margin`` without
#   ``--budget``) is an error naming both.
#
# Rejected: checking each pair in the command that has it (collect's options, resume's, sbatch's
# copy of collect's), which is how ``+output_jsonl_fpath`` came to beat ``-o`` unseen; and
# making every cross-layer repetition an error, which would refuse a resume given a new
# ``--head-server`` (the saved one is what it replaces) and a NeMo Gym config whose values the
# command line adjusts, the layering every Hydra user relies on.

# Two keys that decide one setting: (key, other key, what both decide, the remedy).
ALTERNATIVES: Final = (
    (
        "agent_name",
        "agent_map",
        "which agent runs the rows",
        "--agent X is +agent_map={_default:X}",
    ),
    (
        "agent_urls",
        "head_server",
        "where the deployment is",
        "--agent-url to reach the agents directly, or --head-server to discover them",
    ),
)
# A key that does nothing without another: key -> (the other key, its option, what the key does).
NEEDS: Final = {
    "drain_margin_s": (
        "dispatch_budget_s",
        "--budget",
        "stops starting rollouts that long before the dispatch budget ends",
    ),
}
_COMMAND_LINE: Final = "the command line"


def command_line(
    options: Mapping[str, Any],
    overrides: Iterable[str],
    labels: Mapping[str, str] | None = None,
    *,
    parse: Callable[[str], tuple[str, Any]] = parse_override,
) -> dict[str, tuple[Any, str]]:
    """Return the command line's settings, each with how it was given (``-o``, ``+key``).

    Args:
        options: settings from options (None values are left out), by key.
        overrides: ``+key=value`` tokens.
        labels: how each option is spelled (``{"output_jsonl_fpath": "-o/--output"}``);
            ``--key`` otherwise.
        parse: parses one token (a command may take paths as written).

    Raises:
        ConfigError: a setting given twice (an option and its ``+key``, or ``+key`` twice),
            naming both; or a bad token.
    """
    labels = labels or {}
    line = {
        key: (value, labels.get(key, "--" + key.replace("_", "-")))
        for key, value in options.items()
        if value is not None
    }
    for token in overrides:
        key, value = parse(token)
        if key in line:
            raise ConfigError(
                f"{key} is given twice on the command line ({line[key][1]} and +{key}); "
                "give it once"
            )
        line[key] = (value, f"+{key}")
    return line


def load_run_config(
    *,
    config_file: str | os.PathLike[str] | None = None,
    options: Mapping[str, Any] | None = None,
    overrides: Iterable[str] = (),
    defaults: Mapping[str, Any] | None = None,
    saved: Mapping[str, Any] | None = None,
    labels: Mapping[str, str] | None = None,
) -> tuple[RunConfig, list[str]]:
    """Build a collection's `RunConfig` from every source, NeMo Gym keys included.

    Sources, lowest first (the design note above): ``defaults`` < ``config_paths`` files <
    ``config_file`` < ``saved`` (a resumed run's settings) < the command line (``options``
    and ``overrides``, one layer).

    Args:
        labels: how each option is spelled, for messages (`command_line`).

    Returns:
        The config and the notes to show (one per own-way key given, one per setting a higher
        source replaced under another key).

    Raises:
        ConfigError: as `translate` and `build.build_config`, naming the key; a setting given
            twice within one source, or set without the one it needs, naming both.
    """
    line = command_line(options or {}, overrides, labels)
    layers: list[tuple[str, Mapping[str, Any]]] = [("the defaults", defaults or {})]
    from_file = read_settings_file(config_file) if config_file is not None else {}
    top = {**from_file, **{key: value for key, (value, _) in line.items()}}
    if "config_paths" in top:
        check_type(BY_NAME["config_paths"], top["config_paths"])
        layers.append(("config_paths", merge_config_paths(top["config_paths"], COLLECT)))
    if config_file is not None:
        layers.append((f"config file {str(config_file)!r}", from_file))
    layers.append(("the run's saved settings", saved or {}))
    values: dict[str, Any] = {}
    given: dict[str, tuple[int, str]] = {}  # key -> (its layer, how it was given)
    for rank, (name, layer) in enumerate(layers):
        for key, value in layer.items():
            values[key] = value
            given[key] = (rank, f"{key} from {name}")
    for key, (value, label) in line.items():
        values[key] = value
        given[key] = (len(layers), label)
    notes = _one_source_each(values, given)
    values, own_way = translate(values, COLLECT)
    values.pop("config_paths", None)
    config = build_config(values)  # values are checked before what they combine into
    _check_needs(config, given)
    return config, own_way + notes


def _one_source_each(values: dict[str, Any], given: Mapping[str, tuple[int, str]]) -> list[str]:
    """Apply `ALTERNATIVES` to the merged settings; return the notes."""
    notes = []
    for key, other, what, remedy in ALTERNATIVES:
        if not (_is_set(values.get(key)) and _is_set(values.get(other))):
            continue
        (rank, label), (other_rank, other_label) = given[key], given[other]
        if rank == other_rank:
            raise ConfigError(f"{label} and {other_label} both set {what}; give one ({remedy})")
        low, high = (key, other) if rank < other_rank else (other, key)
        notes.append(f"{given[high][1]} replaces {given[low][1]} (both set {what})")
        del values[low]
    return notes


def _check_needs(config: RunConfig, given: Mapping[str, tuple[int, str]]) -> None:
    """Refuse a setting that would do nothing without the one it needs (`NEEDS`)."""
    for key, (needed, option, what) in NEEDS.items():
        if getattr(config, key) is not None and getattr(config, needed) is None:
            raise ConfigError(
                f"{given[key][1]} {what}, but {option} (+{needed}) is not set, so it would do "
                f"nothing; give {option} too, or drop it"
            )


def _is_set(value: Any) -> bool:
    return value is not None and value != {} and value != []


def merge_config_paths(paths: str | list[str], command: str) -> dict[str, Any]:
    """Merge YAML files in order (later wins, mappings deeply); keep the command's settings.

    Server blocks and deployment settings in the files are the deployment's (trollout finds
    the servers through the head server), so only keys that are settings of ``command`` are
    kept.

    Raises:
        ConfigError: a file cannot be read or is not a mapping.
    """
    merged: dict[str, Any] = {}
    for path in [paths] if isinstance(paths, str) else paths:
        _deep_merge(merged, read_settings_file(path, what="config_paths file"))
    fields = FIELD_NAMES if command == COLLECT else frozenset()
    return {
        k: v
        for k, v in merged.items()
        if k != "config_paths"
        and (k in fields or (k in BY_NAME and command in BY_NAME[k].commands))
    }


def _deep_merge(into: dict[str, Any], other: Mapping[str, Any]) -> None:
    for key, value in other.items():
        old = into.get(key)
        if isinstance(old, dict) and isinstance(value, Mapping):
            _deep_merge(old, value)
        else:
            into[key] = dict(value) if isinstance(value, Mapping) else value


def load_config(
    *,
    config_file: str | os.PathLike[str] | None = None,
    options: Mapping[str, Any] | None = None,
    overrides: Iterable[str] = (),
    defaults: Mapping[str, Any] | None = None,
    saved: Mapping[str, Any] | None = None,
    labels: Mapping[str, str] | None = None,
) -> RunConfig:
    """Build a validated `RunConfig` from every source, as the command line does.

    `load_run_config` without its notes (the lines a command prints about own-way keys and
    replaced settings): the same sources, the same NeMo Gym keys, the same errors.

    Args:
        config_file: a YAML file of settings (NeMo Gym key names; ``config_paths`` too).
        options: settings given as options (None values are left out).
        overrides: ``+key=value`` tokens.
        defaults: settings below all of these (a command's own defaults).
        saved: a resumed run's settings, below the options and overrides.
        labels: how each option is spelled, for messages.

    Raises:
        ConfigError: a file that cannot be read, an unknown key, or a bad value, naming it.
    """
    config, _ = load_run_config(
        config_file=config_file,
        options=options,
        overrides=overrides,
        defaults=defaults,
        saved=saved,
        labels=labels,
    )
    return config


# --- aggregate ----------------------------------------------------------------------------------


@frozen
class AggregateSettings:
    """``trollout aggregate``'s settings, merged and checked.

    Attributes:
        values: every setting of `AGGREGATE_SETTINGS` given or defaulted, by key.
        notes: one line per own-way NeMo Gym key given.
        tokens: the settings given as ``+key=value`` (INPUT and ``+input_glob`` combine).
        files: the settings of the ``+config_paths`` files (their ``input_glob`` is used only
            without an INPUT on the command line).
    """

    values: dict[str, Any]
    notes: list[str]
    tokens: dict[str, Any]
    files: dict[str, Any]


def load_aggregate_settings(
    options: Mapping[str, Any], overrides: Sequence[str], labels: Mapping[str, str]
) -> AggregateSettings:
    """Merge defaults, ``+config_paths`` files and the command line, later winning.

    A setting given twice on the command line (an option and its ``+key``) is refused, as for
    collect (`command_line`).

    Raises:
        ConfigError: a setting given twice, an unknown key or a value of the wrong type.
    """
    line = command_line(options, overrides, labels, parse=parse_aggregate_override)
    tokens = {key: value for key, (value, label) in line.items() if label == f"+{key}"}
    files = _aggregate_files(tokens)
    values = AGGREGATE_DEFAULTS | files | {key: value for key, (value, _) in line.items()}
    values, notes = translate(values, AGGREGATE)
    values.pop("config_paths", None)
    unknown = sorted(values.keys() - AGGREGATE_BY_NAME.keys())
    if unknown:
        known = sorted(AGGREGATE_BY_NAME)
        raise ConfigError(f"unknown aggregate setting {unknown[0]!r}; known: {known}")
    for key, setting in AGGREGATE_BY_NAME.items():
        if key in values and not setting.accepts(values[key]):
            _refuse(key, values[key], setting.expected)
    return AggregateSettings(values, notes, tokens, files)


def _aggregate_files(tokens: Mapping[str, Any]) -> dict[str, Any]:
    """Return the aggregate settings of the ``+config_paths`` files (none without it)."""
    if "config_paths" not in tokens:
        return {}
    paths = tokens["config_paths"]
    if not BY_NAME["config_paths"].accepts(paths):
        _refuse("config_paths", paths, BY_NAME["config_paths"].expected)
    return merge_config_paths(paths, AGGREGATE)


def _refuse(key: str, value: Any, expected: str) -> None:
    raise ConfigError(f"{key} must be {expected} (got {value!r}); fix the value or drop it")


def parse_aggregate_override(token: str) -> tuple[str, Any]:
    """Parse ``+key=value``; a path or glob is taken as written (it may hold commas)."""
    key, _, raw = token.lstrip("+").partition("=")
    if key.strip() in AGGREGATE_PATH_KEYS and raw and raw[0] not in "[{'\"":
        return key.strip(), raw
    return parse_override(token)
