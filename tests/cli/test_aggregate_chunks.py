"""The chunked workflow end to end: separate ``collect`` runs over chunks, then ``aggregate``.

NeMo Gym's ``gym eval run --no-serve +disable_aggregation=true`` sharding: each chunk of a
dataset is collected by its own run (numbering its tasks from 0), then ``aggregate`` merges the
shards. Real runs against the fake deployment, so the shards are exactly what collect writes.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson

from builders import invoke, read_jsonl, write_jsonl
from trollout.testing import AgentSpec, DeploymentSpec, spawn_fake_deployment, task_rows


def collect_chunk(head: str, rows: list[dict[str, object]], output: Path, *extra: str) -> None:
    """Collect one chunk of rows into ``output`` as a separate run (no aggregation)."""
    source = write_jsonl(output.parent / "inputs" / f"{output.stem}.jsonl", rows)
    result = invoke(
        "collect",
        str(source),
        "-o",
        str(output),
        "--head-server",
        head,
        "--progress",
        "plain",
        "+agent_name=math_agent",
        "+num_repeats=2",
        "+disable_aggregation=true",
        *extra,
    )
    assert result.exit_code == 0, result.output


def aggregate_into(output: Path, *shards: Path) -> dict[str, Any]:
    """Run ``trollout aggregate <shards> -o <output> --json``; return its report."""
    result = invoke(
        "aggregate", ",".join(map(str, shards)), "-o", str(output), "--json", "--no-report"
    )
    assert result.exit_code == 0, result.output
    report: dict[str, Any] = orjson.loads(result.output)
    return report


def aggregate(folder: Path) -> dict[str, object]:
    """Run ``trollout aggregate 'shards/rollouts-chunk*.jsonl' -o merged.jsonl --json``."""
    result = invoke(
        "aggregate",
        f"{folder}/rollouts-chunk*.jsonl",
        "-o",
        str(folder / "merged" / "merged.jsonl"),
        "--json",
        "--no-report",
    )
    assert result.exit_code == 0, result.output
    report: dict[str, object] = orjson.loads(result.output)
    return report


def test_chunked_runs_count_the_sum_and_copies_and_reruns_count_once(tmp_path: Path) -> None:
    """Three chunks aggregate to every rollout; a copied shard and a re-run add nothing."""
    rows = list(task_rows(12, seed=3))
    shards = tmp_path / "shards"
    spec = DeploymentSpec(agents=(AgentSpec(name="math_agent"),))
    with spawn_fake_deployment(spec) as urls:
        for i, chunk in enumerate((rows[0:4], rows[4:8], rows[8:12])):
            collect_chunk(urls.head_url, chunk, shards / f"rollouts-chunk{i}.jsonl")
        summed = aggregate(shards)
        assert summed["coverage"]["expected"] == 24  # type: ignore[index]
        assert summed["coverage"]["landed"] == 24  # type: ignore[index]
        merged = read_jsonl(shards / "merged" / "merged_materialized_inputs.jsonl")
        questions = {orjson.dumps(r["responses_create_params"]) for r in merged}
        assert len(questions) == 12
        for sibling in ("", "_materialized_inputs", "_manifest"):
            name = f"rollouts-chunk1{sibling}"
            suffix = ".json" if sibling == "_manifest" else ".jsonl"
            shutil.copy(
                shards / f"{name}{suffix}", shards / f"rollouts-chunk1-copy{sibling}{suffix}"
            )
        collect_chunk(urls.head_url, rows[2:6], shards / "rollouts-chunk3-rerun.jsonl")
    again = aggregate(shards)
    assert again["coverage"]["expected"] == 24  # type: ignore[index]
    assert again["coverage"]["landed"] == 24  # type: ignore[index]
    duplicates = again["inputs"]["duplicates"]  # type: ignore[index]
    assert duplicates == {str(shards / "rollouts-chunk3-rerun.jsonl"): 8}
    assert len(again["inputs"]["skipped"]) == 2  # type: ignore[index, arg-type]
    assert len(read_jsonl(shards / "merged" / "merged.jsonl")) == 24


def test_a_copied_rollouts_file_without_its_plan_counts_once(tmp_path: Path) -> None:
    """``cp r1/out.jsonl bk/`` (the rollouts file alone) beside r1 adds no rollout, even seeded."""
    spec = DeploymentSpec(agents=(AgentSpec(name="math_agent"),))
    with spawn_fake_deployment(spec) as urls:
        collect_chunk(urls.head_url, list(task_rows(4, seed=5)), tmp_path / "r1" / "out.jsonl")
        collect_chunk(
            urls.head_url, list(task_rows(4, seed=6)), tmp_path / "s1" / "out.jsonl", "--add-seed"
        )
    for run in ("r1", "s1"):
        backup = tmp_path / f"bk-{run}"
        backup.mkdir()
        shutil.copy(tmp_path / run / "out.jsonl", backup / "out.jsonl")
        partial = tmp_path / f"part-{run}"  # the first three rows only, no plan either
        partial.mkdir()
        lines = (tmp_path / run / "out.jsonl").read_bytes().splitlines(keepends=True)
        (partial / "out.jsonl").write_bytes(b"".join(lines[:3]))
        shards = (tmp_path / run / "out.jsonl", backup / "out.jsonl", partial / "out.jsonl")
        report = aggregate_into(tmp_path / f"m-{run}" / "merged.jsonl", *shards)
        assert report["coverage"]["expected"] == 8, run
        assert report["coverage"]["landed"] == 8, run
        assert len(read_jsonl(tmp_path / f"m-{run}" / "merged.jsonl")) == 8, run


def test_a_merged_output_merged_again_with_a_seeded_run_counts_each_rollout_once(
    tmp_path: Path,
) -> None:
    """aggregate r5 -o M, then M with r6 (a superset of r5's tasks, seeds added): as r5 with r6."""
    rows = list(task_rows(5, seed=7))
    spec = DeploymentSpec(agents=(AgentSpec(name="math_agent"),))
    with spawn_fake_deployment(spec) as urls:
        collect_chunk(urls.head_url, rows[:4], tmp_path / "r5" / "out.jsonl", "--add-seed")
        collect_chunk(urls.head_url, rows, tmp_path / "r6" / "out.jsonl", "--add-seed")
    r5, r6 = tmp_path / "r5" / "out.jsonl", tmp_path / "r6" / "out.jsonl"
    direct = aggregate_into(tmp_path / "direct" / "merged.jsonl", r5, r6)
    assert (direct["coverage"]["expected"], direct["coverage"]["landed"]) == (10, 10)
    once = tmp_path / "M" / "merged.jsonl"
    aggregate_into(once, r5)
    again = aggregate_into(tmp_path / "again" / "merged.jsonl", once, r6)
    assert (again["coverage"]["expected"], again["coverage"]["landed"]) == (10, 10)
    assert len(read_jsonl(tmp_path / "again" / "merged.jsonl")) == 10


def test_the_union_plan_of_two_chunks_keeps_every_rollout(tmp_path: Path) -> None:
    """+materialized_inputs_jsonl_fpath=<the chunks' plans concatenated, or merged>: 40 of 40.

    What a NeMo Gym user passes: each chunk run numbers its tasks from 0, so the union plan
    holds every task index twice; no chunk's rollouts may be taken for the other's duplicates.
    """
    rows = list(task_rows(20, seed=11))
    shards = tmp_path / "shards"
    spec = DeploymentSpec(agents=(AgentSpec(name="math_agent"),))
    with spawn_fake_deployment(spec) as urls:
        for i, chunk in enumerate((rows[:10], rows[10:])):
            collect_chunk(urls.head_url, chunk, shards / f"rollouts-chunk{i}.jsonl")
    plans = [shards / f"rollouts-chunk{i}_materialized_inputs.jsonl" for i in range(2)]
    concatenated = tmp_path / "plan.jsonl"
    concatenated.write_bytes(b"".join(p.read_bytes() for p in plans))
    aggregate(shards)  # without the key: merged/merged_materialized_inputs.jsonl is the union
    merged_plan = tmp_path / "merged-plan.jsonl"
    shutil.copy(shards / "merged" / "merged_materialized_inputs.jsonl", merged_plan)
    for name, plan in (("concatenated", concatenated), ("merged", merged_plan)):
        out = tmp_path / name / "merged.jsonl"
        result = invoke(
            "aggregate",
            f"+input_glob={shards}/rollouts-chunk*.jsonl",
            f"+materialized_inputs_jsonl_fpath={plan}",
            "-o",
            str(out),
            "--no-report",
        )
        assert result.exit_code == 0, (name, result.output)
        assert "duplicate" not in result.output, name
        assert "Metrics cover: 40 of 40" in result.output, (name, result.output)
        assert len(read_jsonl(out)) == 40, name
        merged = read_jsonl(out.with_name("merged_materialized_inputs.jsonl"))
        assert len(merged) == 40, name


def test_rows_numbered_as_another_runs_tasks_are_refused_not_dropped(tmp_path: Path) -> None:
    """A shard beside another run's materialized inputs: exit 2 naming the row, nothing lost."""
    rows = list(task_rows(8, seed=13))
    shards = tmp_path / "shards"
    spec = DeploymentSpec(agents=(AgentSpec(name="math_agent"),))
    with spawn_fake_deployment(spec) as urls:
        for i, chunk in enumerate((rows[:4], rows[4:])):
            collect_chunk(urls.head_url, chunk, shards / f"rollouts-chunk{i}.jsonl")
    shutil.copy(  # the second chunk's plan replaced by the first's (a copy gone wrong)
        shards / "rollouts-chunk0_materialized_inputs.jsonl",
        shards / "rollouts-chunk1_materialized_inputs.jsonl",
    )
    out = tmp_path / "merged" / "merged.jsonl"
    result = invoke("aggregate", f"{shards}/rollouts-chunk*.jsonl", "-o", str(out))
    assert result.exit_code == 2, result.output
    [error] = [line for line in result.stderr.splitlines() if line.strip()]
    assert f"{shards / 'rollouts-chunk1.jsonl'}:1: this landed row and an earlier one" in error
    assert "ran different responses_create_params, so one would be lost" in error
    assert not out.parent.exists() or not out.exists()
