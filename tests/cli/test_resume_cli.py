"""`collect --resume`, `resume` and `resubmit` from the command line: refusals and reuse."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from builders import invoke, without_hanging
from trollout import jsonl
from trollout.testing import AgentSpec, DeploymentSpec, FakeUrls, task_rows

SPEC = DeploymentSpec(
    agents=(AgentSpec(name="math_agent"), AgentSpec(name="string_agent")), record_runs=False
)


@pytest.fixture(scope="module")
def fake_spec() -> DeploymentSpec:
    """Unlike the shared fake's: two agents, no detailed /run log (record_runs=False)."""
    return SPEC


def first_run(tmp_path: Path, fake: FakeUrls, *extra: str) -> tuple[Path, Path]:
    """Collect 6 tasks through math_agent's URL only; return (input, output)."""
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"".join(jsonl.dumps(r) for r in task_rows(6, seed=2)))
    out = tmp_path / "run" / "r.jsonl"
    result = invoke("collect", str(source), "-o", str(out), "--agent", "math_agent",
                    "--agent-url", f"math_agent={fake.run_urls['math_agent']}",
                    "--progress", "plain", *extra)  # fmt: skip
    assert result.exit_code == 0, result.output
    return source, out


def resume_collect(source: Path, out: Path, fake: FakeUrls, *extra: str) -> Result:
    """Run collect --resume on the same input and output."""
    return invoke("collect", str(source), "-o", str(out), "--agent", "math_agent",
                  "--agent-url", f"math_agent={fake.run_urls['math_agent']}",
                  "--progress", "plain", "--resume", *extra)  # fmt: skip


def errors(result: Result) -> list[str]:
    """Return the non-blank stderr lines."""
    return [line for line in result.stderr.splitlines() if line.strip()]


def test_resume_cli_changed_input_exits_2_naming_it(tmp_path: Path, fake: FakeUrls) -> None:
    """A changed input file: exit 2, one line naming the file; unsafe resume proceeds."""
    source, out = first_run(tmp_path, fake)
    with open(source, "ab") as f:
        f.write(jsonl.dumps(next(task_rows(1, seed=9))))
    result = resume_collect(source, out, fake)
    assert result.exit_code == 2, result.output
    assert len(errors(result)) == 1
    assert "the input file" in errors(result)[0]
    assert "in.jsonl" in errors(result)[0]
    assert "--allow-unsafe-resume" in errors(result)[0]
    assert "Traceback" not in result.output
    result = resume_collect(source, out, fake, "--allow-unsafe-resume")
    assert result.exit_code == 0, result.output
    assert "resumed: 6 of 6 rollouts were done" in result.stdout


def test_resume_cli_changed_num_repeats_exits_2(tmp_path: Path, fake: FakeUrls) -> None:
    """Changing num_repeats (as +num_repeats=2) is refused naming the setting."""
    source, out = first_run(tmp_path, fake)
    result = resume_collect(source, out, fake, "+num_repeats=2")
    assert result.exit_code == 2, result.output
    assert "num_repeats 1 -> 2" in errors(result)[0]
    result = invoke("collect", str(source), "-o", str(out), "--agent", "math_agent",
                    "--agent-url", f"math_agent={fake.run_urls['math_agent']}",
                    "+resume_from_cache=true", "--num-repeats", "2")  # fmt: skip
    assert result.exit_code == 2, result.output


def test_resume_cli_changed_agent_set_exits_2(tmp_path: Path, fake: FakeUrls) -> None:
    """A deployment with another agent set is refused naming the agent added."""
    source, out = first_run(tmp_path, fake)
    result = resume_collect(
        source, out, fake, "--agent-url", f"string_agent={fake.run_urls['string_agent']}"
    )
    assert result.exit_code == 2, result.output
    assert "agents added: string_agent" in errors(result)[0]
    result = resume_collect(
        source,
        out,
        fake,
        "--allow-unsafe-resume",
        "--agent-url",
        f"string_agent={fake.run_urls['string_agent']}",
    )
    assert result.exit_code == 0, result.output
    assert "agents added: string_agent" in result.stderr  # the warning names it


def test_resume_cli_resume_reuses_saved_settings(tmp_path: Path, fake: FakeUrls) -> None:
    """`trollout resume RUN` needs no input or deployment argument; the second finds it done."""
    _source, out = first_run(tmp_path, fake, "--num-repeats", "2")
    out.write_bytes(b"".join(out.read_bytes().splitlines(keepends=True)[:5]))  # lose 7 rows
    result = invoke("resume", str(out), "--progress", "plain")
    assert result.exit_code == 0, result.output
    assert "resumed: 5 of 12 rollouts were done (5 landed); dispatched 7" in result.stdout
    rows = list(jsonl.read_rows(out))
    assert len(rows) == 12
    assert len({(r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows}) == 12
    lost = list(rows[5:])
    assert all(r["_ng_attempt_index"] == 1 for r in lost)  # attempt 0 is on record
    result = invoke("resume", str(out.parent), "+num_repeats=3")
    assert result.exit_code == 2
    assert "num_repeats 2 -> 3" in result.stderr


def test_resume_cli_without_manifest_names_the_way_forward(tmp_path: Path, fake: FakeUrls) -> None:
    """`trollout resume` on a folder without a manifest exits 2 and suggests collect --resume."""
    _, out = first_run(tmp_path, fake)
    out.with_name("r_manifest.json").unlink()
    result = invoke("resume", str(out))
    assert result.exit_code == 2
    assert "--resume --allow-unsafe-resume" in result.stderr


def test_resume_cli_resubmit_by_class(tmp_path: Path, fake: FakeUrls) -> None:
    """resubmit --class sends only rollouts whose latest failure has that class."""
    rows: list[dict[str, Any]] = list(task_rows(4, seed=3))
    rows[0]["fake_fault"] = {"kind": "failure_class", "failure_class": "skipped",
                             "terminal": True, "attempts": [0]}  # fmt: skip
    rows[1]["fake_fault"] = {"kind": "status", "status": 500}
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"".join(jsonl.dumps(r) for r in rows))
    out = tmp_path / "r.jsonl"
    url = f"math_agent={fake.run_urls['math_agent']}"
    assert invoke("collect", str(source), "-o", str(out), "--agent", "math_agent",
                  "--agent-url", url, "--max-attempts", "1").exit_code == 0  # fmt: skip
    result = invoke("resubmit", str(out), "--class", "skipped")
    assert result.exit_code == 0, result.output
    assert "dispatched 1" in result.stdout
    landed = sorted(r["_ng_task_index"] for r in jsonl.read_rows(out))
    assert landed == [0, 2, 3]


def test_resume_cli_fifo_input_exits_2_without_opening_it(tmp_path: Path, fake: FakeUrls) -> None:
    """A resume whose input is now a FIFO is refused at once (it is never opened, so nothing
    blocks), one line naming it; the folder is left as it was."""
    source, out = first_run(tmp_path, fake)
    source.unlink()
    os.mkfifo(source)
    before = {p.name: p.read_bytes() for p in out.parent.iterdir()}
    result = without_hanging(lambda: resume_collect(source, out, fake), source)
    assert result.exit_code == 2, result.output
    assert errors(result) == [
        f"trollout: error: {source}: the input is a pipe or FIFO, not a regular file; pass the "
        "JSONL file the run was planned from"
    ]
    assert {p.name: p.read_bytes() for p in out.parent.iterdir()} == before


def test_resume_cli_no_retry_failed_sends_only_what_never_finished(
    tmp_path: Path, fake: FakeUrls
) -> None:
    """``--no-retry-failed`` (what a requeued Slurm task runs): the retryable failure of the
    first session is kept, not sent again; a plain resume sends it (and it lands)."""
    rows: list[dict[str, Any]] = list(task_rows(4, seed=3))
    rows[1]["fake_fault"] = {"kind": "status", "status": 500, "attempts": [0]}
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"".join(jsonl.dumps(r) for r in rows))
    out = tmp_path / "r.jsonl"
    url = f"math_agent={fake.run_urls['math_agent']}"
    first = invoke("collect", str(source), "-o", str(out), "--agent", "math_agent",
                   "--agent-url", url, "--max-attempts", "3", "+max_request_retries=0")  # fmt: skip
    assert first.exit_code == 0, first.output
    assert sorted(r["_ng_task_index"] for r in jsonl.read_rows(out)) == [0, 2, 3]
    kept = invoke("resume", str(out), "--no-retry-failed")
    assert kept.exit_code == 0, kept.output
    assert "dispatched 0" in kept.stdout
    assert sorted(r["_ng_task_index"] for r in jsonl.read_rows(out)) == [0, 2, 3]
    retried = invoke("resume", str(out))
    assert retried.exit_code == 0, retried.output
    assert "dispatched 1" in retried.stdout
    assert sorted(r["_ng_task_index"] for r in jsonl.read_rows(out)) == [0, 1, 2, 3]
