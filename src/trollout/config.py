"""Run configuration: one flat attrs record, filled from YAML, click options and overrides.

A run is described by `RunConfig`, whose field names are NeMo Gym's config keys (so
``+num_repeats=4`` and ``num_repeats: 4`` in a YAML file mean what they mean in NeMo Gym) plus
trollout's own settings. Sources of `load_config`, later wins: defaults < ``--config run.yaml``
< options < ``+key=value`` / ``++key=value`` overrides (docs/protocol.md section 10); the command
line refuses one setting given by two of its sources (`nemo_keys.load_run_config`).

Values of overrides use Hydra's flow syntax: ``{host:127.0.0.1,port:11000}`` is a mapping,
``[a,b]`` a list, ``true``/``false``/``null``, numbers, and quoted or bare strings. YAML's own flow
syntax is not used because it reads ``{host:127.0.0.1}`` as a key with no value.

Validation happens once, in field validators and `validate()`, and every message names the key,
shows the value and says what was expected. Unknown keys are refused with the closest known key
suggested, so a typo never silently does nothing.

Numbers (`NumberRange`, one validator for every numeric field here and in the dispatch and retry
policies): bools, NaN and infinities are refused everywhere. Integer settings take integers only:
an integral float such as ``1e9`` (what ``+key=1e9`` parses to) is refused with the integer to
write instead, rather than truncated, so ``1.5`` can never quietly become 1. Durations are at most
`MAX_SECONDS` (about 31 years; a bigger one can only mean "forever", which the optional limits
spell as unset), counts are below 2**63 and the seed below 2**64, the widest integers a run
folder's JSON holds.

Untrusted structure (`load_yaml`, `parse_value`): YAML aliases of mappings and lists are refused,
since they are how a few hundred bytes expand into gigabytes of rows (scalar aliases are kept),
and YAML documents and override values nest at most `MAX_VALUE_DEPTH` levels, so parsing cannot
recurse without bound and a setting merged into a row keeps it within the rows' own limit
(`jsonl.MAX_DEPTH`).

Length: this module is longer than the house's ~400 lines on purpose. It is a leaf that may
import only `errors` (docs/architecture.md), so every check a setting needs (numbers, URLs, YAML,
override syntax) lives here; the override parser and the YAML loader are the parts to move out if
the layering ever allows a second leaf.
"""

from __future__ import annotations

import difflib
import enum
import hashlib
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Final, TypeVar
from urllib.parse import SplitResult, urlsplit

import attrs
import cattrs
import orjson
import yaml
from attrs import frozen

from .errors import ConfigError

__all__ = [
    "COUNT",
    "DEFAULT_MAX_INPUT_LINE_BYTES",
    "DEFAULT_START_MIN_FRACTION",
    "FRACTION",
    "MAX_ATTEMPTS_ENV",
    "MAX_SECONDS",
    "MAX_VALUE_DEPTH",
    "NULL_MEANS_DEFAULT",
    "ORDER_KEYS",
    "PATH_KEYS",
    "PORT",
    "POSITIVE_COUNT",
    "POSITIVE_SECONDS",
    "SECONDS",
    "TASKSET_NEEDS_ROUTES",
    "FsyncPolicy",
    "NumberRange",
    "OutagePolicy",
    "RunConfig",
    "SeedMode",
    "default_max_attempts",
    "load_config",
    "load_yaml",
    "parse_override",
    "parse_shard",
    "parse_value",
    "plan_differences",
    "read_settings_file",
    "validate_url",
]


class SeedMode(enum.Enum):
    """How `num_repeats_add_seed` chooses a rollout's seed."""

    HASH = "hash"  # hash(run seed, task, rollout): seeds differ across tasks (ours, default)
    ROLLOUT_INDEX = "rollout-index"  # seed = rollout index (NeMo Gym's behaviour)


_Choice = TypeVar("_Choice", bound=enum.Enum)


def _choice(kind: type[_Choice], key: str, value: Any) -> _Choice:
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
    NEVER = "never"  # leave it to the OS


class OutagePolicy(enum.Enum):
    """What the run does once an endpoint is down (collector/dispatch/retry.py's design note)."""

    STOP = "stop"  # stop the run, exit 1, resumable: one line names the endpoint (default)
    FAIL = "fail"  # fail its rollouts (endpoint_down, not sent) and go on with the others


MAX_ATTEMPTS_ENV = "NEMO_GYM_MAX_ROLLOUT_ATTEMPTS"


def default_max_attempts() -> int:
    """Return the attempt cap from env NEMO_GYM_MAX_ROLLOUT_ATTEMPTS, else 3.

    Raises:
        ConfigError: the variable is set but is not an integer >= 1.
    """
    raw = os.environ.get(MAX_ATTEMPTS_ENV, "").strip()
    if not raw:
        return 3
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(
            f"{MAX_ATTEMPTS_ENV} must be an integer >= 1 (got {raw!r}); unset it or use e.g. 3"
        )
    return value


MAX_SECONDS: Final = 1e9  # about 31 years: any longer duration can only mean "no limit"
MAX_COUNT: Final = 2**63 - 1  # the widest signed integer a run folder's JSON holds
MAX_SEED: Final = 2**64 - 1  # the widest unsigned one (seeds are hashed as decimal text)
MAX_VALUE_DEPTH: Final = 100  # nesting of YAML documents and override values (module doc)
# The healthy share of rollouts started within dispatch_start_report_within_s. NeMo Gym's API
# reference gives the setting's type (a float, always judged) but not its default value.
DEFAULT_START_MIN_FRACTION: Final = 0.9
# A line holds one row; a 1M-token prompt is ~4 MB and rows with base64 images run to tens of
# MB, while a line is parsed whole (a few times its size in memory), so 64 MiB is generous for
# real data and still a bound; --max-line-bytes raises it.
DEFAULT_MAX_INPUT_LINE_BYTES: Final = 64 * 1024 * 1024


@frozen
class NumberRange:
    """An attrs validator for a numeric setting.

    It refuses bools, NaN and infinities, anything but an `int` when `integer` is set, and
    values outside ``[low, high]`` (or ``(low, high]`` with `low_open`); None only when
    `none_ok` (`or_none`: an optional setting, where None means unset).

    Attributes:
        what: what is expected, for messages (``"an integer >= 1"``).
    """

    what: str
    low: float
    high: float
    low_open: bool = False
    integer: bool = False
    none_ok: bool = False

    @property
    def or_none(self) -> NumberRange:
        """Return this range for an optional setting (None accepted)."""
        return attrs.evolve(self, none_ok=True)

    def __call__(self, instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        """Raise `ConfigError` naming the field when ``value`` is out of range."""
        if (value is None and self.none_ok) or self.accepts(value):
            return
        remedy = self._remedy(attribute, value)
        raise ConfigError(f"{attribute.name} must be {self.what} (got {value!r}); {remedy}")

    def accepts(self, value: Any) -> bool:
        """Return whether ``value`` is a number of the right kind within the range."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if self.integer and not isinstance(value, int):
            return False
        if isinstance(value, float) and not math.isfinite(value):
            return False
        above_low = self.low < value if self.low_open else self.low <= value
        return above_low and value <= self.high

    def _remedy(self, attribute: attrs.Attribute[Any], value: Any) -> str:
        integral = isinstance(value, float) and value.is_integer()
        if self.integer and integral and self.accepts(int(value)):
            return f"write it as an integer: {int(value)}"
        default = attribute.default
        if isinstance(default, int | float) and not isinstance(default, bool):
            return f"use e.g. {default!r} (the default)"
        return "fix the value, or leave it unset"


SECONDS: Final = NumberRange("a number of seconds from 0 to 1e9", 0, MAX_SECONDS)
POSITIVE_SECONDS: Final = NumberRange(
    "a number of seconds > 0 and at most 1e9", 0, MAX_SECONDS, low_open=True
)
FRACTION: Final = NumberRange("a number from 0 to 1", 0, 1)
RATIO: Final = NumberRange("a number from 0 to 1e9", 0, MAX_SECONDS)
POSITIVE_RATIO: Final = NumberRange("a number > 0 and at most 1e9", 0, MAX_SECONDS, low_open=True)
COUNT: Final = NumberRange("an integer from 0 to 2**63 - 1", 0, MAX_COUNT, integer=True)
POSITIVE_COUNT: Final = NumberRange("an integer from 1 to 2**63 - 1", 1, MAX_COUNT, integer=True)
SEED: Final = NumberRange("an integer from 0 to 2**64 - 1", 0, MAX_SEED, integer=True)
PORT: Final = NumberRange("a port from 0 to 65535 (0: any free port)", 0, 65535, integer=True)


def _flag(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(
            f"{attribute.name} must be true or false (got {value!r}); write true or false"
        )


def _task_ids(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
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


def _shard(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None:
        parse_shard(value)


def _seed_setting(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool):
        return
    bad = {k: v for k, v in value.items() if not isinstance(v, bool)}
    if bad:
        raise ConfigError(
            f"num_repeats_add_seed must be true or false, or a mapping of agent names to true "
            f"or false (got {value!r}); write e.g. {{_default: false, math_agent: true}}"
        )


def _seed_mode(value: Any) -> SeedMode:
    return _choice(SeedMode, "seed_mode", value)


def _fsync(value: Any) -> FsyncPolicy:
    return _choice(FsyncPolicy, "fsync", value)


def _outage(value: Any) -> OutagePolicy:
    return _choice(OutagePolicy, "on_endpoint_outage", value)


@frozen(kw_only=True)
class RunConfig:
    """Every setting of a collection run (NeMo Gym key names where NeMo Gym has the setting).

    Attributes are documented in ``trollout collect --help`` and docs/user-guide.md; the groups
    are input and output, deployment, preprocessing (docs/protocol.md section 5), dispatch and
    durability.
    """

    # input and output
    input_jsonl_fpath: str | None = None
    output_jsonl_fpath: str | None = None
    max_input_line_bytes: int = attrs.field(
        default=DEFAULT_MAX_INPUT_LINE_BYTES, validator=POSITIVE_COUNT
    )
    # deployment
    head_server: str | None = None
    agent_urls: dict[str, str] = attrs.field(factory=dict)
    # environment variables a head server's config may read (served_config: none by default)
    served_config_env_allow: list[str] = attrs.field(factory=list)
    # preprocessing (these change what is dispatched, so they are fingerprinted)
    agent_name: str | None = None
    agent_map: dict[str, str] = attrs.field(factory=dict)
    fan_out: dict[str, list[str]] = attrs.field(factory=dict)
    num_repeats: int | dict[str, int] = 1
    # True, False, or {agent: bool, _default: bool}: which agents' rollouts get seeds
    num_repeats_add_seed: bool | dict[str, bool] = attrs.field(
        default=False, validator=_seed_setting
    )
    seed: int = attrs.field(default=0, validator=SEED)
    seed_mode: SeedMode = attrs.field(default=SeedMode.HASH, converter=_seed_mode)
    limit: int | None = attrs.field(default=None, validator=COUNT.or_none)
    task_ids: list[str | int] | None = attrs.field(default=None, validator=_task_ids)
    # "I/N": keep the tasks whose identity hashes to shard I of N (task_selection.py)
    shard: str | None = attrs.field(default=None, validator=_shard)
    prompt_config: str | None = None  # a prompt YAML: builds responses_create_params.input
    interleave_repeats: bool = attrs.field(default=False, validator=_flag)
    round_robin_agents: bool = attrs.field(default=False, validator=_flag)
    responses_create_params: dict[str, Any] = attrs.field(factory=dict)
    environment_routing_mode: str = "agent"
    environment_server_name: str | None = None
    environment_server_routes: dict[str, str] = attrs.field(factory=dict)
    # dispatch
    num_samples_in_parallel: int = attrs.field(default=64, validator=POSITIVE_COUNT)
    max_resident_rollout_tasks: int | None = attrs.field(
        default=None, validator=POSITIVE_COUNT.or_none
    )
    connect_timeout_s: float = attrs.field(default=10.0, validator=POSITIVE_SECONDS)
    read_timeout_s: float = attrs.field(default=3600.0, validator=POSITIVE_SECONDS)
    # the longest one /run request may take, sending through the last reply byte, however
    # steadily bytes trickle in; None: twice read_timeout_s (7200 s by default)
    reply_timeout_s: float | None = attrs.field(default=None, validator=POSITIVE_SECONDS.or_none)
    max_reply_bytes: int = attrs.field(default=256 * 1024 * 1024, validator=POSITIVE_COUNT)
    # a 200 whose echoed responses_create_params.input is another conversation is
    # identity_mismatch (collector/classify/outcomes.py); false for agents that rewrite their input
    check_echoed_input: bool = attrs.field(default=True, validator=_flag)
    max_rollouts: int = attrs.field(default=10_000_000, validator=POSITIVE_COUNT)  # a plan's size
    # the outage grace: an endpoint that gave no answer this long is down (dispatch/retry.py)
    dispatch_connect_grace_s: float = attrs.field(default=30.0, validator=SECONDS)
    max_connect_retries: int = attrs.field(default=4, validator=COUNT)  # own, per attempt
    on_endpoint_outage: OutagePolicy = attrs.field(default=OutagePolicy.STOP, converter=_outage)
    fail_fast: bool = attrs.field(default=False, validator=_flag)
    # budget, drain and the run's wall clock (docs/protocol.md section 9); a budget of 0 starts
    # nothing (the engine's documented meaning), which the CLI refuses as an empty run
    dispatch_budget_s: float | None = attrs.field(default=None, validator=SECONDS.or_none)
    drain_margin_s: float | None = attrs.field(default=None, validator=SECONDS.or_none)
    max_run_time_s: float | None = attrs.field(default=None, validator=POSITIVE_SECONDS.or_none)
    grace_s: float = attrs.field(default=30.0, validator=SECONDS)
    # run-level stops: conditions no retry can fix
    stop_after_auth_failures: int | None = attrs.field(default=5, validator=POSITIVE_COUNT.or_none)
    environment_protocol_violation_stop_after: int | None = attrs.field(
        default=5, validator=POSITIVE_COUNT.or_none
    )
    require_complete: bool = attrs.field(default=False, validator=_flag)
    # retries, budgets, breaker and the per-rollout limit (dispatch/retry.py design note)
    retry_requests: bool = attrs.field(default=False, validator=_flag)  # new attempt numbers
    max_request_retries: int = attrs.field(default=3, validator=COUNT)  # per rollout
    retry_backoff_base_s: float = attrs.field(default=0.5, validator=SECONDS)
    retry_backoff_max_s: float = attrs.field(default=30.0, validator=SECONDS)
    retry_budget_per_endpoint: int = attrs.field(default=100, validator=COUNT)  # a count
    breaker_failure_threshold: int = attrs.field(default=5, validator=POSITIVE_COUNT)
    breaker_open_s: float = attrs.field(default=5.0, validator=POSITIVE_SECONDS)  # the longest
    rollout_timeout_s: float | None = attrs.field(default=None, validator=POSITIVE_SECONDS.or_none)
    timeout_is_terminal: bool = attrs.field(default=False, validator=_flag)
    # the run timing report (docs/protocol.md section 9; collector/engine/timing.py)
    server_queue_metrics_urls: list[str] = attrs.field(factory=list)
    server_queue_sample_interval_s: float = attrs.field(default=10.0, validator=POSITIVE_SECONDS)
    server_queue_max_waiting_ratio: float = attrs.field(default=1.0, validator=RATIO)
    timing_summary_interval_s: float | None = attrs.field(
        default=300.0, validator=POSITIVE_SECONDS.or_none
    )
    # unset: the start row reports no window; the fraction is judged once a window is set
    dispatch_start_report_within_s: float | None = attrs.field(
        default=None, validator=SECONDS.or_none
    )
    dispatch_start_report_min_fraction: float = attrs.field(
        default=DEFAULT_START_MIN_FRACTION, validator=FRACTION
    )
    dispatch_all_started_within_s: float | None = attrs.field(
        default=None, validator=POSITIVE_SECONDS.or_none
    )
    timed_out_max_fraction: float = attrs.field(default=0.01, validator=FRACTION)
    long_rollout_s: float | None = attrs.field(default=None, validator=POSITIVE_SECONDS.or_none)
    long_rollout_max_fraction: float = attrs.field(default=0.05, validator=FRACTION)
    straggler_p90_multiple: float = attrs.field(default=3.0, validator=POSITIVE_RATIO)
    # a run on a Ray cluster (trollout.scaleout): its address ("local": a cluster of this
    # machine's own), the blocks in flight at once, and the blocks the plan is cut into (fixed
    # when the run starts, so a resume with another worker count finds the same block folders)
    ray_address: str | None = None
    ray_workers: int | None = attrs.field(default=None, validator=POSITIVE_COUNT.or_none)
    ray_blocks: int | None = attrs.field(default=None, validator=POSITIVE_COUNT.or_none)
    # durability and reporting
    fsync: FsyncPolicy = attrs.field(default=FsyncPolicy.BATCH, converter=_fsync)
    fsync_every_rows: int = attrs.field(default=256, validator=POSITIVE_COUNT)
    fsync_every_s: float = attrs.field(default=1.0, validator=POSITIVE_SECONDS)
    status_interval_s: float = attrs.field(default=2.0, validator=POSITIVE_SECONDS)
    record_omitted_rollouts: bool = attrs.field(default=False, validator=_flag)
    disable_aggregation: bool = attrs.field(default=False, validator=_flag)
    count_failure_classes_as_zero: list[str] | None = None
    count_missing_rollouts_as_zero: bool = attrs.field(default=False, validator=_flag)
    # a NeMo Gym batch manifest: members checked before dispatch, batch_status.json beside it
    batch_manifest_fpath: str | None = None
    # resume and attempts (docs/protocol.md section 8); none changes the materialized rows, so none
    # is fingerprinted: raising the cap or retrying terminal timeouts on resume is legitimate
    resume_from_cache: bool = attrs.field(default=False, validator=_flag)
    # resume, and send again what is done without having landed (``trollout resubmit``)
    resubmit: bool = attrs.field(default=False, validator=_flag)
    overwrite: bool = attrs.field(default=False, validator=_flag)  # a fresh run may replace one
    allow_unsafe_resume: bool = attrs.field(default=False, validator=_flag)
    max_attempts: int = attrs.field(factory=default_max_attempts, validator=POSITIVE_COUNT)
    retry_terminal_timeouts: bool = attrs.field(default=False, validator=_flag)
    # resume dispatches retryable failures (false: only what never finished; sbatch's tasks)
    retry_failed_on_resume: bool = attrs.field(default=True, validator=_flag)
    dispatch_longest_first: bool = attrs.field(default=False, validator=_flag)
    # telemetry (trollout.telemetry; the OTEL_* environment variables configure the rest)
    otlp_endpoint: str | None = None  # OTLP/HTTP base URL (OTEL_EXPORTER_OTLP_ENDPOINT's role)
    metrics_port: int | None = attrs.field(default=None, validator=PORT.or_none)  # Prometheus
    metrics_host: str = "127.0.0.1"  # where the Prometheus endpoint binds

    @property
    def resident_rollouts(self) -> int:
        """Workers to run: `max_resident_rollout_tasks`, or the concurrency."""
        return self.max_resident_rollout_tasks or self.num_samples_in_parallel

    def validate(self) -> None:
        """Check cross-field rules that single-field validators cannot.

        Raises:
            ConfigError: naming the key, the value and the remedy.
        """
        _check_repeats(self.num_repeats)
        self._check_urls()
        if self.environment_routing_mode not in {"agent", "legacy", "taskset"}:
            raise ConfigError(
                f"environment_routing_mode must be one of agent, legacy, taskset "
                f"(got {self.environment_routing_mode!r})"
            )
        if self.environment_routing_mode == "legacy" and not self.environment_server_name:
            raise ConfigError(
                "environment_routing_mode 'legacy' needs environment_server_name; set "
                "+environment_server_name=<server>"
            )
        if self.environment_routing_mode == "taskset" and not self.environment_server_routes:
            raise ConfigError(TASKSET_NEEDS_ROUTES)

    def _check_urls(self) -> None:
        for name, url in self.agent_urls.items():
            validate_url(url, what=f"URL of agent {name!r}")
        if self.head_server is not None:
            validate_url(self.head_server, what="head server URL")
        for url in self.server_queue_metrics_urls:
            validate_url(url, what="server_queue_metrics_urls entry")

    def plan_fingerprint(self) -> str:
        """Return sha256 of the settings that change what is dispatched.

        A key added to `PLAN_KEYS` after runs were made is hashed only when it is not at its
        default, so the fingerprint of a run that never used it stays what it was.
        """
        plan = {
            name: converter.unstructure(getattr(self, name))
            for name in PLAN_KEYS
            if name not in _LATER_PLAN_KEYS or getattr(self, name) != _DEFAULTS[name]
        }
        return hashlib.sha256(orjson.dumps(plan, option=orjson.OPT_SORT_KEYS)).hexdigest()

    def with_absolute_paths(self) -> RunConfig:
        """Return these settings with every file they name (`PATH_KEYS`) made absolute.

        For settings handed to another process that may run in another working directory (a
        Ray worker): there a relative path would name another file, or none.
        """
        paths = {k: os.path.abspath(v) for k in PATH_KEYS if (v := getattr(self, k))}
        return attrs.evolve(self, **paths)


TASKSET_NEEDS_ROUTES: Final = (
    "environment_routing_mode 'taskset' needs environment_server_routes (every row routes by "
    "its taskset); pass +environment_server_routes={<taskset>:<environment server>}"
)

# Settings whose change alters the materialized rows (fingerprinted in the manifest).
PLAN_KEYS = (
    "agent_name",
    "agent_map",
    "fan_out",
    "num_repeats",
    "num_repeats_add_seed",
    "seed",
    "seed_mode",
    "limit",
    "task_ids",
    "interleave_repeats",
    "round_robin_agents",
    "responses_create_params",
    "environment_routing_mode",
    "environment_server_name",
    "environment_server_routes",
    "prompt_config",
    "shard",
)
# Settings that name a file (`RunConfig.with_absolute_paths`).
PATH_KEYS: Final = (
    "input_jsonl_fpath",
    "output_jsonl_fpath",
    "prompt_config",
    "batch_manifest_fpath",
)
# Added to PLAN_KEYS after the first runs were made (hashed only when set; see above).
_LATER_PLAN_KEYS: Final = frozenset({"prompt_config", "shard"})
# Keys that order the materialized rows without changing one: a resume dispatches the rows
# saved in the run folder, in their saved order, so a change of these never mixes two runs.
ORDER_KEYS: Final = frozenset({"interleave_repeats", "round_robin_agents"})


def _default_of(field: attrs.Attribute[Any]) -> Any:
    factory = getattr(field.default, "factory", None)
    return factory() if callable(factory) else field.default


_DEFAULTS: Final = {a.name: _default_of(a) for a in attrs.fields(RunConfig) if a.name in PLAN_KEYS}


def plan_differences(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """Return ``key saved -> now`` for each plan setting that differs between two saved sets.

    Both are `saved_settings`-shaped mappings (a manifest's, and the current run's); a key one
    of them lacks (a setting added later) counts as its default, and `ORDER_KEYS` are not
    compared. This, not the fingerprint's bytes, decides whether a run may be resumed, so a
    fingerprint that gains a key never strands the runs made before.
    """
    diffs = []
    for key in PLAN_KEYS:
        if key in ORDER_KEYS:
            continue
        default = converter.unstructure(_DEFAULTS[key])
        before, after = saved.get(key, default), now.get(key, default)
        if before != after:
            diffs.append(f"{key} {before!r} -> {after!r}")
    return diffs


FIELD_NAMES = frozenset(a.name for a in attrs.fields(RunConfig))

converter = cattrs.Converter(forbid_extra_keys=True)


def _structure_repeats(value: Any, _: Any) -> Any:
    # cattrs has no hook for `int | dict[str, int]`; values pass through and `_check_repeats`
    # refuses bad ones, naming the key.
    return dict(value) if isinstance(value, Mapping) else value


converter.register_structure_hook(int | dict[str, int], _structure_repeats)
converter.register_structure_hook(bool | dict[str, bool], _structure_repeats)
converter.register_structure_hook(str | int, lambda value, _: value)  # `_task_ids` checks


def _as_given(value: Any, _: Any) -> Any:
    # cattrs would call int(), bool() or float() on the value: int(1.5) is 1, bool("false") is
    # True and float("nan") parses. Values pass through as given and the field validators,
    # which know the key, refuse the wrong kind.
    return value


def _as_float(value: Any, _: Any) -> Any:
    # An integer is a fine number of seconds (``+read_timeout_s=30``); keep the field a float.
    if type(value) is int and abs(value) <= MAX_COUNT:
        return float(value)
    return value


converter.register_structure_hook(int, _as_given)
converter.register_structure_hook(bool, _as_given)
converter.register_structure_hook(float, _as_float)


def repeats_problems(value: Any) -> list[str]:
    """Return one message per bad ``num_repeats`` value (an int, or ``{agent: int}``)."""
    counts = value.items() if isinstance(value, dict) else [(None, value)]
    problems = []
    for key, count in counts:
        name = "num_repeats" if key is None else f"num_repeats.{key}"
        if not POSITIVE_COUNT.accepts(count):
            problems.append(f"{name} must be an integer >= 1 (got {count!r}); use 1 or more")
    return problems


def _check_repeats(value: int | dict[str, int]) -> None:
    problems = repeats_problems(value)
    if problems:
        raise ConfigError("; ".join(problems))


# --- sources ----------------------------------------------------------------------------------


def load_config(
    *,
    config_file: str | os.PathLike[str] | None = None,
    options: Mapping[str, Any] | None = None,
    overrides: Iterable[str] = (),
    defaults: Mapping[str, Any] | None = None,
) -> RunConfig:
    """Build a validated `RunConfig` from a YAML file, options and ``+key=value`` overrides.

    Args:
        config_file: a YAML file of settings.
        options: settings from command-line options (None values are left out).
        overrides: ``+key=value`` tokens.
        defaults: settings below all of these (a command's own defaults).

    Raises:
        ConfigError: a file that cannot be read, an unknown key, or a bad value.
    """
    values: dict[str, Any] = dict(defaults or {})
    if config_file is not None:
        values.update(read_settings_file(config_file))
    values.update({k: v for k, v in (options or {}).items() if v is not None})
    for token in overrides:
        key, value = parse_override(token)
        values[key] = value
    return build_config(values)


def build_config(values: Mapping[str, Any]) -> RunConfig:
    """Structure a mapping of settings into a validated `RunConfig`."""
    values = dict(values)
    unknown = sorted(set(values) - FIELD_NAMES)
    if unknown:
        raise ConfigError("; ".join(_unknown_key_message(k) for k in unknown))
    for key in NULL_MEANS_DEFAULT & values.keys():
        if values[key] is None:
            del values[key]
    _check_shapes(values)
    if isinstance(values.get("head_server"), Mapping):
        values["head_server"] = head_server_url(values["head_server"])
    try:
        config = converter.structure(values, RunConfig)
    except ConfigError:
        raise
    except (cattrs.BaseValidationError, ValueError, TypeError) as exc:
        # A validator's ConfigError arrives wrapped by cattrs; its own message is the best one.
        inner = _wrapped_config_error(exc)
        raise ConfigError(str(inner) if inner else _structure_message(exc)) from exc
    config.validate()
    return config


# NeMo Gym's Optional settings whose null means "the default" where trollout's are required
# (NeMo Gym coerces ``num_repeats: null`` to 1; ``num_samples_in_parallel: null`` is its "no
# limit", trollout's default 64; an empty mapping or list is what null asks for).
NULL_MEANS_DEFAULT: Final = frozenset(
    {
        "num_repeats",
        "num_samples_in_parallel",
        "agent_map",
        "fan_out",
        "responses_create_params",
        "environment_server_routes",
        "server_queue_metrics_urls",
        "agent_urls",
        "served_config_env_allow",
        "dispatch_start_report_min_fraction",  # saved as null by runs made before it had one
    }
)


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _optional_str(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _str_map(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def _str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _optional_list(value: Any) -> bool:
    return value is None or isinstance(value, list)


def _optional_str_list(value: Any) -> bool:
    return value is None or _str_list(value)


def _fan_out(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and _str_list(v) for k, v in value.items()
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


# The expected shape of every setting that is not a number or a flag (those have validators),
# with an example; checked before structuring, because cattrs would turn a list into its
# text where a string is expected (``+agent_map={a:[1,2]}`` would route to agent "[1, 2]").
_MAPPING_OF_AGENTS: Final = "a mapping of names to agent names"
_SHAPES: Final[dict[str, tuple[str, Callable[[Any], bool], str]]] = {
    "input_jsonl_fpath": ("a path", _optional_str, "data/in.jsonl"),
    "output_jsonl_fpath": ("a path", _optional_str, "out/rollouts.jsonl"),
    "head_server": ("a URL or {host, port}", _head, "{host:127.0.0.1,port:11000}"),
    "agent_urls": ("a mapping of agent names to URLs", _str_map, "{math:'http://h:1'}"),
    "served_config_env_allow": ("a list of environment variable names", _str_list, "[HEAD_HOST]"),
    "agent_name": ("an agent name (a string)", _optional_str, "math_agent"),
    "agent_map": (_MAPPING_OF_AGENTS, _str_map, "{old_agent:new_agent}"),
    "fan_out": ("a mapping of names to lists of agent names", _fan_out, "{source:[a,b]}"),
    "num_repeats": ("an integer, or a mapping of agent names to integers", _repeats, "4"),
    "num_repeats_add_seed": (
        "true or false, or a mapping of agent names to true or false",
        _seeds,
        "{_default:false,math_agent:true}",
    ),
    "task_ids": ("a list of task ids", _optional_list, "[row-000001,row-000007]"),
    "prompt_config": ("a path to a prompt YAML file", _optional_str, "prompts/math.yaml"),
    "responses_create_params": ("a mapping of parameters", _object, "{temperature:0.6}"),
    "environment_routing_mode": ("one of agent, legacy, taskset", _is_str, "agent"),
    "environment_server_name": ("a server name (a string)", _optional_str, "math_env"),
    "environment_server_routes": ("a mapping of tasksets to servers", _str_map, "{ts:env}"),
    "server_queue_metrics_urls": ("a list of URLs", _str_list, "['http://h:8000']"),
    "count_failure_classes_as_zero": (
        "a list of failure classes",
        _optional_str_list,
        "[agent_run_error]",
    ),
    "batch_manifest_fpath": ("a path to a batch manifest", _optional_str, "batch.json"),
}


def _check_shapes(values: Mapping[str, Any]) -> None:
    """Refuse a setting whose value has the wrong shape, naming the key and the shape."""
    for key, value in values.items():
        shape = _SHAPES.get(key)
        if shape is not None and not shape[1](value):
            raise ConfigError(
                f"{key} must be {shape[0]} (got {_shown(value)}); write e.g. +{key}={shape[2]}"
            )


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:199] + "…"


def _unknown_key_message(key: str) -> str:
    close = difflib.get_close_matches(key, FIELD_NAMES, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else "; see trollout collect --help"
    return f"unknown setting {key!r}{hint}"


def _wrapped_config_error(exc: BaseException) -> ConfigError | None:
    if isinstance(exc, ConfigError):
        return exc
    for inner in getattr(exc, "exceptions", ()):
        found = _wrapped_config_error(inner)
        if found is not None:
            return found
    return None


def _structure_message(exc: Exception) -> str:
    if isinstance(exc, cattrs.BaseValidationError):
        notes = cattrs.transform_error(exc)
        return "invalid settings: " + "; ".join(notes)
    return f"invalid settings: {exc}"


def head_server_url(block: Mapping[str, Any]) -> str:
    """Return the URL of NeMo Gym's ``head_server: {host, port}`` block."""
    host = block.get("host", "127.0.0.1")
    port = block.get("port", 11000)
    return f"http://{host}:{port}"


def read_settings_file(
    path: str | os.PathLike[str], *, what: str = "config file"
) -> dict[str, Any]:
    """Read a YAML file of settings (a mapping; an empty file is no setting).

    Raises:
        ConfigError: the file cannot be read, is not YAML, or is not a mapping.
    """
    return _read_yaml(Path(path), what)


def _read_yaml(path: Path, what: str = "config file") -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"cannot read {what} {str(path)!r}: {reason}") from exc
    data = load_yaml(text, source=f"{what} {str(path)!r}")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {str(path)!r} must hold a mapping of settings")
    return data


# --- YAML and URLs ----------------------------------------------------------------------------


def load_yaml(text: str, *, source: str, quote: bool = True) -> Any:
    """Parse YAML safely, refusing aliases of mappings and lists and deep nesting.

    Args:
        text: the document.
        source: what it is, for messages (``"config file 'run.yaml'"``).
        quote: let messages carry the YAML parser's description of a syntax error, which may
            quote a few characters of the document; pass False for text that holds secrets.

    Raises:
        ConfigError: naming ``source``, the line and column, and what was refused.
    """
    loader = _BoundedLoader(text, quote=quote)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        problem = _yaml_problem(exc, quote, source)
    except (ValueError, LookupError, AttributeError, TypeError) as exc:
        # PyYAML's constructors raise plain errors that quote the value (`!!int sk-...`).
        problem = f"{source} holds a value YAML cannot build ({type(exc).__name__}); fix the YAML"
    finally:
        loader.dispose()
    # Raised outside `except`: a chained YAMLError's marks hold the document's text.
    raise ConfigError(problem)


def _yaml_problem(exc: yaml.YAMLError, quote: bool, source: str) -> str:
    # Plain concatenation: the parser's wording quotes the document (braces included).
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    if isinstance(exc, _RefusedYamlError):
        return f"{source} {exc.reason}{where}; {exc.remedy}"
    detail = getattr(exc, "problem", None) if quote else None
    said = f" ({detail})" if detail else ""
    return f"{source} is not valid YAML{where}{said}; fix the YAML"


class _RefusedYamlError(yaml.MarkedYAMLError):
    """A well-formed document that trollout refuses (reason and remedy are our own text)."""

    def __init__(self, reason: str, remedy: str, mark: Any) -> None:
        super().__init__(problem=reason, problem_mark=mark)
        self.reason = reason
        self.remedy = remedy


class _BoundedLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses aliases of collections, nesting past MAX_VALUE_DEPTH and
    a key given twice in one mapping.

    Composing is where the first two show: a scalar alias copies one value, a collection alias
    is how a billion-laughs document grows exponentially once serialized, and composing
    recurses once per level (RecursionError on a deep enough flow sequence). A duplicate key
    is legal to PyYAML, which keeps the last value: a setting written twice would silently
    take the second, so it is refused naming its line (and, when ``quote``, the key).
    """

    def __init__(self, stream: str, *, quote: bool = True) -> None:
        super().__init__(stream)
        self._depth = 0
        self._quote = quote

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                repeated = key in seen
            except TypeError:
                continue  # an unhashable key: the constructor refuses it itself
            if repeated:
                shown = f"the key {_shown(key)}" if self._quote else "a key"
                raise _RefusedYamlError(
                    f"has {shown} twice in one mapping",
                    "keep one (YAML would silently take the last)",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep)

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event: Any = self.peek_event()  # type: ignore[no-untyped-call]  # untyped in the stubs
        if isinstance(event, yaml.AliasEvent):
            target = self.anchors.get(event.anchor)
            if isinstance(target, yaml.MappingNode | yaml.SequenceNode):
                raise _RefusedYamlError(
                    "uses an alias of a mapping or list",
                    "write the value out instead of *alias or <<: merge (only scalar aliases "
                    "are accepted: collection aliases expand without bound)",
                    event.start_mark,
                )
        elif isinstance(event, yaml.CollectionStartEvent) and self._depth >= MAX_VALUE_DEPTH:
            raise _RefusedYamlError(
                f"nests deeper than {MAX_VALUE_DEPTH} levels", "flatten it", event.start_mark
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def validate_url(url: str, *, what: str) -> str:
    """Return ``url`` without a trailing slash after checking it is ``http://host[:port]``.

    trollout speaks plain HTTP/1.1 (its own codec, no TLS), so ``https://`` is refused here,
    before anything is written, rather than failing every rollout later.

    Raises:
        ConfigError: naming ``what`` and the URL (unless it may carry credentials).
    """
    if "@" in url:
        raise ConfigError(f"{what} must not carry credentials (user:password@); remove them")
    parts = _split(url)
    if parts is not None and parts.scheme.lower() == "https":
        raise ConfigError(
            f"{what} must be a plain http:// URL (got {url!r}): trollout speaks HTTP/1.1 without "
            "TLS; use http://, or reach a TLS-only server through a local proxy or tunnel"
        )
    if parts is None or parts.scheme != "http" or not parts.hostname:
        raise ConfigError(
            f"{what} must be http://host:port with a port 1..65535 (got {url!r}); fix it"
        )
    if parts.query or parts.fragment:
        raise ConfigError(f"{what} must have no ?query or #fragment (got {url!r}); remove them")
    return url.rstrip("/")


def _split(url: str) -> SplitResult | None:
    try:
        parts = urlsplit(url)
        port = parts.port  # raises for a non-numeric or out-of-range port
    except ValueError:
        return None
    return None if port == 0 else parts


# --- +key=value overrides ---------------------------------------------------------------------


def parse_override(token: str) -> tuple[str, Any]:
    """Parse ``+key=value`` or ``++key=value`` (Hydra syntax) into a key and a value.

    Raises:
        ConfigError: the token has no ``=`` or no key.
    """
    body = token.lstrip("+")
    key, sep, raw = body.partition("=")
    if len(token) - len(body) not in (1, 2) or not sep or not key:
        raise ConfigError(f"override {token!r} must look like +key=value")
    try:
        value = parse_value(raw)
    except ConfigError as exc:
        raise ConfigError(f"override +{key.strip()}: {exc}") from None
    return key.strip(), value


def parse_value(text: str) -> Any:
    """Parse a Hydra-style value: mappings, lists, booleans, null, numbers, strings."""
    parser = _ValueParser(text)
    value = parser.value()
    parser.expect_end()
    return value


class _ValueParser:
    """A small recursive-descent parser for Hydra's override values."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.depth = 0

    def value(self) -> Any:
        self._skip()
        ch = self._peek()
        if ch and ch in "{[":
            return self._collection(ch)
        if ch and ch in "'\"":
            return self._quoted()
        return _scalar(self._bare())

    def expect_end(self) -> None:
        self._skip()
        if self.pos != len(self.text):
            raise ConfigError(f"cannot parse override value {self.text!r} near position {self.pos}")

    def _collection(self, opening: str) -> Any:
        # Each level is a recursive call: bound it before Python's recursion limit does.
        if self.depth >= MAX_VALUE_DEPTH:
            raise ConfigError(
                f"override value nests deeper than {MAX_VALUE_DEPTH} levels (at position "
                f"{self.pos}); flatten it"
            )
        self.depth += 1
        try:
            return self._mapping() if opening == "{" else self._list()
        finally:
            self.depth -= 1

    def _mapping(self) -> dict[str, Any]:
        self.pos += 1
        out: dict[str, Any] = {}
        while not self._eat("}"):
            key = self._quoted() if self._peek() in "'\"" else self._bare(stop=":}")
            if not self._eat(":"):
                raise ConfigError(f"expected ':' after key {key!r} in {self.text!r}")
            out[str(key).strip()] = self.value()
            self._eat(",")
        return out

    def _list(self) -> list[Any]:
        self.pos += 1
        out: list[Any] = []
        while not self._eat("]"):
            out.append(self.value())
            self._eat(",")
        return out

    def _quoted(self) -> str:
        quote = self.text[self.pos]
        end = self.text.find(quote, self.pos + 1)
        if end < 0:
            raise ConfigError(f"unterminated quote in override value {self.text!r}")
        value = self.text[self.pos + 1 : end]
        self.pos = end + 1
        return value

    def _bare(self, stop: str = ",]}") -> str:
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] not in stop:
            self.pos += 1
        return self.text[start : self.pos].strip()

    def _peek(self) -> str:
        if self.pos >= len(self.text):
            return ""
        return self.text[self.pos]

    def _eat(self, ch: str) -> bool:
        self._skip()
        if self.pos >= len(self.text):
            if ch in "}]":
                raise ConfigError(f"unclosed bracket in override value {self.text!r}")
            return False
        if self.text[self.pos] == ch:
            self.pos += 1
            self._skip()
            return True
        return False

    def _skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] == " ":
            self.pos += 1


def _scalar(text: str) -> Any:
    lowered = text.lower()
    if lowered in {"true", "false"}:
        return lowered == "true"
    if lowered in {"null", "none", "~"}:
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
