"""The parts a setting is made of: its checks, its shape, and `setting`, which makes one row.

A `RunConfig` field is one row: ``setting(default, check, shape=..., nemo=True, plan=0)`` says
the default, the validator (a `NumberRange`, `flag`, ...) or the value's shape (`Shape`: what is
expected, the test, an example for messages), and what the rest of trollout needs to know about
the key (`Row`): that NeMo Gym has it, that it changes the materialized rows (and since which
version of the fingerprint), that it names a file, that null means its default. The tables the
other modules used to keep by hand (the NeMo Gym key table's implemented rows, `PLAN_KEYS`,
`PATH_KEYS`, `ORDER_KEYS`, `NULL_MEANS_DEFAULT`, the shapes) are read off the rows
(`record.py`), so a new key is one row and cannot be half-registered.

Rejected: a separate table per concern keyed by name (today's state before this package): each
new key had to be added to four to six of them in as many files, and nothing noticed a missing
entry until a user hit it.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from typing import Any, Final, TypeVar

import attrs
from attrs import frozen

from ..errors import ConfigError
from .numbers import POSITIVE_COUNT, NumberRange

__all__ = [
    "META",
    "FsyncPolicy",
    "OutagePolicy",
    "Row",
    "SeedMode",
    "Shape",
    "flag",
    "optional_str",
    "parse_shard",
    "repeats_problems",
    "row_of",
    "setting",
    "str_list_of",
]


class SeedMode(enum.Enum):
    """How `num_repeats_add_seed` chooses a rollout's seed."""

    HASH = "hash"  # hash(run seed, task, rollout): seeds differ across tasks (ours, opt-in)
    ROLLOUT_INDEX = "rollout-index"  # seed = rollout index (NeMo Gym's values; the default)


_Choice = TypeVar("_Choice", bound=enum.Enum)


def choice(kind: type[_Choice], key: str, value: Any) -> _Choice:
    """Return the member of `kind` that `value` is or names (``"rollout-index"``).

    An embedding driver may pass the value as written in YAML or on the command line; anything
    else is one ConfigError naming the key and the choices, never a silent default.
    """
    if isinstance(value, kind):
        return value
    try:
        return kind(value)
    except (ValueError, TypeError):
        choices = ", ".join(repr(member.value) for member in kind)
        raise ConfigError(f"{key} must be one of {choices} (got {value!r})") from None


class FsyncPolicy(enum.Enum):
    """When the store fsyncs appended rows."""

    ROW = "row"  # after every row: safest, slowest
    BATCH = "batch"  # every fsync_every_rows rows or fsync_every_s seconds (default)
    NEVER = "never"  # leave it to the OS: nothing the collector writes (inputs, manifest, status)


class OutagePolicy(enum.Enum):
    """What the run does once an endpoint is down (collector/dispatch/retry.py's design note)."""

    STOP = "stop"  # stop the run, exit 1, resumable: one line names the endpoint (default)
    FAIL = "fail"  # fail its rollouts (endpoint_down, not sent) and go on with the others


def flag(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(
            f"{attribute.name} must be true or false (got {value!r}); write true or false"
        )


def task_ids_check(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    for index, task in enumerate(value or ()):
        if isinstance(task, bool) or not isinstance(task, str | int) or task == "":
            raise ConfigError(
                f"task_ids[{index}] must be a task id stored in the rows, a string or an "
                f"integer (got {task!r}); list the rows' ids, e.g. [row-000000, row-000003]"
            )


_SHARD: Final = re.compile(r"([0-9]{1,9})/([0-9]{1,9})")


def parse_shard(text: str) -> tuple[int, int]:
    """Return ``(index, count)`` of a shard written ``I/N`` (0 <= I < N).

    Raises:
        ConfigError: naming the value, what is expected and the remedy.
    """
    match = _SHARD.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ConfigError(
            f"shard must be I/N, two integers such as 0/4 for the first of 4 shards "
            f"(got {text!r}); write --shard 0/4"
        )
    i, n = int(match[1]), int(match[2])
    if n < 1:
        raise ConfigError(
            f"shard {text!r} has a count of {n}; the count N of I/N must be at least 1, "
            "e.g. --shard 0/4 for the first of 4 shards"
        )
    if i >= n:
        raise ConfigError(
            f"shard {text!r} has no shard {i} of {n}: shards are numbered from 0, so I of "
            f"I/N runs from 0 to {n - 1}; write e.g. --shard {n - 1}/{n}"
        )
    return i, n


def shard_check(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None:
        parse_shard(value)


def repeats_problems(value: Any) -> list[str]:
    """Return one message per bad ``num_repeats`` value (an int, or ``{agent: int}``)."""
    counts = value.items() if isinstance(value, dict) else [(None, value)]
    problems = []
    for key, count in counts:
        label = "num_repeats" if key is None else f"num_repeats.{key}"
        if not POSITIVE_COUNT.accepts(count):
            problems.append(f"{label} must be an integer >= 1 (got {count!r}); use 1 or more")
    return problems


def seed_setting_check(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool):
        return
    bad = {k: v for k, v in value.items() if not isinstance(v, bool)}
    if bad:
        raise ConfigError(
            f"num_repeats_add_seed must be true or false, or a mapping of agent names to true "
            f"or false (got {value!r}); write e.g. {{_default: false, math_agent: true}}"
        )


def seed_mode_of(value: Any) -> SeedMode:
    return choice(SeedMode, "seed_mode", value)


def fsync_of(value: Any) -> FsyncPolicy:
    return choice(FsyncPolicy, "fsync", value)


def outage_of(value: Any) -> OutagePolicy:
    return choice(OutagePolicy, "on_endpoint_outage", value)


# --- shapes: settings that are not a number or a flag ----------------------------------------


@frozen
class Shape:
    """The expected shape of a setting's value, checked before structuring.

    cattrs would turn a list into its text where a string is expected (``+agent_map={a:[1,2]}``
    would route to agent "[1, 2]"), so these are checked on the raw value.

    Attributes:
        expected: what is expected, for messages (``"a mapping of names to agent names"``).
        accepts: whether a value has the shape.
        example: a value to suggest (``+key=<example>``).
        wrong: a value without the shape (the tests walk the rows with it).
    """

    expected: str
    accepts: Callable[[Any], bool]
    example: str
    wrong: Any = ("not", "a", "shape")


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def optional_str(value: Any) -> bool:
    """Whether ``value`` is a string or None."""
    return value is None or isinstance(value, str)


def _str_map(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def str_list_of(value: Any) -> bool:
    """Whether ``value`` is a list of strings."""
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _optional_list(value: Any) -> bool:
    return value is None or isinstance(value, list)


def _optional_str_list(value: Any) -> bool:
    return value is None or str_list_of(value)


def _fan_out(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and str_list_of(v) for k, v in value.items()
    )


def _repeats(value: Any) -> bool:
    return not isinstance(value, dict) or all(isinstance(k, str) for k in value)


def _seeds(value: Any) -> bool:
    return isinstance(value, bool) or (
        isinstance(value, dict)
        and all(isinstance(k, str) and isinstance(v, bool) for k, v in value.items())
    )


def _object(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) for k in value)


def _head(value: Any) -> bool:
    return value is None or isinstance(value, str | dict)


def path(example: str, expected: str = "a path") -> Shape:
    """Return the shape of a setting naming a file (a string, or null)."""
    return Shape(expected, optional_str, example, [1])


def name(expected: str, example: str) -> Shape:
    """Return the shape of an optional name (a string, or null)."""
    return Shape(expected, optional_str, example, [1])


def str_map(expected: str, example: str, wrong: Any = ("a",)) -> Shape:
    """Return the shape of a mapping of strings to strings."""
    return Shape(expected, _str_map, example, list(wrong))


def str_list(expected: str, example: str, wrong: Any = "x") -> Shape:
    """Return the shape of a list of strings."""
    return Shape(expected, str_list_of, example, wrong)


OPTIONAL_LIST: Final = Shape(
    "a list of task ids", _optional_list, "[row-000001,row-000007]", "row-1"
)
OPTIONAL_STR_LIST: Final = Shape(
    "a list of failure classes", _optional_str_list, "[agent_run_error]", "x"
)
AGENT_MAP: Final = str_map("a mapping of names to agent names", "{old_agent:new_agent}")
FAN_OUT: Final = Shape(
    "a mapping of names to lists of agent names", _fan_out, "{source:[a,b]}", {"x": "a"}
)
REPEATS: Final = Shape("an integer, or a mapping of agent names to integers", _repeats, "4", [2])
SEEDS: Final = Shape(
    "true or false, or a mapping of agent names to true or false",
    _seeds,
    "{_default:false,math_agent:true}",
    1,
)
OBJECT: Final = Shape("a mapping of parameters", _object, "{temperature:0.6}", [1])
ROUTING_MODE: Final = Shape("one of agent, legacy, taskset", _is_str, "agent", 1)
HEAD: Final = Shape("a URL or {host, port}", _head, "{host:127.0.0.1,port:11000}", [1])
# NeMo Gym's list of check ids, or its comma-separated string (trollout.health parses both and
# knows the ids: its callers check them, settings imports nothing of health)
IGNORED_CHECKS: Final = Shape(
    "a list of check ids, or a comma-separated string",
    lambda v: isinstance(v, str) or str_list_of(v),
    "[model_call_failed]",
    5,
)


# --- the row ----------------------------------------------------------------------------------

META: Final = "trollout"  # the attrs metadata key a setting's `Row` is kept under


@frozen
class Row:
    """What trollout knows about one setting besides its type and default.

    Attributes:
        nemo: NeMo Gym has the key (a collection setting of NeMo Gym's under this name).
        shape: the shape of the value, when it is not a number or a flag.
        plan: the setting changes the materialized rows, so it is fingerprinted; the number is
            the version of the fingerprint that added it (0: the first; a later key is hashed
            only when set, so the fingerprints of older runs stay what they were).
        order: a plan setting that orders the rows without changing one.
        path: the value names a file (made absolute for another process).
        null_default: null means the default (NeMo Gym's Optional where trollout's is required).
        wrong: a value of the wrong type, for the tests that walk the rows.
        expected: what is expected, for the key table.
        absent: what a run's saved settings mean when they lack the key (None: the default).
            A key whose default changed sets the old default here, so a run saved before the
            change, or before the key existed, resumes as it was started.
    """

    nemo: bool = False
    shape: Shape | None = None
    plan: int | None = None
    order: bool = False
    path: bool = False
    null_default: bool = False
    wrong: Any = "many"
    expected: str = "a value"
    absent: Any = None


def setting(
    default: Any = attrs.NOTHING,
    check: Any = None,
    *,
    factory: Callable[[], Any] | None = None,
    converter: Callable[[Any], Any] | None = None,
    shape: Shape | None = None,
    nemo: bool = False,
    plan: int | None = None,
    order: bool = False,
    path: bool = False,
    null_default: bool = False,
    wrong: Any = None,
    absent: Any = None,
) -> Any:
    """Return one `RunConfig` field: its default, its check and its `Row` (module doc)."""
    if wrong is None:
        wrong = shape.wrong if shape is not None else ("yes" if check is flag else "many")
    if shape is not None:
        expected = shape.expected
    elif isinstance(check, NumberRange):
        expected = check.what
    else:
        expected = "true or false" if check is flag else "a value"
    row = Row(nemo, shape, plan, order, path, null_default, wrong, expected, absent)
    return attrs.field(
        default=default,
        factory=factory,
        validator=check,
        converter=converter,
        metadata={META: row},
    )


def row_of(field: attrs.Attribute[Any]) -> Row:
    """Return a field's `Row` (a field made without `setting` has an empty one)."""
    row = field.metadata.get(META)
    return row if isinstance(row, Row) else Row()
