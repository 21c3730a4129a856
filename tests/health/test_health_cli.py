"""``trollout health-check``, and the health step of ``collect``, ``aggregate`` and ``status``.

Real files and the bundled fake deployment (a real subprocess on loopback); NeMo Gym's messages
and exit codes (its ``gym eval health-check`` transcript) are the expectations.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from trollout.cli.main import cli
from trollout.testing import FakeUrls

FIXTURES = Path(__file__).parents[1] / "fixtures" / "health"
ROW = {
    "responses_create_params": {"input": [{"role": "user", "content": "What is 1 + 1?"}]},
    "expected_answer": "2",
    "agent_ref": {"name": "math_agent"},
}
HEALTH_FILES = ("quality_summary.json", "rollout_verdicts.jsonl")


def edited_run(folder: Path) -> Path:
    """A run folder holding NeMo Gym's hand-edited rollouts (every check flags something)."""
    folder.mkdir(parents=True, exist_ok=True)
    data = (FIXTURES / "edited_unhealthy" / "rollouts.jsonl.gz").read_bytes()
    (folder / "rollouts.jsonl").write_bytes(gzip.decompress(data))
    return folder


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_health_check_prints_the_two_lines_and_exits_0_on_unhealthy_rows(tmp_path: Path) -> None:
    run = edited_run(tmp_path / "run")
    ignore = "model_call_failed,rollout_ended_on_failed_model_call"
    result = invoke(
        "health-check",
        str(run),
        "--ignore-checks",
        ignore,
        "--ignore",
        "task_consistently_unhealthy",
    )
    assert result.exit_code == 0, result.output
    expected = (FIXTURES / "edited_unhealthy_ignore3" / "health_check.stdout").read_text()
    assert result.output.splitlines() == [
        expected.splitlines()[0],
        f"Quality summary: {run / 'quality_summary.json'}",
    ]
    assert all((run / name).is_file() for name in HEALTH_FILES)


def test_health_check_json_is_the_summary_on_one_line(tmp_path: Path) -> None:
    run = edited_run(tmp_path / "run")
    result = invoke(
        "health-check", str(run), "--json", "--ignore", "model_call_failed", "--workers", "1"
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len(lines) == 1
    expected = FIXTURES / "cli" / "ignore_model_call_failed.quality_summary.json"
    assert json.loads(lines[0]) == json.loads(expected.read_text())
    assert lines[0].startswith('{"run":{"ignored_checks":["model_call_failed"],"artifacts"')


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--ignore-checks", "no_such_check"), "Unknown rollout health check(s): no_such_check"),
        (("--rollouts-file", "other.jsonl"), "Rollout JSONL not found: {run}/other.jsonl"),
        (("+workers=2",), "health-check does not accept Hydra overrides"),
        (("--workers", "0"), "--workers must be >= 1 (got 0)"),
    ],
)
def test_health_check_bad_input_is_one_line_exit_2_nothing_written(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    run = edited_run(tmp_path / "run")
    result = invoke("health-check", str(run), *args)
    assert result.exit_code == 2
    assert result.output == f"trollout: error: {message.format(run=run)}\n"
    assert not any((run / name).exists() for name in HEALTH_FILES)


def test_health_check_names_a_missing_run_directory(tmp_path: Path) -> None:
    result = invoke("health-check", str(tmp_path / "does_not_exist"))
    assert result.exit_code == 2
    assert result.output == f"trollout: error: Run directory not found: {tmp_path}/does_not_exist\n"


def test_rerun_reproduces_the_files_byte_for_byte(tmp_path: Path) -> None:
    run = edited_run(tmp_path / "run")
    invoke("health-check", str(run))
    first = [(run / name).read_bytes() for name in HEALTH_FILES]
    invoke("health-check", str(run), "--workers", "2")
    assert [(run / name).read_bytes() for name in HEALTH_FILES] == first


def collect(tmp_path: Path, fake: FakeUrls, *extra: str) -> Result:
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(json.dumps(ROW) for _ in range(3)) + "\n")
    return invoke(
        "collect",
        str(source),
        "-o",
        str(tmp_path / "out" / "rollouts.jsonl"),
        "--head-server",
        fake.head_url,
        "--progress",
        "plain",
        "+num_repeats=2",
        *extra,
    )


def test_collect_ends_with_the_health_lines_and_files(tmp_path: Path, fake: FakeUrls) -> None:
    """Without observability the fake's rows carry no trajectory: all unobserved, as NeMo Gym."""
    result = collect(tmp_path, fake, "--health-check-ignore", "agent_turn_hollow")
    assert result.exit_code == 0, result.output
    out = tmp_path / "out"
    assert (
        "Rollout health: 6 checked, 0 healthy, 0 unhealthy, 6 unobserved "
        "(ignored: agent_turn_hollow)\n"
        f"Quality summary: {out / 'quality_summary.json'}\n"
    ) in result.output
    summary = json.loads((out / "quality_summary.json").read_text())
    assert summary["run"]["ignored_checks"] == ["agent_turn_hollow"]
    assert summary["run"]["artifacts"]["coverage"]["agent_turn_hollow"]["ignored"] == 6
    assert len((out / "rollout_verdicts.jsonl").read_text().splitlines()) == 6
    status = invoke("status", str(out / "rollouts.jsonl"))
    assert "rollout health      0 healthy, 0 unhealthy, 6 unobserved" in status.output
    report = (out / "rollouts_report.html").read_text()
    assert 'id="health"' in report
    assert 'href="rollout_verdicts.jsonl"' in report


@pytest.mark.parametrize("switch", [("--no-health-check",), ("+disable_health_check=true",)])
def test_collect_without_health_check_writes_no_health_files(
    tmp_path: Path, fake: FakeUrls, switch: tuple[str, ...]
) -> None:
    result = collect(tmp_path, fake, *switch)
    assert result.exit_code == 0, result.output
    assert "Rollout health" not in result.output
    assert not any((tmp_path / "out" / name).exists() for name in HEALTH_FILES)


def test_collect_refuses_an_unknown_check_before_dispatch(tmp_path: Path, fake: FakeUrls) -> None:
    result = collect(tmp_path, fake, "+health_check_ignored_checks=[rollout_turns]")
    assert result.exit_code == 2
    assert "Unknown rollout health check(s): rollout_turns" in result.output
    assert not (tmp_path / "out").exists()


def test_collect_takes_nemo_gyms_health_keys(tmp_path: Path, fake: FakeUrls) -> None:
    """+health_check_workers and +health_check_ignored_checks (a list) were refused before."""
    result = collect(
        tmp_path,
        fake,
        "+health_check_workers=2",
        "+health_check_ignored_checks=[model_call_failed,agent_turn_hollow]",
    )
    assert result.exit_code == 0, result.output
    assert "(ignored: agent_turn_hollow, model_call_failed)" in result.output


def test_aggregate_checks_the_merged_output(tmp_path: Path, fake: FakeUrls) -> None:
    assert collect(tmp_path, fake, "--no-health-check").exit_code == 0
    merged = tmp_path / "merged" / "all.jsonl"
    result = invoke("aggregate", str(tmp_path / "out" / "rollouts.jsonl"), "-o", str(merged))
    assert result.exit_code == 0, result.output
    assert f"Quality summary: {merged.parent / 'quality_summary.json'}" in result.output
    verdicts = (merged.parent / "rollout_verdicts.jsonl").read_text().splitlines()
    assert len(verdicts) == 6
    as_json = invoke(
        "aggregate", str(tmp_path / "out" / "rollouts.jsonl"), "-o", str(merged), "--json"
    )
    assert json.loads(as_json.stdout)["health"][0].startswith("Rollout health: 6 checked")


def test_a_failing_health_step_is_one_line_and_the_run_succeeds(tmp_path: Path) -> None:
    """The health step cannot write its files (a folder is where a file goes): one line."""
    from trollout.health import HealthSettings, run_after

    run = edited_run(tmp_path / "run")
    (run / "quality_summary.json").mkdir()
    report, lines = run_after([run / "rollouts.jsonl"], run, HealthSettings())
    assert report is None
    assert len(lines) == 1
    assert lines[0].startswith("Rollout health: not checked (")
