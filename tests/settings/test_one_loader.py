"""One loader: `trollout.load_config` takes what the command line takes, with the same errors.

The command line builds a run's settings through `cli.common.build_run_config`, which calls
`settings.load_run_config`; the public `trollout.load_config` calls the same loader. So NeMo Gym
keys the command line accepts (own-way, inert unsupported, ``config_paths``) are accepted by
the library too, and any set of ``+key=value`` tokens gives both the same `RunConfig` or the
same one-line `ConfigError`. The rows of `RunConfig` are the single source of the key table and
of the fingerprinted plan keys, whose hash must not move for runs already on disk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import trollout
from trollout.cli.run_config import RUN_DEFAULTS, build_run_config
from trollout.errors import ConfigError
from trollout.settings import BY_NAME, COLLECT, KEYS, PLAN_KEYS, Handling, RunConfig
from trollout.settings.fields import row_of


def test_the_public_loader_takes_nemo_gym_keys_the_command_line_takes() -> None:
    """+route_failures_to_sidecar=true and +upload_rollouts=false: accepted, nothing changed."""
    config = trollout.load_config(
        overrides=["+route_failures_to_sidecar=true", "+upload_rollouts=false", "+limit=3"]
    )
    assert config == RunConfig(limit=3)
    with pytest.raises(ConfigError, match=r"^upload_rollouts=True is not supported: "):
        trollout.load_config(overrides=["+upload_rollouts=true"])


def test_the_public_loader_merges_config_paths(tmp_path: Path) -> None:
    """config_paths files sit below the overrides; their server blocks are the deployment's."""
    first = tmp_path / "a.yaml"
    first.write_text("num_repeats: 2\nlimit: 5\nmath_agent: {responses_api_agents: {}}\n")
    config_file = tmp_path / "run.yaml"
    config_file.write_text(f"config_paths: [{first}]\nseed: 4\n")
    config = trollout.load_config(config_file=config_file, overrides=["+limit=9"])
    assert (config.num_repeats, config.limit, config.seed) == (2, 9, 4)
    via_override = trollout.load_config(overrides=[f"+config_paths=[{first}]"])
    assert (via_override.num_repeats, via_override.limit) == (2, 5)


def test_the_public_loader_takes_the_materialized_path() -> None:
    """materialized_jsonl_fpath: beside the output by default (NeMo Gym's derived path), or
    where it is given."""
    output, beside = "+output_jsonl_fpath=out/r.jsonl", "out/r_materialized_inputs.jsonl"
    config = trollout.load_config(overrides=[output, f"+materialized_jsonl_fpath={beside}"])
    assert config.output_jsonl_fpath == "out/r.jsonl"
    layout = trollout.RunLayout.for_output("out/r.jsonl", config.materialized_jsonl_fpath)
    assert (layout.materialized_inputs, layout.relocated) == (Path(beside), False)
    config = trollout.load_config(overrides=[output, "+materialized_jsonl_fpath=x.jsonl"])
    layout = trollout.RunLayout.for_output("out/r.jsonl", config.materialized_jsonl_fpath)
    assert (layout.materialized_inputs, layout.relocated) == (Path("x.jsonl"), True)


# Values for keys of every kind the loader handles: fields (good and bad values), own-way and
# unsupported NeMo Gym keys, keys of the other command, pairs that need each other or clash,
# nulls that mean the default, and typos.
TOKENS: tuple[tuple[str, str], ...] = (
    ("num_repeats", "2"),
    ("num_repeats", "0"),
    ("num_repeats", "{a:2,_default:1}"),
    ("num_repeats", "null"),
    ("limit", "3"),
    ("limit", "ten"),
    ("seed", "7"),
    ("seed", "1.5"),
    ("agent_name", "a"),
    ("agent_map", "{x:y}"),
    ("agent_map", "{x:[1]}"),
    ("num_samples_in_parallel", "null"),
    ("num_samples_in_parallel", "8"),
    ("fsync", "row"),
    ("fsync", "sometimes"),
    ("drain_margin_s", "5"),
    ("dispatch_budget_s", "10"),
    ("head_server", "{host:127.0.0.1,port:11000}"),
    ("head_server", "https://h:1"),
    ("agent_urls", "{a:'http://127.0.0.1:1'}"),
    ("output_jsonl_fpath", "out/r.jsonl"),
    ("materialized_jsonl_fpath", "out/r_materialized_inputs.jsonl"),
    ("materialized_jsonl_fpath", "elsewhere.jsonl"),
    ("route_failures_to_sidecar", "true"),
    ("route_failures_to_sidecar", "yes"),
    ("retain_results_in_memory", "false"),
    ("disable_health_check", "true"),
    ("disable_health_check", "false"),
    ("upload_rollouts", "false"),
    ("upload_rollouts", "true"),
    ("skills", "null"),
    ("health_check_workers", "4"),
    ("split", "null"),
    ("merge_shards", "false"),
    ("input_glob", "x/*.jsonl"),
    ("environment_routing_mode", "legacy"),
    ("environment_server_name", "env"),
    ("num_repeats_add_seed", "{a:true}"),
    ("seed_mode", "rollout-index"),
    ("task_ids", "[t1,2]"),
    ("shard", "1/4"),
    ("shard", "4/4"),
    ("retry_terminal_timeouts", "true"),
    ("health_check_ignored_checks", "[model_call_failed]"),
    ("health_check_ignored_checks", "[rollout_turns]"),
    ("health_check_ignored_checks", "model_call_failed,agent_turn_hollow"),
    ("observability_enabled", "true"),
    ("model_call_capture_dir", "/srv/gym/model-calls"),
    ("model_call_capture_dir", "relative/dir"),
    ("include_model_call_payloads", "false"),
    ("delete_model_call_capture", "true"),
    ("num_repats", "2"),
)


def outcome(load: Any) -> tuple[str, Any]:
    """Return ("config", the config) or ("error", the message) of one load."""
    try:
        return "config", load()
    except ConfigError as exc:
        return "error", str(exc)


def test_the_public_loader_refuses_an_unknown_health_check_as_the_command_line_does() -> None:
    """The check ids are trollout.health's: both loaders' callers check them (settings is a
    leaf and does not know them), with the same one-line error."""
    tokens = ["+health_check_ignored_checks=[rollout_turns]"]
    with pytest.raises(ConfigError, match=r"Unknown rollout health check\(s\): rollout_turns") as a:
        trollout.load_config(overrides=tokens)
    with pytest.raises(ConfigError) as b:
        build_run_config(list(tokens), {})
    assert str(a.value) == str(b.value)
    assert "\n" not in str(a.value)
    config = trollout.load_config(overrides=["+health_check_ignored_checks=[model_call_failed]"])
    assert config.health_check_ignored_checks == ["model_call_failed"]


@given(st.lists(st.sampled_from(TOKENS), max_size=8))
def test_the_command_line_and_the_public_loader_agree(pairs: list[tuple[str, str]]) -> None:
    """Any set of +key=value tokens: the same RunConfig from both, or the same error."""
    tokens = [f"+{key}={value}" for key, value in pairs]
    from_cli = outcome(lambda: build_run_config(list(tokens), {}))
    public = outcome(lambda: trollout.load_config(overrides=tokens, defaults=RUN_DEFAULTS))
    assert from_cli == public


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_every_implemented_collect_key_is_one_row_of_the_record(name: str) -> None:
    """The key table's implemented collect keys are the record's rows marked nemo, and back."""
    key = BY_NAME[name]
    fields = {a.name: row_of(a) for a in attrs.fields(RunConfig)}
    marked = name in fields and fields[name].nemo
    implemented_field = key.handling is Handling.IMPLEMENTED and key.field
    assert marked == (implemented_field and COLLECT in key.commands), name
    assert len({k.name for k in KEYS}) == len(KEYS)


def test_the_plan_keys_and_the_fingerprint_are_those_of_existing_runs() -> None:
    """Read off the rows, the plan keys are the list runs were fingerprinted with, in order,
    and a fingerprint is unchanged (a resume compares it with the manifest's)."""
    assert PLAN_KEYS == (
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
    # the settings of a default run before seeds became NeMo Gym's (seed_mode was hash then)
    assert RunConfig(seed_mode="hash").plan_fingerprint() == (
        "8f22cd5ba2dfa7c17359e37de0d719f527800b750ff20f20101c5d277df09099"
    )
    config = RunConfig(
        shard="1/4", prompt_config="p.yaml", num_repeats={"a": 2}, seed_mode="rollout-index"
    )
    assert config.plan_fingerprint() == (
        "352f80389aa438b40fa2f505bbf47ad35c8654d18604df6fb7b1fae9d437ccbc"
    )


def test_a_run_saved_before_seeds_became_nemo_gyms_reads_as_hash() -> None:
    """A saved set lacking seed_mode means hash (the old default): a seeded one differs from
    today's default, and neither seed setting is compared when no seeds are added."""
    from trollout.recovery.manifest import saved_settings
    from trollout.settings import plan_differences, saved_as_started

    old = saved_settings(RunConfig(num_repeats_add_seed=True))
    del old["seed_mode"]
    assert saved_as_started(old)["seed_mode"] == "hash"
    now = saved_settings(RunConfig(num_repeats_add_seed=True))
    assert plan_differences(old, now) == ["seed_mode 'hash' -> 'rollout-index'"]
    assert (
        plan_differences(
            old, saved_settings(RunConfig(num_repeats_add_seed=True, seed_mode="hash"))
        )
        == []
    )
    unseeded = saved_settings(RunConfig(seed_mode="hash", seed=3))
    assert plan_differences(unseeded, saved_settings(RunConfig())) == []
