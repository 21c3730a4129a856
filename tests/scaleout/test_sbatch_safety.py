"""``trollout sbatch`` in careless or hostile hands: nothing destroyed, nothing injected.

The script is never written over a file the run reads or writes, through a link, or over an
existing file without ``--overwrite-script``; the run gets collect's own checks before a script
exists; and no value given (options, paths, collect arguments) can become a line or a command of
the script, which the last test shows by running a script made of hostile values under bash as
Slurm would, against the fake deployment.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from builders import HANG_GUARD_S, invoke, read_jsonl, write_tasks_input
from trollout.testing import FakeUrls


def one_error_line(result: object, *needles: str) -> str:
    """Assert exit 2 with one ``trollout: error:`` line holding every needle; return it."""
    output = result.output  # type: ignore[attr-defined]
    assert result.exit_code == 2, output  # type: ignore[attr-defined]
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert lines[0].startswith("trollout: error:"), output
    for needle in needles:
        assert needle in lines[0], output
    return str(lines[0])


def make_script(tmp_path: Path, *extra: str, source: Path | None = None) -> object:
    """Run ``sbatch --shards 2`` on a 3-task input into runs/eval.jsonl."""
    source = source or write_tasks_input(tmp_path / "tasks.jsonl", 3)
    out = tmp_path / "runs" / "eval.jsonl"
    return invoke("sbatch", "--shards", "2", *extra, str(source), "-o", str(out), "--agent", "a")


@pytest.mark.parametrize(
    ("target", "named"),
    [
        ("tasks.jsonl", "the input"),
        ("runs/eval.jsonl", "a file of the merged run"),
        ("runs/eval_failures.jsonl", "a file of the merged run"),
        ("runs/eval_materialized_inputs.jsonl", "a file of the merged run"),
        ("runs/../tasks.jsonl", "the input"),
        ("hardlink.jsonl", "the input"),
        ("runs/eval_shards/00000-of-00002/job.sh", "inside the shards folder"),
    ],
)
def test_sbatch_refuses_a_script_path_the_run_reads_or_writes(
    tmp_path: Path, target: str, named: str
) -> None:
    """--script IN (the dataset replaced by a shell script before), OUT, a run file, the input
    by another name or a hard link, a file in the shards folder: exit 2, one line, untouched."""
    source = write_tasks_input(tmp_path / "tasks.jsonl", 3)
    before = source.read_bytes()
    (tmp_path / "runs").mkdir()
    os.link(source, tmp_path / "hardlink.jsonl")
    result = make_script(tmp_path, "--script", str(tmp_path / target), "--overwrite-script")
    one_error_line(result, named, "choose another --script path")
    assert source.read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == []


def test_sbatch_refuses_a_symlinked_script_even_with_overwrite(tmp_path: Path) -> None:
    """--script through a link (to someone's file): refused; the link's target is untouched."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    link = tmp_path / "job.sh"
    link.symlink_to(victim)
    for extra in ((), ("--overwrite-script",)):
        one_error_line(make_script(tmp_path, "--script", str(link), *extra), "is a symlink")
    assert victim.read_text() == "precious\n"
    assert link.is_symlink()


@pytest.mark.parametrize(
    ("kind", "needles"),
    [
        ("link", ("is a symlink; trollout never writes through links", "remove the link, or")),
        ("file", ("is a regular file, not a directory trollout made", "written into")),
    ],
)
def test_sbatch_refuses_a_shards_folder_that_is_a_link_or_a_file_by_the_one_rule(
    tmp_path: Path, kind: str, needles: tuple[str, ...]
) -> None:
    """<stem>_shards as a symlink or a file: refused by the rule every path trollout writes
    gets (the --script file's, the run files'): what the path is, and the same remedy."""
    script = tmp_path / "job.sh"
    root = tmp_path / "runs" / "eval_shards"
    root.parent.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if kind == "link":
        root.symlink_to(elsewhere)
    else:
        root.write_text("")
    result = make_script(tmp_path, "--script", str(script))
    one_error_line(result, f"the shards folder {str(root)!r}", *needles, "choose another output")
    assert not script.exists()
    assert not any(elsewhere.iterdir())


def test_sbatch_refuses_an_existing_script_unless_asked_and_then_replaces_it_atomically(
    tmp_path: Path,
) -> None:
    """An existing --script file is kept (exit 2 naming --overwrite-script); with the flag it
    is replaced whole, leaving no temp file beside it."""
    script = tmp_path / "job.sh"
    script.write_text("an older script\n")
    one_error_line(make_script(tmp_path, "--script", str(script)), "already exists", "--overwrite")
    assert script.read_text() == "an older script\n"
    made = make_script(tmp_path, "--script", str(script), "--overwrite-script")
    assert made.exit_code == 0, made.output  # type: ignore[attr-defined]
    assert script.read_text().startswith("#!/bin/bash\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.sh", "runs", "tasks.jsonl"]
    # beside the script only the (empty) folder Slurm appends the tasks' logs to, made now
    # because Slurm opens --output before the task runs and does not make its folder
    logs = tmp_path / "runs" / "eval_shards" / "logs"
    assert [p for p in (tmp_path / "runs").rglob("*") if p.is_file()] == []
    assert logs.is_dir()


def test_sbatch_runs_the_checks_collect_runs_before_writing_anything(tmp_path: Path) -> None:
    """A missing input, an input that is a folder, a shard or merged run file that is a link:
    sbatch refuses each with collect's own line (exit 2), and writes no script."""
    script = tmp_path / "job.sh"
    out = tmp_path / "runs" / "eval.jsonl"
    missing = tmp_path / "nowhere.jsonl"
    collect = invoke("collect", str(missing), "-o", str(out), "--agent-url", "a=http://127.0.0.1:9")
    line = one_error_line(collect, "cannot read the input file")
    refused = make_script(tmp_path, "--script", str(script), source=missing)
    assert one_error_line(refused, "cannot read the input file") == line
    (tmp_path / "folder.jsonl").mkdir()
    refused = make_script(tmp_path, "--script", str(script), source=tmp_path / "folder.jsonl")
    one_error_line(refused, "is a directory")
    shard = tmp_path / "runs" / "eval_shards" / "00001-of-00002"
    shard.mkdir(parents=True)
    (tmp_path / "elsewhere.jsonl").write_text("")
    (shard / "eval_failures.jsonl").symlink_to(tmp_path / "elsewhere.jsonl")
    one_error_line(make_script(tmp_path, "--script", str(script)), "00001-of-00002", "symlink")
    (shard / "eval_failures.jsonl").unlink()
    (tmp_path / "runs" / "eval_failures.jsonl").symlink_to(tmp_path / "elsewhere.jsonl")
    one_error_line(make_script(tmp_path, "--script", str(script)), "eval_failures", "symlink")
    assert not script.exists()


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--time", "1:00:00\n#SBATCH --uid=0"], "the #SBATCH option '--time=1:00:00\\n#SBATCH"),
        (["--partition", "gpu\ntouch MARKER"], "the #SBATCH option '--partition=gpu\\ntouch"),
        (["--job-name", "x\rtouch MARKER"], "the #SBATCH option '--job-name=x\\r"),
        (["--sbatch-option", "--mem=8G\n#SBATCH --uid=0"], "'--mem=8G\\n#SBATCH --uid=0'"),
        (["+responses_create_params={x: 'a\ntouch MARKER'}"], "the collect argument"),
    ],
)
def test_sbatch_refuses_a_control_character_in_any_value_it_writes(
    tmp_path: Path, extra: list[str], named: str
) -> None:
    """A newline (or CR, or any control character) would start a line bash or Slurm obeys:
    exit 2, one line naming the value (escaped), no script written."""
    script = tmp_path / "job.sh"
    one_error_line(make_script(tmp_path, "--script", str(script), *extra), named, "control")
    assert not script.exists()


def test_sbatch_refuses_paths_with_a_newline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An output path or a working directory holding a newline is refused the same way."""
    source = write_tasks_input(tmp_path / "tasks.jsonl", 3)
    out = tmp_path / "runs\ntouch MARKER" / "eval.jsonl"
    result = invoke("sbatch", "--shards", "2", str(source), "-o", str(out), "--agent", "a")
    one_error_line(result, "the output path", "control character")
    odd = tmp_path / "cwd\ntouch MARKER"
    odd.mkdir()
    monkeypatch.chdir(odd)
    result = invoke("sbatch", "--shards", "2", str(source), "-o", str(tmp_path / "o.jsonl"))
    one_error_line(result, "the working directory", "control character")


def sbatch_arguments(script: str) -> list[list[str]]:
    """Return each ``#SBATCH`` line's words, split as Slurm's directive parser splits them."""
    return [
        shlex.split(line[len("#SBATCH ") :])
        for line in script.splitlines()
        if line.startswith("#SBATCH ")
    ]


def test_hostile_values_never_run_under_bash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake: FakeUrls
) -> None:
    """Shell syntax in every value (options, the input and output paths): each #SBATCH option
    stays one word, and the job run under bash as Slurm runs it collects its shard (exit 0)
    with the paths as given, while no injected ``touch MARKER`` ever runs."""
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "in $(touch MARKER) 'q'"
    folder.mkdir()
    source = write_tasks_input(folder / "tasks `touch MARKER`.jsonl", 4)
    out = tmp_path / "out;touch MARKER" / "eval $(touch MARKER).jsonl"
    hostile = {
        "--time": "1:00:00 --uid=0",
        "--partition": "gpu;touch MARKER",
        "--job-name": "$(touch MARKER)",
        "--sbatch-option": "--comment=`touch MARKER` 'x' \"y\" #z",
    }
    script = tmp_path / "job.sh"
    made = invoke(
        "sbatch", "--shards", "1", "--script", str(script),
        *(item for pair in hostile.items() for item in pair),
        str(source), "-o", str(out), "--head-server", fake.head_url, "--agent", "math_agent",
        "--concurrency", "2",
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    text = script.read_text()
    words = sbatch_arguments(text)
    for name, value in hostile.items():
        option = value if name == "--sbatch-option" else f"{name}={value}"
        assert [option] in words, text
    assert [f"--chdir={tmp_path}"] in words
    env = {**os.environ, "SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "0"}
    env |= {"SLURM_ARRAY_TASK_COUNT": "1", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "0"}
    job = subprocess.run(
        ["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=HANG_GUARD_S, check=False,
    )  # fmt: skip
    assert job.returncode == 0, job.stderr
    shard = out.with_name("eval $(touch MARKER)_shards") / "00000-of-00001" / out.name
    assert len(read_jsonl(shard)) == 4
    assert not (tmp_path / "MARKER").exists()
    assert not list(tmp_path.rglob("MARKER"))
