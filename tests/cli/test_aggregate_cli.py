"""``trollout aggregate`` on the command line (click's CliRunner on the command object)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import orjson
from click.testing import CliRunner

from builders import write_jsonl
from trollout.cli.aggregate import aggregate
from trollout.cli.failures import EXIT_INCOMPLETE_RETRYABLE
from trollout.records import Failed, Identity, Landed, outcome_to_row


def shards(folder: Path) -> Path:
    """Write two shards of agent "a" (tasks 0-3, 2 repeats) with one failure and one gap."""
    for name, tasks in (("s0", (0, 1)), ("s1", (2, 3))):
        rows, plan = [], []
        for t in tasks:
            for r in range(2):
                ident = Identity(t, r, agent_name="a")
                plan.append({"responses_create_params": {"input": f"q{t}"}, **ident.stamps()})
                if (t, r) != (3, 1) and (t, r) != (2, 0):
                    result = {"response": {"usage": {"input_tokens": 5}}, "reward": float(t % 2)}
                    rows.append(outcome_to_row(Landed(ident, 0, result, 0.5 + t)))
        write_jsonl(folder / f"{name}.jsonl", rows)
        write_jsonl(folder / f"{name}_materialized_inputs.jsonl", plan)
    failure = outcome_to_row(Failed(Identity(3, 1, agent_name="a"), 0, "agent_run_error"))
    write_jsonl(folder / "s1_failures.jsonl", [failure])
    return folder


def invoke(*args: str) -> Any:
    """Run the command and return click's result."""
    return CliRunner().invoke(aggregate, list(args), catch_exceptions=False)


def test_aggregate_glob_writes_merged_metrics_and_report(tmp_path: Path) -> None:
    """A glob and -o merge the shards and write metrics and the report; a planned rollout with
    no row is said, with exit 75."""
    shards(tmp_path / "s")
    out = tmp_path / "m" / "merged.jsonl"
    result = invoke(f"{tmp_path}/s/*.jsonl", "-o", str(out))
    assert result.exit_code == EXIT_INCOMPLETE_RETRYABLE, result.output
    assert "1 of 8 planned rollouts have no outcome (no row 1)" in result.output
    assert "Metrics cover: 6 of 8 rollouts" in result.output
    assert "agent_run_error 1, no row 1" in result.output
    assert len(out.read_bytes().splitlines()) == 6
    entries = orjson.loads((tmp_path / "m" / "merged_aggregate_metrics.json").read_bytes())
    assert entries[0]["agent_metrics"]["mean/reward"] == 0.5
    assert (tmp_path / "m" / "merged_report.html").is_file()


def test_aggregate_accepts_nemo_gym_tokens(tmp_path: Path) -> None:
    """+input_glob, +output_jsonl_fpath and the count-as-zero settings work as in NeMo Gym."""
    shards(tmp_path / "s")
    out = tmp_path / "m" / "merged.jsonl"
    result = invoke(
        f"+input_glob={tmp_path}/s/s0.jsonl,{tmp_path}/s/s1.jsonl",
        f"+output_jsonl_fpath={out}",
        "+count_failure_classes_as_zero=[agent_run_error]",
        "+count_missing_rollouts_as_zero=true",
        "--json",
    )
    assert result.exit_code == 0, result.output
    report = orjson.loads(result.output)
    assert report["coverage"]["covered"] == 8
    assert report["coverage"]["imputed"] == {"agent_run_error": 1, "no row": 1}
    (group,) = report["groups"]
    assert group["local_agent_metrics"]["mean/reward"] == 3 / 8
    assert group["failures_excluded"]["mean_reward"]["value"] == 0.5
    assert group["failures_as_zero"]["mean_reward"]["ci_method"] == "bootstrap"
    assert report["files"]["merged"] == str(out)


def test_aggregate_without_servers_is_local(tmp_path: Path) -> None:
    """With no server options (and no server running) one shard is aggregated in place."""
    shards(tmp_path)
    result = invoke(str(tmp_path / "s0.jsonl"), "--no-report")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "s0_aggregate_metrics.json").is_file()
    assert not (tmp_path / "s0_report.html").exists()


def test_aggregate_refuses_to_overwrite_an_input(tmp_path: Path) -> None:
    """-o naming an input exits 2 with the remedy, and leaves the input alone."""
    shards(tmp_path)
    before = (tmp_path / "s0.jsonl").read_bytes()
    result = invoke(f"{tmp_path}/*.jsonl", "-o", str(tmp_path / "s0.jsonl"))
    assert result.exit_code == 2
    assert "is one of the input files" in result.output
    assert (tmp_path / "s0.jsonl").read_bytes() == before


def test_aggregate_usage_errors_exit_2(tmp_path: Path) -> None:
    """No input, an unknown +key, several shards without -o and a bad URL all exit 2."""
    shards(tmp_path)
    assert "no INPUT given" in invoke().output
    assert invoke("+nope=1", str(tmp_path / "s0.jsonl")).exit_code == 2
    assert "-o merged.jsonl" in invoke(f"{tmp_path}/*.jsonl").output
    assert invoke(str(tmp_path / "s0.jsonl"), "--agent-url", "a=ftp://x").exit_code == 2


def test_aggregate_server_failure_exits_1_after_writing(tmp_path: Path) -> None:
    """An unreachable /aggregate_metrics is recorded; files are written; exit code 1."""
    shards(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again on exit: connections are refused
    result = invoke(str(tmp_path / "s0.jsonl"), "--agent-url", f"a=http://127.0.0.1:{port}")
    assert result.exit_code == 1
    assert "/aggregate_metrics call(s) failed" in result.output
    (entry,) = orjson.loads((tmp_path / "s0_aggregate_metrics.json").read_bytes())
    assert entry["agent_metrics"] == {}
    assert "ConnectError" in entry["aggregation_error"]
    assert entry["trollout"]["local_agent_metrics"]["mean/reward"] == 0.5


def test_aggregate_unreachable_head_server_exits_2(tmp_path: Path) -> None:
    """A head server that does not answer is a usage error that suggests aggregating locally."""
    shards(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = invoke(str(tmp_path / "s0.jsonl"), f"+head_server={{host:127.0.0.1,port:{port}}}")
    assert result.exit_code == 2
    assert "drop --head-server to aggregate locally" in result.output
    assert not (tmp_path / "s0_aggregate_metrics.json").exists()
