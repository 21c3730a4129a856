"""A head server's config holds API keys: no error of `trollout collect` ever shows one.

docs/protocol.md section 1: the config "may hold secrets (API keys), so it is never logged".
Each case serves a broken config from a real loopback head server and checks the secret appears
nowhere in what `collect` prints; the error names key paths, positions and types instead.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from trollout.cli.main import cli

SECRET = "sk-SECRET-4f1c9a7e2b"
GOOD_AGENT = "math_agent:\n  responses_api_agents:\n    simple_agent: {host: 127.0.0.1, port: 9}\n"


def json_string(text: str) -> bytes:
    """Return ``text`` as NeMo Gym's head server sends it: YAML inside a JSON string."""
    return json.dumps(text).encode()


CASES = {
    "invalid YAML right after the secret": (
        json_string(f"{GOOD_AGENT}policy_api_key: {SECRET}\n  bad: [unclosed\n"),
        "is not valid YAML at line",
    ),
    "a server block of the wrong type holding the secret": (
        json_string(f"math_agent:\n  responses_api_agents:\n    simple_agent: {SECRET}\n"),
        "'math_agent.responses_api_agents.simple_agent' must be a mapping (got a str)",
    ),
    "a port that is the secret": (
        json_string(
            "math_agent:\n  responses_api_agents:\n"
            f"    simple_agent: {{host: 127.0.0.1, port: {SECRET}}}\n"
        ),
        "'math_agent.responses_api_agents.simple_agent.port' must be a port",
    ),
    "a JSON body that is not a string": (
        json.dumps({"policy_api_key": SECRET}).encode(),
        "with JSON a mapping of 1 key",
    ),
    "a body that is not JSON": (f"policy_api_key: {SECRET}\n".encode(), "not JSON"),
    "a tag PyYAML cannot build from the secret": (
        json_string(f"{GOOD_AGENT}policy_api_key: !!int {SECRET}\n"),
        "holds a value YAML cannot build (ValueError)",
    ),
}


@pytest.fixture
def head() -> Iterator[tuple[str, list[bytes]]]:
    """A loopback head server answering every GET with the bytes put in the list it yields."""
    bodies: list[bytes] = [b'""']

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(bodies[-1])))
            self.end_headers()
            self.wfile.write(bodies[-1])

        def log_message(self, *_: object) -> None:
            pass  # keep the test's output clean

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", bodies
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize(("body", "named"), CASES.values(), ids=list(CASES))
def test_collect_never_prints_a_secret_from_the_head_server(
    tmp_path: Path, head: tuple[str, list[bytes]], body: bytes, named: str
) -> None:
    """A broken config is one line naming where it broke, never what the config holds."""
    url, bodies = head
    bodies.append(body)
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"responses_create_params": {"input": "q"}}) + "\n")
    out = tmp_path / "out" / "r.jsonl"
    args = ["collect", str(source), "-o", str(out), "--head-server", url, "--agent", "math_agent"]
    result = CliRunner().invoke(cli, args)
    assert isinstance(result.exception, SystemExit), result.exc_info
    assert result.exit_code == 2, result.stderr
    printed = result.stdout + result.stderr
    assert SECRET not in printed
    assert SECRET[3:9] not in printed  # not even a part of it
    assert named in result.stderr
    assert result.stderr.count("\n") == 1
    assert not out.exists()
