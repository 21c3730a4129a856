"""A head server that breaks HTTP framing around a secret: `trollout collect` never prints it."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from trollout.cli.main import cli
from trollout.testing import task_row

SECRET = "sk-live-0123456789abcdefSECRET"
CONFIG = orjson.dumps(f"policy_api_key: {SECRET}\nmath_agent: {{}}\n")
CHUNKED = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"

REPLIES = {
    "chunk data runs past its size": CHUNKED + b"8\r\n" + CONFIG + b"\r\n0\r\n\r\n",
    "chunk size line is the body": CHUNKED + CONFIG + b"\r\n",
    "body in the trailers": CHUNKED + b"0\r\n" + CONFIG + b"\r\n\r\n",
    "bare-LF head with a bad header": b"HTTP/1.1 200 OK\nx-key " + SECRET.encode() + b"\n\n",
    "garbage head": SECRET.encode() + b" 200 OK\r\n\r\n",
    "control byte in a header": b"HTTP/1.1 200 OK\r\nx-key: " + SECRET.encode() + b"\x01\r\n\r\n",
    "secret coding": b"HTTP/1.1 200 OK\r\ncontent-encoding: " + SECRET.encode() + b"\r\n\r\n",
}


@contextmanager
def raw_server(reply: bytes) -> Iterator[str]:
    """Answer every connection on 127.0.0.1 with `reply` verbatim, then close; yield the URL."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # the listener was closed: the test is over
            with conn:
                conn.recv(65536)
                conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join(timeout=10)


@pytest.mark.parametrize("reply", REPLIES.values(), ids=REPLIES.keys())
def test_collect_head_server_breaking_framing_never_prints_its_bytes(
    tmp_path: Path, reply: bytes
) -> None:
    """Discovery fails with exit 2 and one line, and no 8 characters of the secret appear."""
    source = tmp_path / "tasks.jsonl"
    source.write_bytes(orjson.dumps(task_row("What is 2 + 3?")) + b"\n")
    with raw_server(reply) as head:
        result = CliRunner().invoke(
            cli,
            [
                "collect",
                str(source),
                "-o",
                str(tmp_path / "run" / "r.jsonl"),
                "--head-server",
                head,
            ],
        )
    output = result.output + (result.stderr if result.stderr_bytes is not None else "")
    assert result.exit_code == 2, output
    assert "cannot reach head server" in output
    assert not any(SECRET[i : i + 8] in output for i in range(len(SECRET) - 7)), output
    assert not (tmp_path / "run").exists()
