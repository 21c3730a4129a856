"""Every NeMo Gym 0.7.0 collection setting, and what trollout does with it: one table.

NeMo Gym users keep their launch scripts: every key of ``RolloutCollectionConfig``,
``SharedRolloutCollectionConfig``, ``E2ERolloutCollectionConfig``, ``RolloutAggregationConfig``
and their mixins (``config_paths``, ``upload_rollouts``) is accepted by ``trollout collect``
(and, for the aggregation keys, ``trollout aggregate``) in one of three ways (`Handling`):

- **implemented**: it changes what trollout does. Most are `config.RunConfig` fields under the
  same name (checked there); a few are read here: ``config_paths`` (YAML files merged in order,
  later wins, mappings merged deeply as OmegaConf does, below every other source; only the
  keys that are collection settings are taken, server blocks are the deployment's) and
  ``materialized_jsonl_fpath`` (always ``<stem>_materialized_inputs.jsonl`` beside the output,
  as in NeMo Gym, where it is derived: another path is refused).
- **own way**: accepted with one line saying how trollout already does it.
- **unsupported**: a subsystem trollout does not have (skills, uploads, E2E
  serving and data preparation, custom drivers): accepted at the value that asks for nothing,
  otherwise refused in one line saying what is not supported and what to do instead.

A value of the wrong type is refused naming the key and the expected type, before anything is
written. `KEYS` is the table; `differences` lists, for a run summary, where trollout
deliberately differs from NeMo Gym for the settings in force.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from attrs import frozen

from .config import (
    FIELD_NAMES,
    RunConfig,
    SeedMode,
    build_config,
    parse_override,
    read_settings_file,
)
from .errors import ConfigError
from .health.after import HealthSettings
from .recovery.layout import RunLayout

__all__ = [
    "AGGREGATE",
    "ALTERNATIVES",
    "COLLECT",
    "KEYS",
    "NEEDS",
    "Handling",
    "NemoKey",
    "command_line",
    "differences",
    "load_run_config",
    "merge_config_paths",
    "translate",
]

COLLECT: Final = "collect"
AGGREGATE: Final = "aggregate"
_BOTH: Final = frozenset({COLLECT, AGGREGATE})
_RUN: Final = frozenset({COLLECT})


class Handling(enum.Enum):
    """What trollout does with a NeMo Gym key."""

    IMPLEMENTED = "implemented"  # changes what trollout does
    OWN_WAY = "own way"  # accepted; one line says how trollout already does it
    UNSUPPORTED = "unsupported"  # accepted at the value asking for nothing, else refused


def _any(value: Any) -> bool:
    return True


def _flag(value: Any) -> bool:
    return isinstance(value, bool)


def _true(value: Any) -> bool:
    return value is True


def _false(value: Any) -> bool:
    return value is False


def _none(value: Any) -> bool:
    return value is None


def _empty(value: Any) -> bool:
    return value is None or value == []


def _optional_str(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _optional_count(value: Any) -> bool:
    return value is None or (type(value) is int and value >= 1)


@frozen
class NemoKey:
    """One NeMo Gym setting and trollout's handling of it.

    Attributes:
        name: the key, as NeMo Gym spells it.
        handling: implemented, own way, or unsupported.
        commands: the trollout commands that take it (``collect``, ``aggregate``).
        expected: its type, for messages.
        accepts: whether a value has that type (keys read here; RunConfig checks its own).
        inert: for an unsupported or own-way key, the values trollout accepts.
        text: own way: the line shown; unsupported: what is not supported and the remedy.
        field: the key is a `RunConfig` field (collect) or an aggregate setting of that name.
        wrong: a value of the wrong type (the tests walk the table with it).
    """

    name: str
    handling: Handling
    commands: frozenset[str]
    expected: str
    accepts: Callable[[Any], bool] = _any
    inert: Callable[[Any], bool] = _any
    text: str = ""
    field: bool = True
    wrong: Any = "not-a-valid-value"


def _implemented(name: str, expected: str, wrong: Any, commands: frozenset[str] = _RUN) -> NemoKey:
    return NemoKey(name, Handling.IMPLEMENTED, commands, expected, wrong=wrong)


def _unsupported(
    name: str,
    expected: str,
    accepts: Callable[[Any], bool],
    inert: Callable[[Any], bool],
    what: str,
    wrong: Any,
    commands: frozenset[str] = _RUN,
) -> NemoKey:
    return NemoKey(
        name, Handling.UNSUPPORTED, commands, expected, accepts, inert, what, False, wrong
    )


_E2E: Final = (
    "trollout collects from a running deployment (gym eval run --no-serve); it does not serve "
    "servers or prepare datasets: prepare the split with NeMo Gym, then pass its JSONL as INPUT"
)
_FLAG = "true or false"
_SECONDS = "a number of seconds"
_COUNT = "an integer"
_FRACTION = "a number from 0 to 1"
_PATH = "a path"

KEYS: Final[tuple[NemoKey, ...]] = (
    # RolloutCollectionConfig
    _implemented("agent_map", "a mapping of names to agent names", {"a": [1, 2]}),
    _implemented("agent_name", "an agent name (a string)", [1]),
    _implemented("allow_unsafe_resume", _FLAG, "yes"),
    _implemented("dispatch_all_started_within_s", _SECONDS, "soon"),
    _implemented("dispatch_budget_s", _SECONDS, "soon"),
    _implemented("dispatch_connect_grace_s", _SECONDS, "soon"),
    _implemented("dispatch_longest_first", _FLAG, "yes"),
    _implemented("dispatch_start_report_min_fraction", _FRACTION, "most"),
    _implemented("dispatch_start_report_within_s", _SECONDS, "soon"),
    _implemented("drain_margin_s", _SECONDS, "soon"),
    _implemented("fan_out", "a mapping of names to lists of agent names", {"x": "a"}),
    _implemented("input_jsonl_fpath", _PATH, [1]),
    _implemented("interleave_repeats", _FLAG, "yes"),
    _implemented("limit", _COUNT, "ten"),
    _implemented("long_rollout_max_fraction", _FRACTION, "most"),
    _implemented("long_rollout_s", _SECONDS, "soon"),
    NemoKey(
        "materialized_jsonl_fpath",
        Handling.IMPLEMENTED,
        _RUN,
        _PATH,
        lambda v: isinstance(v, str),
        field=False,
        wrong=[1],
    ),
    _implemented("num_repeats", "an integer, or a mapping of agent names to integers", [2]),
    _implemented(
        "num_repeats_add_seed", "true or false, or a mapping of agent names to true or false", 1
    ),
    _implemented("prompt_config", "a path to a prompt YAML file", [1]),
    _implemented("record_omitted_rollouts", _FLAG, "yes"),
    _implemented("resubmit", _FLAG, "yes"),
    _implemented("resume_from_cache", _FLAG, "yes"),
    _implemented("retry_terminal_timeouts", _FLAG, "yes", _BOTH),
    _implemented("server_queue_max_waiting_ratio", "a number", "high"),
    _implemented("server_queue_metrics_urls", "a list of URLs", "http://h:1"),
    _implemented("server_queue_sample_interval_s", _SECONDS, "soon"),
    _unsupported(
        "skills",
        "a skills config (a mapping) or null",
        lambda v: v is None or isinstance(v, dict),
        _none,
        "trollout has no Agent Skills support (skills_ref); drop the key, or run that "
        "benchmark with NeMo Gym",
        "skills/",
    ),
    _implemented("timed_out_max_fraction", _FRACTION, "most"),
    _implemented("timing_summary_interval_s", _SECONDS, "soon"),
    _implemented("task_ids", "a list of task ids", "row-1"),
    # SharedRolloutCollectionConfig
    _implemented("batch_manifest_fpath", "a path to a batch manifest", [1], _BOTH),
    _implemented("count_failure_classes_as_zero", "a list of failure classes", "x", _BOTH),
    _implemented("count_missing_rollouts_as_zero", _FLAG, "yes", _BOTH),
    _implemented("disable_aggregation", _FLAG, "yes"),
    _implemented("disable_health_check", _FLAG, "yes", _BOTH),
    _implemented("environment_protocol_violation_stop_after", _COUNT, "five"),
    _implemented("environment_routing_mode", "one of agent, legacy, taskset", 1),
    _implemented("environment_server_name", "a server name (a string)", [1]),
    _implemented("environment_server_routes", "a mapping of tasksets to servers", ["a"]),
    _implemented("health_check_ignored_checks", "a list of check ids", 5, _BOTH),
    _implemented("health_check_workers", "an integer >= 1, or null", "many", _BOTH),
    _implemented("max_resident_rollout_tasks", _COUNT, "many"),
    _implemented("num_samples_in_parallel", _COUNT, "many"),
    _implemented("output_jsonl_fpath", _PATH, [1], _BOTH),
    _implemented("require_complete", _FLAG, "yes"),
    _implemented("responses_create_params", "a mapping of parameters", [1]),
    NemoKey(
        "retain_results_in_memory",
        Handling.OWN_WAY,
        _RUN,
        _FLAG,
        _flag,
        _flag,
        "retain_results_in_memory: trollout never keeps results in memory; every outcome is "
        "appended to the run folder as it settles",
        field=False,
        wrong="yes",
    ),
    _unsupported(
        "rollout_collection_driver",
        "a module.path:function (a string) or null",
        _optional_str,
        _none,
        "trollout runs its own collection and cannot call a NeMo Gym driver; drop the key and "
        "use trollout's options (or embed trollout.open_collector in your driver)",
        [1],
    ),
    NemoKey(
        "route_failures_to_sidecar",
        Handling.OWN_WAY,
        _RUN,
        _FLAG,
        _flag,
        _flag,
        "route_failures_to_sidecar: trollout always records a failed rollout in the failures "
        "sidecar and goes on (--fail-fast stops at the first)",
        field=False,
        wrong="yes",
    ),
    # E2ERolloutCollectionConfig
    _unsupported("reuse_existing_data_preparation", _FLAG, _flag, _false, _E2E, "yes"),
    _unsupported(
        "split",
        "one of train, validation, benchmark",
        lambda v: v in (None, "train", "validation", "benchmark"),
        _none,
        _E2E,
        "example",
    ),
    # mixins: BaseNeMoGymCLIConfig's command line, UploadRolloutsConfigMixin
    NemoKey(
        "config_paths",
        Handling.IMPLEMENTED,
        _BOTH,
        "a list of YAML paths",
        lambda v: isinstance(v, str) or _str_list(v),
        field=False,
        wrong={"a": 1},
    ),
    _unsupported(
        "upload_rollouts",
        _FLAG,
        _flag,
        _false,
        "trollout does not upload rollouts; copy the run folder where it should go",
        "yes",
        _BOTH,
    ),
    # RolloutAggregationConfig (also count_*, output_jsonl_fpath, health checks, batch manifest)
    _implemented("input_glob", "a glob, or comma-separated globs", [1], frozenset({AGGREGATE})),
    _implemented("materialized_inputs_jsonl_fpath", _PATH, [1], frozenset({AGGREGATE})),
    _implemented("merge_shards", _FLAG, "yes", frozenset({AGGREGATE})),
)
BY_NAME: Final = {key.name: key for key in KEYS}


def translate(values: Mapping[str, Any], command: str) -> tuple[dict[str, Any], list[str]]:
    """Handle the NeMo Gym keys a command's settings hold; return the rest and the notes.

    Keys that are fields (`NemoKey.field`) pass through for the command to check, and so do
    the implemented keys its caller reads (after a type check); own-way and unsupported keys
    are checked and removed, with a note for each own-way key given.

    Raises:
        ConfigError: a wrong type, an unsupported value, or a key the command does not take.
    """
    out = dict(values)
    notes = []
    for name in sorted(BY_NAME.keys() & values.keys()):
        key = BY_NAME[name]
        if command not in key.commands:
            other = " or ".join(f"trollout {c}" for c in sorted(key.commands))
            raise ConfigError(f"{name} is a setting of {other}, not of trollout {command}; drop it")
        if key.field:
            continue
        _check_type(key, out[name])
        if key.handling is Handling.IMPLEMENTED:
            continue  # read by the caller (config_paths, materialized_jsonl_fpath)
        value = out.pop(name)
        if not key.inert(value):
            raise ConfigError(f"{name}={_shown(value)} is not supported: {key.text}")
        if key.handling is Handling.OWN_WAY:
            notes.append(key.text)
    return out, notes


def _check_type(key: NemoKey, value: Any) -> None:
    if not key.accepts(value):
        raise ConfigError(
            f"{key.name} must be {key.expected} (got {_shown(value)}); fix the value or drop it"
        )


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:199] + "…"


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
#   cannot hold a key twice (`config.load_yaml`), and ``--agent-url`` cannot name an agent twice;
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
        ConfigError: as `translate` and `config.build_config`, naming the key; a setting given
            twice within one source, or set without the one it needs, naming both.
    """
    line = command_line(options or {}, overrides, labels)
    layers: list[tuple[str, Mapping[str, Any]]] = [("the defaults", defaults or {})]
    from_file = read_settings_file(config_file) if config_file is not None else {}
    top = {**from_file, **{key: value for key, (value, _) in line.items()}}
    if "config_paths" in top:
        _check_type(BY_NAME["config_paths"], top["config_paths"])
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
    if "materialized_jsonl_fpath" in values:
        _check_materialized(values.pop("materialized_jsonl_fpath"), values)
    config = build_config(values)  # values are checked before what they combine into
    HealthSettings.of(config)  # unknown health check ids are refused before anything runs
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


def _check_materialized(value: str, values: Mapping[str, Any]) -> None:
    output = values.get("output_jsonl_fpath")
    derived = RunLayout.for_output(output).materialized_inputs if output else None
    if derived is None or os.path.abspath(value) != os.path.abspath(derived):
        where = f" (here {str(derived)!r})" if derived else ""
        raise ConfigError(
            f"materialized_jsonl_fpath={value!r} is not where the run writes its materialized "
            f"inputs: always <stem>_materialized_inputs.jsonl beside the output{where}, as in "
            "NeMo Gym; set output_jsonl_fpath instead, or drop the key"
        )


def differences(config: RunConfig) -> list[str]:
    """Return where this run deliberately differs from NeMo Gym, one line each (for summaries).

    docs/user-guide.md lists every difference; these are the ones the run's settings put in force.
    """
    out = []
    if config.num_repeats_add_seed and config.seed_mode is SeedMode.HASH:
        out.append(
            "seeds are hash(run seed, task, rollout), different across tasks (NeMo Gym: the "
            "rollout index; --seed-mode rollout-index)"
        )
    if not config.retry_requests:
        out.append(
            "a request that may have been delivered is not sent again (NeMo Gym replays it; "
            "--retry-requests)"
        )
    out.append(
        f"a request silent for {config.read_timeout_s:g}s fails (NeMo Gym waits without a "
        "limit; --read-timeout)"
    )
    return out
