"""``trollout aggregate`` with NeMo Gym's aggregation settings (merge_shards, plans)."""

from __future__ import annotations

from pathlib import Path

import orjson
from run_folders import landed, plan_for, write_run

from builders import invoke, write_jsonl
from trollout.cli.failures import EXIT_INCOMPLETE_RETRYABLE


def test_merge_shards_false_writes_metrics_only(tmp_path: Path) -> None:
    """+merge_shards=false: the metrics file goes beside output_jsonl_fpath; no merged rows."""
    write_run(tmp_path / "s" / "a.jsonl", [landed(0, 0)], plan=plan_for(1, 1))
    write_run(tmp_path / "s" / "b.jsonl", [landed(0, 0)], plan=plan_for(1, 1, agent="agent_b"))
    out = tmp_path / "m" / "merged.jsonl"
    result = invoke(
        "aggregate", f"{tmp_path}/s/*.jsonl", f"+output_jsonl_fpath={out}",
        "+merge_shards=false", "--no-report",
    )  # fmt: skip
    # agent_b's planned rollout has no row: written, and said with exit 75
    assert result.exit_code == EXIT_INCOMPLETE_RETRYABLE, result.output
    assert (tmp_path / "m" / "merged_aggregate_metrics.json").is_file()
    assert not out.exists()


def test_materialized_inputs_jsonl_fpath_stands_for_every_shard(tmp_path: Path) -> None:
    """One materialized-inputs file is the plan of shards that share its numbering."""
    write_run(tmp_path / "s" / "a.jsonl", [landed(0, 0), landed(1, 0)])
    write_run(tmp_path / "s" / "b.jsonl", [landed(2, 0)])
    plan = write_jsonl(tmp_path / "plan.jsonl", plan_for(4, 1))
    out = tmp_path / "m" / "merged.jsonl"
    result = invoke(
        "aggregate", f"{tmp_path}/s/*.jsonl", "-o", str(out), "--json", "--no-report",
        f"+materialized_inputs_jsonl_fpath={plan}",
    )  # fmt: skip
    assert result.exit_code == EXIT_INCOMPLETE_RETRYABLE, result.output  # task 3 has no row
    coverage = orjson.loads(result.stdout)["coverage"]
    assert (coverage["expected"], coverage["landed"], coverage["missing"]) == (4, 3, 1)
    missing = invoke("aggregate", f"{tmp_path}/s/a.jsonl", "+materialized_inputs_jsonl_fpath=nope")
    assert missing.exit_code == 2
    assert "is not a file" in missing.output
