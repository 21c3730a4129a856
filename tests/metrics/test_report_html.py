"""The HTML report: self-contained, escaped, with its four charts; renders in Chromium."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import trio
from run_folders import failed, landed, plan_for, write_run

from trollout.metrics import AggregateOptions, AggregateResult, aggregate_run

CHROMIUM = Path("/usr/bin/chromium")


async def make_report(tmp_path: Path) -> AggregateResult:
    """Aggregate a small run with two agents, failures, latencies and an unsafe agent name."""
    rows = [
        landed(t, r, float((t + r) % 3 == 0), elapsed=0.5 + t * 0.37 + r * 0.11)
        for t in range(12)
        for r in range(4)
        if (t, r) not in {(3, 1), (5, 2), (7, 0)}
    ]
    rows += [landed(t, 0, 0.5 * (t % 3), agent="<b>evil</b>") for t in range(5)]
    failures = [failed(3, 1, "agent_run_error"), failed(5, 2, "timeout_exceeded")]
    plan = plan_for(12, 4)
    layout = write_run(tmp_path / "run.jsonl", rows, failures=failures, plan=plan)
    return await aggregate_run(layout, options=AggregateOptions(bootstrap_samples=200))


async def test_report_is_self_contained_and_escaped(tmp_path: Path) -> None:
    """The page loads nothing, runs nothing, escapes names and draws four charts per group."""
    result = await make_report(tmp_path)
    assert result.report_path == tmp_path / "run_report.html"
    page = result.report_path.read_text(encoding="utf-8")
    assert "<script" not in page
    assert "<link" not in page
    assert "<img" not in page
    assert not re.search(r"(src|href)=", page)
    assert set(re.findall(r"https?://[^\"' ]+", page)) == {"http://www.w3.org/2000/svg"}
    assert "<b>evil</b>" not in page
    assert "&lt;b&gt;evil&lt;/b&gt;" in page
    assert page.count("<svg") == 8
    for title in ("Reward distribution", "pass@k", "Rollouts that did not land", "Latency"):
        assert title in page
    assert "Metrics cover: 50 of 53 rollouts" in page
    assert "agent_run_error" in page
    assert "no row" in page


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed")
async def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    """Headless Chromium renders the report to a non-blank screenshot without errors."""
    result = await make_report(tmp_path)
    assert result.report_path is not None
    shot = tmp_path / "report.png"
    profile = tempfile.mkdtemp(prefix="chromium-")
    command = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--window-size=1200,1600",
        f"--screenshot={shot}",
        result.report_path.as_uri(),
    ]
    try:
        with trio.fail_after(120):
            done = await trio.run_process(
                command,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                env={**os.environ, "HOME": profile},
            )
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 30_000  # a blank 1200x1600 page compresses to a few KB
