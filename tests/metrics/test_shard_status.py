"""After an aggregation, each shard's status file says how the aggregation that merged it went."""

from __future__ import annotations

import socket
from pathlib import Path

import orjson
from run_folders import landed, plan_for, write_run

from trollout.metrics import aggregate_shards, resolve_inputs
from trollout.metrics.shards import refresh_shard_status, shard_statuses
from trollout.recovery.lock import RunLock


def write_status(path: Path, completed: int) -> None:
    """Write a status file as a collector leaves it."""
    path.write_bytes(orjson.dumps({"expected": 2, "completed": completed, "finished": True}))


async def test_shard_status_files_record_the_aggregation(tmp_path: Path) -> None:
    """Both shards' status files get aggregation_status ok and the metrics file; counts kept."""
    for name, task in (("a", 0), ("b", 1)):
        layout = write_run(tmp_path / "s" / f"{name}.jsonl", [landed(task, 0)], plan=plan_for(2, 1))
        write_status(layout.batch_status, completed=task + 1)
    out = tmp_path / "m" / "merged.jsonl"
    await aggregate_shards(resolve_inputs(f"{tmp_path}/s/*.jsonl"), output=out)
    for name, completed in (("a", 1), ("b", 2)):
        status = orjson.loads((tmp_path / "s" / f"{name}_batch_status.json").read_bytes())
        assert status["completed"] == completed
        assert status["aggregation_status"] == "ok"
        assert status["aggregate_metrics_fpath"] == str(
            tmp_path / "m" / "merged_aggregate_metrics.json"
        )
        assert status["aggregation_errors"] == []
    assert not (tmp_path / "m" / "merged_batch_status.json").exists()


async def test_failed_server_aggregation_marks_the_shard_error(tmp_path: Path) -> None:
    """A failed /aggregate_metrics call is recorded as aggregation_status error."""
    layout = write_run(tmp_path / "a.jsonl", [landed(0, 0)], plan=plan_for(1, 1))
    write_status(layout.batch_status, completed=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again on exit: connections are refused
    await aggregate_shards([layout.output], targets=[("agent_a", None, f"http://127.0.0.1:{port}")])
    status = orjson.loads(layout.batch_status.read_bytes())
    assert status["aggregation_status"] == "error"
    assert len(status["aggregation_errors"]) == 1


async def test_a_collector_that_locks_after_the_check_is_not_raced(tmp_path: Path) -> None:
    """A run locked between the check and the write keeps its status file; one warning."""
    layout = write_run(tmp_path / "a.jsonl", [landed(0, 0)], plan=plan_for(1, 1))
    write_status(layout.batch_status, completed=1)
    layout.lock.touch()  # a trollout run folder: its collector made the lock file
    before = layout.batch_status.read_bytes()
    layouts, warnings = shard_statuses([layout.output])
    assert (layouts, warnings) == ([layout], [])
    with RunLock.for_layout(layout):
        (warning,) = refresh_shard_status(layouts, tmp_path / "m.json", [])
    assert "holds the lock" in warning
    assert layout.batch_status.read_bytes() == before
    assert refresh_shard_status(layouts, tmp_path / "m.json", []) == []
    assert orjson.loads(layout.batch_status.read_bytes())["aggregation_status"] == "ok"
