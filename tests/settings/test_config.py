"""Tests of run configuration: overrides, validation, files and precedence."""

from __future__ import annotations

import functools
import math
import random
import re
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trollout.collector.dispatch.request import DispatchPolicy
from trollout.collector.dispatch.retry import RetryPolicy
from trollout.enrichment import EnrichmentOptions
from trollout.errors import ConfigError
from trollout.settings import (
    NULL_MEANS_DEFAULT,
    FsyncPolicy,
    NumberRange,
    RunConfig,
    SeedMode,
    build_config,
    converter,
    load_config,
    load_yaml,
    parse_override,
    parse_value,
    validate_url,
)

# --- +key=value parsing ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        ("+num_repeats=4", ("num_repeats", 4)),
        ("++num_repeats=4", ("num_repeats", 4)),
        ("+agent_name=math_agent", ("agent_name", "math_agent")),
        ("+input_jsonl_fpath=data/in=1.jsonl", ("input_jsonl_fpath", "data/in=1.jsonl")),
        ("+key=", ("key", "")),
    ],
)
def test_parse_override_splits_key_and_value(token: str, expected: tuple[str, Any]) -> None:
    """+key=value and ++key=value give the key and the parsed value (split at the first =)."""
    assert parse_override(token) == expected


@pytest.mark.parametrize("token", ["key=1", "+key", "+=1", "+++key=1", "", "+"])
def test_parse_override_refuses_malformed_tokens(token: str) -> None:
    """Tokens that are not +key=value or ++key=value are refused, shown as given."""
    with pytest.raises(ConfigError, match=re.escape(f"override {token!r} must look like")):
        parse_override(token)


def test_parse_value_reads_a_mapping() -> None:
    """Hydra's {host:127.0.0.1,port:11000} is a mapping with a string and an int."""
    assert parse_value("{host:127.0.0.1,port:11000}") == {"host": "127.0.0.1", "port": 11000}


def test_parse_value_reads_a_list() -> None:
    """[agent_run_error,transient] is a list of bare strings."""
    assert parse_value("[agent_run_error,transient]") == ["agent_run_error", "transient"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("true", True),
        ("False", False),
        ("null", None),
        ("42", 42),
        ("-3", -3),
        ("2.5", 2.5),
        ("1e3", 1000.0),
        ("'42'", "42"),
        ("'true'", "true"),
        ('"a, b]"', "a, b]"),
        ("hello", "hello"),
        ("  padded  ", "padded"),
        ("", ""),
        ("[]", []),
        ("{}", {}),
    ],
)
def test_parse_value_reads_scalars(text: str, expected: Any) -> None:
    """Booleans, null, numbers, quoted and bare strings parse to their Python types."""
    value = parse_value(text)
    assert value == expected
    assert type(value) is type(expected)


def test_parse_value_reads_nested_structures() -> None:
    """Mappings and lists nest, with spaces, quoted keys and quoted values."""
    text = "{a: {b: [1, 2.5, 'x y', true, null]}, 'c d': [[], {e: f}]}"
    assert parse_value(text) == {"a": {"b": [1, 2.5, "x y", True, None]}, "c d": [[], {"e": "f"}]}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1,2", "unclosed bracket"),
        ("{a:1", "unclosed bracket"),
        ("'open", "unterminated quote"),
        ("{a 1}", "expected ':' after key 'a 1'"),
        ("a]", "near position 1"),
    ],
)
def test_parse_value_refuses_malformed_values(text: str, message: str) -> None:
    """Unclosed brackets and quotes, missing colons and trailing text are refused."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_value(text)


# A hypothesis round-trip: render a generated value in Hydra syntax, parse it back.

_BARE = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*")
_KEYWORDS = {"true", "false", "null", "none", "nan", "inf", "infinity"}


def _bare_ok(text: str) -> bool:
    return bool(_BARE.fullmatch(text)) and text.lower() not in _KEYWORDS


def _render(value: Any) -> str:
    """Render a value in the override syntax, quoting strings that would not read back."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return value if _bare_ok(value) else f"'{value}'"
    if isinstance(value, list):
        return "[" + ",".join(_render(v) for v in value) + "]"
    return "{" + ",".join(f"{_render(k)}:{_render(v)}" for k, v in value.items()) + "}"


def _typed(value: Any) -> Any:
    """Return a comparable form that tells True from 1 and 1 from 1.0."""
    if isinstance(value, list):
        return ("list", [_typed(v) for v in value])
    if isinstance(value, dict):
        return ("dict", {k: _typed(v) for k, v in value.items()})
    return (type(value).__name__, value)


_texts = st.text(st.characters(exclude_characters="'\"", exclude_categories=["Cs"]), max_size=12)
_keys = _texts.filter(lambda k: k == k.strip() and k != "")
_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | _texts
)
simple_values = st.recursive(
    _scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_keys, children, max_size=4),
    max_leaves=12,
)


@given(simple_values)
def test_parse_value_round_trips_rendered_values(value: Any) -> None:
    """Any simple value rendered in the override syntax parses back to itself, types kept."""
    assert _typed(parse_value(_render(value))) == _typed(value)


@given(st.from_regex(_BARE, fullmatch=True).filter(_bare_ok), simple_values)
def test_parse_override_round_trips_rendered_values(key: str, value: Any) -> None:
    """+key=<rendered value> parses back to the key and the value."""
    parsed_key, parsed = parse_override(f"+{key}={_render(value)}")
    assert (parsed_key, _typed(parsed)) == (key, _typed(value))


def test_render_helper_quotes_keyword_strings() -> None:
    """The round-trip helper quotes strings that would read as other types."""
    assert [_render(v) for v in ("true", "nan", "12", "a b", "ok")] == [
        "'true'",
        "'nan'",
        "'12'",
        "'a b'",
        "ok",
    ]
    assert math.isinf(parse_value("inf"))


# --- validation -----------------------------------------------------------------------------


def test_build_config_refuses_unknown_keys_with_a_suggestion() -> None:
    """A typo is refused with the closest known key suggested."""
    with pytest.raises(ConfigError) as info:
        build_config({"num_repeat": 3})
    assert str(info.value) == "unknown setting 'num_repeat'; did you mean 'num_repeats'?"


def test_build_config_reports_every_unknown_key() -> None:
    """All unknown keys are reported together; one without a close match points to --help."""
    with pytest.raises(ConfigError) as info:
        build_config({"zzzz": 1, "limt": 3})
    assert str(info.value) == (
        "unknown setting 'limt'; did you mean 'limit'?; "
        "unknown setting 'zzzz'; see trollout collect --help"
    )


@pytest.mark.parametrize(
    ("repeats", "message"),
    [
        (0, "num_repeats must be an integer >= 1 (got 0); use 1 or more"),
        (True, "num_repeats must be an integer >= 1 (got True); use 1 or more"),
        ("3", "num_repeats must be an integer >= 1 (got '3'); use 1 or more"),
        ({"math": 0, "_default": 2}, "num_repeats.math must be an integer >= 1 (got 0)"),
        ({"math": 2, "_default": -1}, "num_repeats._default must be an integer >= 1 (got -1)"),
    ],
)
def test_build_config_refuses_repeats_below_one_naming_the_key(repeats: Any, message: str) -> None:
    """num_repeats 0, and per-agent values below 1, are refused with the key named."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_config({"num_repeats": repeats})


def test_build_config_accepts_per_agent_repeats() -> None:
    """num_repeats may be an int or a per-agent mapping with _default."""
    assert build_config({"num_repeats": 4}).num_repeats == 4
    per_agent = {"math": 2, "_default": 1}
    assert build_config({"num_repeats": per_agent}).num_repeats == per_agent


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"limit": -1},
            "limit must be an integer from 0 to 2**63 - 1 (got -1); "
            "fix the value, or leave it unset",
        ),
        (
            {"num_samples_in_parallel": 0},
            "num_samples_in_parallel must be an integer from 1 to 2**63 - 1 (got 0); "
            "use e.g. 64 (the default)",
        ),
        (
            {"read_timeout_s": -5.0},
            "read_timeout_s must be a number of seconds > 0 and at most 1e9 (got -5.0); "
            "use e.g. 3600.0 (the default)",
        ),
    ],
)
def test_build_config_keeps_validator_messages(values: dict[str, Any], message: str) -> None:
    """A field validator's message reaches the user unwrapped by cattrs."""
    with pytest.raises(ConfigError) as info:
        build_config(values)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"num_samples_in_parallel": "many"}, "num_samples_in_parallel must be an integer"),
        ({"seed_mode": "bogus"}, "$.seed_mode"),
        ({"task_ids": [True]}, "task_ids[0] must be a task id"),
        ({"agent_map": {"agent_a": [1, 2]}}, "agent_map must be a mapping of names to agent"),
    ],
)
def test_build_config_names_the_key_of_a_bad_type(values: dict[str, Any], key: str) -> None:
    """A value of the wrong type is refused naming its key path."""
    with pytest.raises(ConfigError, match=re.escape(key)):
        build_config(values)


def test_build_config_converts_head_server_mapping_to_url() -> None:
    """head_server given as {host, port} becomes http://host:port; defaults fill gaps."""
    assert (
        build_config({"head_server": {"host": "10.1.2.3", "port": 12000}}).head_server
        == "http://10.1.2.3:12000"
    )
    assert build_config({"head_server": {}}).head_server == "http://127.0.0.1:11000"
    assert build_config({"head_server": "http://h:1"}).head_server == "http://h:1"


def test_build_config_structures_enums_and_collections() -> None:
    """Enum values, lists and mappings are structured into their field types."""
    config = build_config(
        {
            "seed_mode": "rollout-index",
            "fsync": "row",
            "fan_out": {"math": ["a", "b"]},
            "task_ids": [3, 1],
            "environment_server_routes": {"math": "env"},
        }
    )
    assert config.seed_mode is SeedMode.ROLLOUT_INDEX
    assert config.fsync is FsyncPolicy.ROW
    assert (config.fan_out, config.task_ids) == ({"math": ["a", "b"]}, [3, 1])


def test_build_config_checks_environment_routing_mode() -> None:
    """The routing mode must be known, and legacy needs a server name."""
    with pytest.raises(ConfigError, match="must be one of agent, legacy, taskset"):
        build_config({"environment_routing_mode": "bogus"})
    with pytest.raises(ConfigError, match=r"needs environment_server_name"):
        build_config({"environment_routing_mode": "legacy"})
    config = build_config({"environment_routing_mode": "legacy", "environment_server_name": "e"})
    assert config.environment_server_name == "e"


def test_build_config_taskset_mode_needs_routes() -> None:
    """environment_routing_mode=taskset routes every row by taskset, so it needs the routes."""
    with pytest.raises(ConfigError) as info:
        build_config({"environment_routing_mode": "taskset"})
    assert str(info.value) == (
        "environment_routing_mode 'taskset' needs environment_server_routes (every row routes by "
        "its taskset); pass +environment_server_routes={<taskset>:<environment server>}"
    )
    routes = {"environment_routing_mode": "taskset", "environment_server_routes": {"ts": "e"}}
    assert build_config(routes).environment_server_routes == {"ts": "e"}


def test_resident_rollouts_defaults_to_the_concurrency() -> None:
    """Workers follow max_resident_rollout_tasks when set, else num_samples_in_parallel."""
    assert RunConfig(num_samples_in_parallel=8).resident_rollouts == 8
    both = RunConfig(num_samples_in_parallel=8, max_resident_rollout_tasks=3)
    assert both.resident_rollouts == 3


def test_plan_fingerprint_follows_plan_keys_only() -> None:
    """Settings that change the rows change the fingerprint; dispatch settings do not."""
    base = build_config({"num_repeats": 2}).plan_fingerprint()
    assert build_config({"num_repeats": 2}).plan_fingerprint() == base
    assert build_config({"num_repeats": 3}).plan_fingerprint() != base
    concurrency = build_config({"num_repeats": 2, "num_samples_in_parallel": 7})
    assert concurrency.plan_fingerprint() == base


# --- files and precedence ------------------------------------------------------------------


def test_load_config_precedence_is_file_then_options_then_overrides(tmp_path: Path) -> None:
    """A YAML file < click options and +key=value overrides (one layer), key by key."""
    path = tmp_path / "run.yaml"
    path.write_text("num_repeats: 2\nlimit: 10\nseed: 1\nagent_name: from_file\n")
    config = load_config(
        config_file=path,
        options={"limit": 20, "agent_name": None},
        overrides=["+seed=3"],
    )
    assert (config.num_repeats, config.limit, config.seed) == (2, 20, 3)
    assert config.agent_name == "from_file"
    # options and overrides are one layer, the command line's: one key in both is refused,
    # as the command line refuses it (one loader: settings.load_run_config)
    with pytest.raises(ConfigError, match="seed is given twice"):
        load_config(options={"seed": 2}, overrides=["+seed=3"])


def test_load_config_accepts_nemo_gym_overrides() -> None:
    """The overrides of docs/protocol.md section 10 build the same config as NeMo Gym's flags."""
    config = load_config(
        overrides=[
            "+agent_name=A",
            "+input_jsonl_fpath=in.jsonl",
            "+output_jsonl_fpath=out.jsonl",
            "+limit=100",
            "+num_repeats=4",
            "+num_samples_in_parallel=10",
            "++head_server={host:127.0.0.1,port:11000}",
        ]
    )
    assert (config.agent_name, config.limit, config.num_repeats) == ("A", 100, 4)
    assert (config.input_jsonl_fpath, config.output_jsonl_fpath) == ("in.jsonl", "out.jsonl")
    assert config.num_samples_in_parallel == 10
    assert config.head_server == "http://127.0.0.1:11000"


def test_load_config_reads_head_server_mapping_from_a_file(tmp_path: Path) -> None:
    """A head_server mapping in a YAML file becomes a URL too."""
    path = tmp_path / "run.yaml"
    path.write_text("head_server:\n  host: 127.0.0.2\n  port: 11001\n")
    assert load_config(config_file=path).head_server == "http://127.0.0.2:11001"


def test_load_config_empty_file_gives_defaults(tmp_path: Path) -> None:
    """An empty YAML file is no settings at all."""
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_config(config_file=path) == RunConfig()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read config file"),
        ("a: [1\n", "is not valid YAML"),
        ("- 1\n- 2\n", "must hold a mapping of settings"),
        ("num_repats: 2\n", "did you mean 'num_repeats'?"),
    ],
)
def test_load_config_refuses_bad_files(tmp_path: Path, content: str | None, message: str) -> None:
    """Missing, malformed and non-mapping files, and unknown keys in them, are refused."""
    path = tmp_path / "run.yaml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(config_file=path)


def test_load_config_refuses_a_bad_override() -> None:
    """A malformed override token fails the whole load."""
    with pytest.raises(ConfigError, match="must look like"):
        load_config(overrides=["num_repeats=2"])


# --- numbers: one validator, every numeric field (issue 8) ----------------------------------

NUMERIC_TYPES = {"int", "float", "int | None", "float | None", "int | dict[str, int]"}
NUMERIC_FIELDS = sorted(a.name for a in attrs.fields(RunConfig) if a.type in NUMERIC_TYPES)
# Where 0 means something: no retries, no grace, no margin, seed 0, a zero threshold; `limit` 0
# is valid here and refused by the plan as empty; a budget of 0 is the engine's "start nothing"
# (the CLI refuses it).
ZERO_ALLOWED = {
    "dispatch_budget_s",
    "dispatch_connect_grace_s",
    "dispatch_start_report_min_fraction",
    "dispatch_start_report_within_s",
    "drain_margin_s",
    "grace_s",
    "limit",
    "long_rollout_max_fraction",
    "max_connect_retries",
    "max_request_retries",
    "metrics_linger_s",  # close the Prometheus endpoint at once
    "metrics_port",  # any free port
    "retry_backoff_base_s",
    "retry_backoff_max_s",
    "retry_budget_per_endpoint",
    "seed",
    "server_queue_max_waiting_ratio",
    "timed_out_max_fraction",
}
OUT_OF_RANGE = [math.nan, math.inf, -math.inf, -1, -0.5, 1e300, 2**64, 10**400, True, "3"]


def test_numeric_fields_are_the_ones_the_table_knows() -> None:
    """Every numeric setting is covered (a new one must decide whether 0 means something)."""
    assert len(NUMERIC_FIELDS) >= 35
    assert set(NUMERIC_FIELDS) >= ZERO_ALLOWED


@pytest.mark.parametrize("name", NUMERIC_FIELDS)
@pytest.mark.parametrize("value", OUT_OF_RANGE, ids=repr)
def test_numeric_settings_refuse_nan_inf_huge_negative_and_bools(name: str, value: Any) -> None:
    """nan, ±inf, 1e300, 2**64, -1, a bool or a string: refused, naming the key and the value."""
    with pytest.raises(ConfigError) as info:
        build_config({name: value})
    message = str(info.value)
    assert message.startswith(f"{name} must be "), message
    shown = {repr(value)} | (
        {repr(float(value))} if type(value) is int and value < 2**64 else set()
    )
    assert any(f"(got {s})" in message for s in shown), message  # seconds take ints as floats


@pytest.mark.parametrize("name", NUMERIC_FIELDS)
def test_numeric_settings_take_zero_only_where_it_means_something(name: str) -> None:
    """0 is accepted where it has a meaning and refused, naming the key, where it has none."""
    if name in ZERO_ALLOWED:
        assert getattr(build_config({name: 0}), name) == 0
    else:
        with pytest.raises(ConfigError, match=rf"^{name}(\.\w+)? must be "):
            build_config({name: 0})


@pytest.mark.parametrize("name", NUMERIC_FIELDS)
def test_numeric_settings_take_null_only_where_optional(name: str) -> None:
    """null (None) unsets an optional number; a required one refuses it, naming the key."""
    field = attrs.fields_dict(RunConfig)[name]
    if "None" in str(field.type):
        assert getattr(build_config({name: None}), name) is None
    elif name in NULL_MEANS_DEFAULT:  # NeMo Gym's Optional settings: null is the default
        assert getattr(build_config({name: None}), name) == getattr(RunConfig(), name)
    else:
        with pytest.raises(ConfigError, match=rf"^{name}(\.\w+)? must be .*\(got None\)"):
            build_config({name: None})


def test_the_largest_accepted_numbers_make_a_config_a_run_folder_can_hold() -> None:
    """Every numeric setting at its bound builds, fingerprints and serializes as JSON."""
    values: dict[str, Any] = {}
    for field in attrs.fields(RunConfig):
        check = field.validator
        if isinstance(check, NumberRange):
            values[field.name] = check.high
    values["num_repeats"] = 2**63 - 1
    config = build_config(values)
    assert config.seed == 2**64 - 1
    assert config.read_timeout_s == 1e9
    assert config.plan_fingerprint()
    orjson.dumps(converter.unstructure(config))  # the manifest's settings


def test_integral_floats_are_refused_for_integers_with_the_integer_to_write() -> None:
    """+num_samples_in_parallel=1e9 is a float: refused, showing the integer to write instead."""
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["+num_samples_in_parallel=1e9"])
    assert str(info.value) == (
        "num_samples_in_parallel must be an integer from 1 to 2**63 - 1 (got 1000000000.0); "
        "write it as an integer: 1000000000"
    )
    with pytest.raises(ConfigError, match=r"\(got 2\.5\); use e\.g\. 4"):
        build_config({"max_connect_retries": 2.5})


def test_integers_are_accepted_for_seconds_and_kept_as_floats() -> None:
    """+read_timeout_s=30 is 30.0 seconds."""
    config = load_config(overrides=["+read_timeout_s=30"])
    assert config.read_timeout_s == 30.0
    assert type(config.read_timeout_s) is float


@pytest.mark.parametrize("value", ["false", "no", 0, 1, None])
def test_flags_take_true_or_false_only(value: Any) -> None:
    """A flag given "false" (a string) is refused, not read as true."""
    with pytest.raises(ConfigError, match=rf"^fail_fast must be true or false \(got {value!r}\)"):
        build_config({"fail_fast": value})


@pytest.mark.parametrize("task", [True, 1.0, None, [1], ""])
def test_task_ids_must_be_stored_ids(task: Any) -> None:
    """task_ids entries are the ids stored in the rows (strings or integers); bad ones named."""
    with pytest.raises(
        ConfigError, match=rf"^task_ids\[1\] must be a task id.*\(got {re.escape(repr(task))}\)"
    ):
        build_config({"task_ids": ["row-1", task]})
    assert build_config({"task_ids": ["row-1", 7, "0"]}).task_ids == ["row-1", 7, "0"]


@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0, 1e300, True])
@pytest.mark.parametrize(
    ("policy", "name"),
    [
        (lambda v: DispatchPolicy(v, 1.0), "connect_timeout_s"),
        (lambda v: DispatchPolicy(1.0, v), "read_timeout_s"),
        (lambda v: DispatchPolicy(1.0, 1.0, rollout_timeout_s=v), "rollout_timeout_s"),
        (lambda v: RetryPolicy(outage_grace_s=v), "outage_grace_s"),
        (lambda v: RetryPolicy(max_connect_retries=v), "max_connect_retries"),
        (lambda v: RetryPolicy(backoff_base_s=v), "backoff_base_s"),
        (lambda v: RetryPolicy(backoff_max_s=v), "backoff_max_s"),
        (lambda v: RetryPolicy(breaker_open_s=v), "breaker_open_s"),
        (lambda v: RetryPolicy(max_request_retries=v), "max_request_retries"),
    ],
)
def test_dispatch_and_retry_policies_share_the_number_checks(
    policy: Callable[[Any], object], name: str, value: Any
) -> None:
    """Policies built without a RunConfig refuse the same values with the same messages."""
    with pytest.raises(ConfigError, match=rf"^{name} must be .*\(got {re.escape(repr(value))}\)"):
        policy(value)


def test_backoff_does_not_overflow_after_a_thousand_retries() -> None:
    """max_connect_retries / max_request_retries may be huge: 2.0**1024 must never be computed."""
    rng = random.Random(0)
    retry_policy = RetryPolicy(
        max_request_retries=2**63 - 1, max_connect_retries=2**63 - 1, backoff_base_s=1e9
    )
    assert 0.0 <= retry_policy.backoff_s(5000, rng) <= retry_policy.backoff_max_s
    assert retry_policy.open_period_s(5000) == retry_policy.breaker_open_s


# --- untrusted structure: YAML aliases and depth, override depth (issue 8) -----------------

BILLION_LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True)
)


def test_load_yaml_refuses_a_billion_laughs_without_growing() -> None:
    """A billion-laughs document is refused at its first collection alias, in little memory."""
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError) as info:
            load_yaml(BILLION_LAUGHS, source="config file 'bomb.yaml'")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(info.value) == (
        "config file 'bomb.yaml' uses an alias of a mapping or list at line 2, column 8; write "
        "the value out instead of *alias or <<: merge (only scalar aliases are accepted: "
        "collection aliases expand without bound)"
    )
    assert peak < 1_000_000


def test_load_yaml_keeps_scalar_aliases_and_refuses_merge_keys() -> None:
    """A scalar alias copies one value and is kept; a <<: merge of a mapping is refused."""
    assert load_yaml("a: &x 3\nb: *x\n", source="s") == {"a": 3, "b": 3}
    with pytest.raises(ConfigError, match="alias of a mapping or list at line 3, column 7"):
        load_yaml("base: &b {x: 1}\nc:\n  <<: *b\n", source="s")
    with pytest.raises(ConfigError, match="alias of a mapping or list"):
        load_yaml("a: &a [1, *a]\n", source="s")  # a recursive alias, refused the same way


def test_load_yaml_bounds_nesting_instead_of_recursing() -> None:
    """100 levels load; 101, or 50,000 (RecursionError before), are refused naming the place."""
    assert load_yaml("[" * 100 + "]" * 100, source="s") is not None
    with pytest.raises(ConfigError, match=r"^s nests deeper than 100 levels at line 1, column 101"):
        load_yaml("[" * 101 + "]" * 101, source="s")
    with pytest.raises(ConfigError, match="nests deeper than 100 levels"):
        load_yaml("a: " + "[" * 50_000, source="s")


def test_load_yaml_without_quote_never_shows_the_text() -> None:
    """quote=False: a syntax error names line and column, never the characters around it."""
    secret = "sk-yaml-0123456789"
    with pytest.raises(ConfigError) as info:
        load_yaml(f"key: {secret}\nbad: [{secret}\n", source="head", quote=False)
    assert str(info.value).startswith("head is not valid YAML at line 3, column 1")
    assert secret not in str(info.value)
    assert info.value.__context__ is None


@pytest.mark.parametrize("text", ["{a: 1", "a: {b: 1}}\n", "x: [}\n", "a: {{b}}: 1\n"])
def test_load_yaml_syntax_errors_with_braces_are_one_config_error(text: str) -> None:
    """The parser's wording may quote braces: still a ConfigError naming the source and line,
    never a ValueError from formatting the message."""
    with pytest.raises(
        ConfigError, match=r"^config file 'run\{1\}.yaml' is not valid YAML at line"
    ):
        load_yaml(text, source="config file 'run{1}.yaml'")


def test_load_config_refuses_an_alias_bomb_file(tmp_path: Path) -> None:
    """--config with a billion-laughs file is refused naming the file and line."""
    path = tmp_path / "bomb.yaml"
    path.write_text(BILLION_LAUGHS)
    with pytest.raises(ConfigError, match=re.escape(f"config file {str(path)!r} uses an alias")):
        load_config(config_file=path)


def test_parse_value_bounds_nesting() -> None:
    """100 levels of [ parse; 101 and 50,000 are a ConfigError, never a RecursionError."""
    assert parse_value("[" * 100 + "]" * 100) == functools.reduce(lambda v, _: [v], range(99), [])
    for depth in (101, 50_000):
        with pytest.raises(ConfigError, match="nests deeper than 100 levels"):
            parse_value("[" * depth)


def test_parse_override_names_the_key_of_a_bad_value() -> None:
    """An override whose value cannot be parsed is named by its key."""
    with pytest.raises(ConfigError, match=r"^override \+limit: unclosed bracket"):
        parse_override("+limit=[1")


# --- URLs: trollout speaks plain http:// (issue 8) -------------------------------------------


@pytest.mark.parametrize(
    ("values", "what"),
    [
        ({"agent_urls": {"a": "https://h:1"}}, "URL of agent 'a'"),
        ({"head_server": "https://h:1"}, "head server URL"),
        ({"server_queue_metrics_urls": ["https://h:1/metrics"]}, "server_queue_metrics_urls entry"),
        ({"agent_urls": {"a": "HTTPS://h:1"}}, "URL of agent 'a'"),
    ],
)
def test_build_config_refuses_https_urls(values: dict[str, Any], what: str) -> None:
    """https:// anywhere a URL is read is refused up front, saying trollout speaks http://."""
    with pytest.raises(ConfigError) as info:
        build_config(values)
    assert str(info.value).startswith(f"{what} must be a plain http:// URL (got ")
    assert "without TLS" in str(info.value)


@pytest.mark.parametrize("url", ["ftp://h:1", "h:1", "http://h:0", "http://h:1?x=1"])
def test_validate_url_refuses_what_is_not_http_host_port(url: str) -> None:
    """Other schemes, no scheme, port 0 and a query are refused naming the URL."""
    with pytest.raises(ConfigError, match=re.escape(repr(url))):
        validate_url(url, what="u")


@pytest.mark.parametrize(
    ("key", "value", "member"),
    [
        ("seed_mode", "rollout-index", SeedMode.ROLLOUT_INDEX),
        ("seed_mode", SeedMode.HASH, SeedMode.HASH),
        ("fsync", "row", FsyncPolicy.ROW),
    ],
)
def test_choices_take_their_written_value(key: str, value: object, member: object) -> None:
    """An embedding driver may write a choice as in YAML: it means that member, not the
    default."""
    assert getattr(RunConfig(**{key: value}), key) is member


@pytest.mark.parametrize(("key", "value"), [("seed_mode", "rollout_index"), ("fsync", ["row"])])
def test_unknown_choices_are_one_error_naming_the_key(key: str, value: object) -> None:
    """A misspelt choice is refused naming the key, the value and the choices."""
    with pytest.raises(
        ConfigError, match=rf"^{key} must be one of .* \(got {re.escape(repr(value))}\)$"
    ):
        RunConfig(**{key: value})


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"observability_enabled": True}, "model_call_capture_dir is required"),
        (
            {"observability_enabled": True, "model_call_capture_dir": "model-calls"},
            "model_call_capture_dir must be an absolute path",
        ),
        (
            {"delete_model_call_capture": True, "include_model_call_payloads": False},
            "delete_model_call_capture=true needs include_model_call_payloads=true",
        ),
    ],
)
def test_contradictory_enrichment_settings_are_one_rule(values: dict[str, Any], match: str) -> None:
    """`RunConfig` and `EnrichmentOptions` refuse the same settings with the same line: one
    rule (`settings.enrichment_problem`), which enrichment reads from the leaf package."""
    with pytest.raises(ConfigError, match=match) as from_config:
        build_config(values)
    with pytest.raises(ConfigError) as from_options:
        EnrichmentOptions(
            observability=values.get("observability_enabled", False),
            capture_dir=values.get("model_call_capture_dir"),
            include_payloads=values.get("include_model_call_payloads", True),
            delete_capture=values.get("delete_model_call_capture", False),
        )
    assert str(from_config.value) == str(from_options.value)
    assert "\n" not in str(from_config.value)


def test_enrichment_settings_that_agree_are_taken() -> None:
    """Observability on with an absolute capture dir; payloads kept by default."""
    config = build_config(
        {"observability_enabled": True, "model_call_capture_dir": "/srv/gym/model-calls"}
    )
    assert config.include_model_call_payloads is True
    assert config.delete_model_call_capture is False
    assert RunConfig().observability_enabled is False
