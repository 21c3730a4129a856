"""The rows a run folder dispatches: read back from its materialized-inputs file."""

from __future__ import annotations

from pathlib import Path

import orjson

from trollout.recovery.layout import RunLayout
from trollout.recovery.run_folder import _materialized


def test_rows_keep_their_line_so_the_first_attempt_is_not_serialized_again(
    tmp_path: Path,
) -> None:
    """Each row read back carries its line as read (blank lines skipped, whitespace kept)."""
    layout = RunLayout.for_output(tmp_path / "r.jsonl")
    lines = [
        b'{"_ng_task_index": 0, "_ng_rollout_index": 0, "agent_ref": {"name": "a"}}',
        b'{"_ng_task_index":1,"_ng_rollout_index":0,"agent_ref":{"name":"a"}}',
    ]
    layout.materialized_inputs.write_bytes(lines[0] + b"\n\n" + lines[1] + b"\n")
    rows = list(_materialized(layout))
    assert [row.raw for row in rows] == lines
    assert [row.body for row in rows] == [orjson.loads(line) for line in lines]
    assert [row.identity.task_index for row in rows] == [0, 1]
