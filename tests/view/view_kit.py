"""Helpers of the view's tests (fixtures in conftest.py): the runs' rows, a real collection,
a ``trollout view`` in its own process, getting Debian's chromium, and playwright's turn at
this thread's asyncio state (conftest's module doc says why)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from trollout.cli.main import cli

HOSTILE_PROMPT = (
    '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
    "\x1b[31mred\x1b[0m bell\x07 \u202eevil"
)
HOSTILE_CLASS = "<img src=y onerror=window.__pwned=3>"
LONG_PROMPT = "What is 2 + 3? " + "padding " * 3_000  # longer than the API's string cut
CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def task_rows() -> list[dict[str, Any]]:
    """Tasks 0-3 land; 4 fails terminally; 5 fails once, lands on resume; 6 hostile; 7 long."""

    def row(content: str, fault: dict[str, Any] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "responses_create_params": {"input": [{"role": "user", "content": content}]}
        }
        if fault is not None:
            out["fake_fault"] = fault
        return out

    return [
        row("What is 17 + 25?"),
        row("Reverse the string 'hello'."),
        row("What is 6 * 7?"),
        row("What is 9 - 4?"),
        row(
            "What is 1 + 1?",
            {"kind": "failure_class", "failure_class": "boom_class", "terminal": True},
        ),
        row("What is 30 + 12?", {"kind": "status", "status": 500, "attempts": [0]}),
        row(
            HOSTILE_PROMPT,
            {"kind": "failure_class", "failure_class": HOSTILE_CLASS, "terminal": True},
        ),
        row(LONG_PROMPT),
    ]


def collect(folder: Path, rows: list[dict[str, Any]], head_url: str, *extra: str) -> Path:
    """Collect ``rows`` into ``folder/out/r.jsonl`` with the real CLI; return the output."""
    source = folder / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = folder / "out" / "r.jsonl"
    result = CliRunner().invoke(
        cli,
        ["collect", str(source), "-o", str(out), "--head-server", head_url, "--agent",
         "math_agent", "--progress", "plain", *extra],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    # Task 5 failed its attempt 0 (a 500: delivered, so not re-sent within the run); a resume
    # sends attempt 1, which lands: a retried rollout.
    resumed = CliRunner().invoke(cli, ["resume", str(out), "--progress", "plain"])
    assert resumed.exit_code == 0, resumed.output
    return out


class ViewProcess:
    """A ``trollout view`` in its own process."""

    def __init__(self, args: list[str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trollout.cli.main", "view", *args, "--port", "0",
             "--no-browser"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        found = re.search(r"http://\S+/", line)
        if found is None:
            self.stop()
            raise AssertionError(f"no URL printed: {line!r} {self.proc.stderr.read()!r}")  # type: ignore[union-attr]
        self.url = found.group(0)
        self.port = int(self.url.rsplit(":", 1)[1].strip("/"))

    def stop(self) -> str:
        """End the process (it is ours, by its pid) and return its stderr."""
        if self.proc.poll() is None:
            self.proc.terminate()
        _, err = self.proc.communicate(timeout=30)
        return err


def ensure_chromium() -> str | None:
    """Install Debian's chromium when absent; return why it cannot be had, or None."""
    if os.path.exists(CHROMIUM):
        return None
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        return "no /usr/bin/chromium, and apt-get cannot install it here (not root, or not Debian)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            return f"{' '.join(command)} failed: {done.stderr.strip()[-300:]}"
    return None if os.path.exists(CHROMIUM) else "apt-get installed no /usr/bin/chromium"


@contextlib.contextmanager
def playwright_turn(loop: asyncio.AbstractEventLoop) -> Iterator[None]:
    """Mark playwright's `loop` as running in this thread for the block, as its sync API
    expects between its calls; put back what was marked before on the way out."""
    before = asyncio._get_running_loop()
    asyncio._set_running_loop(loop)
    try:
        yield
    finally:
        asyncio._set_running_loop(before)
