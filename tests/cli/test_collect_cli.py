"""`trollout collect` from the command line: bad input is refused before anything happens."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from trollout.cli.main import cli

ROW = {
    "responses_create_params": {"input": [{"role": "user", "content": "What is 1 + 1?"}]},
    "expected_answer": "2",
    "agent_ref": {"name": "math_agent"},
}


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A loopback port that accepts connections but never answers (counts dispatches)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    sock.setblocking(False)
    yield sock
    sock.close()


def connections(sock: socket.socket) -> int:
    """Return how many connections reached the listener."""
    n = 0
    while True:
        try:
            conn, _ = sock.accept()
        except BlockingIOError:
            return n
        conn.close()
        n += 1


def write_input(path: Path, lines: list[str]) -> Path:
    """Write raw JSONL lines."""
    path.write_text("\n".join(lines) + "\n")
    return path


def run_collect(tmp_path: Path, listener: socket.socket, lines: list[str], *extra: str):
    """Run collect on the given lines against the never-answering listener."""
    source = write_input(tmp_path / "in.jsonl", lines)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    return CliRunner().invoke(
        cli,
        [
            "collect",
            str(source),
            "-o",
            str(tmp_path / "out" / "r.jsonl"),
            "--agent-url",
            f"math_agent={url}",
            "--progress",
            "plain",
            *extra,
        ],
    )


BAD_INPUTS = {
    "malformed line": ([json.dumps(ROW), "{not json", json.dumps(ROW)], (), "in.jsonl:2"),
    "unknown agent": ([json.dumps({**ROW, "agent_ref": {"name": "nobody"}})], (), "nobody"),
    "reserved rollout id": ([json.dumps({**ROW, "_ng_rollout_id": "x-a3"})], (), "-a3"),
    "num_repeats 0": ([json.dumps(ROW)], ("+num_repeats=0",), "num_repeats"),
    "missing responses_create_params": (
        [json.dumps({"expected_answer": "2", "agent_ref": {"name": "math_agent"}})],
        (),
        "responses_create_params",
    ),
    "unknown setting": ([json.dumps(ROW)], ("+num_repeat=2",), "num_repeats"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_collect_bad_input_exits_2_with_one_line_and_no_side_effects(
    case: str, tmp_path: Path, listener: socket.socket
) -> None:
    """Bad input: one line naming the problem, exit 2, nothing dispatched, no files written."""
    lines, extra, needle = BAD_INPUTS[case]
    result = run_collect(tmp_path, listener, lines, *extra)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, result.stderr
    assert needle in errors[0]
    assert "Traceback" not in result.output
    assert connections(listener) == 0
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_collect_help_explains_overrides() -> None:
    """--help names the +key=value overrides and the main options."""
    result = CliRunner().invoke(cli, ["collect", "--help"])
    assert result.exit_code == 0
    for needle in ("+key=value", "--concurrency", "--agent-url", "--num-repeats"):
        assert needle in result.output
