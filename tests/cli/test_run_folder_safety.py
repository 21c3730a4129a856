"""The run folder is the only thing trollout writes, and it never destroys what it did not make.

Each case is refused with exit 2 and one line, and the folder (and anything a link points to)
is compared byte for byte before and after.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from trollout import jsonl
from trollout.testing import AgentSpec, DeploymentSpec, FakeUrls, task_rows

SPEC = DeploymentSpec(agents=(AgentSpec(name="math_agent"),), record_runs=False)


@pytest.fixture(scope="module")
def fake_spec() -> DeploymentSpec:
    """Unlike the shared fake's: no detailed /run log (record_runs=False)."""
    return SPEC


def invoke(*args: str) -> Result:
    """Run the trollout CLI with args."""
    from trollout.cli.main import cli

    return CliRunner().invoke(cli, list(args))


def write_input(path: Path, rows: int = 6) -> Path:
    """Write ``rows`` example task rows to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(jsonl.dumps(r) for r in task_rows(rows, seed=2)))
    return path


def collect(source: Path, out: Path, fake: FakeUrls, *extra: str) -> Result:
    """Run ``trollout collect`` from ``source`` into ``out`` through the fake's agent."""
    return invoke("collect", str(source), "-o", str(out), "--agent", "math_agent",
                  "--agent-url", f"math_agent={fake.run_urls['math_agent']}",
                  "--progress", "plain", "--no-aggregate", *extra)  # fmt: skip


def snapshot(*folders: Path) -> dict[str, bytes | str]:
    """Every entry of the folders: file bytes, link targets, and the kind of anything else."""
    out: dict[str, bytes | str] = {}
    for folder in folders:
        for path in sorted(folder.iterdir()):
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                out[str(path)] = "link -> " + os.readlink(path)
            elif stat.S_ISREG(mode):
                out[str(path)] = path.read_bytes()
            else:
                out[str(path)] = f"mode {stat.S_IFMT(mode):o}"
    return out


def refused(result: Result, *needles: str) -> None:
    """Assert exit 2, one error line holding every needle, no traceback."""
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert "Traceback" not in result.output


def test_collect_refuses_input_that_is_the_output(tmp_path: Path, fake: FakeUrls) -> None:
    """collect out/r.jsonl -o out/r.jsonl: refused, the input untouched."""
    source = write_input(tmp_path / "out" / "r.jsonl")
    before = snapshot(source.parent)
    refused(collect(source, source, fake), "is the run file", "-o")
    assert snapshot(source.parent) == before


@pytest.mark.parametrize("sibling", ["r_failures.jsonl", "r_materialized_inputs.jsonl", "r.lock"])
def test_collect_refuses_input_named_like_a_run_file(
    tmp_path: Path, fake: FakeUrls, sibling: str
) -> None:
    """An input that is a sidecar of the output (by name or hard link) is refused, untouched."""
    source = write_input(tmp_path / "out" / sibling)
    before = snapshot(source.parent)
    refused(collect(source, tmp_path / "out" / "r.jsonl", fake), "is the run file")
    assert snapshot(source.parent) == before
    elsewhere = write_input(tmp_path / "elsewhere" / "in.jsonl")
    os.link(elsewhere, tmp_path / "out" / "r.jsonl")  # the output is a hard link to the input
    refused(collect(elsewhere, tmp_path / "out" / "r.jsonl", fake), "is the run file")


def test_collect_over_a_finished_run_needs_resume_or_overwrite(
    tmp_path: Path, fake: FakeUrls
) -> None:
    """Re-collecting a finished run is refused untouched; --overwrite replaces it."""
    source = write_input(tmp_path / "in.jsonl")
    out = tmp_path / "run" / "r.jsonl"
    assert collect(source, out, fake).exit_code == 0
    before = snapshot(out.parent)
    refused(collect(source, out, fake), "already holds a run", "--resume", "--overwrite")
    assert snapshot(out.parent) == before
    result = collect(source, out, fake, "--overwrite", "--limit", "2")
    assert result.exit_code == 0, result.output
    assert len(list(jsonl.read_rows(out))) == 2
    assert len(list(jsonl.read_rows(out.with_name("r_materialized_inputs.jsonl")))) == 2


@pytest.mark.parametrize(
    ("row", "extra", "needle"),
    [
        (b"{not json\n", (), "in.jsonl:7"),
        (jsonl.dumps({"expected_answer": "2"}), (), "responses_create_params"),
        (b"", ("+num_repeats=0",), "num_repeats"),
    ],
)
def test_collect_overwrite_that_fails_validation_keeps_the_old_run(
    tmp_path: Path, fake: FakeUrls, row: bytes, extra: tuple[str, ...], needle: str
) -> None:
    """--overwrite with bad input is refused before the old run loses a byte."""
    source = write_input(tmp_path / "in.jsonl")
    out = tmp_path / "run" / "r.jsonl"
    assert collect(source, out, fake).exit_code == 0
    before = snapshot(out.parent)
    with open(source, "ab") as f:
        f.write(row)
    refused(collect(source, out, fake, "--overwrite", *extra), needle)
    assert snapshot(out.parent) == before


def test_collect_refuses_a_symlinked_lock_and_leaves_its_target(
    tmp_path: Path, fake: FakeUrls
) -> None:
    """OUT.lock planted as a link to someone's file: refused; the file keeps its bytes."""
    source = write_input(tmp_path / "in.jsonl")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "r.lock").symlink_to(victim)
    before = snapshot(tmp_path, tmp_path / "run")
    for extra in ((), ("--resume",), ("--overwrite",)):
        refused(collect(source, tmp_path / "run" / "r.jsonl", fake, *extra), "is a symlink")
    assert snapshot(tmp_path, tmp_path / "run") == before


@pytest.mark.parametrize("name", ["r.jsonl", "r_failures.jsonl", "r_attempts.jsonl"])
def test_resume_refuses_symlinked_run_files_and_leaves_their_targets(
    tmp_path: Path, fake: FakeUrls, name: str
) -> None:
    """A run file replaced by a link (with a torn tail behind it) is never appended or cut."""
    source = write_input(tmp_path / "in.jsonl")
    out = tmp_path / "run" / "r.jsonl"
    assert collect(source, out, fake, "--limit", "3").exit_code == 0
    victim = tmp_path / "victim.jsonl"
    sibling = out.parent / name
    victim.write_bytes((sibling.read_bytes() if sibling.exists() else b"") + b'{"torn": ')
    sibling.unlink(missing_ok=True)
    sibling.symlink_to(victim)
    before = snapshot(tmp_path, out.parent)
    for extra in (("--resume",), ("--overwrite",)):
        refused(collect(source, out, fake, *extra), "is a symlink")
    refused(invoke("resume", str(out), "--progress", "plain"), "is a symlink")
    assert snapshot(tmp_path, out.parent) == before


def test_refused_resume_leaves_the_folder_byte_for_byte(tmp_path: Path, fake: FakeUrls) -> None:
    """A resume refused for a changed input does not even repair the torn tail."""
    source = write_input(tmp_path / "in.jsonl")
    out = tmp_path / "run" / "r.jsonl"
    assert collect(source, out, fake).exit_code == 0
    with open(out, "ab") as f:
        f.write(b'{"_ng_task_index": 9, "tor')
    write_input(source, rows=7)  # changed since the run began
    before = snapshot(out.parent)
    refused(collect(source, out, fake, "--resume"), "the input file")
    assert snapshot(out.parent) == before


def test_collect_refuses_a_fifo_as_output(tmp_path: Path, fake: FakeUrls) -> None:
    """A FIFO at -o is not a file trollout made: refused, still a FIFO, nothing beside it."""
    source = write_input(tmp_path / "in.jsonl")
    (tmp_path / "run").mkdir()
    fifo = tmp_path / "run" / "r.jsonl"
    os.mkfifo(fifo)
    refused(collect(source, fifo, fake), "is a FIFO")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in fifo.parent.iterdir()) == ["r.jsonl"]


def test_collect_refuses_a_device_as_output(tmp_path: Path, fake: FakeUrls) -> None:
    """A character device at -o (our own node, never the machine's) stays a device."""
    source = write_input(tmp_path / "in.jsonl")
    (tmp_path / "run").mkdir()
    device = tmp_path / "run" / "null"
    try:
        os.mknod(device, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("making a device node needs root (CAP_MKNOD)")
    refused(collect(source, device, fake), "is a character device")
    assert stat.S_ISCHR(os.lstat(device).st_mode)
    assert sorted(p.name for p in device.parent.iterdir()) == ["null"]


def test_collect_refuses_directories_where_run_files_go(tmp_path: Path, fake: FakeUrls) -> None:
    """A directory at -o (click's usage error) or at a sidecar's path is refused, left alone."""
    source = write_input(tmp_path / "in.jsonl")
    (tmp_path / "run" / "r.jsonl").mkdir(parents=True)
    result = collect(source, tmp_path / "run" / "r.jsonl", fake)
    assert result.exit_code == 2
    assert "is a directory" in result.stderr
    (tmp_path / "run" / "r.jsonl").rmdir()
    (tmp_path / "run" / "r_batch_status.json").mkdir()
    refused(collect(source, tmp_path / "run" / "r.jsonl", fake), "is a directory")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["r_batch_status.json"]


def test_resume_of_a_folder_without_a_run_refuses_its_inputs_file_as_input(
    tmp_path: Path, fake: FakeUrls
) -> None:
    """Only the materialized inputs are left (killed before the manifest, or a NeMo Gym shard
    with no row yet): naming them as the input of a resume is refused, as a fresh run would
    plan them again and replace them."""
    source = write_input(tmp_path / "in.jsonl", rows=4)
    out = tmp_path / "run" / "r.jsonl"
    assert collect(source, out, fake).exit_code == 0
    inputs = out.with_name("r_materialized_inputs.jsonl")
    for path in out.parent.iterdir():
        if path != inputs:
            path.unlink()
    before = snapshot(out.parent)
    refused(collect(inputs, out, fake, "--resume", "--num-repeats", "2"), "is the run file")
    assert snapshot(out.parent) == before


def test_resume_may_name_its_own_materialized_inputs_as_input(
    tmp_path: Path, fake: FakeUrls
) -> None:
    """A folder holding a run without a manifest (as NeMo Gym leaves it) resumes from its own
    inputs file, which it reads and never replaces."""
    source = write_input(tmp_path / "in.jsonl", rows=4)
    out = tmp_path / "run" / "r.jsonl"
    assert collect(source, out, fake, "--num-repeats", "2").exit_code == 0
    out.with_name("r_manifest.json").unlink()
    rows = out.read_bytes().splitlines(keepends=True)
    out.write_bytes(b"".join(rows[:5]))  # three rollouts still to collect
    inputs = out.with_name("r_materialized_inputs.jsonl")
    before = inputs.read_bytes()
    result = collect(inputs, out, fake, "--resume", "--allow-unsafe-resume")
    assert result.exit_code == 0, result.output
    assert inputs.read_bytes() == before
    assert len(list(jsonl.read_rows(out))) == 8
