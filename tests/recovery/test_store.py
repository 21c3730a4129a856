"""Tests of the run folder store: routing, stamps, fresh/resume, status, fsync, shielded close."""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import orjson
import pytest
import trio
import trio.testing

import builders
from builders import identity
from trollout.collector.deployment.discovery import Deployment
from trollout.errors import RunFolderError, RunFolderLockedError, RunFolderWriteError
from trollout.records import (
    BatchStatus,
    Delivery,
    Identity,
    Landed,
    MaterializedRow,
    Outcome,
    RolloutState,
    converter,
    outcome_from_row,
)
from trollout.recovery import status as status_mod
from trollout.recovery import store as store_mod
from trollout.recovery.files import replace_atomically
from trollout.recovery.layout import RunLayout
from trollout.recovery.lock import RunLock
from trollout.recovery.run_folder import MaterializedRows, open_run_folder
from trollout.recovery.store import open_run_store
from trollout.settings import FsyncPolicy, RunConfig

REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference" / "nemo_gym_0.7.0"
STATUS_ROLLOUT_KEYS = {
    "task_index",
    "rollout_index",
    "attempt_index",
    "state",
    "agent_name",
    "failure_class",
    "kind",
    "terminal",
}


# --- builders ---------------------------------------------------------------------------------


RESULT = {"responses_create_params": {"input": "2+2"}, "response": {"id": "r"}, "reward": 1.0}
ident = partial(identity, agent="math_agent")
landed = partial(builders.landed, result=RESULT, elapsed_seconds=0.25, agent="math_agent")
failed = partial(
    builders.failed, agent="math_agent", kind="http_500", http_status=500, max_attempts=3
)
omitted = partial(builders.omitted, agent="math_agent")


def read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def read_status(layout: RunLayout) -> BatchStatus:
    return converter.structure(orjson.loads(layout.batch_status.read_bytes()), BatchStatus)


async def store_with(layout: RunLayout, outcomes: list[Outcome], **config: Any) -> None:
    async with open_run_store(layout, RunConfig(**config), expected=10) as store:
        await store.write(outcomes)


@pytest.fixture
def layout(tmp_path: Path) -> RunLayout:
    return RunLayout.for_output(tmp_path / "runs" / "out.jsonl")


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the path of every file or folder fsynced."""
    calls: list[str] = []
    real = os.fsync

    def recording(fd: int) -> None:
        calls.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", recording)
    return calls


@pytest.fixture
def jobs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the name of every function the store hands to a worker thread (one job each)."""
    names: list[str] = []
    real = trio.to_thread.run_sync

    async def counting(fn: Callable[..., Any], *args: Any, **options: Any) -> Any:
        names.append(fn.__name__)
        return await real(fn, *args, **options)

    monkeypatch.setattr(trio.to_thread, "run_sync", counting)
    return names


@pytest.fixture
def inline_io(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the store's file work on the loop thread, so the fake clock stays exact."""

    async def inline(fn: Callable[..., Any], *args: Any) -> Any:
        await trio.lowlevel.checkpoint()
        return fn(*args)

    monkeypatch.setattr(store_mod, "_off_loop", inline)


# --- routing and stamps -----------------------------------------------------------------------


async def test_store_routes_each_outcome_to_its_file(layout: RunLayout) -> None:
    """Landed goes to the rollouts file, failures to the sidecar, no_persist and omitted nowhere."""
    batch: list[Outcome] = [
        landed(0),
        failed(1),
        failed(2, failure_class="kill_shaped", no_persist=True),
        omitted(3),
        omitted(4, drained=True),
    ]
    await store_with(layout, batch)
    assert [(r["_ng_task_index"], r["reward"]) for r in read_rows(layout.rollouts)] == [(0, 1.0)]
    sidecar = read_rows(layout.failures)
    assert [r["_ng_task_index"] for r in sidecar] == [1]
    assert sidecar[0]["_ng_failure_class"] == "agent_run_error"
    assert sidecar[0]["_ng_failure_max_attempts"] == 3


async def test_store_records_omitted_rows_when_asked(layout: RunLayout) -> None:
    """With record_omitted_rollouts, omitted attempts become _ng_omitted_rollout sidecar rows."""
    batch: list[Outcome] = [omitted(3, attempt=1), omitted(4, drained=True), failed(5)]
    await store_with(layout, batch, record_omitted_rollouts=True)
    sidecar = read_rows(layout.failures)
    assert [(r["_ng_task_index"], r.get("_ng_omitted_rollout")) for r in sidecar] == [
        (3, True),
        (4, True),
        (5, None),
    ]
    assert sidecar[0]["_ng_attempt_index"] == 1
    assert sidecar[1]["_ng_dispatch_drained"] is True
    assert read_rows(layout.rollouts) == []


async def test_store_landed_row_stamps(layout: RunLayout) -> None:
    """A landed row is the reply plus identity stamps, attempt and elapsed time."""
    outcome = Landed(
        Identity(7, 3, "math_agent", "env_a", "legacy_agent", "my-id", "math"),
        2,
        {"response": {}, "reward": 0.5, "agent_ref": {"name": "echoed", "type": "x"}},
        elapsed_seconds=1.5,
    )
    await store_with(layout, [outcome])
    [row] = read_rows(layout.rollouts)
    assert row == {
        "response": {},
        "reward": 0.5,
        "agent_ref": {"name": "math_agent"},
        "_ng_task_index": 7,
        "_ng_rollout_index": 3,
        "_ng_attempt_index": 2,
        "_ng_rollout_id": "my-id",
        "_ng_environment_server": "env_a",
        "_ng_result_type": "legacy_agent",
        "task_source": "math",
        "elapsed_seconds": 1.5,
    }


@pytest.mark.skipif(not REFERENCE.is_dir(), reason="NeMo Gym reference files not present")
async def test_store_rows_have_reference_keys(layout: RunLayout) -> None:
    """Rows rebuilt from NeMo Gym 0.7.0 replies carry the reference rows' keys (plus ours)."""
    ref_landed = read_rows(REFERENCE / "rollouts.jsonl")
    ref_failed = read_rows(REFERENCE / "rollouts_failures.jsonl")
    outcomes: list[Outcome] = []
    for row in ref_landed:
        got = outcome_from_row(row)
        assert isinstance(got, Landed)
        outcomes.append(Landed(got.identity, 0, got.result, elapsed_seconds=2.0))
    outcomes.extend(outcome_from_row(row) for row in ref_failed)
    await store_with(layout, outcomes)
    for ours, ref in zip(read_rows(layout.rollouts), ref_landed, strict=True):
        assert set(ours) == set(ref) | {"elapsed_seconds"}
        assert {k: ours[k] for k in ref} == ref
    extra = {
        "_ng_failure_terminal",
        "_ng_failure_max_attempts",
        "_ng_failure_delivery",
        "failure_kind",
    }
    for ours, ref in zip(read_rows(layout.failures), ref_failed, strict=True):
        assert set(ref) <= set(ours) <= set(ref) | extra
        assert {k: ours[k] for k in ref} == ref


# --- fresh runs and resume --------------------------------------------------------------------


def stale_run(layout: RunLayout) -> dict[Path, bytes]:
    """Fill the folder with an old run's files, a leftover temp file and a stranger's file,
    and the lock record of the writer that died leaving them (`RunLock.inherited`)."""
    layout.output.parent.mkdir(parents=True, exist_ok=True)
    for path in layout.all_files():
        path.write_text('{"stale": true}\n')
    layout.lock.write_text('{"pid": 1, "host": "gone", "started_at": 0.0, "token": "dead"}\n')
    (layout.output.parent / f".{layout.batch_status.name}.deadbeef.tmp").write_text("{")
    (layout.output.parent / f".{layout.batch_status.name}.mine.tmp").write_text("mine")
    (layout.output.parent / "other.jsonl").write_text("{}\n")
    return folder_bytes(layout.output.parent)


def folder_bytes(folder: Path) -> dict[Path, bytes]:
    """Every file of a folder (links as their target text), for byte-for-byte comparisons."""
    return {
        p: (os.readlink(p).encode() if p.is_symlink() else p.read_bytes())
        for p in sorted(folder.iterdir())
        if p.is_symlink() or p.is_file()
    }


def without_lock(layout: RunLayout, files: dict[Path, bytes] | None = None) -> dict[Path, bytes]:
    """The folder's files (or ``files``) but the lock (whose owner record a store writes while
    it runs)."""
    files = folder_bytes(layout.output.parent) if files is None else files
    return {p: b for p, b in files.items() if p != layout.lock}


async def test_store_fresh_run_over_a_run_is_refused_untouched(layout: RunLayout) -> None:
    """Without overwrite, a fresh store refuses a folder holding a run and changes nothing."""
    before = stale_run(layout)
    with pytest.raises(RunFolderError, match=r"already holds a run.*--resume.*--overwrite"):
        async with open_run_store(layout, RunConfig(), expected=2):
            pass  # pragma: no cover
    assert folder_bytes(layout.output.parent) == before


async def test_store_overwrite_clears_old_files_only_once_the_new_inputs_are_written(
    layout: RunLayout,
) -> None:
    """With overwrite, the old run stays whole until the new inputs are on disk, then goes."""
    before = stale_run(layout)
    leftover = layout.output.parent / f".{layout.batch_status.name}.deadbeef.tmp"
    rows = [MaterializedRow.from_body({"_ng_task_index": 0, "_ng_rollout_index": 0, "q": 1})]
    async with open_run_store(layout, RunConfig(overwrite=True), expected=1) as store:
        assert without_lock(layout) == without_lock(layout, before)
        with pytest.raises(RunFolderError, match="has not started"):
            await store.write([landed(0)])
        assert await store.write_materialized_inputs(rows) == 1
        assert layout.rollouts.read_bytes() == b""
        assert not layout.failures.exists()
        assert not layout.manifest.exists()
        assert not leftover.exists()
        assert [r["q"] for r in read_rows(layout.materialized_inputs)] == [1]
        assert not layout.batch_status.exists()  # the old run's; the new one's comes later
        await store.write([landed(0)])
    assert attrs.evolve(read_status(layout), updated_at=0.0) == attrs.evolve(
        store.snapshot(finished=True), updated_at=0.0
    )
    assert (layout.output.parent / "other.jsonl").read_text() == "{}\n"
    assert (layout.output.parent / f".{layout.batch_status.name}.mine.tmp").read_text() == "mine"


async def test_store_overwrite_interrupted_while_writing_inputs_keeps_the_old_run(
    layout: RunLayout,
) -> None:
    """A cancelled materialization removes its temp file and leaves the old run as it was."""
    before = stale_run(layout)
    started = threading.Event()

    def endless() -> Iterator[MaterializedRow]:
        for i in range(10**9):
            started.set()
            yield MaterializedRow.from_body({"_ng_task_index": i, "_ng_rollout_index": 0})

    async with open_run_store(layout, RunConfig(overwrite=True), expected=1) as store:
        with trio.move_on_after(30) as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(store.write_materialized_inputs, endless())
                await trio.to_thread.run_sync(started.wait)
                nursery.cancel_scope.cancel()
        assert not scope.cancelled_caught  # stopped by our cancel, not by the hang guard
    assert without_lock(layout) == without_lock(layout, before)


async def test_store_new_run_interrupted_while_writing_inputs_leaves_no_run(
    layout: RunLayout,
) -> None:
    """A fresh run in a new folder starts only with its inputs: cancelled before, no run shows.

    No rollouts file and no status (which would say ``finished`` with nothing done and make
    `trollout status` report missing inputs); only the lock file, which is never unlinked.
    """
    started = threading.Event()

    def endless() -> Iterator[MaterializedRow]:
        for i in range(10**9):
            started.set()
            yield MaterializedRow.from_body({"_ng_task_index": i, "_ng_rollout_index": 0})

    async with open_run_store(layout, RunConfig(), expected=80_000) as store:
        with trio.move_on_after(30) as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(store.write_materialized_inputs, endless())
                await trio.to_thread.run_sync(started.wait)
                nursery.cancel_scope.cancel()
        assert not scope.cancelled_caught  # stopped by our cancel, not by the hang guard
    assert sorted(p.name for p in layout.output.parent.iterdir()) == [layout.lock.name]


async def test_store_new_run_without_inputs_starts_with_its_first_outcome(
    layout: RunLayout,
) -> None:
    """A driver recording outcomes without inputs: the run starts at its first write."""
    async with open_run_store(layout, RunConfig(), expected=2) as store:
        assert sorted(p.name for p in layout.output.parent.iterdir()) == [layout.lock.name]
        await store.write([landed(0)])
    assert [r["_ng_task_index"] for r in read_rows(layout.rollouts)] == [0]
    assert read_status(layout).completed == 1
    assert read_status(layout).expected == 2


async def test_store_resume_keeps_files_and_repairs_tails_once_seeded(layout: RunLayout) -> None:
    """A non-fresh open changes nothing; seed keeps rows, drops a torn tail, ends a line."""
    layout.output.parent.mkdir(parents=True)
    layout.rollouts.write_bytes(b'{"_ng_task_index": 0}\n{"_ng_task_ind')
    layout.failures.write_bytes(b'{"_ng_task_index": 1}')
    before = folder_bytes(layout.output.parent)
    async with open_run_store(layout, RunConfig(), expected=3, fresh=False) as store:
        assert without_lock(layout) == without_lock(layout, before)
        store.seed(expected=4, landed=set(), statuses=[])
        await store.write([landed(2), failed(3)])
    assert [r["_ng_task_index"] for r in read_rows(layout.rollouts)] == [0, 2]
    assert [r["_ng_task_index"] for r in read_rows(layout.failures)] == [1, 3]


# --- duplicates and status --------------------------------------------------------------------


async def test_store_refuses_duplicate_landed(
    layout: RunLayout, caplog: pytest.LogCaptureFixture
) -> None:
    """A second Landed for a landed rollout is counted and logged, never written or raised."""
    caplog.set_level(logging.WARNING, logger="trollout.recovery.store")
    async with open_run_store(layout, RunConfig(), expected=2) as store:
        await store.write([landed(0), landed(0, attempt=1), landed(1)])
        await store.write([landed(0, attempt=2), failed(0, attempt=3)])
        counts = store.counts
    assert [r["_ng_task_index"] for r in read_rows(layout.rollouts)] == [0, 1]
    assert counts.landed == 2
    assert counts.duplicates_refused == 2
    assert counts.failed == 0  # a failure after landing does not unland the rollout
    assert [r["_ng_attempt_index"] for r in read_rows(layout.failures)] == [3]
    assert "task 0 rollout 0 (attempt 1)" in caplog.text


async def test_store_status_counts_match_files(layout: RunLayout) -> None:
    """The final status counts agree with the rows in the files, per rollout's latest state."""
    batches: list[list[Outcome]] = [
        [landed(0), failed(1), failed(2), failed(3, failure_class="kill_shaped", no_persist=True)],
        [landed(1, attempt=1), failed(2, attempt=1, failure_class="transient", terminal=True)],
        [omitted(4), failed(5, kind="connect", delivery=Delivery.NOT_SENT), landed(6)],
    ]
    async with open_run_store(layout, RunConfig(), expected=9) as store:
        for batch in batches:
            await store.write(batch)
    status = read_status(layout)
    rows = read_rows(layout.rollouts)
    sidecar_keys = {
        (r["_ng_task_index"], r["_ng_rollout_index"]) for r in read_rows(layout.failures)
    }
    landed_keys = {(r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows}
    assert status.closed is True
    assert status.finished is False  # tasks 7 and 8 never started
    assert status.expected == 9
    assert status.completed == len(rows) == 3
    assert status.failed == len(sidecar_keys - landed_keys) == 2
    assert (status.no_persist, status.omitted, status.not_started) == (1, 1, 2)
    assert status.failures_by_class == {"agent_run_error": 1, "transient": 1}
    by_task = {s.task_index: s for s in status.rollouts}
    assert sorted(by_task) == [2, 3, 4, 5]
    assert (by_task[2].attempt_index, by_task[2].terminal) == (1, True)
    assert by_task[3].state is RolloutState.NO_PERSIST
    assert (by_task[4].state, by_task[4].kind) == (RolloutState.OMITTED, "interrupted")
    raw = orjson.loads(layout.batch_status.read_bytes())
    assert all(set(r) == STATUS_ROLLOUT_KEYS for r in raw["rollouts"])  # never payloads


async def test_store_never_started_attempt_keeps_earlier_state(layout: RunLayout) -> None:
    """A drained or not-sent attempt does not replace the rollout's earlier state."""
    batch: list[Outcome] = [
        failed(0),
        omitted(0, attempt=1, drained=True),
        failed(1),
        failed(1, attempt=1, failure_class="transient", delivery=Delivery.NOT_SENT),
        failed(2),
        omitted(2, attempt=1),
        omitted(3, drained=True),
    ]
    async with open_run_store(layout, RunConfig(), expected=4) as store:
        await store.write(batch)
        states = {s.task_index: (s.state, s.attempt_index) for s in store.snapshot().rollouts}
    assert states == {
        0: (RolloutState.FAILED, 0),
        1: (RolloutState.FAILED, 0),
        2: (RolloutState.OMITTED, 1),  # an interrupted attempt did run: it stands
        3: (RolloutState.OMITTED, 0),
    }


async def test_store_status_interval_on_fake_clock(
    layout: RunLayout,
    autojump_clock: trio.testing.MockClock,
    inline_io: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The status is saved status_interval_s after the run starts, at most every
    status_interval_s after that, and at close (a run shorter than the interval, a training
    step's shard, saves it once).

    A fresh run in a new folder, fed no inputs, starts at its first outcome (0.5 s).
    """
    saved: list[tuple[float, int, bool]] = []
    real = status_mod.write_status_file

    def recording(path: Path, status: BatchStatus, **options: Any) -> None:
        saved.append((trio.current_time(), status.completed, status.closed))
        real(path, status, **options)

    monkeypatch.setattr(status_mod, "write_status_file", recording)
    config = RunConfig(status_interval_s=2.0)
    async with open_run_store(layout, config, expected=5) as store, trio.open_nursery() as nursery:
        await nursery.start(store.run_housekeeping)
        for at, task in [(0.5, 0), (1.0, 1), (3.0, 2), (9.0, 3)]:
            await trio.sleep_until(at)
            await store.write([landed(task)])
        await trio.sleep_until(12.0)
        nursery.cancel_scope.cancel()
    assert saved == [
        (2.5, 2, False),
        (4.5, 3, False),
        (9.0, 4, False),  # quiet for longer than the interval: saved at once
        (12.0, 4, True),
    ]


async def test_store_first_status_of_a_quiet_run_comes_one_interval_after_its_start(
    layout: RunLayout, autojump_clock: trio.testing.MockClock, inline_io: None
) -> None:
    """A run whose first outcome is long in coming still shows a status (nothing settled yet)
    status_interval_s after it started; not before: a shorter run saves its status once."""
    row = MaterializedRow.from_body({"_ng_task_index": 0, "_ng_rollout_index": 0})
    config = RunConfig(status_interval_s=2.0)
    async with open_run_store(layout, config, expected=1) as store, trio.open_nursery() as nursery:
        await nursery.start(store.run_housekeeping)
        await store.write_materialized_inputs([row])
        await trio.sleep(1.9)
        assert not layout.batch_status.exists()
        await trio.sleep(0.2)
        status = read_status(layout)
        assert (status.completed, status.not_started, status.closed) == (0, 1, False)
        nursery.cancel_scope.cancel()
    assert read_status(layout).closed


# --- atomic replace ---------------------------------------------------------------------------


def test_replace_atomically_never_shows_a_partial_file(tmp_path: Path) -> None:
    """Concurrent readers always parse the status file, and no temp file is left behind."""
    path = tmp_path / "out_batch_status.json"
    replace_atomically(path, [b"{}"])
    stop = threading.Event()
    bad: list[bytes] = []
    reads: list[int] = []

    def reader() -> None:
        while not stop.is_set():
            data = path.read_bytes()
            try:
                orjson.loads(data)
            except orjson.JSONDecodeError:
                bad.append(data)
            reads.append(1)
            time.sleep(0)  # let the writer thread have the GIL between reads

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(300):
            replace_atomically(
                path, [b'{"n": ', str(i).encode(), b', "pad": "', b"x" * 8192, b'"}']
            )
    finally:
        stop.set()
        thread.join()
    assert bad == []
    assert len(reads) > 100
    assert orjson.loads(path.read_bytes())["n"] == 299
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_replace_atomically_fsyncs_before_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The temp file is fsynced before the rename and the folder after it."""
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync " + os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    def replace(src: Any, dst: Any) -> None:
        events.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    path = tmp_path / "s.json"
    replace_atomically(path, [b"{}"])
    assert len(events) == 3
    assert events[0].startswith(f"fsync {tmp_path}/.s.json.")
    assert events[0].endswith(".tmp")
    assert events[1:] == ["replace", f"fsync {tmp_path}"]


def test_replace_atomically_removes_temp_on_error(tmp_path: Path) -> None:
    """A failing producer leaves the old file and no temp file."""
    path = tmp_path / "s.json"
    path.write_bytes(b"old")

    def chunks() -> Iterator[bytes]:
        yield b"new"
        raise ValueError("producer broke")

    with pytest.raises(ValueError, match="producer broke"):
        replace_atomically(path, chunks())
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]


# --- fsync policies ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "expected_syncs"),
    [
        (FsyncPolicy.ROW, 10),  # after every batch (so every acknowledged row is on disk)
        (FsyncPolicy.BATCH, 3),  # at rows 4 and 8, then the last 2 at close
        (FsyncPolicy.NEVER, 0),
    ],
)
async def test_store_fsync_policy(
    layout: RunLayout, fsyncs: list[str], policy: FsyncPolicy, expected_syncs: int
) -> None:
    """Each policy fsyncs the rollouts file as often as it promises."""
    config = RunConfig(fsync=policy, fsync_every_rows=4, fsync_every_s=3600.0)
    async with open_run_store(layout, config, expected=10) as store:
        for task in range(10):
            await store.write([landed(task)])
    assert fsyncs.count(str(layout.rollouts)) == expected_syncs
    assert len(read_rows(layout.rollouts)) == 10


async def test_store_fsyncs_a_batch_together(layout: RunLayout, fsyncs: list[str]) -> None:
    """One batch is one fsync per file; a newly created sidecar also fsyncs the folder once."""
    config = RunConfig(fsync=FsyncPolicy.ROW, status_interval_s=3600.0)
    async with open_run_store(layout, config, expected=10) as store:
        await store.write([])  # starts the run: its status and the new rollouts file
        fsyncs.clear()
        await store.write([landed(0), landed(1), failed(2), failed(3)])
        assert fsyncs == [str(layout.rollouts), str(layout.failures), str(layout.output.parent)]
        fsyncs.clear()
        await store.write([failed(4)])
        assert fsyncs == [str(layout.failures)]


async def test_store_fsync_every_s_on_fake_clock(
    layout: RunLayout,
    autojump_clock: trio.testing.MockClock,
    inline_io: None,
    fsyncs: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Unsynced rows are fsynced fsync_every_s after the first of them, even with no new batch."""
    times: list[float] = []
    real = os.fsync

    def timed(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}") == str(layout.rollouts):
            times.append(trio.current_time())
        real(fd)

    monkeypatch.setattr(os, "fsync", timed)
    config = RunConfig(fsync=FsyncPolicy.BATCH, fsync_every_rows=1000, fsync_every_s=1.0)
    async with open_run_store(layout, config, expected=5) as store, trio.open_nursery() as nursery:
        await nursery.start(store.run_housekeeping)
        await trio.sleep(0.25)
        await store.write([landed(0)])
        await trio.sleep(0.5)
        await store.write([landed(1)])  # unsynced since 0.25: due at 1.25
        await trio.sleep(5.0)
        nursery.cancel_scope.cancel()
    assert times == [1.25]


async def test_store_fsync_due_is_checked_on_write(
    layout: RunLayout,
    autojump_clock: trio.testing.MockClock,
    inline_io: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without housekeeping, a due fsync happens on the next write."""
    times: list[float] = []
    real = os.fsync

    def timed(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}") == str(layout.rollouts):
            times.append(trio.current_time())
        real(fd)

    monkeypatch.setattr(os, "fsync", timed)
    config = RunConfig(fsync=FsyncPolicy.BATCH, fsync_every_rows=1000, fsync_every_s=1.0)
    async with open_run_store(layout, config, expected=5) as store:
        await store.write([landed(0)])
        await trio.sleep(0.5)
        await store.write([landed(1)])
        await trio.sleep(1.0)
        await store.write([landed(2)])  # due since 1.0: fsynced now
        await trio.sleep(7.0)
        await store.write([landed(3)])  # not due until 9.5: left to the close
    assert times == [1.5, 8.5]


# --- close and cancellation -------------------------------------------------------------------


async def test_store_exit_flushes_when_cancelled(layout: RunLayout, fsyncs: list[str]) -> None:
    """Leaving the block under cancellation still fsyncs the rows and saves the final status."""
    config = RunConfig(fsync=FsyncPolicy.BATCH, fsync_every_rows=1000, fsync_every_s=3600.0)
    with trio.CancelScope() as scope:
        async with open_run_store(layout, config, expected=3) as store:
            await store.write([landed(0), failed(1)])
            fsyncs.clear()
            scope.cancel()
            await trio.sleep(1)  # raises Cancelled: exit runs under a cancelled scope
    assert scope.cancelled_caught
    assert str(layout.rollouts) in fsyncs
    assert str(layout.failures) in fsyncs
    status = read_status(layout)
    assert (status.closed, status.completed, status.failed) == (True, 1, 1)
    assert not list(layout.output.parent.glob(".*.tmp"))


async def test_store_close_fsyncs_rows_then_saves_the_status_in_one_thread_job(
    layout: RunLayout, fsyncs: list[str], jobs: list[str]
) -> None:
    """Close fsyncs the rows before the final status replaces the last one, both in a single
    worker-thread job (a hop costs CPU that a trainer's shard pays every step); the folder
    once, after the status's rename (it covers the sidecar's new name too)."""
    config = RunConfig(fsync=FsyncPolicy.BATCH, fsync_every_rows=1000, fsync_every_s=3600.0)
    async with open_run_store(layout, config, expected=3) as store:
        await store.write([landed(0), failed(1)])
        fsyncs.clear()
        jobs.clear()
    folder = str(layout.output.parent)
    assert len(jobs) == 1
    assert fsyncs[:2] == [str(layout.rollouts), str(layout.failures)]
    assert fsyncs[2].startswith(f"{folder}/.{layout.batch_status.name}.")  # the status's temp
    assert fsyncs[3:] == [folder]
    assert read_status(layout).closed


@pytest.mark.parametrize("policy", list(FsyncPolicy))
async def test_store_never_means_no_fsync_of_any_run_file(
    tmp_path: Path, fsyncs: list[str], policy: FsyncPolicy
) -> None:
    """Under ``never`` a run fsyncs nothing: not the rows, nor the inputs, manifest, status or
    folder (a shard per training step pays no fsync); every other policy fsyncs each of them.
    The files are the same either way."""
    rows = [
        MaterializedRow.from_body({"_ng_task_index": i, "_ng_rollout_index": 0}) for i in (0, 1)
    ]
    config = RunConfig(
        fsync=policy,
        status_interval_s=0.001,
        input_jsonl_fpath=None,
        output_jsonl_fpath=str(tmp_path / "run" / "out.jsonl"),
        agent_urls={"math_agent": "http://127.0.0.1:9/run"},
    )
    deployment = Deployment.from_agent_urls(config.agent_urls)
    async with open_run_folder(config, deployment, plan=MaterializedRows(rows)) as run:
        await run.store.write([landed(0), failed(1)])
    layout = run.layout
    synced = {Path(p).name.split(".")[1] if Path(p).name.startswith(".") else p for p in fsyncs}
    if policy is FsyncPolicy.NEVER:
        assert fsyncs == []
    else:
        for name in ("out_materialized_inputs", "out_manifest", "out_batch_status"):
            assert name in synced  # each one's temp file, before its rename
        assert {str(layout.rollouts), str(layout.failures), str(layout.output.parent)} <= synced
    assert read_status(layout).closed
    assert [r["_ng_task_index"] for r in read_rows(layout.materialized_inputs)] == [0, 1]
    assert orjson.loads(layout.manifest.read_bytes())["expected_rollouts"] == 2
    assert len(read_rows(layout.rollouts)) == len(read_rows(layout.failures)) == 1


async def test_store_exit_releases_lock_and_refuses_writes(layout: RunLayout) -> None:
    """After exit the lock is free for the next run and the store refuses writes."""
    async with open_run_store(layout, RunConfig(), expected=1) as store:
        with pytest.raises(RunFolderLockedError, match="is collecting into"):
            async with open_run_store(layout, RunConfig(), expected=1):
                pass  # pragma: no cover
        await store.write([landed(0)])
    with pytest.raises(RunFolderError, match="is closed"):
        await store.write([landed(1)])
    async with open_run_store(layout, RunConfig(), expected=1, fresh=False) as again:
        assert again.counts.landed == 0
    assert len(read_rows(layout.rollouts)) == 1


async def test_store_write_error_names_the_file(
    layout: RunLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk error while appending becomes a RunFolderError naming the file and the remedy."""

    def full(fd: int, data: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    async with open_run_store(layout, RunConfig(), expected=2) as store:
        await store.write([landed(0)])
        monkeypatch.setattr(os, "write", full)
        with pytest.raises(RunFolderWriteError, match=r"cannot append to '.*out\.jsonl'.*free"):
            await store.write([landed(1)])
        monkeypatch.undo()
        assert store.counts.landed == 1
        with pytest.raises(RunFolderWriteError):  # poisoned: nothing more is written
            await store.write([landed(1)])
    assert [r["_ng_task_index"] for r in read_rows(layout.rollouts)] == [0]


async def test_store_short_write_on_a_full_disk_leaves_no_torn_row(
    layout: RunLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write cut short by ENOSPC is cut back: the file ends with the last whole row."""
    real_write = os.write
    calls = []

    def half_then_full(fd: int, data: Any) -> int:
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    async with open_run_store(layout, RunConfig(), expected=3) as store:
        await store.write([landed(0)])
        monkeypatch.setattr(os, "write", half_then_full)
        with pytest.raises(RunFolderWriteError):
            await store.write([landed(1), landed(2)])
        monkeypatch.undo()
    assert layout.rollouts.read_bytes().endswith(b"}\n")
    assert [r["_ng_task_index"] for r in read_rows(layout.rollouts)] == [0]


# --- materialized inputs and counts -----------------------------------------------------------


async def test_store_writes_materialized_inputs(layout: RunLayout, fsyncs: list[str]) -> None:
    """Materialized rows stream to their file in order, are fsynced, and are counted."""
    bodies = [{"_ng_task_index": i // 2, "_ng_rollout_index": i % 2, "q": i} for i in range(1000)]
    async with open_run_store(layout, RunConfig(), expected=1000) as store:
        fsyncs.clear()
        count = await store.write_materialized_inputs(MaterializedRow.from_body(b) for b in bodies)
    assert count == 1000
    assert read_rows(layout.materialized_inputs) == bodies
    assert fsyncs[0].startswith(f"{layout.output.parent}/.out_materialized_inputs.jsonl.")
    assert fsyncs[-1] == str(layout.output.parent)  # the rename is durable


async def test_store_starts_a_run_in_one_thread_job_and_then_calls_then(
    layout: RunLayout, fsyncs: list[str], jobs: list[str]
) -> None:
    """A fresh run starts in one worker-thread job: the inputs complete and synced, the new
    rollouts file created before their rename (whose folder fsync makes its name durable), then
    ``then`` with their sha256 (`run_folder` writes the manifest there). What ``then`` raises
    is raised once the run has started, as a manifest written after would have."""
    seen: list[tuple[str, bytes, bool, list[str]]] = []

    def then(sha256: str) -> None:
        inputs = layout.materialized_inputs.read_bytes()
        seen.append((sha256, inputs, layout.rollouts.exists(), list(fsyncs)))
        raise RunFolderError("cannot write the manifest: disk full")

    bodies = [{"_ng_task_index": i, "_ng_rollout_index": 0} for i in range(3)]
    async with open_run_store(layout, RunConfig(), expected=3) as store:
        fsyncs.clear()
        with pytest.raises(RunFolderError, match="cannot write the manifest"):
            await store.write_materialized_inputs(
                (MaterializedRow.from_body(b) for b in bodies), then=then
            )
        assert len(jobs) == 1
        ((sha256, inputs, rollouts_there, synced),) = seen
        assert sha256 == hashlib.sha256(inputs).hexdigest() == store.materialized_sha256
        assert rollouts_there
        assert synced[-1] == str(layout.output.parent)  # the inputs' rename is durable
        assert fsyncs == synced  # and so is the rollouts file's name: no folder fsync of its own
        await store.write([landed(0)])  # the run has started
    assert read_status(layout).completed == 1


async def test_store_counts_summarize_the_run(layout: RunLayout) -> None:
    """counts reports landed, failed, no_persist, omitted and rows written."""
    config = RunConfig(record_omitted_rollouts=True)
    async with open_run_store(layout, config, expected=6) as store:
        await store.write(
            [landed(0), failed(1), failed(1, attempt=1), failed(2, no_persist=True), omitted(3)]
        )
        counts = store.counts
    assert (counts.expected, counts.landed, counts.failed) == (6, 1, 1)
    assert (counts.no_persist, counts.omitted, counts.failure_rows) == (1, 1, 3)
    assert counts.failures_by_class == {"agent_run_error": 1}


async def test_store_housekeeping_ends_when_the_store_closes(
    layout: RunLayout, autojump_clock: trio.testing.MockClock, inline_io: None
) -> None:
    """run_housekeeping returns at close, so a nursery around the store's block can end."""
    async with (
        trio.open_nursery() as nursery,
        open_run_store(layout, RunConfig(), expected=1) as store,
    ):
        await nursery.start(store.run_housekeeping)
        await store.write([landed(0)])
        await trio.sleep(1.0)
    assert trio.current_time() == 1.0
    assert read_status(layout).finished is True


async def test_store_landed_keys_never_collide(layout: RunLayout) -> None:
    """Indices outside the packed key's range are kept apart from packed ones."""
    batch: list[Outcome] = [landed(1, 0), landed(0, 1 << 32), landed(-1, 0)]
    async with open_run_store(layout, RunConfig(), expected=3) as store:
        await store.write(batch)
        assert store.counts.duplicates_refused == 0
    assert len(read_rows(layout.rollouts)) == 3


async def test_store_start_failure_releases_the_lock(
    layout: RunLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder where the run cannot start raises a RunFolderError and leaves the lock free."""

    def cannot(path: Any) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    layout.output.parent.mkdir(parents=True)
    layout.batch_status.write_text("{}")
    monkeypatch.setattr(os, "unlink", cannot)
    with pytest.raises(RunFolderError, match=r"cannot start the run in '.*out\.jsonl'"):
        async with open_run_store(layout, RunConfig(), expected=1) as store:
            await store.write([landed(0)])
    with RunLock.for_layout(layout) as lock:
        assert lock.held


async def test_a_retried_start_after_a_failed_rename_records_into_the_rollouts_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """write_materialized_inputs is safe to retry: a first try whose inputs' rename fails
    (after the new rollouts file was opened) leaves no descriptor on a removed file, so the
    retried run's rows land in the rollouts file on disk."""
    layout = RunLayout.for_output(tmp_path / "runs" / "out.jsonl")
    real = os.replace
    failures = [OSError(errno.EIO, "Input/output error")]

    def flaky(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        if failures and str(dst) == str(layout.materialized_inputs):
            raise failures.pop()
        real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", flaky)
    body = {"_ng_task_index": 0, "_ng_rollout_index": 0}
    async with open_run_store(layout, RunConfig(), expected=1) as store:
        with pytest.raises(RunFolderError):
            await store.write_materialized_inputs([MaterializedRow.from_body(body)])
        await store.write_materialized_inputs([MaterializedRow.from_body(body)])
        await store.write([landed(0)])
    assert [
        orjson.loads(line)["_ng_task_index"] for line in layout.rollouts.read_bytes().splitlines()
    ] == [0]
