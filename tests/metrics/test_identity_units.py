"""The identity tables: task numbers dense and sparse, batch manifests refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from trollout.errors import ConfigError
from trollout.metrics.batch import check_members, read_batch_manifest
from trollout.metrics.identity import LocalIds, TaskIds

GROUP = ("agent_a", None)


def test_task_numbers_keep_a_runs_own_and_take_the_next_free_otherwise() -> None:
    """A task keeps its index when free, else takes the next above all; huge ones too."""
    ids = TaskIds()
    seen = ids.occurrences()
    assert [ids.assign(GROUP, t, digest, seen) for t, digest in ((0, 10), (1, 11))] == [0, 1]
    later = ids.occurrences()
    assert ids.assign(GROUP, 0, 12, later) == 2  # another task 0: renumbered
    assert ids.assign(GROUP, 1, 10, later) == 0  # the first run's task 0, matched by content
    huge = 1 << 40
    assert ids.assign(GROUP, huge, 13, later) == huge
    assert ids.assign(GROUP, 5, 14, later) == 5
    assert ids.assign(GROUP, huge, 15, ids.occurrences()) == huge + 1
    assert ids.renumbered == 3


def test_local_ids_hold_dense_and_sparse_task_indices() -> None:
    """Small indices live in an array, huge or negative ones in a dict."""
    local = LocalIds()
    for task, merged in ((3, 7), (1 << 30, 8), (-1, 9)):
        local.set(GROUP, task, merged)
    assert [local.get(GROUP, t) for t in (3, 1 << 30, -1, 2, 100)] == [7, 8, 9, None, None]
    assert local.get(("other", None), 3) is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "is not JSON"),
        ('{"schema_version": "2", "members": {}}', "schema_version '1'"),
        ('{"schema_version": "1", "members": {}}', "declares no members"),
        ('{"schema_version": "1", "members": {"m": {}}}', "must name its agent"),
        (
            '{"schema_version": "1", "members": {"m": {"agent_name": "a", '
            '"expected_rollout_count": -1}}}',
            "expected_rollout_count must be an integer >= 0",
        ),
    ],
)
def test_bad_batch_manifests_are_refused(tmp_path: Path, text: str, message: str) -> None:
    """A batch manifest that is not NeMo Gym's shape is a one-line config error."""
    path = tmp_path / "b.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        read_batch_manifest(path)
    with pytest.raises(ConfigError, match="cannot read batch_manifest_fpath"):
        read_batch_manifest(tmp_path / "missing.json")


def test_members_with_no_rows_are_refused(tmp_path: Path) -> None:
    """A member whose agent the plan never routes to is named."""
    path = tmp_path / "b.json"
    path.write_text('{"schema_version": "1", "members": {"m": {"agent_name": "gone"}}}')
    with pytest.raises(ConfigError, match="member 'm': the plan has no rows for 'gone'"):
        check_members(read_batch_manifest(path), {})
