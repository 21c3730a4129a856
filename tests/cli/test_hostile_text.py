"""Server text is data: markup and control characters print literally, never act.

A real collection against the fake deployment, whose replies carry hostile failure classes
(rich markup, ANSI and OSC sequences, C1 CSI, CR), then `status` and `aggregate` over the folder
it wrote. tests/metrics/test_hostile_names.py does the same for names in hand-made folders.
"""

from __future__ import annotations

import html
import io
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from click.testing import CliRunner, Result

from trollout.cli.failures import fail, report_errors
from trollout.cli.main import cli
from trollout.cli.progress import ProgressReporter
from trollout.collector.engine.collector import open_collector
from trollout.collector.engine.timing_report import Straggler
from trollout.collector.http.transport import RawResponse
from trollout.errors import DeploymentError, RunStoppedError
from trollout.records import Identity, MaterializedRow
from trollout.settings import RunConfig
from trollout.testing import AgentSpec, DeploymentSpec, spawn_fake_deployment

# Each hostile class and how it must read on the terminal.
HOSTILE = {
    "oops[/bold]": "oops[/bold]",  # crashed the summary (MarkupError)
    "judge_failed[timeout]": "judge_failed[timeout]",  # was shown as "judge_failed"
    "[red]x[/red]": "[red]x[/red]",
    "a\x1b[31mred": "a\\x1b[31mred",
    "t\x1b]0;pwned\x07": "t\\x1b]0;pwned\\x07",
    "c\x9bq": "c\\x9bq",
    "r\rx": "r\\rx",
    "e:thumbs_up:": "e:thumbs_up:",  # rich would print an emoji
}
RAW_CONTROLS = ("\x1b", "\x07", "\x9b", "\r")


def invoke(*args: str) -> Result:
    """Run the CLI; it must end by exiting, never by an uncaught exception."""
    result = CliRunner().invoke(cli, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    assert "Traceback" not in result.stdout + result.stderr
    return result


def assert_literal(text: str) -> None:
    """Every hostile class reads as shown, and no control character reached the output."""
    for shown in HOSTILE.values():
        assert shown in text
    for char in RAW_CONTROLS:
        assert char not in text
    assert "👍" not in text


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Result]:
    """Collect one landed rollout and one terminal failure per hostile class."""
    folder = tmp_path_factory.mktemp("hostile")
    rows = [{"responses_create_params": {"input": [{"role": "user", "content": "ok"}]}}]
    for i, cls in enumerate(HOSTILE):
        fault = {"kind": "failure_class", "failure_class": cls, "terminal": True}
        content = [{"role": "user", "content": f"q{i}"}]
        rows.append({"responses_create_params": {"input": content}, "fake_fault": fault})
    source = folder / "in.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = folder / "out" / "r.jsonl"
    spec = DeploymentSpec(agents=(AgentSpec(name="math_agent"),))
    with spawn_fake_deployment(spec) as urls:
        result = invoke(
            "collect", str(source), "-o", str(out), "--head-server", urls.head_url,
            "--agent", "math_agent", "--progress", "plain",
        )  # fmt: skip
    return out, result


def test_collect_prints_hostile_failure_classes_literally(run: tuple[Path, Result]) -> None:
    """The summary, the progress line and the metrics show each class as data."""
    _, result = run
    assert result.exit_code == 0, result.stderr
    assert_literal(result.stdout)
    for char in RAW_CONTROLS:
        assert char not in result.stderr  # the progress lines


def test_status_prints_hostile_failure_classes_literally(run: tuple[Path, Result]) -> None:
    """`trollout status` lists each class by name, escaped."""
    out, _ = run
    result = invoke("status", str(out))
    assert result.exit_code == 0, result.stderr
    assert_literal(result.stdout)
    raw = json.loads(invoke("status", str(out), "--json").stdout)
    assert set(raw["failures_by_class"]) == set(HOSTILE)  # --json stays the data itself


def test_aggregate_report_prints_hostile_failure_classes_literally(
    run: tuple[Path, Result],
) -> None:
    """`trollout aggregate` prints each class in its coverage lines; the HTML escapes it."""
    out, _ = run
    result = invoke("aggregate", str(out))
    assert result.exit_code == 0, result.stderr
    assert_literal(result.stdout)
    page = out.with_name("r_report.html").read_text(encoding="utf-8")
    for shown in HOSTILE.values():
        assert html.escape(shown) in page
    for char in RAW_CONTROLS:
        assert char not in page


CONTROLS = ("a\x1b[31mred", "t\x1b]0;pwned\x07", "c\x9bq\r")  # the progress line shows three


class HostileAgent:
    """A transport stand-in whose /run reply names one hostile class per task."""

    async def post(self, url: str, body: bytes, **_: Any) -> RawResponse:
        await trio.sleep(1.0)
        task = orjson.loads(body)["_ng_task_index"]
        reply = {"_ng_failure_class": CONTROLS[task]}
        return RawResponse(status=200, headers=[], body=orjson.dumps(reply), truncated=False)

    async def aclose(self) -> None:
        pass


async def report_progress(live: bool) -> str:
    """Collect one rollout per class of `CONTROLS` with a reporter; return what it printed."""
    rows = [
        MaterializedRow.from_body(
            {"responses_create_params": {}, "agent_ref": {"name": "agent"}}
            | {"_ng_task_index": i, "_ng_rollout_index": 0}
        )
        for i in range(len(CONTROLS))
    ]
    stream = io.StringIO()
    reporter = ProgressReporter(total=len(rows), stream=stream, live=live, plain_interval_s=0.5)
    config = RunConfig(num_samples_in_parallel=1, max_attempts=1)
    async with (
        open_collector(
            config=config, urls={"agent": "http://127.0.0.1:1"}, transport=HostileAgent()
        ) as collector,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(reporter.run, collector)
        await collector.collect(rows)
        nursery.cancel_scope.cancel()
    return stream.getvalue()


@pytest.mark.parametrize("live", [False, True])
async def test_progress_shows_hostile_failure_classes_escaped(
    live: bool, autojump_clock: Any
) -> None:
    """Plain and live progress lines name the classes without acting on them."""
    text = await report_progress(live)
    for shown in ("a\\x1b[31mred", "t\\x1b]0;pwned\\x07", "c\\x9bq\\r"):
        assert shown in text
    for char in RAW_CONTROLS:
        assert char not in text


def test_timing_report_names_a_hostile_agent_escaped() -> None:
    """A straggler's agent name (from the input file) is shown escaped."""
    who = Identity(3, 1, agent_name="a\x1b]0;pwned\x07")
    assert Straggler(who, 90.0, 4.5).render() == (
        "task 3 rollout 1 (a\\x1b]0;pwned\\x07): running 90.0s (4.5 x p90)"
    )


def test_error_lines_show_control_characters_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    """`fail` and `report_errors` print messages quoting servers and files as data."""
    with pytest.raises(SystemExit) as one:
        fail("server said \x1b]0;pwned\x07")
    with pytest.raises(SystemExit) as many:
        report_errors([RunStoppedError("quota \x9b2J"), DeploymentError("host \rgone")])
    assert (one.value.code, many.value.code) == (2, 1)
    assert capsys.readouterr().err.splitlines() == [
        "trollout: error: server said \\x1b]0;pwned\\x07",
        "trollout: error: run stopped: quota \\x9b2J",
        "trollout: error: host \\rgone",
    ]
