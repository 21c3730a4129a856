"""The attempt ledger: one durable write per batch, before any request of the batch is sent."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import trio

from builders import materialized_rows
from trollout.collector.engine.collector import open_collector
from trollout.collector.http.transport import RawResponse
from trollout.errors import RunFolderError
from trollout.records import Failed, Identity, Landed
from trollout.recovery.layout import RunLayout
from trollout.recovery.ledger import encode_reservation, read_entries, read_ledger
from trollout.recovery.resume import ResumeRules, scan_run
from trollout.recovery.store import open_run_store
from trollout.settings import FsyncPolicy, RunConfig


class LedgerCheckingTransport:
    """Answers 200, first checking that the request's attempt is already in the ledger."""

    def __init__(self, layout: RunLayout, *, status: int = 200) -> None:
        self.layout = layout
        self.status = status
        self.unreserved: list[tuple[int, int, int]] = []
        self.sent: list[tuple[int, int, int]] = []

    async def post(self, url: str, body: bytes, **_: Any) -> RawResponse:
        row = orjson.loads(body)
        key = (row["_ng_task_index"], row["_ng_rollout_index"], row.get("_ng_attempt_index", 0))
        self.sent.append(key)
        if key not in set(read_ledger(self.layout.attempts)):
            self.unreserved.append(key)
        await trio.sleep(0.001)
        reply = b'{"response": {}, "reward": 1.0}' if self.status == 200 else b'"boom"'
        return RawResponse(status=self.status, headers=[], body=reply, truncated=False)

    async def aclose(self) -> None:
        pass


def test_ledger_round_trip_and_torn_tail(tmp_path: Path) -> None:
    """Reserved triples read back in order; a torn last line is skipped."""
    path = tmp_path / "r_attempts.jsonl"
    path.write_bytes(encode_reservation([(0, 0, 0), (1, 2, 3)]) + encode_reservation([(5, 0, 1)]))
    with open(path, "ab") as f:
        f.write(b'{"attempts": [[7, 0')
    assert list(read_ledger(path)) == [(0, 0, 0), (1, 2, 3), (5, 0, 1)]
    assert list(read_ledger(tmp_path / "absent.jsonl")) == []


def test_ledger_damaged_middle_line_is_refused(tmp_path: Path) -> None:
    """A damaged line followed by others is not a crash's torn tail: refuse, naming the line."""
    path = tmp_path / "r_attempts.jsonl"
    path.write_bytes(encode_reservation([(0, 0, 0)]) + b"garbage\n" + encode_reservation([]))
    with pytest.raises(RunFolderError, match=r"r_attempts\.jsonl:2"):
        list(read_ledger(path))


@pytest.mark.parametrize("policy", [FsyncPolicy.ROW, FsyncPolicy.BATCH])
async def test_ledger_store_reserve_follows_the_fsync_policy(
    tmp_path: Path, monkeypatch: Any, policy: FsyncPolicy
) -> None:
    """Each reserve call appends one line; row fsyncs it before returning, batch by close."""
    layout = RunLayout.for_output(tmp_path / "r.jsonl")
    synced: list[str] = []
    real = os.fsync
    monkeypatch.setattr(
        os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd))
    )
    async with open_run_store(layout, RunConfig(fsync=policy), expected=3) as store:
        synced.clear()
        await store.reserve([(Identity(0, 0), 0), (Identity(1, 0), 2)])
        assert (str(layout.attempts) in synced) is (policy is FsyncPolicy.ROW)
        await store.reserve([(Identity(2, 0), 0)])
    assert str(layout.attempts) in synced
    lines = layout.attempts.read_bytes().splitlines()
    assert len(lines) == 2
    assert list(read_ledger(layout.attempts)) == [(0, 0, 0), (1, 0, 2), (2, 0, 0)]


async def test_ledger_never_policy_skips_fsync(tmp_path: Path, monkeypatch: Any) -> None:
    """With fsync=never the reservation is written (SIGKILL-safe) but not fsynced."""
    layout = RunLayout.for_output(tmp_path / "r.jsonl")
    synced: list[str] = []
    real = os.fsync
    monkeypatch.setattr(
        os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd))
    )
    async with open_run_store(layout, RunConfig(fsync=FsyncPolicy.NEVER), expected=1) as store:
        await store.reserve([(Identity(0, 0), 0)])
    assert list(read_ledger(layout.attempts)) == [(0, 0, 0)]
    assert str(layout.attempts) not in synced


async def test_ledger_engine_reserves_every_attempt_before_sending(tmp_path: Path) -> None:
    """Every request's attempt is in the ledger when it arrives, and only those are."""
    layout = RunLayout.for_output(tmp_path / "r.jsonl")
    transport = LedgerCheckingTransport(layout)
    config = RunConfig(num_samples_in_parallel=8)
    work = [(row, 2 if row.identity.task_index % 3 == 0 else 0) for row in materialized_rows(600)]
    async with (
        open_run_store(layout, config, expected=50) as store,
        open_collector(
            config=config,
            urls={"agent": "http://127.0.0.1:1"},
            sink=store,
            transport=transport,  # type: ignore[arg-type]
        ) as collector,
    ):
        await collector.collect(work)
    assert len(transport.sent) == 600
    assert transport.unreserved == []
    assert sorted(read_ledger(layout.attempts)) == sorted(transport.sent)
    assert sorted(read_ledger(layout.attempts)) == sorted(
        (row.identity.task_index, 0, attempt) for row, attempt in work
    )


async def test_ledger_submit_reserves_single_rows(tmp_path: Path) -> None:
    """A driver's submit() reserves its one attempt before handing it to a worker."""
    layout = RunLayout.for_output(tmp_path / "r.jsonl")
    transport = LedgerCheckingTransport(layout)
    async with (
        open_run_store(layout, RunConfig(), expected=2) as store,
        open_collector(
            urls={"agent": "http://127.0.0.1:1"},
            sink=store,
            transport=transport,  # type: ignore[arg-type]
        ) as collector,
    ):
        for row in materialized_rows(2):
            await collector.submit(row, 1)
    assert transport.unreserved == []
    assert list(read_ledger(layout.attempts)) == [(0, 0, 1), (1, 0, 1)]


class RefusingTransport(LedgerCheckingTransport):
    """Refuses the connection (never sent) for odd tasks, answers 200 for the others."""

    async def post(self, url: str, body: bytes, **kw: Any) -> RawResponse:
        if orjson.loads(body)["_ng_task_index"] % 2:
            raise httpx.ConnectError("connection refused")
        return await super().post(url, body, **kw)


async def test_ledger_never_sent_attempts_are_released_and_handed_out_again(
    tmp_path: Path,
) -> None:
    """A refused connection's number is released; resume sends the same number again."""
    layout = RunLayout.for_output(tmp_path / "r.jsonl")
    transport = RefusingTransport(layout)
    config = RunConfig(num_samples_in_parallel=3, max_connect_retries=0)
    rows = materialized_rows(8)
    async with open_run_store(layout, config, expected=8) as store:
        await store.write_materialized_inputs(rows)
        async with open_collector(
            config=config,
            urls={"agent": "http://127.0.0.1:1"},
            sink=store,
            transport=transport,  # type: ignore[arg-type]
        ) as collector:
            await collector.collect(rows)
    entries = list(read_entries(layout.attempts))
    released = sorted((t, r, a) for gone, t, r, a in entries if gone)
    assert released == [(t, 0, 0) for t in (1, 3, 5, 7)]
    assert sorted((t, r, a) for gone, t, r, a in entries if not gone) == [
        (t, 0, 0) for t in range(8)
    ]
    plan = scan_run(layout, ResumeRules())
    again = {row.identity.task_index: attempt for row, attempt in plan.rows()}
    assert again == {1: 0, 3: 0, 5: 0, 7: 0}


async def test_ledger_failure_rows_carry_the_configured_cap(tmp_path: Path) -> None:
    """Failure rows record the run's attempt cap as _ng_failure_max_attempts."""
    layout = RunLayout.for_output(tmp_path / "r.jsonl")
    config = RunConfig(max_attempts=7)
    async with open_run_store(layout, config, expected=1) as store:
        await store.write(
            [Failed(Identity(0, 0, agent_name="a"), 0, "agent_run_error", max_attempts=3)]
        )
        await store.write([Landed(Identity(1, 0, agent_name="a"), 0, {"reward": 1.0})])
    row = orjson.loads(layout.failures.read_bytes())
    assert row["_ng_failure_max_attempts"] == 7


def test_ledger_max_attempts_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cap defaults to NEMO_GYM_MAX_ROLLOUT_ATTEMPTS, else 3; a bad value names the variable."""
    monkeypatch.delenv("NEMO_GYM_MAX_ROLLOUT_ATTEMPTS", raising=False)
    assert RunConfig().max_attempts == 3
    monkeypatch.setenv("NEMO_GYM_MAX_ROLLOUT_ATTEMPTS", "5")
    assert RunConfig().max_attempts == 5
    assert RunConfig(max_attempts=2).max_attempts == 2
    monkeypatch.setenv("NEMO_GYM_MAX_ROLLOUT_ATTEMPTS", "zero")
    with pytest.raises(ValueError, match="NEMO_GYM_MAX_ROLLOUT_ATTEMPTS"):
        RunConfig()


class RetriedOnceTransport(LedgerCheckingTransport):
    """Answers 503 (Retry-After: 0) to the first request of each rollout, then 200; notes, as
    each request arrives, its task, its retry header and the ledger's lines."""

    def __init__(self, layout: RunLayout) -> None:
        super().__init__(layout)
        self.seen: list[tuple[int, bytes, list[dict[str, Any]]]] = []

    async def post(self, url: str, body: bytes, *, headers: bytes = b"") -> RawResponse:
        lines = [orjson.loads(line) for line in self.layout.attempts.read_bytes().splitlines()]
        self.seen.append((orjson.loads(body)["_ng_task_index"], headers, lines))
        if not headers:
            return RawResponse(503, [(b"retry-after", b"0")], b'"busy"', False)
        return await super().post(url, body)


async def test_ledger_records_a_retry_within_an_attempt_before_it_leaves(
    tmp_path: Path,
) -> None:
    """A retried 503 is visible to the server (X-Trollout-Retry: 1) and, before it leaves, to
    the ledger (a resent line); resume reads the ledger as before: the rollouts landed."""
    layout = RunLayout.for_output(tmp_path / "r.jsonl")
    transport = RetriedOnceTransport(layout)
    config = RunConfig(num_samples_in_parallel=2)
    rows = materialized_rows(3)
    async with open_run_store(layout, config, expected=3) as store:
        await store.write_materialized_inputs(rows)
        async with open_collector(
            config=config,
            urls={"agent": "http://127.0.0.1:1"},
            sink=store,
            transport=transport,  # type: ignore[arg-type]
        ) as collector:
            await collector.collect(rows)
    retries = [(task, lines) for task, headers, lines in transport.seen if headers]
    assert sorted(task for task, _ in retries) == [0, 1, 2]
    assert {headers for _, headers, _ in transport.seen} == {b"", b"x-trollout-retry: 1\r\n"}
    for task, lines in retries:  # on record before it left
        assert {"resent": [[task, 0, 0, 1]]} in lines
    assert sorted(read_ledger(layout.attempts)) == [(t, 0, 0) for t in range(3)]
    plan = scan_run(layout, ResumeRules())
    assert list(plan.rows()) == []
