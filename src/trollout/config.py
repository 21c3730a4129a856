"""Run configuration: one flat attrs record, filled from YAML, click options and overrides.

A run is described by `RunConfig`, whose field names are NeMo Gym's config keys (so
``+num_repeats=4`` and ``num_repeats: 4`` in a YAML file mean what they mean in NeMo Gym) plus
trollout's own settings. Sources, later wins: defaults < ``--config run.yaml`` < click options
< ``+key=value`` / ``++key=value`` overrides (protocol.md section 10).

Values of overrides use Hydra's flow syntax: ``{host:127.0.0.1,port:11000}`` is a mapping,
``[a,b]`` a list, ``true``/``false``/``null``, numbers, and quoted or bare strings. YAML's own flow
syntax is not used because it reads ``{host:127.0.0.1}`` as a key with no value.

Validation happens once, in `RunConfig.__attrs_post_init__`-free validators and `validate()`, and
every message names the key, shows the value and says what was expected. Unknown keys are refused
with the closest known key suggested, so a typo never silently does nothing.
"""

from __future__ import annotations

import difflib
import enum
import hashlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs
import cattrs
import orjson
import yaml
from attrs import frozen

from .errors import ConfigError

__all__ = [
    "MAX_ATTEMPTS_ENV",
    "FsyncPolicy",
    "RunConfig",
    "SeedMode",
    "default_max_attempts",
    "load_config",
    "parse_override",
    "parse_value",
]


class SeedMode(enum.Enum):
    """How `num_repeats_add_seed` chooses a rollout's seed."""

    HASH = "hash"  # hash(run seed, task, rollout): seeds differ across tasks (ours, default)
    ROLLOUT_INDEX = "rollout-index"  # seed = rollout index (NeMo Gym's behaviour)


class FsyncPolicy(enum.Enum):
    """When the store fsyncs appended rows."""

    ROW = "row"  # after every row: safest, slowest
    BATCH = "batch"  # every fsync_every_rows rows or fsync_every_s seconds (default)
    NEVER = "never"  # leave it to the OS


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


def _positive(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and value <= 0:
        raise ConfigError(f"{attribute.name} must be > 0 (got {value!r})")


def _non_negative(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and value < 0:
        raise ConfigError(f"{attribute.name} must be >= 0 (got {value!r})")


@frozen(kw_only=True)
class RunConfig:
    """Every setting of a collection run (NeMo Gym key names where NeMo Gym has the setting).

    Attributes are documented in ``trollout collect --help`` and README.md; the groups are input
    and output, deployment, preprocessing (protocol.md section 5), dispatch and durability.
    """

    # input and output
    input_jsonl_fpath: str | None = None
    output_jsonl_fpath: str | None = None
    # deployment
    head_server: str | None = None
    agent_urls: dict[str, str] = attrs.field(factory=dict)
    # preprocessing (these change what is dispatched, so they are fingerprinted)
    agent_name: str | None = None
    agent_map: dict[str, str] = attrs.field(factory=dict)
    fan_out: dict[str, list[str]] = attrs.field(factory=dict)
    num_repeats: int | dict[str, int] = 1
    num_repeats_add_seed: bool = False
    seed: int = 0
    seed_mode: SeedMode = SeedMode.HASH
    limit: int | None = attrs.field(default=None, validator=_non_negative)
    task_ids: list[int] | None = None
    interleave_repeats: bool = False
    round_robin_agents: bool = False
    responses_create_params: dict[str, Any] = attrs.field(factory=dict)
    environment_routing_mode: str = "agent"
    environment_server_name: str | None = None
    environment_server_routes: dict[str, str] = attrs.field(factory=dict)
    # dispatch
    num_samples_in_parallel: int = attrs.field(default=64, validator=_positive)
    max_resident_rollout_tasks: int | None = attrs.field(default=None, validator=_positive)
    max_rollouts: int = attrs.field(default=10_000_000, validator=_positive)  # a plan's size
    connect_timeout_s: float = attrs.field(default=10.0, validator=_positive)
    read_timeout_s: float = attrs.field(default=3600.0, validator=_positive)
    # the longest one /run request may take, sending through the last reply byte, however
    # steadily bytes trickle in; None: twice read_timeout_s (7200 s by default)
    reply_timeout_s: float | None = attrs.field(default=None, validator=_positive)
    max_reply_bytes: int = attrs.field(default=256 * 1024 * 1024, validator=_positive)  # decoded
    dispatch_connect_grace_s: float = attrs.field(default=30.0, validator=_non_negative)
    max_connect_retries: int = attrs.field(default=4, validator=_non_negative)
    fail_fast: bool = False
    # budget, drain and the run's wall clock (protocol.md section 9)
    dispatch_budget_s: float | None = attrs.field(default=None, validator=_non_negative)
    drain_margin_s: float | None = attrs.field(default=None, validator=_non_negative)
    max_run_time_s: float | None = attrs.field(default=None, validator=_positive)
    grace_s: float = attrs.field(default=30.0, validator=_non_negative)
    # run-level stops: conditions no retry can fix
    stop_after_auth_failures: int | None = attrs.field(default=5, validator=_positive)
    environment_protocol_violation_stop_after: int | None = attrs.field(
        default=5, validator=_positive
    )
    require_complete: bool = False
    # retries, budgets, breaker and the per-rollout limit (collector/retry.py's design note)
    retry_requests: bool = False  # re-send possibly-delivered requests (new attempt numbers)
    max_request_retries: int = attrs.field(default=3, validator=_non_negative)  # per rollout
    retry_backoff_base_s: float = attrs.field(default=0.5, validator=_non_negative)
    retry_backoff_max_s: float = attrs.field(default=30.0, validator=_non_negative)
    retry_budget_per_endpoint: int = attrs.field(default=100, validator=_non_negative)  # a count
    breaker_failure_threshold: int = attrs.field(default=20, validator=_positive)
    breaker_open_s: float = attrs.field(default=30.0, validator=_positive)
    rollout_timeout_s: float | None = attrs.field(default=None, validator=_positive)
    timeout_is_terminal: bool = False
    # the run timing report (protocol.md section 9; collector/timing.py)
    server_queue_metrics_urls: list[str] = attrs.field(factory=list)
    server_queue_sample_interval_s: float = attrs.field(default=10.0, validator=_positive)
    server_queue_max_waiting_ratio: float = attrs.field(default=1.0, validator=_non_negative)
    timing_summary_interval_s: float | None = attrs.field(default=300.0, validator=_positive)
    dispatch_start_report_within_s: float = attrs.field(default=60.0, validator=_non_negative)
    dispatch_start_report_min_fraction: float | None = None
    dispatch_all_started_within_s: float | None = attrs.field(default=None, validator=_positive)
    timed_out_max_fraction: float = attrs.field(default=0.01, validator=_non_negative)
    long_rollout_s: float | None = attrs.field(default=None, validator=_positive)
    long_rollout_max_fraction: float = attrs.field(default=0.05, validator=_non_negative)
    straggler_p90_multiple: float = attrs.field(default=3.0, validator=_positive)
    # durability and reporting
    fsync: FsyncPolicy = FsyncPolicy.BATCH
    fsync_every_rows: int = attrs.field(default=256, validator=_positive)
    fsync_every_s: float = attrs.field(default=1.0, validator=_positive)
    status_interval_s: float = attrs.field(default=2.0, validator=_positive)
    record_omitted_rollouts: bool = False
    disable_aggregation: bool = False
    count_failure_classes_as_zero: list[str] | None = None
    count_missing_rollouts_as_zero: bool = False
    # resume and attempts (protocol.md section 8); none changes the materialized rows, so none
    # is fingerprinted: raising the cap or retrying terminal timeouts on resume is legitimate
    resume_from_cache: bool = False
    overwrite: bool = False  # a fresh run may replace a run already in the output folder
    allow_unsafe_resume: bool = False
    max_attempts: int = attrs.field(factory=default_max_attempts, validator=_positive)
    retry_terminal_timeouts: bool = False
    dispatch_longest_first: bool = False

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

    def plan_fingerprint(self) -> str:
        """Return sha256 of the settings that change what is dispatched."""
        plan = {name: converter.unstructure(getattr(self, name)) for name in PLAN_KEYS}
        return hashlib.sha256(orjson.dumps(plan, option=orjson.OPT_SORT_KEYS)).hexdigest()


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
)

FIELD_NAMES = frozenset(a.name for a in attrs.fields(RunConfig))

converter = cattrs.Converter(forbid_extra_keys=True)


def _structure_repeats(value: Any, _: Any) -> Any:
    # cattrs has no hook for `int | dict[str, int]`; values pass through and `_check_repeats`
    # refuses bad ones, naming the key.
    return dict(value) if isinstance(value, Mapping) else value


converter.register_structure_hook(int | dict[str, int], _structure_repeats)


def repeats_problems(value: Any) -> list[str]:
    """Return one message per bad ``num_repeats`` value (an int, or ``{agent: int}``)."""
    counts = value.items() if isinstance(value, dict) else [(None, value)]
    problems = []
    for key, count in counts:
        name = "num_repeats" if key is None else f"num_repeats.{key}"
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
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
) -> RunConfig:
    """Build a validated `RunConfig` from a YAML file, options and ``+key=value`` overrides.

    Raises:
        ConfigError: a file that cannot be read, an unknown key, or a bad value.
    """
    values: dict[str, Any] = {}
    if config_file is not None:
        values.update(_read_yaml(Path(config_file)))
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


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of settings")
    return data


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
    return key.strip(), parse_value(raw)


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

    def value(self) -> Any:
        self._skip()
        ch = self._peek()
        if ch == "{":
            return self._mapping()
        if ch == "[":
            return self._list()
        if ch and ch in "'\"":
            return self._quoted()
        return _scalar(self._bare())

    def expect_end(self) -> None:
        self._skip()
        if self.pos != len(self.text):
            raise ConfigError(f"cannot parse override value {self.text!r} near position {self.pos}")

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
