"""Temp files a killed writer leaves are removed by the next run, found by its lock's record.

The property (`recovery.lock`'s module docstring): whatever a writer was doing when it was
SIGKILLed, the next run started on the folder leaves none of its temp files behind; and a fresh
start after a clean close does not list the folder (a shards folder of thousands of steps), so
a temp-named file nobody died writing is not its business.
"""

from __future__ import annotations

import selectors
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from trollout.metrics.shards import refresh_shard_status
from trollout.records import MaterializedRow
from trollout.recovery.files import temp_files
from trollout.recovery.layout import RunLayout
from trollout.recovery.lock import RunLock
from trollout.recovery.store import open_run_store
from trollout.settings import RunConfig

# A writer killed mid-way through each kind of temp file a run writes: the materialized inputs
# (an endless stream, so it is surely in the middle), or the status replaced by its store (its
# save blocked in the worker thread until the kill).
WRITER = """
import sys, threading, time
import trio
from trollout.records import MaterializedRow
from trollout.recovery import files, status
from trollout.recovery.layout import RunLayout
from trollout.recovery.store import open_run_store
from trollout.settings import RunConfig

layout, what = RunLayout.for_output(sys.argv[1]), sys.argv[2]

def endless():
    for i in range(10**9):
        if i == 100:
            print("writing", flush=True)
        yield MaterializedRow.from_body({"_ng_task_index": i, "_ng_rollout_index": 0})

real_commit = files.AtomicFile.commit
def stuck_commit(self, *args, **kwargs):
    if self.path == layout.batch_status:
        print("writing", flush=True)
        time.sleep(60)
    return real_commit(self, *args, **kwargs)

async def main():
    async with open_run_store(layout, RunConfig(overwrite=True), expected=1) as store:
        if what == "inputs":
            await store.write_materialized_inputs(endless())
        else:
            files.AtomicFile.commit = stuck_commit
            row = MaterializedRow.from_body({"_ng_task_index": 0, "_ng_rollout_index": 0})
            await store.write_materialized_inputs([row])

trio.run(main)
"""


# An aggregation of a run, killed while it replaces the run's metrics file.
AGGREGATION = """
import sys, time, trio
from trollout.recovery import files
from trollout.recovery.layout import RunLayout
from trollout.metrics.aggregate import aggregate_run

def stuck_commit(self, *args, **kwargs):
    print("writing", flush=True)
    time.sleep(60)

files.AtomicFile.commit = stuck_commit
trio.run(aggregate_run, RunLayout.for_output(sys.argv[1]))
"""


@pytest.fixture
def layout(tmp_path: Path) -> RunLayout:
    return RunLayout.for_output(tmp_path / "shards" / "rollouts-step-0001.jsonl")


def kill_while_writing(layout: RunLayout, what: str, script: str = WRITER) -> None:
    """Run a writer of ``what`` and SIGKILL it once it is writing its temp file."""
    with subprocess.Popen(
        [sys.executable, "-c", script, str(layout.output), what], stdout=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None
            with selectors.DefaultSelector() as ready:  # a child that never says so fails
                ready.register(proc.stdout, selectors.EVENT_READ)
                assert ready.select(timeout=120), "the writer never started writing"
            assert proc.stdout.readline() == "writing\n"
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)


def start_fresh(layout: RunLayout) -> None:
    """Start a new run over the folder (overwrite) and close it."""
    row = MaterializedRow.from_body({"_ng_task_index": 0, "_ng_rollout_index": 0})

    async def main() -> None:
        async with open_run_store(layout, RunConfig(overwrite=True), expected=1) as store:
            await store.write_materialized_inputs([row])

    trio.run(main)


def stray_temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


@pytest.fixture(params=["inputs", "status"])
def killed(request: pytest.FixtureRequest, layout: RunLayout) -> RunLayout:
    layout.output.parent.mkdir(parents=True)
    kill_while_writing(layout, request.param)
    assert temp_files(layout), "the kill left no temp file: the test would prove nothing"
    return layout


def test_a_fresh_start_removes_the_temp_files_of_a_killed_writer(killed: RunLayout) -> None:
    """The killed writer's lock record sends the next fresh start to list the folder."""
    start_fresh(killed)
    assert stray_temps(killed.output.parent) == []
    assert killed.lock.read_bytes() == b""  # cleaned up: the report is cleared at release


def test_the_crash_report_outlives_a_holder_that_does_not_clean_up(killed: RunLayout) -> None:
    """Aggregation marks a shard's status under its lock but removes no temp file: the dead
    writer's record is put back, and the next run still cleans up."""
    if not killed.batch_status.exists():
        killed.batch_status.write_text("{}\n")  # a status to mark (the inputs kill has none)
    report = killed.lock.read_bytes()
    assert report, "a killed writer leaves its record"
    assert refresh_shard_status([killed], killed.output.parent / "m.json", []) == []
    assert killed.lock.read_bytes() == report
    start_fresh(killed)
    assert stray_temps(killed.output.parent) == []


def test_a_fresh_start_after_a_clean_close_does_not_list_the_folder(layout: RunLayout) -> None:
    """Nobody died writing here, so a temp-named file is someone else's: it stays."""
    start_fresh(layout)  # a clean run: its lock record emptied at release
    assert layout.lock.read_bytes() == b""
    stranger = layout.output.parent / f".{layout.manifest.name}.0123abcd.tmp"
    stranger.write_text("not ours to remove")
    start_fresh(layout)
    assert stranger.read_text() == "not ours to remove"


def test_a_killed_aggregation_leaves_no_temp_file_to_the_next_run(layout: RunLayout) -> None:
    """Aggregation writes into the run folder under its lock (when free), so a kill leaves
    the record that sends the next run to clean up."""
    start_fresh(layout)
    kill_while_writing(layout, "", AGGREGATION)
    assert temp_files(layout), "the kill left no temp file: the test would prove nothing"
    start_fresh(layout)
    assert stray_temps(layout.output.parent) == []


def test_lock_reports_the_record_a_dead_holder_left(layout: RunLayout) -> None:
    """inherited: the record found when the lock was taken; crash_handled clears it."""
    layout.output.parent.mkdir(parents=True)
    with RunLock.for_layout(layout) as lock:
        assert not lock.inherited  # a new lock file
    with RunLock.for_layout(layout) as lock:
        assert not lock.inherited  # released cleanly
    dead = b'{"pid": 1, "host": "gone", "started_at": 0.0, "token": "dead"}\n'
    layout.lock.write_bytes(dead)
    with RunLock.for_layout(layout) as lock:
        assert lock.inherited
    assert layout.lock.read_bytes() == dead  # not cleaned up: still reported
    with RunLock.for_layout(layout) as lock:
        assert lock.inherited
        lock.crash_handled()
    assert layout.lock.read_bytes() == b""
