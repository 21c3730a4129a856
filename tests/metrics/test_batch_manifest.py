"""Reading a batch manifest refuses one its own batch status would replace."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from trollout.errors import ConfigError
from trollout.metrics.batch import read_batch_manifest, status_path

MANIFEST = {"schema_version": "1", "members": {"math": {"agent_name": "math_agent"}}}


def test_read_batch_manifest_refuses_the_batch_status_file(tmp_path: Path) -> None:
    """A manifest named batch_status.json, or hard-linked to it, is refused when read."""
    named = tmp_path / "a" / "batch_status.json"
    named.parent.mkdir()
    named.write_bytes(orjson.dumps(MANIFEST))
    with pytest.raises(ConfigError, match="is the batch manifest, which trollout would write"):
        read_batch_manifest(named)
    linked = tmp_path / "b" / "manifest.json"
    linked.parent.mkdir()
    linked.write_bytes(orjson.dumps(MANIFEST))
    assert [m.agent for m in read_batch_manifest(linked)] == ["math_agent"]
    os.link(linked, status_path(linked))
    with pytest.raises(ConfigError, match=r"manifest\.json' \(the same file\)"):
        read_batch_manifest(linked)
