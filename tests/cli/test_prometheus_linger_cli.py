"""`trollout collect --metrics-port 0`: after the summary, the final values stay scrapeable.

A real `trollout collect` process against the fake deployment in its own process. The process
prints the summary and the endpoint's URL, then keeps serving; the test scrapes it over loopback,
compares the counts to the run folder, and ends the wait with SIGINT (the user's Ctrl-C): the
run's exit code stays 0. Synchronised on the printed line, never on time.
"""

from __future__ import annotations

import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from builders import HANG_GUARD_S, cli_command, count_lines, write_tasks_input
from trollout.testing import AgentSpec, DeploymentSpec, FakeUrls, spawn_fake_deployment

pytest.importorskip("opentelemetry")

SERVING = re.compile(r"serving the final metrics at (http://127\.0\.0\.1:\d+/metrics)")


@pytest.fixture(scope="module")
def own_fake() -> Iterator[FakeUrls]:
    """A fake deployment in its own process (the collector is a process of its own too)."""
    spec = DeploymentSpec(agents=(AgentSpec(name="math_agent"),), record_runs=False)
    with spawn_fake_deployment(spec) as urls:
        yield urls


def test_collect_serves_the_final_counts_after_the_summary_until_ctrl_c(
    tmp_path: Path, own_fake: FakeUrls
) -> None:
    source = write_tasks_input(tmp_path / "tasks.jsonl", 12, seed=4)
    out = tmp_path / "run" / "r.jsonl"
    command = cli_command(
        "collect", str(source), "-o", str(out), "--head-server", own_fake.head_url,
        "--agent", "math_agent", "--progress", "plain", "--metrics-port", "0",
        "--metrics-linger", "600",
    )  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        url = None
        for line in proc.stderr:  # blocks on the child's lines, ends at its exit
            found = SERVING.search(line)
            if found:
                url = found.group(1)
                break
        assert url is not None, f"no linger line; exit {proc.wait(HANG_GUARD_S)}"
        assert proc.poll() is None  # still serving after the summary
        text = httpx.get(url, timeout=30).text
        landed = sum(
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "trollout_rollouts_total" and s.labels["outcome"] == "landed"
        )
        assert landed == count_lines(out) == 12
        assert re.search(r"^trollout_in_flight(\{[^}]*\})? 0\.0$", text, re.M)
        assert "trollout_run_info{" in text
        assert httpx.get(url.removesuffix("metrics") + "x", timeout=30).status_code == 404
        proc.send_signal(signal.SIGINT)
        stdout, _ = proc.communicate(timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    assert "metrics:" in stdout  # the summary came before the wait
