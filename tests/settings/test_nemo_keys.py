"""Every config key NeMo Gym 0.7.0 documents is taken in its documented one of three ways.

The keys come from the API reference when ``../shared`` is present (and must equal the
checked-in list), else from the checked-in list. For each key: implemented keys reach the run
(or aggregation) settings; own-way keys are accepted with one note naming them; unsupported
keys are accepted at the value that asks for nothing and refused otherwise, in one line; and a
value of the wrong type is refused in one line naming the key and the type, exit 2, with
nothing written.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from builders import invoke, write_jsonl
from trollout.cli.aggregate_settings import _settings as aggregate_settings
from trollout.errors import ConfigError
from trollout.settings import (
    AGGREGATE,
    BY_NAME,
    COLLECT,
    FIELD_NAMES,
    KEYS,
    NEEDS,
    Handling,
    load_run_config,
    parse_value,
)

REFERENCE = (
    Path(__file__).parents[3] / "shared/reference/nemo_gym_0.7.0/rollout_collection_api_0.7.0.md"
)
CHECKED_IN = Path(__file__).parents[1] / "data" / "nemo_gym_0.7.0_config_keys.json"
CLASSES = (
    "E2ERolloutCollectionConfig",
    "RolloutAggregationConfig",
    "RolloutCollectionConfig",
    "SharedRolloutCollectionConfig",
)


def parse_reference(text: str) -> dict[str, list[str]]:
    """Return the keys the reference lists under each config class (``**`key`**`` lines)."""
    found: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        header = re.match(r"^class nemo_gym\.rollouts\.rollout_collection\.(\w+)\(", line)
        if header:
            current = header.group(1) if header.group(1) in CLASSES else None
            if current:
                found[current] = []
            continue
        if current is None:
            continue
        if line.startswith("```python") and found[current]:
            current = None
            continue
        found[current] += re.findall(r"\*\*`(\w+)`\*\*", line)
    return found


def checked_in() -> dict[str, list[str]]:
    """Return the checked-in key list (classes and mixins)."""
    data: dict[str, Any] = json.loads(CHECKED_IN.read_text())
    return {k: v for k, v in data.items() if k != "source"}


def documented_keys() -> dict[str, list[str]]:
    """Return the keys per class: the reference's when present, else the checked-in list."""
    listed = checked_in()
    if REFERENCE.is_file():
        parsed = parse_reference(REFERENCE.read_text(encoding="utf-8"))
        assert parsed == {k: v for k, v in listed.items() if k in CLASSES}
    return listed


KEYS_BY_CLASS = documented_keys()
ALL_KEYS = sorted({key for keys in KEYS_BY_CLASS.values() for key in keys})
AGGREGATE_KEYS = set(KEYS_BY_CLASS["RolloutAggregationConfig"]) | {
    "config_paths",
    "upload_rollouts",
}
COLLECT_KEYS = set(ALL_KEYS) - set(KEYS_BY_CLASS["RolloutAggregationConfig"]) | (
    set(KEYS_BY_CLASS["RolloutAggregationConfig"])
    & set(KEYS_BY_CLASS["SharedRolloutCollectionConfig"])
)

# A valid value of every implemented key: it must reach the settings unchanged.
SAMPLES: dict[str, str] = {
    "agent_map": "{old:new}",
    "agent_name": "math_agent",
    "allow_unsafe_resume": "true",
    "dispatch_all_started_within_s": "30.0",
    "dispatch_budget_s": "60.0",
    "dispatch_connect_grace_s": "5.0",
    "dispatch_longest_first": "true",
    "dispatch_start_report_min_fraction": "0.5",
    "dispatch_start_report_within_s": "20.0",
    "drain_margin_s": "10.0",
    "fan_out": "{src:[a,b]}",
    "input_jsonl_fpath": "in.jsonl",
    "interleave_repeats": "true",
    "limit": "5",
    "long_rollout_max_fraction": "0.2",
    "long_rollout_s": "600.0",
    "num_repeats": "{_default:2,a:4}",
    "num_repeats_add_seed": "{a:false,_default:true}",
    "prompt_config": "prompts/p.yaml",
    "record_omitted_rollouts": "true",
    "resubmit": "true",
    "resume_from_cache": "true",
    "retry_terminal_timeouts": "true",
    "server_queue_max_waiting_ratio": "2.0",
    "server_queue_metrics_urls": "['http://127.0.0.1:8000']",
    "server_queue_sample_interval_s": "3.0",
    "timed_out_max_fraction": "0.1",
    "timing_summary_interval_s": "60.0",
    "batch_manifest_fpath": "batch.json",
    "count_failure_classes_as_zero": "[agent_run_error]",
    "count_missing_rollouts_as_zero": "true",
    "disable_aggregation": "true",
    "disable_health_check": "true",
    "health_check_ignored_checks": "[model_call_failed,agent_turn_hollow]",
    "health_check_workers": "4",
    "environment_protocol_violation_stop_after": "3",
    "environment_routing_mode": "agent",
    "environment_server_name": "env",
    "environment_server_routes": "{ts:env}",
    "max_resident_rollout_tasks": "8",
    "num_samples_in_parallel": "16",
    "output_jsonl_fpath": "out/r.jsonl",
    "materialized_jsonl_fpath": "inputs/r.jsonl",
    "require_complete": "true",
    "responses_create_params": "{temperature:0.5}",
    "input_glob": "shards/*.jsonl",
    "materialized_inputs_jsonl_fpath": "plan.jsonl",
    "merge_shards": "false",
}
# A valid value asking for something trollout lacks (unsupported), or handled its own way.
ASKING: dict[str, str] = {
    "skills": "{path:skills/}",
    "rollout_collection_driver": "my.module:run",
    "reuse_existing_data_preparation": "true",
    "split": "benchmark",
    "upload_rollouts": "true",
}
INERT: dict[str, str] = {
    "skills": "null",
    "rollout_collection_driver": "null",
    "reuse_existing_data_preparation": "false",
    "split": "null",
    "upload_rollouts": "false",
    "retain_results_in_memory": "false",
    "route_failures_to_sidecar": "true",
}


def render(value: Any) -> str:
    """Render a value as a Hydra override value."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{render(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(render(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def collect_settings(*tokens: str) -> tuple[Any, list[str]]:
    """Load a collection's settings from ``+key=value`` tokens."""
    return load_run_config(overrides=[f"+{t}" for t in tokens])


def aggregate_values(*tokens: str) -> dict[str, Any]:
    """Read ``trollout aggregate``'s settings from tokens (as its command does)."""
    opts = {"inputs": ("x.jsonl",), "zero_classes": (), "zero_missing": None, "output": None}
    opts |= {"head_server": None, "seed": None, "overwrite": None, "agent_urls": (), "env_urls": ()}
    return aggregate_settings(tuple(f"+{t}" for t in tokens), opts)


def test_every_documented_key_is_in_the_table() -> None:
    """The table lists every key the reference documents, and nothing else."""
    assert sorted(BY_NAME.keys() - {"task_ids"}) == ALL_KEYS
    assert len(KEYS) == len(BY_NAME)


def test_the_checked_in_list_is_the_references() -> None:
    """When ../shared is present, the checked-in list is exactly what the reference lists."""
    if not REFERENCE.is_file():
        pytest.skip(f"{REFERENCE} is absent")
    parsed = parse_reference(REFERENCE.read_text(encoding="utf-8"))
    assert set(parsed) == set(CLASSES)
    assert sum(len(v) for v in parsed.values()) == 62


@pytest.mark.parametrize("name", ALL_KEYS)
def test_key_behaves_as_documented(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Implemented: reaches the settings; own way: one note; unsupported: inert or refused."""
    key = BY_NAME[name]
    for command in sorted(key.commands):
        load = _loader(command)
        if key.handling is Handling.IMPLEMENTED:
            _check_implemented(name, command, load, capsys)
        elif key.handling is Handling.OWN_WAY:
            _check_own_way(name, command, load, capsys)
        else:
            _check_unsupported(name, load, capsys)


def _loader(command: str) -> Any:
    return collect_settings if command == COLLECT else aggregate_values


def _check_implemented(name: str, command: str, load: Any, capsys: Any) -> None:
    if name == "config_paths":
        return  # test_config_paths_merge_like_nemo_gym
    token = f"{name}={SAMPLES[name]}"
    expected = parse_value(SAMPLES[name])
    if command == COLLECT:
        assert name in FIELD_NAMES
        needed = NEEDS.get(name)  # a key that does nothing alone goes with the one it needs
        config, notes = load(token, *([f"{needed[0]}={SAMPLES[needed[0]]}"] if needed else []))
        assert notes == []
        assert getattr(config, name) == expected, name
    else:
        values = load(token)
        assert capsys.readouterr().err == ""
        shown = values["inputs"][-1] if name == "input_glob" else values[name]
        assert shown == expected, name


def _check_own_way(name: str, command: str, load: Any, capsys: Any) -> None:
    if command == COLLECT:
        _, notes = load(f"{name}={INERT[name]}")
        assert len(notes) == 1, notes
        assert notes[0].startswith(f"{name}: trollout"), notes
    else:
        load(f"{name}={INERT[name]}")
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1, err
        assert err[0].startswith(f"trollout: note: {name}: "), err
    if name in ASKING:
        with pytest.raises(ConfigError, match=rf"^{name}=.* is not supported: "):
            load(f"{name}={ASKING[name]}")


def _check_unsupported(name: str, load: Any, capsys: Any) -> None:
    result = load(f"{name}={INERT[name]}")
    if isinstance(result, tuple):
        assert result[1] == []
    assert capsys.readouterr().err == ""
    with pytest.raises(ConfigError) as info:
        load(f"{name}={ASKING[name]}")
    message = str(info.value)
    assert message.startswith(f"{name}=")
    assert " is not supported: " in message
    assert "\n" not in message
    assert ";" in message  # what is missing; then what to do


@pytest.mark.parametrize("name", ALL_KEYS)
def test_wrong_type_is_one_line_exit_2_and_nothing_written(name: str, tmp_path: Path) -> None:
    """A value of the wrong type: one line naming the key and the type; exit 2; no file."""
    key = BY_NAME[name]
    token = f"+{name}={render(key.wrong)}"
    out = tmp_path / "out"
    source = write_jsonl(tmp_path / "in.jsonl", [{"responses_create_params": {"input": "q"}}])
    if COLLECT in key.commands:
        # INPUT and -o would give the key twice, which is refused before its type is checked
        where = {"input_jsonl_fpath": [], "output_jsonl_fpath": [str(source)]}
        args = where.get(name, [str(source), "-o", str(out / "r.jsonl")])
        result = invoke("collect", *args, token)
    else:
        shard = write_jsonl(tmp_path / "s.jsonl", [])
        result = invoke("aggregate", str(shard), "-o", str(out / "m.jsonl"), token)
    assert result.exit_code == 2, (name, result.output)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"trollout: error: {name} must be "), lines  # the expected type
    assert f"(got {key.wrong!r})" in lines[0], lines
    assert not out.exists()


def test_agent_map_with_a_list_value_is_refused(tmp_path: Path) -> None:
    """+agent_map={agent_a:[1,2]}: one line naming agent_map and its type; exit 2; nothing."""
    source = write_jsonl(tmp_path / "in.jsonl", [{"responses_create_params": {"input": "q"}}])
    out = tmp_path / "out" / "r.jsonl"
    result = invoke("collect", str(source), "-o", str(out), "+agent_map={agent_a:[1,2]}")
    assert result.exit_code == 2
    assert result.output == (
        "trollout: error: agent_map must be a mapping of names to agent names (got "
        "{'agent_a': [1, 2]}); write e.g. +agent_map={old_agent:new_agent}\n"
    )
    assert not out.parent.exists()


def test_num_repeats_null_is_one() -> None:
    """+num_repeats=null is NeMo Gym's 1; +num_samples_in_parallel=null the default."""
    config, _ = collect_settings("num_repeats=null", "num_samples_in_parallel=null")
    assert (config.num_repeats, config.num_samples_in_parallel) == (1, 64)


def test_config_paths_merge_like_nemo_gym(tmp_path: Path) -> None:
    """Files merge in order (later wins, mappings deeply), below overrides; servers ignored."""
    first = tmp_path / "a.yaml"
    first.write_text(
        "num_repeats: 2\nresponses_create_params: {temperature: 0.1, top_p: 0.9}\n"
        "math_agent: {responses_api_agents: {simple_agent: {host: h, port: 1}}}\n"
        "policy_base_url: http://h:1\n"
    )
    second = tmp_path / "b.yaml"
    second.write_text("responses_create_params: {temperature: 0.7}\nlimit: 3\n")
    config, notes = collect_settings(f"config_paths=[{first},{second}]", "limit=9")
    assert (config.num_repeats, config.limit) == (2, 9)
    assert config.responses_create_params == {"temperature": 0.7, "top_p": 0.9}
    assert notes == []
    with pytest.raises(ConfigError, match="cannot read config_paths file"):
        collect_settings(f"config_paths=[{tmp_path / 'nope.yaml'}]")
    values = aggregate_values(f"config_paths=[{second}]", "merge_shards=false")
    assert values["merge_shards"] is False


def test_materialized_jsonl_fpath_elsewhere_is_taken() -> None:
    """The materialized inputs go where the key says (`recovery.layout` finds them again);
    a run split into parts refuses it, since one file cannot hold every part's inputs."""
    config, notes = collect_settings(
        "output_jsonl_fpath=out/r.jsonl", "materialized_jsonl_fpath=x.jsonl"
    )
    assert (config.materialized_jsonl_fpath, notes) == ("x.jsonl", [])
    with pytest.raises(ConfigError, match="shard splits the run into parts"):
        collect_settings("materialized_jsonl_fpath=x.jsonl", "shard=0/2")


def test_a_key_of_the_other_command_is_refused() -> None:
    """An aggregation-only key given to collect (and back) is refused naming the command."""
    with pytest.raises(ConfigError, match="merge_shards is a setting of trollout aggregate"):
        collect_settings("merge_shards=false")
    with pytest.raises(ConfigError, match="is a setting of trollout collect, not of"):
        aggregate_values("route_failures_to_sidecar=true")


def test_table_covers_both_commands() -> None:
    """Collection keys go to collect, aggregation keys to aggregate (the shared ones both)."""
    assert {k.name for k in KEYS if COLLECT in k.commands} >= COLLECT_KEYS - {"task_ids"}
    assert {k.name for k in KEYS if AGGREGATE in k.commands} >= AGGREGATE_KEYS


def test_command_line_round_robins_by_agent_and_the_library_keeps_order() -> None:
    """gym eval run's full path interleaves agents; an embedding driver's config does not."""
    from trollout.cli.run_config import build_run_config
    from trollout.settings import RunConfig

    assert build_run_config(["in.jsonl"], {}).round_robin_agents is True
    assert (
        build_run_config(["in.jsonl", "+round_robin_agents=false"], {}).round_robin_agents is False
    )
    assert RunConfig().round_robin_agents is False
