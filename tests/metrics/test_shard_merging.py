"""Shards: globs, identical files, torn tails, duplicates, the merged run folder."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from run_folders import failed, landed, plan_for, read_metrics, write_run

from builders import write_jsonl
from trollout.errors import ConfigError, InputError
from trollout.metrics import AggregateOptions, aggregate_shards, resolve_inputs
from trollout.metrics.shards import identical_files, read_lines
from trollout.recovery.layout import RunLayout


def test_resolve_inputs_sorts_dedupes_and_skips_siblings(tmp_path: Path) -> None:
    """Comma-separated globs give sorted unique shards, never sidecars or other files."""
    for name in ("b.jsonl", "a.jsonl", "a_failures.jsonl", "a_materialized_inputs.jsonl", "c.json"):
        (tmp_path / name).write_text("")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "d.jsonl").write_text("")
    found = resolve_inputs(f"{tmp_path}/*.jsonl, {tmp_path}/a.jsonl,{tmp_path}/sub/*.jsonl")
    assert found == [tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "sub" / "d.jsonl"]


def test_resolve_inputs_refuses_nothing_and_missing_paths(tmp_path: Path) -> None:
    """A glob matching nothing, or a literal path that does not exist, is a usage error."""
    with pytest.raises(ConfigError, match="no rollouts file matches"):
        resolve_inputs(f"{tmp_path}/*.jsonl")
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_inputs(str(tmp_path / "nope.jsonl"))


def test_identical_files_finds_copies_and_links(tmp_path: Path) -> None:
    """Copies, hard links and symbolic links map to the first file; other content does not."""
    first = tmp_path / "a.jsonl"
    first.write_text('{"x": 1}\n')
    shutil.copy(first, tmp_path / "copy.jsonl")
    os.link(first, tmp_path / "hard.jsonl")
    (tmp_path / "soft.jsonl").symlink_to(first)
    (tmp_path / "other.jsonl").write_text('{"x": 2}\n')
    names = ["a", "copy", "hard", "soft", "other"]
    same = identical_files([tmp_path / f"{n}.jsonl" for n in names])
    assert same == {tmp_path / f"{n}.jsonl": first for n in ("copy", "hard", "soft")}


def test_read_lines_skips_a_torn_tail_only(tmp_path: Path) -> None:
    """A torn last line is reported and skipped; a complete unterminated one is read."""
    path = tmp_path / "r.jsonl"
    path.write_bytes(b'{"a": 1}\n\n{"a": 2}\n{"a": 3')
    torn: list[str] = []
    assert [row for _, _, row in read_lines(path, torn)] == [{"a": 1}, {"a": 2}]
    assert torn == [f"{path}:4"]
    path.write_bytes(b'{"a": 1}\n{"a": 2}')
    assert [raw for _, raw, _ in read_lines(path, torn)] == [b'{"a": 1}\n', b'{"a": 2}\n']
    path.write_bytes(b'{"a": 1}\n{"a": \n{"a": 3}\n')
    with pytest.raises(InputError, match=r"r\.jsonl:2"):
        list(read_lines(path, torn))


async def test_same_shard_twice_is_reported_and_counted_once(tmp_path: Path) -> None:
    """A shard copied under another name is skipped, reported, and not double counted."""
    layout = write_run(
        tmp_path / "s0.jsonl", [landed(0, 0), landed(1, 0, 0.0)], plan=plan_for(2, 1)
    )
    for sibling in (layout.rollouts, layout.materialized_inputs):
        shutil.copy(sibling, sibling.with_name(sibling.name.replace("s0", "s1")))
    shards = resolve_inputs(f"{tmp_path}/*.jsonl")
    result = await aggregate_shards(shards, output=tmp_path / "out" / "merged.jsonl")
    assert result.inputs.skipped == (
        (tmp_path / "s1_materialized_inputs.jsonl", layout.materialized_inputs),
        (tmp_path / "s1.jsonl", layout.rollouts),
    )
    assert result.coverage.landed == 2
    assert result.groups[0].local_metrics["mean/reward"] == 0.5
    assert "identical to" in result.inputs.lines()[0]


async def test_duplicate_keys_across_shards_first_shard_wins(tmp_path: Path) -> None:
    """A rollout landed in two shards counts once, from the first shard in sorted order."""
    write_run(tmp_path / "a.jsonl", [landed(0, 0, 1.0), landed(0, 1, 1.0)])
    write_run(tmp_path / "b.jsonl", [landed(0, 1, 0.0), landed(1, 0, 0.0)])
    merged = tmp_path / "m" / "merged.jsonl"
    result = await aggregate_shards(resolve_inputs(f"{tmp_path}/*.jsonl"), output=merged)
    assert result.inputs.duplicates == {str(tmp_path / "b.jsonl"): 1}
    assert result.coverage.landed == 3
    rewards = [orjson.loads(line)["reward"] for line in merged.read_bytes().splitlines()]
    assert rewards == [1.0, 1.0, 0.0]


async def test_failure_in_one_shard_landed_in_another_counts_as_landed(tmp_path: Path) -> None:
    """Whichever shard holds them, a landed row beats a failure of the same rollout."""
    write_run(tmp_path / "a.jsonl", [], failures=[failed(0, 0)], plan=plan_for(1, 1))
    write_run(tmp_path / "b.jsonl", [landed(0, 0)], plan=plan_for(1, 1))
    result = await aggregate_shards(
        resolve_inputs(f"{tmp_path}/*.jsonl"), output=tmp_path / "m" / "m.jsonl"
    )
    cov = result.coverage
    assert (cov.expected, cov.landed, cov.failed, cov.recovered) == (1, 1, {}, 1)


async def test_merged_folder_aggregates_like_its_shards(tmp_path: Path) -> None:
    """The merged run folder (rollouts, sidecar, plan) gives the same metrics as its shards."""
    options = AggregateOptions(
        count_failure_classes_as_zero=frozenset({"agent_run_error"}),
        count_missing_rollouts_as_zero=True,
    )
    plan = plan_for(6, 2)
    write_run(
        tmp_path / "s" / "a.jsonl",
        [landed(0, 0), landed(1, 1, 0.0)],
        failures=[failed(2, 0)],
        plan=plan[:6],
    )
    write_run(
        tmp_path / "s" / "b.jsonl",
        [landed(3, 0), landed(4, 1, 0.5)],
        failures=[failed(5, 0, "x")],
        plan=plan[6:],
    )
    merged = tmp_path / "m" / "merged.jsonl"
    first = await aggregate_shards(
        resolve_inputs(f"{tmp_path}/s/*.jsonl"), output=merged, options=options
    )
    again = await aggregate_shards(
        [merged], output=tmp_path / "m2" / "again.jsonl", options=options
    )
    assert first.coverage == again.coverage
    assert [g.local_metrics for g in first.groups] == [g.local_metrics for g in again.groups]
    (one,) = read_metrics(RunLayout.for_output(merged))
    (two,) = read_metrics(RunLayout.for_output(tmp_path / "m2" / "again.jsonl"))
    assert one["group_level_metrics"] == two["group_level_metrics"]
    assert RunLayout.for_output(merged).failures.is_file()


async def test_output_that_is_an_input_is_refused(tmp_path: Path) -> None:
    """Aggregation never overwrites an input file, even one reached through a link."""
    layout = write_run(tmp_path / "a.jsonl", [landed(0, 0)], failures=[failed(1, 0)])
    with pytest.raises(ConfigError, match="one of the input files"):
        await aggregate_shards([layout.output], output=layout.output)
    write_jsonl(tmp_path / "b.jsonl", [landed(2, 0)])
    with pytest.raises(ConfigError, match="one of the input files"):
        await aggregate_shards([tmp_path / "b.jsonl", layout.output], output=tmp_path / "a.jsonl")
    (tmp_path / "link").symlink_to(tmp_path)
    with pytest.raises(ConfigError, match="one of the input files"):
        await aggregate_shards([layout.output], output=tmp_path / "link" / "a.jsonl")
    assert layout.rollouts.read_bytes().count(b"\n") == 1


async def test_several_shards_need_an_output(tmp_path: Path) -> None:
    """Without -o only a single shard can be aggregated (in place)."""
    a = write_run(tmp_path / "a.jsonl", [landed(0, 0)])
    b = write_run(tmp_path / "b.jsonl", [landed(1, 0)])
    with pytest.raises(ConfigError, match=r"-o merged\.jsonl"):
        await aggregate_shards([a.output, b.output])


async def test_every_file_an_aggregation_writes_is_fsynced_around_its_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The merged files, the metrics file and the report go through the one atomic replace:
    each temp file is fsynced before its rename and the folder after it (a crash never leaves
    an empty file where a whole one was), and no temp file is left."""
    write_run(
        tmp_path / "s" / "a.jsonl", [landed(0, 0)], failures=[failed(1, 0)], plan=plan_for(2, 1)
    )
    write_run(tmp_path / "s" / "b.jsonl", [landed(2, 0)], plan=plan_for(3, 1)[2:])
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src: Any, dst: Any) -> None:
        events.append(("replace", f"{src} {dst}"))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    merged = tmp_path / "m" / "merged.jsonl"
    await aggregate_shards(resolve_inputs(f"{tmp_path}/s/*.jsonl"), output=merged)
    layout = RunLayout.for_output(merged)
    replaced = [i for i, (kind, _) in enumerate(events) if kind == "replace"]
    targets = {events[i][1].split(" ")[1] for i in replaced}
    wanted = (layout.rollouts, layout.failures, layout.materialized_inputs)
    assert {str(p) for p in (*wanted, layout.aggregate_metrics, layout.report)} <= targets
    for i in replaced:
        temp, target = events[i][1].split(" ")
        assert ("fsync", temp) in events[:i], f"{target} renamed before its content was synced"
        assert events[i + 1] == ("fsync", str(Path(target).parent)), f"{target}'s folder"
    assert not list(merged.parent.glob(".*.tmp"))
