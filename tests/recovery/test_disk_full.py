"""A full disk stops a run promptly, loudly and resumably, never with a torn row.

Two ways to fill a disk: an injected ENOSPC at the OS boundary of the run folder's appends
(always runs), and a real, tiny tmpfs (when this process may mount one, as root in CI).
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from trollout import jsonl
from trollout.recovery import files
from trollout.recovery.layout import RunLayout
from trollout.testing import AgentSpec, DeploymentSpec, FakeUrls, task_rows

SPEC = DeploymentSpec(agents=(AgentSpec(name="math_agent"),), record_runs=False)


@pytest.fixture(scope="module")
def fake_spec() -> DeploymentSpec:
    """Unlike the shared fake's: no detailed /run log (record_runs=False)."""
    return SPEC


class DiskFullAfter:
    """``os`` for `trollout.recovery.files`: appends under ``folder`` fill up after ``room``.

    The last write that fits is short (a disk that fills mid-row), every later one raises
    ENOSPC, as a full file system does; everything else is the real ``os``.
    """

    def __init__(self, folder: Path, room: int) -> None:
        self.folder = str(folder)
        self.room = room

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def write(self, fd: int, data: Any) -> int:
        if not os.readlink(f"/proc/self/fd/{fd}").startswith(self.folder):
            return os.write(fd, data)
        if self.room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = os.write(fd, bytes(data[: self.room]))
        self.room -= n
        return n


def invoke(*args: str) -> Result:
    """Run the trollout CLI with args."""
    from trollout.cli.main import cli

    return CliRunner().invoke(cli, list(args))


def collect_args(source: Path, out: Path, fake: FakeUrls) -> list[str]:
    """Arguments of a collect run of ``source`` into ``out`` through the fake's agent."""
    return ["collect", str(source), "-o", str(out), "--agent", "math_agent",
            "--agent-url", f"math_agent={fake.run_urls['math_agent']}", "--num-repeats", "2",
            "--concurrency", "8", "--progress", "plain", "--no-aggregate"]  # fmt: skip


def write_input(path: Path, rows: int) -> Path:
    """Write ``rows`` example rows."""
    path.write_bytes(b"".join(jsonl.dumps(r) for r in task_rows(rows, seed=5)))
    return path


def assert_complete_once(layout: RunLayout, expected: int) -> None:
    """Every materialized rollout landed exactly once; no line of any file is torn."""
    for path in (layout.rollouts, layout.failures, layout.attempts):
        if path.exists():
            data = path.read_bytes()
            assert not data or data.endswith(b"\n"), path
    keys = Counter(
        (r["_ng_task_index"], r["_ng_rollout_index"]) for r in jsonl.read_rows(layout.rollouts)
    )
    assert len(keys) == expected
    assert set(keys.values()) == {1}


def assert_stopped_by_full_disk(result: Result, out: Path) -> None:
    """Exit 1 with one error line naming the file, the cause and the free space."""
    assert result.exit_code == 1, result.output
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, result.stderr
    assert "run stopped: cannot" in errors[0]
    assert str(out.parent) in errors[0]
    assert "No space left on device" in errors[0]
    assert "free on its file system" in errors[0]
    assert "Traceback" not in result.output


def test_disk_full_mid_run_stops_with_exit_1_then_resumes_to_completion(
    tmp_path: Path, fake: FakeUrls, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC on an append: exit 1 naming file and free space, no torn row, resume finishes."""
    source = write_input(tmp_path / "in.jsonl", 60)
    out = tmp_path / "run" / "r.jsonl"
    monkeypatch.setattr(files, "os", DiskFullAfter(out.parent, room=6000))
    result = invoke(*collect_args(source, out, fake))
    monkeypatch.undo()
    assert_stopped_by_full_disk(result, out)
    layout = RunLayout.for_output(out)
    # How many rows fit before the disk filled depends on how the writer batched them
    # (timing); that it stopped short, with no torn row, does not.
    assert len(list(jsonl.read_rows(layout.rollouts))) < 120
    result = invoke("resume", str(out), "--progress", "plain", "--no-aggregate")
    assert result.exit_code == 0, result.output
    assert_complete_once(layout, 120)


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir()
    if os.geteuid() != 0:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True)  # fmt: skip
    return done.returncode == 0


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 160 kB tmpfs of our own, unmounted afterwards (skips where mounting is not allowed)."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "160k"):
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_real_full_tmpfs_stops_the_run_and_a_bigger_disk_resumes_it(
    tmp_path: Path, fake: FakeUrls, tiny_disk: Path
) -> None:
    """On a really full file system the run exits 1; after growing it, resume completes."""
    source = write_input(tmp_path / "in.jsonl", 200)
    out = tiny_disk / "r.jsonl"
    result = invoke(*collect_args(source, out, fake))
    assert_stopped_by_full_disk(result, out)
    assert not list(tiny_disk.glob(".*.tmp"))
    remount = ["mount", "-o", "remount,size=4m", str(tiny_disk)]
    subprocess.run(remount, check=True, capture_output=True)
    result = invoke("resume", str(out), "--progress", "plain", "--no-aggregate")
    assert result.exit_code == 0, result.output
    assert_complete_once(RunLayout.for_output(out), 400)
