"""``trollout aggregate`` refuses before it touches, and never writes what it did not make.

Real runs: the shards are what ``collect`` writes against the fake deployment (collected once
per module, copied per test), and every aggregation goes through the command line.
"""

from __future__ import annotations

import array
import fcntl
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest
from click.testing import Result

from builders import invoke, read_jsonl, write_jsonl
from trollout.recovery.layout import RunLayout
from trollout.recovery.lock import RunLock
from trollout.testing import AgentSpec, DeploymentSpec, spawn_fake_deployment, task_rows

RUNS = ("r1", "r5", "r6")
MANIFEST = {"schema_version": "1", "members": {"math": {"agent_name": "math_agent"}}}


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Collect three runs of 3 tasks each (r1, r5, r6: other tasks each), once."""
    root = tmp_path_factory.mktemp("collected")
    with spawn_fake_deployment(DeploymentSpec(agents=(AgentSpec(name="math_agent"),))) as urls:
        for seed, run in enumerate(RUNS):
            source = write_jsonl(root / f"{run}.in.jsonl", list(task_rows(3, seed=seed)))
            result = invoke(
                "collect", str(source), "-o", str(root / run / "out.jsonl"),
                "--head-server", urls.head_url, "--progress", "plain",
                "+agent_name=math_agent", "+disable_aggregation=true",
            )  # fmt: skip
            assert result.exit_code == 0, result.output
    return root


@pytest.fixture
def runs(collected: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the collected runs as the working directory (paths as a user types them)."""
    shutil.copytree(collected, tmp_path, dirs_exist_ok=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def aggregate(*args: str) -> Result:
    """Run ``trollout aggregate ARGS --no-report``."""
    return invoke("aggregate", *args, "--no-report")


def error_line(result: Result) -> str:
    """Return the single ``trollout: error:`` line of a refused command (exit code 2)."""
    assert result.exit_code == 2, result.output
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("trollout: error:")]
    return line


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder``, by relative path, with its content."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_aggregate_refuses_to_replace_a_file_it_did_not_write(runs: Path) -> None:
    """-o naming a user's file exits 2 naming it and --overwrite; nothing is written."""
    shutil.copy("r1.in.jsonl", "userdata.jsonl")
    before = snapshot(runs)
    line = error_line(aggregate("r1/out.jsonl", "-o", "userdata.jsonl"))
    assert "'userdata.jsonl'" in line
    assert "--overwrite" in line
    assert snapshot(runs) == before
    assert aggregate("r1/out.jsonl", "-o", "userdata.jsonl", "--overwrite").exit_code == 0
    assert len(read_jsonl(Path("userdata.jsonl"))) == 3
    shutil.copy("r1.in.jsonl", "user2.jsonl")
    assert aggregate("r1/out.jsonl", "-o", "user2.jsonl", "+overwrite=true").exit_code == 0


def test_aggregate_refuses_to_replace_or_delete_a_users_sibling(runs: Path) -> None:
    """A user's file where a merged sidecar goes is neither replaced nor deleted."""
    Path("m").mkdir()
    Path("m/merged_failures.jsonl").write_text('{"mine": 1}\n')
    line = error_line(aggregate("r1/out.jsonl", "-o", "m/merged.jsonl"))
    assert "'m/merged_failures.jsonl'" in line
    assert Path("m/merged_failures.jsonl").read_text() == '{"mine": 1}\n'
    assert not Path("m/merged.jsonl").exists()


def test_aggregate_never_writes_through_a_link_at_the_output(runs: Path) -> None:
    """A symlink at -o is not replaced, not even with --overwrite; its target is untouched."""
    shutil.copy("r1.in.jsonl", "userdata.jsonl")
    os.symlink("userdata.jsonl", "link.jsonl")
    line = error_line(aggregate("r1/out.jsonl", "-o", "link.jsonl", "--overwrite"))
    assert "'link.jsonl'" in line
    assert Path("link.jsonl").is_symlink()
    assert Path("userdata.jsonl").read_bytes() == Path("r1.in.jsonl").read_bytes()


def test_aggregate_reruns_into_its_own_output(runs: Path) -> None:
    """The same aggregation, and another one, may replace an output aggregate wrote."""
    assert aggregate("r1/out.jsonl", "-o", "m/merged.jsonl").exit_code == 0
    result = aggregate("r1/out.jsonl", "r5/out.jsonl", "-o", "m/merged.jsonl", "--json")
    assert result.exit_code == 0, result.output
    assert orjson.loads(result.stdout)["coverage"]["expected"] == 6


def test_aggregate_refuses_a_plan_that_is_an_output(runs: Path) -> None:
    """+materialized_inputs_jsonl_fpath naming a merged output file is refused, not replaced."""
    assert aggregate("r1/out.jsonl", "-o", "m/merged.jsonl").exit_code == 0
    plan = Path("m/merged_materialized_inputs.jsonl")
    before = plan.read_bytes()
    line = error_line(
        aggregate(
            "r1/out.jsonl", "-o", "m/merged.jsonl", f"+materialized_inputs_jsonl_fpath={plan}"
        )
    )
    assert str(plan) in line
    assert plan.read_bytes() == before


@pytest.mark.parametrize("link", ["none", "symlink", "hardlink"])
def test_aggregate_refuses_a_batch_manifest_its_status_would_replace(runs: Path, link: str) -> None:
    """A manifest that is batch_status.json (by name, symlink or hard link) is left alone."""
    Path("bm").mkdir()
    manifest = Path("bm/batch_status.json" if link == "none" else "bm/manifest.json")
    manifest.write_bytes(orjson.dumps(MANIFEST))
    if link == "symlink":
        os.symlink(manifest.name, "bm/batch_status.json")
    elif link == "hardlink":
        os.link(manifest, "bm/batch_status.json")
    before = snapshot(runs)
    line = error_line(
        aggregate("r1/out.jsonl", "-o", "m5/m.jsonl", f"+batch_manifest_fpath={manifest}")
    )
    assert "batch_status.json" in line
    assert snapshot(runs) == before
    assert not Path("m5").exists()


def test_aggregate_writes_the_batch_status_beside_a_manifest(runs: Path) -> None:
    """A manifest with another name gets batch_status.json beside it, as before."""
    Path("bm").mkdir()
    Path("bm/manifest.json").write_bytes(orjson.dumps(MANIFEST))
    result = aggregate("r1/out.jsonl", "-o", "m/m.jsonl", "+batch_manifest_fpath=bm/manifest.json")
    assert result.exit_code == 0, result.output
    status = orjson.loads(Path("bm/batch_status.json").read_bytes())
    assert status["members"]["math_agent"]["completed_rollout_count"] == 3
    assert orjson.loads(Path("bm/manifest.json").read_bytes()) == MANIFEST


_FS_IOC_GETFLAGS, _FS_IOC_SETFLAGS, _FS_IMMUTABLE_FL = 0x80086601, 0x40086602, 0x10


def _set_immutable(folder: Path, on: bool) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        flags = array.array("i", [0])
        fcntl.ioctl(fd, _FS_IOC_GETFLAGS, flags, True)
        flags[0] = flags[0] | _FS_IMMUTABLE_FL if on else flags[0] & ~_FS_IMMUTABLE_FL
        fcntl.ioctl(fd, _FS_IOC_SETFLAGS, flags)
    finally:
        os.close(fd)


@contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """Make ``folder`` unwritable: mode 0o555, and for root the immutable flag if it can.

    Skips the test when neither works (root on a file system without the flag).
    """
    folder.chmod(0o555)
    immutable = False
    try:
        if os.access(folder, os.W_OK):
            try:
                _set_immutable(folder, True)
                immutable = True
            except OSError:
                pass
        if os.access(folder, os.W_OK):
            pytest.skip("cannot make a folder read-only here (root without the immutable flag)")
        yield
    finally:
        if immutable:
            _set_immutable(folder, False)
        folder.chmod(0o755)


def test_aggregate_skips_a_read_only_shard_folder_with_a_warning(runs: Path) -> None:
    """A shard folder that cannot be written: merged anyway, one warning, status untouched."""
    status = RunLayout.for_output(Path("r5/out.jsonl")).batch_status
    before = status.read_bytes()
    with read_only(runs / "r5"):
        result = aggregate("r1/out.jsonl", "r5/out.jsonl", "-o", "m/merged.jsonl")
        assert status.read_bytes() == before
    assert result.exit_code == 0, result.output
    (warning,) = [x for x in result.stderr.splitlines() if x.startswith("trollout: warning:")]
    assert "'r5'" in warning
    assert "not writable" in warning
    assert len(read_jsonl(Path("m/merged.jsonl"))) == 6
    refreshed = orjson.loads(Path("r1/out_batch_status.json").read_bytes())
    assert refreshed["aggregation_status"] == "ok"
    assert refreshed["completed"] == 3


def test_aggregate_skips_a_shard_whose_run_is_locked(runs: Path) -> None:
    """A shard folder a collector holds: merged anyway, one warning, its status left to it."""
    layout = RunLayout.for_output(Path("r5/out.jsonl"))
    before = layout.batch_status.read_bytes()
    with RunLock.for_layout(layout):
        result = aggregate("r1/out.jsonl", "r5/out.jsonl", "-o", "m/merged.jsonl")
    assert result.exit_code == 0, result.output
    (warning,) = [x for x in result.stderr.splitlines() if x.startswith("trollout: warning:")]
    assert "'r5/out.jsonl'" in warning
    assert "lock" in warning
    assert layout.batch_status.read_bytes() == before
    assert "aggregation_status" in orjson.loads(Path("r1/out_batch_status.json").read_bytes())


def test_aggregate_takes_input_glob_from_config_paths(runs: Path) -> None:
    """input_glob in a config_paths file is read; INPUT on the command line wins, with a note."""
    Path("agg.yaml").write_text("input_glob: r6/out.jsonl\noutput_jsonl_fpath: m/merged.jsonl\n")
    result = aggregate("+config_paths=[agg.yaml]", "--json")
    assert result.exit_code == 0, result.output
    assert orjson.loads(result.stdout)["inputs"]["shards"] == ["r6/out.jsonl"]
    result = aggregate("r5/out.jsonl", "+config_paths=[agg.yaml]", "--json")
    assert result.exit_code == 0, result.output
    assert orjson.loads(result.stdout)["inputs"]["shards"] == ["r5/out.jsonl"]
    assert "input_glob 'r6/out.jsonl'" in result.stderr


def test_aggregate_command_line_beats_config_paths(runs: Path) -> None:
    """-o and the count-as-zero options win over a config_paths file; +key=value wins too."""
    Path("agg.yaml").write_text(
        "output_jsonl_fpath: cfg/merged.jsonl\ncount_missing_rollouts_as_zero: false\n"
    )
    plan = write_jsonl(Path("plan.jsonl"), read_jsonl(Path("r1/out_materialized_inputs.jsonl")))
    extra = read_jsonl(plan)[0] | {"_ng_task_index": 9, "responses_create_params": {"input": "x"}}
    write_jsonl(plan, [*read_jsonl(plan), extra])
    result = aggregate(
        "r1/out.jsonl", "-o", "cli/merged.jsonl", "--count-missing-rollouts-as-zero",
        "+config_paths=[agg.yaml]", f"+materialized_inputs_jsonl_fpath={plan}", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert Path("cli/merged.jsonl").is_file()
    assert not Path("cfg").exists()
    assert orjson.loads(result.stdout)["coverage"]["imputed"] == {"no row": 1}
    token = aggregate("r1/out.jsonl", "+config_paths=[agg.yaml]", "+output_jsonl_fpath=t/m.jsonl")
    assert token.exit_code == 0
    assert Path("t/m.jsonl").is_file()
