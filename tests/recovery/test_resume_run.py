"""`collect_run` with resume against the in-process fake deployment: the whole path."""

from __future__ import annotations

import io
import json
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import pytest

from builders import HangArrivals, cancel_when, collect_config, write_tasks_input
from builders import read_jsonl as read
from trollout.cli.collect import collect_run
from trollout.errors import RunChangedError, RunFolderError
from trollout.recovery.layout import RunLayout
from trollout.recovery.resume import Resubmit
from trollout.settings import RunConfig
from trollout.testing import AgentSpec, DeploymentSpec, open_fake_deployment

SPEC = DeploymentSpec(agents=(AgentSpec(name="math_agent"),), record_runs=True)


def keys(rows: list[dict[str, Any]]) -> Counter[tuple[int, int]]:
    """Count rows per (task, rollout)."""
    return Counter((r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows)


def make_config(tmp_path: Path, head: str, **kw: Any) -> RunConfig:
    """A run of tmp_path/in.jsonl into tmp_path/run/r.jsonl."""
    kw.setdefault("num_samples_in_parallel", 8)
    return collect_config(tmp_path / "in.jsonl", tmp_path / "run" / "r.jsonl", head, **kw)


def snapshot(layout: RunLayout) -> dict[str, bytes]:
    """Return every file of the run folder's bytes."""
    return {p.name: p.read_bytes() for p in layout.output.parent.iterdir()}


async def test_resume_after_cancel_lands_each_rollout_once(tmp_path: Path) -> None:
    """A cancelled run resumed to the end: every rollout landed exactly once; status is whole."""
    write_tasks_input(tmp_path / "in.jsonl", 60)
    hang = HangArrivals(first=10, count=8)  # 10 land, then all 8 workers hold a hung request
    async with open_fake_deployment(SPEC, fault_fn=hang) as fake:
        config = make_config(tmp_path, fake.head_url, num_repeats=2)
        await cancel_when(
            partial(collect_run, config, live=False), lambda: hang.all_hanging, "8 hung requests"
        )
        layout = RunLayout.for_output(config.output_jsonl_fpath or "")
        first = len(read(layout.rollouts))
        assert first == 10
        result = await collect_run(attrs.evolve(config, resume_from_cache=True), live=False)
        seen = Counter(run.key for run in fake.stats.runs)
    assert result.resumed is not None
    assert result.resumed.to_dispatch == 120 - first
    assert keys(read(layout.rollouts)) == Counter({(t, r): 1 for t in range(60) for r in range(2)})
    assert max(seen.values()) == 1  # no (task, rollout, attempt) was sent twice
    status = json.loads(layout.batch_status.read_text())
    assert (status["expected"], status["completed"], status["finished"]) == (120, 120, True)


async def test_resume_retries_failures_until_the_cap(tmp_path: Path) -> None:
    """A rollout failing on attempts 0 and 1 lands on 2; one always failing stops at the cap."""
    faults = {0: {"kind": "status", "status": 500, "attempts": [0, 1]},
              1: {"kind": "status", "status": 500}}  # fmt: skip
    write_tasks_input(tmp_path / "in.jsonl", 4, faults=faults)
    async with open_fake_deployment(SPEC) as fake:
        config = make_config(tmp_path, fake.head_url, max_attempts=3)
        await collect_run(config, live=False)
        for _ in range(4):
            await collect_run(attrs.evolve(config, resume_from_cache=True), live=False)
        sent = sorted(run.key for run in fake.stats.runs if run.task_index < 2)
    layout = RunLayout.for_output(config.output_jsonl_fpath or "")
    assert sent == [(0, 0, 0), (0, 0, 1), (0, 0, 2), (1, 0, 0), (1, 0, 1), (1, 0, 2)]
    landed = {r["_ng_task_index"]: r.get("_ng_attempt_index", 0) for r in read(layout.rollouts)}
    assert landed == {0: 2, 2: 0, 3: 0}
    failures = [(r["_ng_task_index"], r.get("_ng_attempt_index", 0)) for r in read(layout.failures)]
    # Rows of one session are in completion order, which concurrency leaves open.
    by_session = sorted(failures, key=lambda row: (row[1], row[0]))
    assert by_session == [(0, 0), (1, 0), (0, 1), (1, 1), (1, 2)]
    assert [attempt for _, attempt in failures] == sorted(attempt for _, attempt in failures)
    assert {r["_ng_failure_max_attempts"] for r in read(layout.failures)} == {3}


async def test_resume_changed_plan_is_refused_and_nothing_erased(tmp_path: Path) -> None:
    """Resuming with another num_repeats raises RunChangedError naming it; files untouched."""
    write_tasks_input(tmp_path / "in.jsonl", 5)
    async with open_fake_deployment(SPEC) as fake:
        config = make_config(tmp_path, fake.head_url)
        await collect_run(config, live=False)
        layout = RunLayout.for_output(config.output_jsonl_fpath or "")
        before = snapshot(layout)
        changed = attrs.evolve(config, resume_from_cache=True, num_repeats=2)
        with pytest.raises(RunChangedError, match="num_repeats 1 -> 2"):
            await collect_run(changed, live=False)
        assert snapshot(layout) == before
        unsafe = attrs.evolve(changed, allow_unsafe_resume=True)
        log = io.StringIO()
        result = await collect_run(unsafe, live=False, progress_stream=log)
    assert result.resumed is not None
    assert result.resumed.to_dispatch == 0
    assert (
        "resuming anyway (--allow-unsafe-resume): settings changed: num_repeats" in log.getvalue()
    )


async def test_resume_without_manifest_refuses_and_keeps_outcomes(tmp_path: Path) -> None:
    """Outcomes but no manifest: refused (the folder is not cleared); unsafe adopts it."""
    write_tasks_input(tmp_path / "in.jsonl", 5)
    async with open_fake_deployment(SPEC) as fake:
        config = make_config(tmp_path, fake.head_url)
        await collect_run(config, live=False)
        layout = RunLayout.for_output(config.output_jsonl_fpath or "")
        layout.manifest.unlink()
        before = snapshot(layout)
        with pytest.raises(RunFolderError, match="no manifest"):
            await collect_run(attrs.evolve(config, resume_from_cache=True), live=False)
        assert snapshot(layout) == before
        layout.materialized_inputs.rename(tmp_path / "moved")
        with pytest.raises(RunFolderError, match=r"materialized inputs .* missing"):
            await collect_run(
                attrs.evolve(config, resume_from_cache=True, allow_unsafe_resume=True), live=False
            )
        (tmp_path / "moved").rename(layout.materialized_inputs)
        result = await collect_run(
            attrs.evolve(config, resume_from_cache=True, allow_unsafe_resume=True), live=False
        )
    assert result.resumed is not None
    assert result.resumed.to_dispatch == 0
    assert layout.manifest.exists()  # adopted
    assert len(read(layout.rollouts)) == 5


async def test_resume_of_new_folder_starts_fresh(tmp_path: Path) -> None:
    """--resume on a folder holding no outcome runs the whole plan, clearing leftovers."""
    write_tasks_input(tmp_path / "in.jsonl", 5)
    layout = RunLayout.for_output(tmp_path / "run" / "r.jsonl")
    layout.output.parent.mkdir()
    layout.attempts.write_text('{"attempts": [[0, 0, 7]]}\n')  # a stale ledger, no outcomes
    async with open_fake_deployment(SPEC) as fake:
        config = make_config(tmp_path, fake.head_url, resume_from_cache=True)
        result = await collect_run(config, live=False)
    assert result.resumed is None
    assert [r.get("_ng_attempt_index", 0) for r in read(layout.rollouts)] == [0] * 5
    assert layout.manifest.exists()


async def test_resume_record_omitted_rows_and_new_numbers(tmp_path: Path) -> None:
    """Interrupted attempts get omitted rows; resume sends them again under new numbers."""
    write_tasks_input(tmp_path / "in.jsonl", 20)
    hang = HangArrivals(first=4, count=4)  # 4 land, then the 4 workers hold hung requests
    async with open_fake_deployment(SPEC, fault_fn=hang) as fake:
        config = make_config(
            tmp_path, fake.head_url, record_omitted_rollouts=True, num_samples_in_parallel=4
        )
        await cancel_when(
            partial(collect_run, config, live=False), lambda: hang.all_hanging, "4 hung requests"
        )
        layout = RunLayout.for_output(config.output_jsonl_fpath or "")
        omitted = [r for r in read(layout.failures) if r.get("_ng_omitted_rollout")]
        assert len(omitted) == 4
        await collect_run(attrs.evolve(config, resume_from_cache=True), live=False)
    again = {(r["_ng_task_index"], r.get("_ng_attempt_index", 0)) for r in read(layout.rollouts)}
    for row in omitted:
        assert (row["_ng_task_index"], 1) in again
    assert len(read(layout.rollouts)) == 20


async def test_resubmit_sends_terminal_failures_again(tmp_path: Path) -> None:
    """A terminal failure is done for resume, but resubmit sends it once more."""
    faults = {1: {"kind": "failure_class", "failure_class": "skipped", "terminal": True,
                  "attempts": [0]}}  # fmt: skip
    write_tasks_input(tmp_path / "in.jsonl", 3, faults=faults)
    async with open_fake_deployment(SPEC) as fake:
        config = make_config(tmp_path, fake.head_url)
        await collect_run(config, live=False)
        resumed = await collect_run(attrs.evolve(config, resume_from_cache=True), live=False)
        assert resumed.resumed is not None
        assert resumed.resumed.to_dispatch == 0
        again = await collect_run(config, live=False, resubmit=Resubmit())
    assert again.resumed is not None
    assert again.resumed.to_dispatch == 1
    layout = RunLayout.for_output(config.output_jsonl_fpath or "")
    assert sorted(keys(read(layout.rollouts))) == [(0, 0), (1, 0), (2, 0)]


async def test_resume_manifest_is_on_disk_before_the_first_dispatch(tmp_path: Path) -> None:
    """When the first /run arrives, the manifest and materialized inputs already exist."""
    write_tasks_input(tmp_path / "in.jsonl", 3)
    layout = RunLayout.for_output(tmp_path / "run" / "r.jsonl")
    seen: list[tuple[bool, bool, int]] = []

    def check(context: Any) -> None:
        inputs = layout.materialized_inputs
        lines = len(inputs.read_bytes().splitlines()) if inputs.exists() else 0
        seen.append((layout.manifest.exists(), inputs.exists(), lines))

    async with open_fake_deployment(SPEC, fault_fn=check) as fake:
        await collect_run(make_config(tmp_path, fake.head_url), live=False)
    assert seen == [(True, True, 3)] * 3
