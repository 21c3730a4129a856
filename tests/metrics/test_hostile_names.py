"""Names and classes read from run folders are data: printed and rendered literally."""

from __future__ import annotations

import html
from pathlib import Path

from click.testing import CliRunner
from run_folders import failed, landed, planned, write_run

from trollout.cli.main import cli

RAW_CONTROLS = ("\x1b", "\x07", "\x9b", "\r")


def test_aggregate_of_a_hand_made_folder_prints_hostile_names_literally(tmp_path: Path) -> None:
    """Agent and environment-server names and classes from files print, and render, as data."""
    agent, env, cls = "[bold]agent\x1b]0;pwned\x07", "env[/]\x9b", "[red]late\r"
    rows = [landed(0, 0, agent=agent), landed(0, 0, 0.0, agent=None, env=env)]
    failures = [failed(1, 0, cls, agent=agent)]
    plan = [planned(t, 0, agent=agent) for t in range(2)]
    layout = write_run(tmp_path / "run.jsonl", rows, failures=failures, plan=plan)
    result = CliRunner().invoke(cli, ["aggregate", str(layout.rollouts)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    assert result.exit_code == 0, result.stderr
    for shown in ("[bold]agent\\x1b]0;pwned\\x07", "env[/]\\x9b", "[red]late\\r"):
        assert shown in result.stdout
    for char in RAW_CONTROLS:
        assert char not in result.stdout + result.stderr
    page = layout.report.read_text(encoding="utf-8")
    assert html.escape("[bold]agent\\x1b]0;pwned\\x07") in page
    assert html.escape("[red]late\\r") in page
    assert not any(char in page for char in RAW_CONTROLS)
