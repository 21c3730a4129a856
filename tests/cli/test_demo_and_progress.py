"""`trollout demo` end to end, and the progress display in both modes."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import trio
from click.testing import CliRunner

import trollout
from builders import materialized_rows, read_jsonl
from trollout.cli.main import cli
from trollout.cli.progress import ProgressReporter, format_duration
from trollout.collector.engine.collector import open_collector
from trollout.collector.http.transport import RawResponse
from trollout.settings import RunConfig

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def test_demo_collects_the_example_dataset_and_prints_metrics(tmp_path: Path) -> None:
    """The demo starts the fake deployment, collects, aggregates and prints the summary; its
    taskset goes to the episode server as episodes, shown as a group of its own."""
    out = tmp_path / "demo" / "rollouts.jsonl"
    result = CliRunner().invoke(
        cli,
        [
            "demo",
            str(FIXTURES / "example_tasks.jsonl"),
            "--spec",
            str(FIXTURES / "demo_deployment.yaml"),
            "-o",
            str(out),
            "--progress",
            "plain",
        ],
    )
    assert result.exit_code == 0, result.output + result.stderr
    assert "expected rollouts" in result.output
    assert "Metrics cover:" in result.output
    assert "mean reward" in result.output
    assert "puzzle_environm" in result.output  # the taskset's group in the metrics table
    status = json.loads(out.with_name("rollouts_batch_status.json").read_text())
    assert status["expected"] == 192  # (40 flat + 8 task rows) x 4 repeats
    assert status["finished"] is True
    assert out.with_name("rollouts_report.html").exists()
    materialized = read_jsonl(out.with_name("rollouts_materialized_inputs.jsonl"))
    episodes = [row for row in materialized if "task_id" in row]
    assert len(episodes) == 32
    assert {row["_ng_environment_server"] for row in episodes} == {"puzzle_environment_server"}
    landed = read_jsonl(out)
    assert any(row.get("_ng_task_id", {}).get("taskset") == "puzzles" for row in landed)


def test_demo_runs_from_any_directory_with_its_bundled_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``trollout demo`` with no arguments, run from a folder that is not the repository: the
    dataset and the spec are the package's own; the output goes under this folder."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["demo", "--progress", "plain"])
    assert result.exit_code == 0, result.output + result.stderr
    status = json.loads((tmp_path / "runs" / "demo" / "rollouts_batch_status.json").read_text())
    assert (status["expected"], status["finished"]) == (192, True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]


def test_demo_files_are_package_data() -> None:
    """The bundled files live in the package (shipped by pyproject.toml's package-data), and
    the repository's fixtures/ names the same files."""
    bundled = Path(trollout.__file__).parent / "testing" / "demo"
    for name in ("example_tasks.jsonl", "demo_deployment.yaml"):
        assert (bundled / name).is_file()
        assert (FIXTURES / name).resolve() == (bundled / name).resolve()
    assert '"testing/demo/*.yaml", "testing/demo/*.jsonl"' in (
        FIXTURES.parent / "pyproject.toml"
    ).read_text(encoding="utf-8")


def test_demo_missing_spec_exits_2() -> None:
    """A spec path that does not exist is a usage error naming it."""
    result = CliRunner().invoke(cli, ["demo", "--spec", "nope.yaml"])
    assert result.exit_code == 2
    assert "nope.yaml" in result.stderr


def test_format_duration_units() -> None:
    """Durations read as seconds, minutes or hours."""
    assert format_duration(4.24) == "4.2s"
    assert format_duration(185) == "3m05s"
    assert format_duration(3720) == "1h02m"
    assert format_duration(float("inf")) == "?"


class Instant:
    """A transport stand-in whose /run answers after one virtual second."""

    async def post(self, url: str, body: bytes, **_: Any) -> RawResponse:
        await trio.sleep(1.0)
        return RawResponse(status=200, headers=[], body=b'{"reward": 1.0}', truncated=False)

    async def aclose(self) -> None:
        pass


async def run_with_reporter(live: bool) -> str:
    """Collect 20 one-second rollouts at concurrency 2 with a reporter; return its output."""
    rows = materialized_rows(20)
    stream = io.StringIO()
    reporter = ProgressReporter(total=20, stream=stream, live=live, plain_interval_s=3.3)
    async with (
        open_collector(
            config=RunConfig(num_samples_in_parallel=2),
            urls={"agent": "http://127.0.0.1:1"},
            transport=Instant(),
        ) as collector,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(reporter.run, collector)
        await collector.collect(rows)
        nursery.cancel_scope.cancel()
    return stream.getvalue()


async def test_progress_plain_prints_periodic_lines(autojump_clock: Any) -> None:
    """Off a terminal, a line every interval and a last one at the end."""
    text = await run_with_reporter(live=False)
    lines = text.strip().splitlines()
    assert len(lines) == 4  # at 3.3, 6.6 and 9.9 virtual seconds, then the final one at 10
    assert lines[0].startswith("6/20 rollouts")
    assert lines[-1].startswith("20/20 rollouts")
    assert "mean reward 1.000" in lines[-1]


async def test_progress_live_redraws_and_ends_with_the_final_state(autojump_clock: Any) -> None:
    """On a terminal, the live line is redrawn and ends showing every rollout."""
    text = await run_with_reporter(live=True)
    assert "20/20 rollouts" in text
    assert "landed 20" in text
