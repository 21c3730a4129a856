"""A rollout's identity across runs: chunks, copies and re-runs of separate collections.

Each run numbers its tasks from 0 (docs/protocol.md section 8), so shards of separate runs are
written here the way a collector writes them: a run over questions ``qs`` has tasks 0, 1, ...
and its materialized inputs hold each question with those stamps.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from run_folders import read_metrics

from builders import read_jsonl, write_jsonl
from trollout.errors import InputError
from trollout.metrics import AggregateOptions, aggregate_shards, resolve_inputs
from trollout.metrics.identity import content_digest, row_content_digest
from trollout.records import Failed, Identity, Landed, outcome_to_row
from trollout.recovery.layout import RunLayout, is_auxiliary

AGENT = "agent_a"
Row = dict[str, Any]


def question_row(question: int, seed: int | None = None) -> Row:
    """Return the dataset row of question ``question`` (a seed in extra_body when given)."""
    params: Row = {"input": [{"role": "user", "content": f"question {question}"}]}
    if seed is not None:
        params["metadata"] = {"extra_body": json.dumps({"seed": seed})}
    return {"responses_create_params": params, "expected_answer": str(question)}


def nemo_echo(params: Row) -> Row:
    """Return ``params`` as a NeMo Gym agent echoes them: pydantic defaults filled in."""
    messages = [{**m, "type": "message", "phase": None} for m in params["input"]]
    return {"background": None, **params, "input": messages, "parallel_tool_calls": True}


def write_chunk_run(
    output: Path,
    questions: Sequence[int],
    *,
    repeats: int = 1,
    landed: frozenset[tuple[int, int]] | None = None,
    failed: frozenset[tuple[int, int]] = frozenset(),
    seeds: str | None = None,
    agent: str = AGENT,
) -> RunLayout:
    """Write one run's folder over ``questions``, numbered from 0 as every run numbers them.

    Args:
        output: the run's rollouts file.
        questions: the chunk, in the run's order (task i asks ``questions[i]``).
        repeats: rollouts per task.
        landed: the (question, rollout) pairs that landed (default: all not failed).
        failed: the (question, rollout) pairs whose latest attempt failed.
        seeds: ``"nemo"`` (seed = rollout index, no manifest), ``"trollout"`` (a different
            seed every run, and a manifest saying seeds were added), or None.
        agent: the agent the run routed to.
    """
    layout = RunLayout.for_output(output)
    plan, rows, failures = [], [], []
    salt = int.from_bytes(output.name.encode()[:4].ljust(4, b"\0"), "big")
    for task, question in enumerate(questions):
        for rollout in range(repeats):
            seed = {"nemo": rollout, "trollout": salt * 1000 + task * 10 + rollout}.get(seeds or "")
            ident = Identity(task, rollout, agent_name=agent)
            plan.append({**question_row(question, seed), **ident.stamps()})
            if (question, rollout) in failed:
                failures.append(outcome_to_row(Failed(ident, 0, "agent_run_error")))
            elif landed is None or (question, rollout) in landed:
                reply = {
                    "responses_create_params": nemo_echo(plan[-1]["responses_create_params"]),
                    "reward": float(question % 2),
                    "question": question,
                }
                rows.append(outcome_to_row(Landed(ident, 0, reply, 1.0)))
    write_jsonl(layout.materialized_inputs, plan)
    write_jsonl(layout.rollouts, rows)
    if failures:
        write_jsonl(layout.failures, failures)
    if seeds == "trollout":
        manifest = {"settings": {"num_repeats_add_seed": True}, "run_id": output.stem}
        layout.manifest.write_bytes(orjson.dumps(_manifest(manifest)))
    return layout


def _manifest(extra: Row) -> Row:
    base: Row = {
        "run_id": "r",
        "trollout_version": "0",
        "created_at": 0.0,
        "input_sha256": "",
        "settings_sha256": "",
        "deployment_sha256": "",
        "expected_rollouts": 0,
        "tasks": 0,
    }
    return base | extra


async def merge(folder: Path, **options: Any) -> Any:
    """Aggregate every shard of ``folder`` into ``folder/merged/merged.jsonl``."""
    shards = resolve_inputs(f"{folder}/shards/*.jsonl")
    out = folder / "merged" / "merged.jsonl"
    return await aggregate_shards(shards, output=out, options=AggregateOptions(**options))


def merged_questions(folder: Path) -> list[int]:
    """Return the question of every landed row of the merged file, in file order."""
    return [row["question"] for row in read_jsonl(folder / "merged" / "merged.jsonl")]


async def test_chunks_of_separate_runs_count_exactly_their_sum(tmp_path: Path) -> None:
    """Two runs over q0-q4 and q5-q9, each numbered from 0, merge into all ten rollouts."""
    write_chunk_run(tmp_path / "shards" / "rollouts-chunk0.jsonl", range(5))
    write_chunk_run(tmp_path / "shards" / "rollouts-chunk1.jsonl", range(5, 10))
    result = await merge(tmp_path)
    assert (result.coverage.expected, result.coverage.landed) == (10, 10)
    assert result.inputs.duplicates == {}
    assert sorted(merged_questions(tmp_path)) == list(range(10))
    (entry,) = read_metrics(RunLayout.for_output(tmp_path / "merged" / "merged.jsonl"))
    assert [g["_ng_task_index"] for g in entry["group_level_metrics"]] == list(range(10))
    assert entry["agent_metrics"]["mean/reward"] == 0.5
    assert "took new task numbers" in " ".join(result.inputs.lines())


async def test_merged_files_are_renumbered_and_aggregate_the_same(tmp_path: Path) -> None:
    """The merged folder numbers later chunks' tasks anew, so it re-aggregates the same."""
    write_chunk_run(tmp_path / "shards" / "a.jsonl", range(3), repeats=2)
    write_chunk_run(
        tmp_path / "shards" / "b.jsonl", range(3, 6), repeats=2, failed=frozenset({(4, 1)})
    )
    first = await merge(tmp_path, count_failure_classes_as_zero=frozenset({"agent_run_error"}))
    merged = RunLayout.for_output(tmp_path / "merged" / "merged.jsonl")
    plan = read_jsonl(merged.materialized_inputs)
    assert sorted({(r["_ng_task_index"], r["expected_answer"]) for r in plan}) == [
        (t, str(t)) for t in range(6)
    ]
    assert [r["_ng_task_index"] for r in read_jsonl(merged.failures)] == [4]
    again = await aggregate_shards(
        [merged.output],
        output=tmp_path / "again" / "again.jsonl",
        options=AggregateOptions(count_failure_classes_as_zero=frozenset({"agent_run_error"})),
    )
    assert first.coverage == again.coverage
    assert first.coverage.expected == 12
    assert [g.local_metrics for g in first.groups] == [g.local_metrics for g in again.groups]


async def test_same_shard_twice_counts_once(tmp_path: Path) -> None:
    """A whole shard folder copied under another name is read once."""
    layout = write_chunk_run(tmp_path / "shards" / "chunk0.jsonl", range(4), repeats=2)
    for path in (layout.rollouts, layout.materialized_inputs):
        shutil.copy(path, path.with_name(path.name.replace("chunk0", "chunk0-copy")))
    result = await merge(tmp_path)
    assert (result.coverage.expected, result.coverage.landed) == (8, 8)
    assert len(result.inputs.skipped) == 2


async def test_rerun_chunk_overlapping_another_counts_once(tmp_path: Path) -> None:
    """A re-run of q3-q7 beside runs of q0-q4 and q5-q9 adds no rollout; overlaps are reported."""
    write_chunk_run(tmp_path / "shards" / "c0.jsonl", range(5))
    write_chunk_run(tmp_path / "shards" / "c1.jsonl", range(5, 10))
    write_chunk_run(tmp_path / "shards" / "c2-rerun.jsonl", range(3, 8))
    result = await merge(tmp_path)
    assert (result.coverage.expected, result.coverage.landed) == (10, 10)
    assert result.inputs.duplicates == {str(tmp_path / "shards" / "c2-rerun.jsonl"): 5}
    assert sorted(merged_questions(tmp_path)) == list(range(10))


async def test_rerun_lands_what_the_first_run_missed(tmp_path: Path) -> None:
    """A rollout failed in one run and landed in a re-run counts once, as landed."""
    write_chunk_run(tmp_path / "shards" / "a.jsonl", range(3), failed=frozenset({(1, 0)}))
    write_chunk_run(tmp_path / "shards" / "b.jsonl", [1])
    result = await merge(tmp_path)
    cov = result.coverage
    assert (cov.expected, cov.landed, cov.failed, cov.recovered) == (3, 3, {}, 1)


async def test_collector_seeds_do_not_split_a_task(tmp_path: Path) -> None:
    """Seeds NeMo Gym or trollout added are not task content; a re-run still counts once."""
    for seeds in ("nemo", "trollout"):
        folder = tmp_path / seeds
        write_chunk_run(folder / "shards" / "a.jsonl", range(4), repeats=2, seeds=seeds)
        write_chunk_run(folder / "shards" / "b.jsonl", range(2, 6), repeats=2, seeds=seeds)
        result = await merge(folder)
        assert (result.coverage.expected, result.coverage.landed) == (12, 12), seeds
        assert [len(g.excluded.pass_at_k) for g in result.groups] == [2]  # 2 repeats a task


def test_a_seed_is_never_task_content_and_the_rest_of_extra_body_is() -> None:
    """Any ``extra_body`` seed is left out (whoever added it); its other keys are content."""
    group = (AGENT, None)
    seeded = [{**question_row(1, seed=s), "_ng_rollout_index": 0} for s in (7, 8)]
    plain = {**question_row(1), "_ng_rollout_index": 3}
    assert content_digest(seeded[0], group) == content_digest(seeded[1], group)
    assert content_digest(seeded[0], group) == content_digest(plain, group)
    params = seeded[0]["responses_create_params"]
    other = {**params, "metadata": {"extra_body": json.dumps({"seed": 7, "top_k": 2})}}
    assert content_digest({**plain, "responses_create_params": other}, group) != (
        content_digest(plain, group)
    )
    assert row_content_digest(seeded[0], group) == row_content_digest(plain, group)


async def test_a_copy_of_the_rollouts_file_without_its_plan_counts_once(tmp_path: Path) -> None:
    """A copy of a run's outcome files alone, whole or a part, sorted first, adds no rollout."""
    for seeds in (None, "nemo", "trollout"):
        folder = tmp_path / str(seeds)
        layout = write_chunk_run(
            folder / "shards" / "run.jsonl",
            range(5),
            repeats=2,
            seeds=seeds,
            failed=frozenset({(4, 0), (4, 1)}),
        )
        copy = RunLayout.for_output(folder / "shards" / "a-copy.jsonl")
        shutil.copy(layout.rollouts, copy.rollouts)
        shutil.copy(layout.failures, copy.failures)  # task 4 is known only from failure rows
        lines = layout.rollouts.read_bytes().splitlines(keepends=True)
        (folder / "shards" / "b-part.jsonl").write_bytes(b"".join(lines[1:6:2]))
        result = await merge(folder)
        cov = result.coverage
        assert (cov.expected, cov.landed, cov.failed) == (10, 8, {"agent_run_error": 2}), seeds
        assert result.inputs.duplicates == {str(folder / "shards" / "b-part.jsonl"): 3}, seeds
        assert result.inputs.skipped == (
            (copy.rollouts, layout.rollouts),
            (copy.failures, layout.failures),
        )
        assert sorted(merged_questions(folder)) == sorted([0, 1, 2, 3] * 2)


async def test_a_merged_output_merged_again_counts_each_rollout_once(tmp_path: Path) -> None:
    """A merged folder (no manifest) beside a seeded superset run: as if the runs were merged."""
    for seeds in (None, "nemo", "trollout"):
        folder = tmp_path / str(seeds)
        first = write_chunk_run(folder / "r5" / "out.jsonl", range(4), repeats=2, seeds=seeds)
        write_chunk_run(folder / "shards" / "r6.jsonl", range(5), repeats=2, seeds=seeds)
        options = AggregateOptions()
        await aggregate_shards(
            [first.output], output=folder / "shards" / "m.jsonl", options=options
        )
        result = await merge(folder)
        assert (result.coverage.expected, result.coverage.landed) == (10, 10), seeds
        assert sorted(merged_questions(folder)) == sorted([0, 1, 2, 3, 4] * 2)


async def test_tasks_of_one_shard_with_equal_content_stay_apart(tmp_path: Path) -> None:
    """Two tasks of one run whose rows differ only in a stale stamp are two tasks."""
    layout = RunLayout.for_output(tmp_path / "shards" / "a.jsonl")
    plan, rows = [], []
    for task in range(2):
        ident = Identity(task, 0, agent_name=AGENT)
        plan.append({**question_row(1), "_ng_failure_class": f"stale{task}", **ident.stamps()})
        rows.append(outcome_to_row(Landed(ident, 0, {"reward": 1.0, "question": 1}, 1.0)))
    write_jsonl(layout.materialized_inputs, plan)
    write_jsonl(layout.rollouts, rows)
    result = await merge(tmp_path)
    assert (result.coverage.expected, result.coverage.landed) == (2, 2)


async def test_same_index_in_two_groups_is_two_tasks(tmp_path: Path) -> None:
    """The same question run by two agents is two tasks (the group is part of the identity)."""
    write_chunk_run(tmp_path / "shards" / "a.jsonl", range(2), agent="agent_a")
    write_chunk_run(tmp_path / "shards" / "b.jsonl", range(2), agent="agent_b")
    result = await merge(tmp_path)
    assert [g.coverage.landed for g in result.groups] == [2, 2]


async def union_plan(folder: Path, runs: Sequence[RunLayout]) -> Path:
    """Return the runs' merged plan (``aggregate`` of the runs, its materialized inputs)."""
    once = folder / "once" / "merged.jsonl"
    await aggregate_shards([lay.output for lay in runs], output=once)
    union = folder / "plan.jsonl"
    shutil.copy(RunLayout.for_output(once).materialized_inputs, union)
    return union


async def test_a_copy_without_its_plan_beside_a_merged_plan_is_numbered_by_content(
    tmp_path: Path,
) -> None:
    """A merged plan numbers a later run's tasks anew: a copy of that run's rows is not by it.

    Run 1 asks q1 as its task 0, which the merged plan calls task 1 (task 0 is run 0's q0);
    numbered by the plan's indices, the copy's q1 row landed q0 (2 landed of 1, exit 0).
    """
    shards = tmp_path / "shards"
    first = write_chunk_run(shards / "run0.jsonl", [0], landed=frozenset())
    second = write_chunk_run(shards / "run1.jsonl", [1, 0], landed=frozenset({(1, 0)}))
    plan = await union_plan(tmp_path, [first, second])
    shutil.copy(second.rollouts, shards / "copy-run1.jsonl")
    result = await aggregate_shards(
        resolve_inputs(f"{shards}/*.jsonl"), output=tmp_path / "m" / "m.jsonl", plan=plan
    )
    assert (result.coverage.expected, result.coverage.landed) == (2, 1)
    assert [row["question"] for row in read_jsonl(tmp_path / "m" / "m.jsonl")] == [1]
    assert result.inputs.skipped == ((shards / "copy-run1.jsonl", second.rollouts),)


async def test_a_whole_copy_without_its_plan_beside_a_union_plan_is_read_once(
    tmp_path: Path,
) -> None:
    """Rollouts and failures copied without their plan: skipped, as without a plan given.

    Failure rows carry no content, so a copy's failures read again were tasks of their own: one
    more expected rollout and one more failure (5 expected of 4).
    """
    shards = tmp_path / "shards"
    first = write_chunk_run(shards / "run0.jsonl", [0, 1], failed=frozenset({(0, 0)}))
    second = write_chunk_run(shards / "run1.jsonl", [2, 3], failed=frozenset({(3, 0)}))
    plan = await union_plan(tmp_path, [first, second])
    copy = RunLayout.for_output(shards / "copy-run1.jsonl")
    shutil.copy(second.rollouts, copy.rollouts)
    shutil.copy(second.failures, copy.failures)
    result = await aggregate_shards(
        resolve_inputs(f"{shards}/*.jsonl"), output=tmp_path / "m" / "m.jsonl", plan=plan
    )
    cov = result.coverage
    assert (cov.expected, cov.landed, cov.failed) == (4, 2, {"agent_run_error": 2})
    assert result.inputs.skipped == (
        (copy.rollouts, second.rollouts),
        (copy.failures, second.failures),
    )


async def test_rows_beside_a_union_plan_that_no_planned_shard_landed_are_refused(
    tmp_path: Path,
) -> None:
    """A rollouts file without its plan, of a run no other shard holds: exit 2 naming it.

    Beside a shard with its own plan, the plan given is a union of runs' plans: its indices
    number no one run, so the rows are not counted as the tasks its indices name.
    """
    shards = tmp_path / "shards"
    kept = write_chunk_run(shards / "run0.jsonl", [0, 1], landed=frozenset())
    lost = write_chunk_run(tmp_path / "elsewhere" / "run1.jsonl", [5])
    plan = await union_plan(tmp_path, [kept, lost])
    shutil.copy(lost.rollouts, shards / "run1.jsonl")  # its plan left behind
    with pytest.raises(InputError) as caught:
        await aggregate_shards(
            resolve_inputs(f"{shards}/*.jsonl"), output=tmp_path / "m" / "m.jsonl", plan=plan
        )
    (message,) = caught.value.problems
    assert message.startswith(f"{shards / 'run1.jsonl'}: 1 landed row matches no task of the plan")
    assert "keep each run's <stem>_materialized_inputs.jsonl beside its rollouts file" in message
    assert not (tmp_path / "m" / "m.jsonl").exists()


# --- the property: random chunkings, copies, re-runs and re-merges ------------------------------

Pairs = frozenset[tuple[int, int]]
Run = tuple[list[int], int, Pairs, Pairs, str | None]
COPY_KINDS = ("whole", "rollouts", "outcomes", "part", "part-with-plan")


@st.composite
def run_sets(draw: st.DrawFn) -> tuple[int, list[Run]]:
    """Draw a dataset size and runs over it: chunks, re-runs of overlapping ranges, sample sets.

    Each run is (its questions in order, repeats, the (question, rollout) pairs that landed,
    those whose latest attempt failed, how it seeded: see `write_chunk_run`).
    """
    size = draw(st.integers(1, 12))
    runs = []
    for _ in range(draw(st.integers(1, 5))):
        questions = draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=size, unique=True))
        repeats = draw(st.integers(1, 3))
        pairs = [(q, r) for q in questions for r in range(repeats)]
        landed = draw(st.sets(st.sampled_from(pairs)))
        failed = draw(st.sets(st.sampled_from(pairs))) - landed
        seeds = draw(st.sampled_from([None, "nemo", "trollout"]))
        runs.append((questions, repeats, frozenset(landed), frozenset(failed), seeds))
    return size, runs


copy_plans = st.lists(
    st.tuples(st.integers(0, 6), st.sampled_from(COPY_KINDS), st.integers(0, 40)), max_size=3
)


async def premerge(folder: Path, runs: list[RunLayout], chosen: set[int], keep: bool) -> None:
    """Merge the ``chosen`` runs into ``shards/premerged.jsonl``; drop them unless ``keep``."""
    picked = [runs[i] for i in sorted({c % len(runs) for c in chosen})]
    out = folder / "shards" / "premerged.jsonl"
    await aggregate_shards([r.output for r in picked], output=out, options=AggregateOptions())
    for layout in picked if not keep else ():
        for path in (layout.rollouts, layout.failures, layout.materialized_inputs, layout.manifest):
            path.unlink(missing_ok=True)


def copy_shard(source: RunLayout, target: Path, kind: str, lines: int) -> None:
    """Copy a shard to ``target``: ``whole`` (outcomes and plan), its ``outcomes`` (rollouts
    and failures), the rollouts alone, or a part of them (with the plan or without)."""
    rows = source.rollouts.read_bytes().splitlines(keepends=True)
    part = rows if kind in ("whole", "rollouts", "outcomes") else rows[lines % (len(rows) + 1) :]
    with_plan = kind in ("whole", "part-with-plan")
    with_failures = kind in ("whole", "outcomes") and source.failures.is_file()
    if not part and not with_plan and not with_failures:
        return  # a file of no row with nothing beside it is refused (test_shard_limits)
    copy = RunLayout.for_output(target)
    target.write_bytes(b"".join(part))
    if with_plan:
        shutil.copy(source.materialized_inputs, copy.materialized_inputs)
    if with_failures:
        shutil.copy(source.failures, copy.failures)


def expected_coverage(runs: list[Run]) -> tuple[int, set[tuple[int, int]], int]:
    """Return the distinct planned rollouts, the landed ones, and the failed ones not landed."""
    planned = {(q, r) for qs, k, _, _, _ in runs for q in qs for r in range(k)}
    landed = {pair for _, _, pairs, _, _ in runs for pair in pairs}
    failed = {pair for _, _, _, pairs, _ in runs for pair in pairs} - landed
    return len(planned), landed, len(failed)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    drawn=run_sets(),
    merged=st.sets(st.integers(0, 4), max_size=3),
    keep=st.booleans(),
    copies=copy_plans,
)
async def test_merged_count_is_the_number_of_distinct_rollouts(
    tmp_path_factory: Any,
    drawn: tuple[int, list[Run]],
    merged: set[int],
    keep: bool,
    copies: list[tuple[int, str, int]],
) -> None:
    """Any chunking, seeding, copying, re-running and re-merging: the distinct rollouts count."""
    folder = tmp_path_factory.mktemp("runs")
    _, runs = drawn
    layouts = [
        write_chunk_run(
            folder / "shards" / f"run{i}.jsonl", qs, repeats=k, landed=ok, failed=ko, seeds=seed
        )
        for i, (qs, k, ok, ko, seed) in enumerate(runs)
    ]
    if merged:
        await premerge(folder, layouts, merged, keep)
    found = sorted((folder / "shards").glob("*.jsonl"))
    shards = [RunLayout.for_output(p) for p in found if not is_auxiliary(p)]
    for n, (index, kind, lines) in enumerate(copies):
        source = shards[index % len(shards)]
        prefix = "a" if n % 2 == 0 else "z"  # copies read before and after their source
        copy_shard(source, folder / "shards" / f"{prefix}-copy{n}-{source.stem}.jsonl", kind, lines)
    planned, landed, failed = expected_coverage(runs)
    result = await merge(folder)
    assert result.coverage.expected == planned
    assert result.coverage.landed == len(landed)
    assert sum(result.coverage.failed.values()) == failed
    assert sorted(merged_questions(folder)) == sorted(q for q, _ in landed)
    out = RunLayout.for_output(folder / "merged" / "merged.jsonl")
    assert len(read_jsonl(out.materialized_inputs)) == planned


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    drawn=run_sets(),
    plan_kind=st.sampled_from(["concatenated", "merged"]),
    copies=copy_plans,
)
@example(  # a copy of the second run's rollouts, numbered by the merged plan's task indices
    drawn=(
        3,
        [
            ([0], 1, frozenset(), frozenset(), None),
            ([1, 0, 2], 1, frozenset({(0, 0), (1, 0)}), frozenset(), None),
        ],
    ),
    plan_kind="merged",
    copies=[(1, "rollouts", 0)],
)
@example(  # the same, silent: the copy's q1 row landed q0 (2 landed of 1, exit 0)
    drawn=(
        2,
        [
            ([0], 1, frozenset(), frozenset(), None),
            ([1, 0], 1, frozenset({(1, 0)}), frozenset(), None),
        ],
    ),
    plan_kind="merged",
    copies=[(1, "rollouts", 0)],
)
async def test_a_union_plan_given_keeps_every_rollout(
    tmp_path_factory: Any,
    drawn: tuple[int, list[Run]],
    plan_kind: str,
    copies: list[tuple[int, str, int]],
) -> None:
    """materialized_inputs_jsonl_fpath = the runs' plans concatenated, or merged: nothing lost.

    Rows in = rows out: every distinct landed rollout is in the merged file once, and coverage
    counts every planned one. Each run keeps its materialized inputs (collect writes them);
    copies of rollouts files without them are numbered by content.
    """
    folder = tmp_path_factory.mktemp("runs")
    _, runs = drawn
    layouts = [
        write_chunk_run(
            folder / "shards" / f"run{i}.jsonl", qs, repeats=k, landed=ok, failed=ko, seeds=seed
        )
        for i, (qs, k, ok, ko, seed) in enumerate(runs)
    ]
    union = folder / "plan.jsonl"
    if plan_kind == "concatenated":
        union.write_bytes(b"".join(lay.materialized_inputs.read_bytes() for lay in layouts))
    else:
        union = await union_plan(folder, layouts)
    for n, (index, kind, lines) in enumerate(copies):
        source = layouts[index % len(layouts)]
        copy_shard(source, folder / "shards" / f"copy{n}-{source.stem}.jsonl", kind, lines)
    planned, landed, failed = expected_coverage(runs)
    shards = resolve_inputs(f"{folder}/shards/*.jsonl")
    out = folder / "merged" / "merged.jsonl"
    result = await aggregate_shards(shards, output=out, options=AggregateOptions(), plan=union)
    assert result.coverage.expected == planned
    assert result.coverage.landed == len(landed)
    assert sum(result.coverage.failed.values()) == failed
    assert sorted(merged_questions(folder)) == sorted(q for q, _ in landed)
    assert len(read_jsonl(RunLayout.for_output(out).materialized_inputs)) == planned
