"""The run layer as a library (`trollout.run`): collect, resume after a cut, status, resubmit.

Every test drives the fake deployment over loopback through `trollout.run` alone, as a Ray
block, a front end or an embedding driver does: no command line, no click, no rich. What the
run shows goes to a `Recorder` observer, so the tests also hold the observer contract (lines
through `message`, progress through one `watch` given a view of the engine's counters).
"""

from __future__ import annotations

from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import trio

from builders import HangArrivals, cancel_when, collect_config, write_tasks_input
from builders import read_jsonl as read
from trollout import run
from trollout.testing import AgentSpec, DeploymentSpec, Fault, open_fake_deployment
from trollout.testing.faults import FaultContext

SPEC = DeploymentSpec(agents=(AgentSpec(name="math_agent"),), record_runs=True)


class Recorder:
    """A `run.RunObserver` that keeps what it was shown."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.totals: list[int] = []
        self.last: run.Snapshot | None = None

    def message(self, text: str) -> None:
        self.lines.append(text)

    async def watch(self, view: run.RunView) -> None:
        self.totals.append(view.total)
        try:
            await trio.sleep_forever()
        finally:
            self.last = view.snapshot()


def keys(rows: list[dict[str, Any]]) -> Counter[tuple[int, int]]:
    """Count rows per (task, rollout)."""
    return Counter((r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows)


async def test_collect_runs_the_whole_composition_and_reports_to_its_observer(
    tmp_path: Path,
) -> None:
    """`run.collect` plans, writes the folder, runs the engine and aggregates; the observer's
    watch sees the session's total and, at the end, every rollout settled."""
    source = write_tasks_input(tmp_path / "in.jsonl", 12)
    recorder = Recorder()
    async with open_fake_deployment(SPEC) as fake:
        config = collect_config(source, tmp_path / "run" / "r.jsonl", fake.head_url, num_repeats=2)
        result = await run.collect(config, observer=recorder)
    assert result.progress.landed == result.expected == 24
    assert keys(read(result.layout.rollouts)) == Counter(
        {(t, r): 1 for t in range(12) for r in range(2)}
    )
    assert result.aggregate is not None
    assert result.layout.aggregate_metrics.exists()
    assert recorder.totals == [24]
    assert recorder.last is not None
    assert recorder.last.progress.settled == 24
    assert result.signal is None
    assert not result.deadline_reached


async def test_resume_after_a_cut_lands_the_rest_with_the_saved_settings(tmp_path: Path) -> None:
    """A run cut mid-way (cancelled) is resumed by its output path alone (`run.resume` reads the
    saved settings); `run.status` says what is left before, and complete after."""
    write_tasks_input(tmp_path / "in.jsonl", 30)
    out = tmp_path / "run" / "r.jsonl"
    hang = HangArrivals(first=10, count=4)  # 10 land, then all 4 workers hold a hung request
    async with open_fake_deployment(SPEC, fault_fn=hang) as fake:
        config = collect_config(
            tmp_path / "in.jsonl", out, fake.head_url, num_samples_in_parallel=4
        )
        observer = Recorder()
        cut = partial(run.collect, config, observer=observer)
        await cancel_when(cut, lambda: hang.all_hanging, "4 hung requests")
        before = run.status(out)
        result = await run.resume(out, observer=Recorder())
        seen = Counter(r.key for r in fake.stats.runs)
    assert (before.complete, before.to_dispatch, before.retryable_remains) == (False, 20, True)
    assert before.document["landed"] == 10
    assert not before.sharded
    assert result.resumed is not None
    assert result.resumed.to_dispatch == 20
    assert keys(read(result.layout.rollouts)) == Counter({(t, 0): 1 for t in range(30)})
    assert max(seen.values()) == 1  # no (task, rollout, attempt) was sent twice
    after = run.status(out)
    assert after.complete
    assert after.to_dispatch == 0
    assert after.document["landed"] == 30


async def test_status_reads_a_run_folder_without_a_server(tmp_path: Path) -> None:
    """`run.status` takes the output file, the manifest or the folder, read-only."""
    source = write_tasks_input(tmp_path / "in.jsonl", 5)
    out = tmp_path / "run" / "r.jsonl"
    async with open_fake_deployment(SPEC) as fake:
        await run.collect(collect_config(source, out, fake.head_url), observer=Recorder())
    files = {p.name: p.read_bytes() for p in out.parent.iterdir()}
    for where in (out, out.parent, run.status(out).layout.manifest):
        status = run.status(where)
        assert status.complete
        assert status.document["expected"] == 5
        assert status.document["collector_pid"] is None  # nobody holds the lock
    assert {p.name: p.read_bytes() for p in out.parent.iterdir()} == files


async def test_resubmit_sends_terminal_failures_again_and_resume_does_not(tmp_path: Path) -> None:
    """Terminal failures are done for `run.resume` and sent once more by `run.resubmit`, which
    may be limited to some failure classes."""
    source = write_tasks_input(tmp_path / "in.jsonl", 6)
    out = tmp_path / "run" / "r.jsonl"

    def first_tries_fail(context: FaultContext) -> Fault | None:
        if context.attempt_index == 0 and context.task_index in (1, 4):
            cls = "skipped" if context.task_index == 1 else "judge_broken"
            return Fault(kind="failure_class", failure_class=cls, terminal=True)
        return None

    async with open_fake_deployment(SPEC, fault_fn=first_tries_fail) as fake:
        config = collect_config(source, out, fake.head_url)
        await run.collect(config, observer=Recorder())
        resumed = await run.resume(out, observer=Recorder())
        only = await run.resubmit(out, classes=["skipped"], observer=Recorder())
        rest = await run.resubmit(out, observer=Recorder())
    assert resumed.resumed is not None
    assert resumed.resumed.to_dispatch == 0
    assert only.progress.landed == 1
    assert rest.progress.landed == 1
    landed = {r["_ng_task_index"]: r.get("_ng_attempt_index", 0) for r in read(out)}
    assert landed == {0: 0, 1: 1, 2: 0, 3: 0, 4: 1, 5: 0}
    assert run.status(out).complete


async def test_resume_takes_settings_given_now_and_warns_through_the_observer(
    tmp_path: Path,
) -> None:
    """Settings given to `run.resume` lie over the saved ones; a change of the plan is refused
    unless allowed, and the warning that it was allowed reaches the observer, not stderr."""
    source = write_tasks_input(tmp_path / "in.jsonl", 4)
    out = tmp_path / "run" / "r.jsonl"
    recorder = Recorder()
    async with open_fake_deployment(SPEC) as fake:
        config = collect_config(source, out, fake.head_url)
        await run.collect(attrs.evolve(config, disable_aggregation=True), observer=Recorder())
        settings = {"num_repeats": 2, "allow_unsafe_resume": True}
        result = await run.resume(out, settings=settings, observer=recorder)
    assert result.resumed is not None
    assert result.resumed.to_dispatch == 0
    assert any(
        line.startswith("trollout: warning: resuming anyway (--allow-unsafe-resume)")
        for line in recorder.lines
    ), recorder.lines
