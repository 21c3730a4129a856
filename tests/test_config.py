"""Tests of run configuration: overrides, validation, files and precedence."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trollout.config import (
    FsyncPolicy,
    RunConfig,
    SeedMode,
    build_config,
    load_config,
    parse_override,
    parse_value,
)
from trollout.errors import ConfigError

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
        ({"limit": -1}, "limit must be >= 0 (got -1)"),
        ({"num_samples_in_parallel": 0}, "num_samples_in_parallel must be > 0 (got 0)"),
        ({"read_timeout_s": -5.0}, "read_timeout_s must be > 0 (got -5.0)"),
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
        ({"num_samples_in_parallel": "many"}, "$.num_samples_in_parallel"),
        ({"seed_mode": "bogus"}, "$.seed_mode"),
        ({"task_ids": ["a"]}, "$.task_ids[0]"),
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
    """A YAML file < click options < +key=value overrides, key by key."""
    path = tmp_path / "run.yaml"
    path.write_text("num_repeats: 2\nlimit: 10\nseed: 1\nagent_name: from_file\n")
    config = load_config(
        config_file=path,
        options={"limit": 20, "seed": 2, "agent_name": None},
        overrides=["+seed=3"],
    )
    assert (config.num_repeats, config.limit, config.seed) == (2, 20, 3)
    assert config.agent_name == "from_file"


def test_load_config_accepts_nemo_gym_overrides() -> None:
    """The overrides of protocol.md section 10 build the same config as NeMo Gym's flags."""
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
