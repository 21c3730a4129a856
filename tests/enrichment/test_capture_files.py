"""Reading capture files: hostile ones become gap markers; waits are bounded (fake clock).

Every case goes through `Enricher` on real files in tmp_path, as a collector's worker would.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from trollout.enrichment import Enricher, EnrichmentOptions
from trollout.errors import ConfigError
from trollout.records import Identity, Landed

_LINE = {
    "model_call_id": "abc",
    "dialect": "responses",
    "model_ref": {"type": "responses_api_models", "name": "policy_model"},
    "started_at": 1.0,
    "completed_at": 1.5,
    "latency_ms": 500.0,
    "latency_ttft_ms": None,
    "status_code": 200,
    "error_category": None,
    "request": {"input": "hi"},
    "response": {
        "id": "resp_1",
        "model": "m",
        "status": "completed",
        "output": [],
        "usage": {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5},
    },
}
_REPLY = {"response": {"output": []}, "reward": 0.5}


def _landed(task: int = 0, attempt: int = 0) -> Landed:
    return Landed(Identity(task, 0, "a"), attempt, dict(_REPLY), 0.25)


def _enricher(tmp_path: Path, **options: Any) -> Enricher:
    return Enricher(EnrichmentOptions(observability=True, capture_dir=str(tmp_path), **options))


def _touch(path: Path) -> str:
    path.touch()
    return str(path)


def _write(path: Path, *lines: Any) -> None:
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))


def _gaps(outcome: Landed) -> list[dict[str, Any]]:
    return list(outcome.result["ng_model_call_capture"].get("gaps", []))


async def test_a_readable_capture_is_merged_and_reply_and_reward_are_untouched(
    tmp_path: Path,
) -> None:
    _write(tmp_path / "0-0.capture.jsonl", _LINE)
    landed = _landed()
    out = await _enricher(tmp_path)(landed)
    capture = out.result["ng_model_call_capture"]
    assert capture["metrics"]["num_calls"] == 1
    assert capture["metrics"]["tokens_total"] == 5
    assert out.result["response"] is landed.result["response"]
    assert out.reward == 0.5
    assert landed.result == _REPLY  # the reply itself was not changed
    model_call = out.result["ng_trajectory"]["model_calls"][0]
    assert model_call["response"] == _LINE["response"]  # payloads kept in the trajectory
    assert "request" not in capture["calls"][0]  # and removed from the capture record


async def test_the_attempt_suffix_picks_the_retried_attempts_own_file(tmp_path: Path) -> None:
    _write(tmp_path / "0-0.capture.jsonl", _LINE, _LINE | {"model_call_id": "x"})
    _write(tmp_path / "0-0-a1.capture.jsonl", _LINE)
    out = await _enricher(tmp_path)(_landed(attempt=1))
    assert out.result["ng_model_call_capture"]["rollout_id"] == "0-0-a1"
    assert out.result["ng_model_call_capture"]["metrics"]["num_calls"] == 1


async def test_no_file_is_a_no_records_gap_and_the_rollout_still_lands(tmp_path: Path) -> None:
    out = await _enricher(tmp_path)(_landed())
    assert _gaps(out) == [{"code": "model_call_capture_no_records"}]
    assert "ng_perf" not in out.result  # no invocation: never a partial ng_perf


async def test_damaged_lines_and_an_incomplete_marker_are_reported(tmp_path: Path) -> None:
    path = tmp_path / "0-0.capture.jsonl"
    path.write_bytes(b"{not json\n" + orjson.dumps(_LINE) + b"\n[1]\n")
    (tmp_path / "0-0.capture.incomplete").touch()
    out = await _enricher(tmp_path)(_landed())
    assert _gaps(out) == [
        {"code": "model_call_capture_incomplete"},
        {"code": "model_call_capture_records_unreadable", "detail": "count=2"},
    ]
    assert out.result["ng_model_call_capture"]["calls"][0]["call_index"] == 1


async def test_a_last_line_still_being_written_is_waited_for(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The writer finishes the line 0.5 s (virtual) later: the read waits and merges it."""
    path = tmp_path / "0-0.capture.jsonl"
    data = orjson.dumps(_LINE) + b"\n"
    path.write_bytes(data[:-30])

    async def finish() -> None:
        await trio.sleep(0.5)
        with path.open("ab") as f:  # the rest of the line lands (appended, as a writer does)
            f.write(data[-30:])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(finish)
        out = await _enricher(tmp_path)(_landed())
    assert "gaps" not in out.result["ng_model_call_capture"]
    assert trio.current_time() >= 0.5


async def test_a_last_line_never_finished_is_unreadable_after_the_bounded_wait(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    (tmp_path / "0-0.capture.jsonl").write_bytes(orjson.dumps(_LINE) + b"\n" + b'{"model_')
    start = trio.current_time()
    out = await _enricher(tmp_path, wait_s=2.0)(_landed())
    assert _gaps(out) == [{"code": "model_call_capture_records_unreadable", "detail": "count=1"}]
    assert out.result["ng_model_call_capture"]["metrics"]["num_calls"] == 1
    assert 2.0 <= trio.current_time() - start < 3.0  # bounded by wait_s, on the fake clock


def _unreadable(out: Landed) -> str:
    [gap] = _gaps(out)
    assert gap["code"] == "model_call_capture_unreadable"
    return str(gap["detail"])


async def test_a_huge_sparse_file_is_refused_unread(tmp_path: Path) -> None:
    """A 2 GB (sparse) capture file: a gap naming the file and the cap, nothing read."""
    path = tmp_path / "0-0.capture.jsonl"
    os.truncate(_touch(path), 2 * 1024**3)  # sparse: no disk used
    out = await _enricher(tmp_path)(_landed())
    detail = _unreadable(out)
    assert str(path) in detail
    assert "cap" in detail
    assert out.result["ng_model_call_capture"]["calls"] == []


async def test_a_symlink_out_of_the_capture_dir_is_refused_and_not_followed(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "outside.jsonl"
    _write(outside, _LINE)
    captures = tmp_path / "captures"
    captures.mkdir()
    (captures / "0-0.capture.jsonl").symlink_to(outside)
    out = await _enricher(captures, delete_capture=True)(_landed())
    assert "symbolic link" in _unreadable(out)
    assert outside.exists()  # deletion never touches what it did not merge


async def test_another_rollouts_file_under_this_key_is_refused(tmp_path: Path) -> None:
    """0-1's capture linked in as 0-0's (symlink or hard link): refused, never merged."""
    _write(tmp_path / "0-1.capture.jsonl", _LINE)
    (tmp_path / "0-0.capture.jsonl").symlink_to(tmp_path / "0-1.capture.jsonl")
    assert "symbolic link" in _unreadable(await _enricher(tmp_path)(_landed()))
    (tmp_path / "0-0.capture.jsonl").unlink()
    os.link(tmp_path / "0-1.capture.jsonl", tmp_path / "0-0.capture.jsonl")
    assert "hard links" in _unreadable(await _enricher(tmp_path)(_landed()))


async def test_an_unreadable_file_or_a_non_file_is_a_gap(tmp_path: Path) -> None:
    path = tmp_path / "0-0.capture.jsonl"
    path.mkdir()  # not a regular file
    assert "not a regular file" in _unreadable(await _enricher(tmp_path)(_landed()))
    path.rmdir()
    os.mkfifo(path)  # a FIFO: opened without blocking, then refused
    assert "not a regular file" in _unreadable(await _enricher(tmp_path)(_landed()))
    path.unlink()
    if os.geteuid() != 0:  # root reads anything
        _write(path, _LINE)
        path.chmod(0)
        assert "cannot be opened" in _unreadable(await _enricher(tmp_path)(_landed()))


async def test_payloads_off_keeps_call_metadata_only(tmp_path: Path) -> None:
    _write(tmp_path / "0-0.capture.jsonl", _LINE)
    out = await _enricher(tmp_path, include_payloads=False)(_landed())
    call = out.result["ng_trajectory"]["model_calls"][0]
    assert call["request"] is None
    assert call["response"] is None
    assert call["token_stats"]["total_tokens"] == 5


async def test_delete_removes_the_merged_file_and_its_marker(tmp_path: Path) -> None:
    _write(tmp_path / "0-0.capture.jsonl", _LINE)
    (tmp_path / "0-0.capture.incomplete").touch()
    _write(tmp_path / "0-1.capture.jsonl", _LINE)
    out = await _enricher(tmp_path, delete_capture=True)(_landed())
    assert out.result["ng_model_call_capture"]["metrics"]["num_calls"] == 1
    assert sorted(os.listdir(tmp_path)) == ["0-1.capture.jsonl"]


def test_delete_without_payloads_is_refused() -> None:
    with pytest.raises(ConfigError, match="include_model_call_payloads=true"):
        EnrichmentOptions(
            observability=True, capture_dir="/x", include_payloads=False, delete_capture=True
        )


async def test_a_cancelled_read_leaves_the_outcome_for_interrupted(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Cancelled while waiting on a line: the call raises Cancelled; `interrupted` gives the
    row its gap without reading anything."""
    (tmp_path / "0-0.capture.jsonl").write_bytes(b'{"partial')
    enricher = _enricher(tmp_path, wait_s=100.0)
    with trio.move_on_after(1.0):
        await enricher(_landed())
        pytest.fail("not cancelled")
    out = enricher.interrupted(_landed())
    assert "cancelled" in _unreadable(out)
