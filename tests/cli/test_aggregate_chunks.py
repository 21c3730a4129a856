"""The chunked workflow end to end: separate ``collect`` runs over chunks, then ``aggregate``.

NeMo Gym's ``gym eval run --no-serve +disable_aggregation=true`` sharding: each chunk of a
dataset is collected by its own run (numbering its tasks from 0), then ``aggregate`` merges the
shards. Real runs against the fake deployment, so the shards are exactly what collect writes.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson

from builders import invoke, read_jsonl, write_jsonl
from trollout.testing import AgentSpec, DeploymentSpec, spawn_fake_deployment, task_rows


def collect_chunk(head: str, rows: list[dict[str, object]], output: Path) -> None:
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
    )
    assert result.exit_code == 0, result.output


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
