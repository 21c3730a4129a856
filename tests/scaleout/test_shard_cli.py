"""``collect --shard I/N`` end to end: N shard runs aggregate to exactly the one-machine run."""

from __future__ import annotations

from pathlib import Path

from shard_runs import collect, metrics, rollout_set

from builders import invoke, read_jsonl, write_tasks_input
from trollout.scaleout import shard_output
from trollout.testing import FakeUrls


def test_four_shards_aggregate_to_the_one_machine_run(tmp_path: Path, fake: FakeUrls) -> None:
    """4 shards + aggregate: same metrics (timing aside), same rollouts, one-machine numbering."""
    source = write_tasks_input(tmp_path / "tasks.jsonl", 30, seed=5)
    one = tmp_path / "one" / "run.jsonl"
    collect(source, one, fake.head_url)
    out = tmp_path / "dist" / "run.jsonl"
    for i in range(4):
        collect(
            source, shard_output(out, i, 4), fake.head_url, "--shard", f"{i}/4", "--no-aggregate"
        )
    sizes = [len(read_jsonl(shard_output(out, i, 4))) for i in range(4)]
    assert sum(sizes) == 60  # every rollout in one shard, none twice
    assert all(sizes), sizes  # and every shard got tasks
    glob = str(out.parent / "run_shards" / "*-of-00004" / "run.jsonl")
    result = invoke(
        "aggregate", glob, "-o", str(out), "--no-report", "--head-server", fake.head_url
    )
    assert result.exit_code == 0, result.output
    assert metrics(out) == metrics(one)
    assert rollout_set(out) == rollout_set(one)
    merged = out.with_name("run_materialized_inputs.jsonl")
    assert sorted(map(str, read_jsonl(merged))) == sorted(
        map(str, read_jsonl(one.with_name("run_materialized_inputs.jsonl")))
    )


def test_a_shard_handed_no_task_aggregates_with_the_others(tmp_path: Path, fake: FakeUrls) -> None:
    """One task over 2 shards: the shard that got none holds no row and merges (2 of 2, exit 0).

    Ray blocks are such shards (a block handed no task ended Ray runs with exit 2).
    """
    source = write_tasks_input(tmp_path / "tasks.jsonl", 1, seed=9)
    out = tmp_path / "dist" / "run.jsonl"
    for i in range(2):
        collect(
            source, shard_output(out, i, 2), fake.head_url, "--shard", f"{i}/2", "--no-aggregate"
        )
    sizes = [len(read_jsonl(shard_output(out, i, 2))) for i in range(2)]
    assert sorted(sizes) == [0, 2]
    glob = str(out.parent / "run_shards" / "*-of-00002" / "run.jsonl")
    result = invoke("aggregate", glob, "-o", str(out), "--no-report")
    assert result.exit_code == 0, result.output
    assert "Metrics cover: 2 of 2" in " ".join(result.output.split()), result.output
    assert len(read_jsonl(out)) == 2
