"""The settings of ``trollout aggregate``, one row each (NeMo Gym's aggregation keys and more).

`trollout aggregate` has no `RunConfig`: its settings are a mapping checked against this table
(`loader.load_aggregate_settings`). A row marked ``nemo`` is a NeMo Gym aggregation key: the
key table (`keys.KEYS`) lists it as implemented for ``aggregate`` (and for ``collect`` too when
`RunConfig` has a NeMo Gym row of the same name). NeMo Gym keys trollout handles its own way,
or lacks, are taken by `keys.translate` before this table is consulted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from attrs import frozen

from .fields import optional_str, str_list_of
from .numbers import DEFAULT_MAX_INPUT_LINE_BYTES

__all__ = ["AGGREGATE_DEFAULTS", "AGGREGATE_PATH_KEYS", "AGGREGATE_SETTINGS", "AggregateSetting"]


def _bool(value: Any) -> bool:
    return isinstance(value, bool)


def _optional_bool(value: Any) -> bool:
    return value is None or _bool(value)


@frozen
class AggregateSetting:
    """One setting of ``trollout aggregate``.

    Attributes:
        name: the key.
        expected: what is expected, for messages.
        accepts: whether a value is of that type.
        default: the value when not given.
        nemo: a NeMo Gym aggregation key.
        path: a path or glob, taken as written after ``+key=`` (it may hold commas).
        wrong: a value of the wrong type, for the tests that walk the table.
        defaulted: False for a setting absent unless given (`default` is then unused).
    """

    name: str
    expected: str
    accepts: Callable[[Any], bool]
    default: Any = None
    nemo: bool = False
    path: bool = False
    wrong: Any = "yes"
    defaulted: bool = True


_FLAG: Final = "true or false"
_PATH: Final = "a path"

AGGREGATE_SETTINGS: Final[tuple[AggregateSetting, ...]] = (
    AggregateSetting(
        "input_glob",
        "a glob, or a list of globs",
        lambda v: isinstance(v, str) or str_list_of(v),
        nemo=True,
        path=True,
        wrong=[1],
        defaulted=False,
    ),
    AggregateSetting("output_jsonl_fpath", _PATH, optional_str, None, True, True, [1]),
    AggregateSetting(
        "count_failure_classes_as_zero",
        "a list of failure classes",
        lambda v: v is None or isinstance(v, str) or str_list_of(v),
        None,
        nemo=True,
        wrong={"x": 1},
    ),
    AggregateSetting("count_missing_rollouts_as_zero", _FLAG, _optional_bool, None, True),
    AggregateSetting("merge_shards", _FLAG, _bool, True, nemo=True),
    AggregateSetting("materialized_inputs_jsonl_fpath", _PATH, optional_str, None, True, True, [1]),
    AggregateSetting("retry_terminal_timeouts", _FLAG, _bool, False, nemo=True),
    AggregateSetting("batch_manifest_fpath", _PATH, optional_str, None, True, True, [1]),
    AggregateSetting(
        "head_server",
        "a URL or {host, port}",
        lambda v: v is None or isinstance(v, str | dict),
        None,
    ),
    AggregateSetting(
        "served_config_env_allow", "a list of environment variable names", str_list_of, []
    ),
    AggregateSetting(
        "seed", "an integer", lambda v: v is None or (type(v) is int and v >= 0), None
    ),
    AggregateSetting(
        "max_input_line_bytes",
        "an integer >= 1",
        lambda v: type(v) is int and v >= 1,
        DEFAULT_MAX_INPUT_LINE_BYTES,
    ),
    AggregateSetting("overwrite", _FLAG, _bool, False),
    # the post-run health check (its callers check the check ids with trollout.health)
    AggregateSetting("disable_health_check", _FLAG, _optional_bool, False, nemo=True),
    AggregateSetting(
        "health_check_workers",
        "an integer >= 1",
        lambda v: v is None or (type(v) is int and v >= 1),
        None,
        nemo=True,
    ),
    AggregateSetting(
        "health_check_ignored_checks",
        "a list of check ids",
        lambda v: v is None or isinstance(v, str) or str_list_of(v),
        [],
        nemo=True,
    ),
)
AGGREGATE_BY_NAME: Final = {s.name: s for s in AGGREGATE_SETTINGS}
AGGREGATE_DEFAULTS: Final = {s.name: s.default for s in AGGREGATE_SETTINGS if s.defaulted}
AGGREGATE_PATH_KEYS: Final = frozenset(s.name for s in AGGREGATE_SETTINGS if s.path)
