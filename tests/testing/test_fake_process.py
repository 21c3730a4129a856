"""The fake deployment in a subprocess: ready line, serving, stopping on signals."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import pytest
import trio
import trio.testing
import yaml
from click.testing import CliRunner

from builders import HANG_GUARD_S
from trollout.errors import DeploymentError
from trollout.testing import (
    DeploymentSpec,
    load_spec,
    serve_until_signal,
    spawn_fake_deployment,
    task_row,
)
from trollout.testing.__main__ import main

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
DEMO = FIXTURES / "demo_deployment.yaml"


def _refused(url: str) -> bool:
    try:
        httpx.get(f"{url}/", timeout=2.0)
    except httpx.ConnectError:
        return True
    return False


def test_spawn_serves_the_demo_and_stops_on_exit() -> None:
    """The subprocess prints its URLs, serves them, and is gone after the block."""
    plan = load_spec(DEMO).faults
    task = next(t for t in range(100) if plan.fault_for(t, 1, 0) is None)
    with spawn_fake_deployment(DEMO) as urls:
        assert urls.pid is not None
        assert urls.pid != os.getpid()
        config = yaml.safe_load(httpx.get(f"{urls.head_url}/global_config_dict_yaml").json())
        assert config["head_server"]["port"] == urls.ports["head_server"]
        row = task_row("What is 2 + 2?") | {"_ng_task_index": task, "_ng_rollout_index": 1}
        reply = httpx.post(f"{urls.run_urls['math_agent']}/run", json=row, timeout=10.0)
        assert reply.status_code == 200
        runs = httpx.get(f"{urls.head_url}/_fake/runs").json()
        assert runs == [["math_agent_environment_server", "math_agent", task, 1, 0, None]]
    assert _refused(urls.head_url)


def test_spawn_takes_a_spec_object_and_a_sleep() -> None:
    """A spec object is written for the child; the sleep mode delays every /run.

    The delay shows without timing anything: a client that gives up long before the sleep ends
    gets no reply, one that waits gets the answer.
    """
    spec = DeploymentSpec(agents=("a",))
    with spawn_fake_deployment(spec, sleep_s=3.0, record_runs=False) as urls:
        row = task_row("What is 1 + 1?")
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{urls.run_urls['a']}/run", json=row, timeout=0.2)
        reply = httpx.post(f"{urls.run_urls['a']}/run", json=row, timeout=30.0)
        assert reply.status_code == 200
        assert httpx.get(f"{urls.head_url}/_fake/runs").json() == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_command_prints_ready_line_and_exits_on_signal(sig: signal.Signals) -> None:
    """``python -m trollout.testing serve`` prints one JSON line and exits 0 on a signal."""
    command = [sys.executable, "-m", "trollout.testing", "serve", "--spec", str(DEMO)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        ready = orjson.loads(proc.stdout.readline())
        assert ready["pid"] == proc.pid
        assert set(ready["run_urls"]) == {"math_agent", "string_agent"}
        assert httpx.get(f"{ready['head_url']}/").json() == {"status": "ok"}
        proc.send_signal(sig)
        assert proc.wait(timeout=HANG_GUARD_S) == 0
        assert proc.stdout.read() == b""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


async def test_serve_until_signal_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    """The serve loop prints its ready line, serves, and returns on SIGTERM."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_until_signal, DeploymentSpec(agents=("a",)))
        await trio.testing.wait_all_tasks_blocked()
        ready = orjson.loads(capsys.readouterr().out)
        assert ready["pid"] == os.getpid()
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"{ready['head_url']}/")).json() == {"status": "ok"}
        # The ready line is printed inside the signal receiver, so SIGTERM is caught.
        signal.raise_signal(signal.SIGTERM)
    assert _refused(ready["head_url"])


def test_spawn_reports_a_child_that_cannot_start() -> None:
    """A child that fails before its ready line is reported as a DeploymentError."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with (
            pytest.raises(DeploymentError, match="exited with code 1 before it was ready"),
            spawn_fake_deployment(DEMO, port_base=port),
        ):
            pass


def test_write_tasks_command_writes_rows(tmp_path: Path) -> None:
    """The write-tasks command writes the requested number of rows."""
    out = tmp_path / "tasks.jsonl"
    result = CliRunner().invoke(main, ["write-tasks", str(out), "--rows", "25", "--seed", "3"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 25
    assert all("expected_answer" in row for row in rows)


def test_serve_command_refuses_a_bad_spec(tmp_path: Path) -> None:
    """A bad spec file is a usage error (exit 2) naming the problem."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("agents: []\n")
    result = CliRunner().invoke(main, ["serve", "--spec", str(bad)])
    assert result.exit_code == 2
    assert "at least one agent" in result.output
