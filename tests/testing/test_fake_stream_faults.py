"""The fake deployment's streamed faults over raw loopback sockets: a reply made as it is sent,
a trickle that never ends, and a reply nobody asked for."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import trio

from trollout.collector.http.http11 import ResponseParser
from trollout.testing import (
    DeploymentSpec,
    FakeDeployment,
    Generation,
    open_fake_deployment,
    task_row,
)


@pytest.fixture
async def legacy() -> AsyncIterator[FakeDeployment]:
    """Serve a one-agent deployment whose agent servers answer /run and echo the row."""
    spec = DeploymentSpec(agents=("a",), generation=Generation.LEGACY)
    async with open_fake_deployment(spec) as fake:
        yield fake


def _request(fault: dict[str, Any], task: int = 4) -> tuple[dict[str, Any], bytes]:
    row = task_row("What is 2 + 3?") | {"_ng_task_index": task, "_ng_rollout_index": 1}
    body = orjson.dumps(row | {"fake_fault": fault})
    head = b"POST /run HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % len(body)
    return row, head + body


async def _connect(fake: FakeDeployment) -> trio.socket.SocketType:
    sock = trio.socket.socket()
    await sock.connect(("127.0.0.1", fake.urls.ports["a"]))
    return sock


async def _replies(sock: trio.socket.SocketType, count: int) -> list[tuple[bytes, bytes]]:
    """Read `count` Content-Length framed replies off `sock`: (head, body) each."""
    buffer, replies = b"", []
    while len(replies) < count:
        end = buffer.find(b"\r\n\r\n")
        if end >= 0:
            match = re.search(rb"content-length: (\d+)", buffer[:end], re.IGNORECASE)
            assert match is not None
            stop = end + 4 + int(match[1])
            if len(buffer) >= stop:
                replies.append((buffer[:end], buffer[end + 4 : stop]))
                buffer = buffer[stop:]
                continue
        buffer += await sock.recv(65536)
    return replies


async def test_fault_unsolicited_reply_replays_the_answer(legacy: FakeDeployment) -> None:
    """After the real answer, the same reply comes again on the connection, unasked."""
    row, request = _request({"kind": "unsolicited_reply"})
    with await _connect(legacy) as sock:
        await sock.send(request)
        real, extra = await _replies(sock, 2)
    assert real[0].startswith(b"HTTP/1.1 200 ")
    assert extra == real
    assert orjson.loads(real[1])["_ng_task_index"] == row["_ng_task_index"]


async def test_fault_unsolicited_reply_forges_the_text_keeping_identity(
    legacy: FakeDeployment,
) -> None:
    """The forged variant keeps the answer's identity and replaces its text and reward."""
    row, request = _request({"kind": "unsolicited_reply", "body": "FORGED"})
    with await _connect(legacy) as sock:
        await sock.send(request)
        real, extra = await _replies(sock, 2)
    answer, forged = orjson.loads(real[1]), orjson.loads(extra[1])
    assert forged["_ng_task_index"] == answer["_ng_task_index"] == row["_ng_task_index"]
    assert forged["response"]["output"][0]["content"][0]["text"] == "FORGED"
    assert answer["response"]["output"][0]["content"][0]["text"] != "FORGED"
    assert forged["reward"] == 1.0


async def test_fault_oversized_streams_a_body_it_never_holds(legacy: FakeDeployment) -> None:
    """A 2 GB oversized reply declares its length and streams; a reader may leave early."""
    _, request = _request({"kind": "oversized", "status": 200, "size": 2_000_000_000})
    parser = ResponseParser()
    with await _connect(legacy) as sock:
        await sock.send(request)
        while parser.size < 5_000_000:
            parser.feed(await sock.recv(65536))
    assert (parser.status, dict(parser.headers)[b"content-length"]) == (200, b"2000000000")
    assert parser.body()[:3] == b'"xx'


async def test_fault_slowloris_trickles_a_body_that_never_ends(legacy: FakeDeployment) -> None:
    """A slowloris reply has no length and sends its body a byte at a time."""
    _, request = _request({"kind": "slowloris", "interval_s": 0.001})
    parser = ResponseParser()
    with await _connect(legacy) as sock:
        await sock.send(request)
        reads = 0
        while parser.size < 20:
            parser.feed(await sock.recv(65536))
            reads += 1
    assert parser.status == 200
    assert not parser.complete
    assert b"content-length" not in dict(parser.headers)
    assert parser.body().startswith(b'"xxx')
    assert reads > 3  # it came in pieces, not at once
