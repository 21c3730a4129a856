"""Every NeMo Gym 0.7.0 collection setting, and what trollout does with it: one table.

NeMo Gym users keep their launch scripts: every key of ``RolloutCollectionConfig``,
``SharedRolloutCollectionConfig``, ``E2ERolloutCollectionConfig``, ``RolloutAggregationConfig``
and their mixins (``config_paths``, ``upload_rollouts``) is accepted by ``trollout collect``
(and, for the aggregation keys, ``trollout aggregate``) in one of three ways (`Handling`):

- **implemented**: it changes what trollout does. Most are `RunConfig` rows marked ``nemo``
  (record.py) or `aggregation.AGGREGATE_SETTINGS` rows marked ``nemo``, and their rows here are
  read off those tables (`KEYS`), so an implemented key is one row, where its type and default
  are; a few are read by the loader: ``config_paths`` (YAML files merged in order, later wins,
  mappings merged deeply as OmegaConf does, below every other source; only the keys that are
  collection settings are taken, server blocks are the deployment's).
- **own way**: accepted with one line saying how trollout already does it (a row in `_OTHERS`).
- **unsupported**: a subsystem trollout does not have (skills, uploads, E2E
  serving and data preparation, custom drivers): accepted at the value that asks for nothing,
  otherwise refused in one line saying what is not supported and what to do instead (a row in
  `_OTHERS`).

A value of the wrong type is refused naming the key and the expected type, before anything is
written. `differences` lists, for a run summary, where trollout deliberately differs from NeMo
Gym for the settings in force.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs
from attrs import frozen

from ..errors import ConfigError
from .aggregation import AGGREGATE_SETTINGS
from .fields import SeedMode, optional_str, row_of, str_list_of
from .record import RunConfig
from .syntax import shown

__all__ = [
    "AGGREGATE",
    "BY_NAME",
    "COLLECT",
    "KEYS",
    "Handling",
    "NemoKey",
    "check_type",
    "differences",
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


def _false(value: Any) -> bool:
    return value is False


def _none(value: Any) -> bool:
    return value is None


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
_FLAG: Final = "true or false"

# The keys that are not a row of `RunConfig` or of the aggregate settings: own-way and
# unsupported keys, and the implemented keys the loader reads itself. A new key trollout does
# not implement is one row here; an implemented one is a row of `RunConfig` (or of
# `AGGREGATE_SETTINGS`) marked ``nemo``.
_OTHERS: Final[tuple[NemoKey, ...]] = (
    NemoKey(
        "config_paths",
        Handling.IMPLEMENTED,
        _BOTH,
        "a list of YAML paths",
        lambda v: isinstance(v, str) or str_list_of(v),
        field=False,
        wrong={"a": 1},
    ),
    # RolloutCollectionConfig
    _unsupported(
        "skills",
        "a skills config (a mapping) or null",
        lambda v: v is None or isinstance(v, dict),
        _none,
        "trollout has no Agent Skills support (skills_ref); drop the key, or run that "
        "benchmark with NeMo Gym",
        "skills/",
    ),
    # SharedRolloutCollectionConfig
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
        optional_str,
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
    # mixins: UploadRolloutsConfigMixin
    _unsupported(
        "upload_rollouts",
        _FLAG,
        _flag,
        _false,
        "trollout does not upload rollouts; copy the run folder where it should go",
        "yes",
        _BOTH,
    ),
)


def _implemented_rows() -> dict[str, NemoKey]:
    """Return the implemented keys' rows, read off `RunConfig` and `AGGREGATE_SETTINGS`."""
    rows: dict[str, NemoKey] = {}
    for field in attrs.fields(RunConfig):
        row = row_of(field)
        if row.nemo:
            rows[field.name] = NemoKey(
                field.name, Handling.IMPLEMENTED, _RUN, row.expected, wrong=row.wrong
            )
    for setting in AGGREGATE_SETTINGS:
        if not setting.nemo:
            continue
        known = rows.get(setting.name)
        if known is not None:  # a setting of both commands: collect's row, both commands
            rows[setting.name] = attrs.evolve(known, commands=_BOTH)
        else:
            rows[setting.name] = NemoKey(
                setting.name,
                Handling.IMPLEMENTED,
                frozenset({AGGREGATE}),
                setting.expected,
                wrong=setting.wrong,
            )
    return rows


def _table() -> tuple[NemoKey, ...]:
    implemented = _implemented_rows()
    twice = sorted(implemented.keys() & {key.name for key in _OTHERS})
    if twice:  # pragma: no cover - a table error, caught by importing the package
        raise AssertionError(f"NeMo Gym keys with two rows: {twice}")
    return tuple(sorted([*implemented.values(), *_OTHERS], key=lambda key: key.name))


KEYS: Final[tuple[NemoKey, ...]] = _table()
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
        check_type(key, out[name])
        if key.handling is Handling.IMPLEMENTED:
            continue  # read by the caller (config_paths)
        value = out.pop(name)
        if not key.inert(value):
            raise ConfigError(f"{name}={shown(value)} is not supported: {key.text}")
        if key.handling is Handling.OWN_WAY:
            notes.append(key.text)
    return out, notes


def check_type(key: NemoKey, value: Any) -> None:
    if not key.accepts(value):
        raise ConfigError(
            f"{key.name} must be {key.expected} (got {shown(value)}); fix the value or drop it"
        )


# --- collect: config_paths and the sources ------------------------------------------------------
#
# Design note: the sources of a run's settings meet here, once, for every command that builds a
def differences(config: RunConfig) -> list[str]:
    """Return where this run deliberately differs from NeMo Gym, one line each (for summaries).

    docs/user-guide.md lists every difference; these are the ones the run's settings put in force.
    """
    out = []
    if config.num_repeats_add_seed and config.seed_mode is SeedMode.HASH:
        out.append(
            "seeds are hash(run seed, task, rollout), different across tasks (NeMo Gym: the "
            "rollout index, the default; --seed-mode rollout-index)"
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
