"""The fake's HTTP/1.1 layer over raw loopback sockets: keep-alive, pipelining, bad requests."""

from __future__ import annotations

import httpx
import orjson
import trio

from trollout.testing import (
    DeploymentSpec,
    FakeDeployment,
    FaultContext,
    open_fake_deployment,
    task_row,
)

ROW = orjson.dumps(task_row("What is 1 + 2?"))


def _post(body: bytes = ROW, *, extra: bytes = b"") -> bytes:
    return b"POST /run HTTP/1.1\r\nhost: x\r\n%scontent-length: %d\r\n\r\n%s" % (
        extra,
        len(body),
        body,
    )


async def _connect(fake: FakeDeployment) -> trio.socket.SocketType:
    sock = trio.socket.socket()
    await sock.connect(("127.0.0.1", fake.urls.ports["math_agent_environment_server"]))
    return sock


async def _read_all(sock: trio.socket.SocketType) -> bytes:
    data = b""
    while chunk := await sock.recv(65536):
        data += chunk
    return data


async def _read_replies(sock: trio.socket.SocketType, count: int) -> list[tuple[bytes, bytes]]:
    """Read ``count`` replies: (head, body) each."""
    buf, replies = b"", []
    while len(replies) < count:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            head = buf[:end]
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            if len(buf) >= end + 4 + length:
                replies.append((head, buf[end + 4 : end + 4 + length]))
                buf = buf[end + 4 + length :]
                continue
        chunk = await sock.recv(65536)
        assert chunk, "the server closed the connection early"
        buf += chunk
    return replies


async def test_http_keep_alive_serves_requests_in_sequence(fake: FakeDeployment) -> None:
    """One connection carries several requests, one after the other."""
    with await _connect(fake) as sock:
        for _ in range(3):
            await sock.send(_post())
            ((head, body),) = await _read_replies(sock, 1)
            assert head.startswith(b"HTTP/1.1 200 OK")
            assert b"connection: close" not in head
            assert "reward" in orjson.loads(body)


async def test_http_pipelined_requests_get_replies_in_order(fake: FakeDeployment) -> None:
    """Requests sent back to back in one write get their replies in order."""
    rows = [task_row(f"What is {n} + 0?") for n in range(4)]
    with await _connect(fake) as sock:
        await sock.send(b"".join(_post(orjson.dumps(r)) for r in rows))
        replies = await _read_replies(sock, 4)
    answers = [
        orjson.loads(b)["responses_create_params"]["input"][0]["content"] for _, b in replies
    ]
    assert answers == [f"What is {n} + 0?" for n in range(4)]


async def test_http_connection_close_is_honoured(fake: FakeDeployment) -> None:
    """A request with Connection: close gets a reply saying so, then the server closes."""
    with await _connect(fake) as sock:
        await sock.send(_post(extra=b"connection: close\r\n"))
        data = await _read_all(sock)
    assert data.startswith(b"HTTP/1.1 200 OK")
    assert b"connection: close\r\n" in data


async def test_http_1_0_closes_by_default(fake: FakeDeployment) -> None:
    """An HTTP/1.0 request without keep-alive closes after the reply."""
    with await _connect(fake) as sock:
        await sock.send(b"GET / HTTP/1.0\r\n\r\n")
        data = await _read_all(sock)
    assert data.endswith(b'{"status":"ok"}')


async def test_http_chunked_body_is_refused(fake: FakeDeployment) -> None:
    """A chunked request body gets 501 and the connection closes."""
    with await _connect(fake) as sock:
        await sock.send(b"POST /run HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n")
        data = await _read_all(sock)
    assert data.startswith(b"HTTP/1.1 501 Not Implemented")


async def test_http_bad_request_line_is_400(fake: FakeDeployment) -> None:
    """A request line that is not METHOD TARGET VERSION gets 400."""
    with await _connect(fake) as sock:
        await sock.send(b"NONSENSE\r\n\r\n")
        data = await _read_all(sock)
    assert data.startswith(b"HTTP/1.1 400 Bad Request")


async def test_http_huge_head_is_431(fake: FakeDeployment) -> None:
    """A request head past 64 KiB gets 431."""
    with await _connect(fake) as sock:
        await sock.send(b"GET / HTTP/1.1\r\nx-big: " + b"a" * 70_000)
        data = await _read_all(sock)
    assert data.startswith(b"HTTP/1.1 431")


async def test_http_client_leaving_mid_body_leaves_the_server_serving(
    fake: FakeDeployment, client: httpx.AsyncClient
) -> None:
    """A client that disconnects inside a body does not disturb the server."""
    with await _connect(fake) as sock:
        await sock.send(b"POST /run HTTP/1.1\r\ncontent-length: 100\r\n\r\n{")
    reply = await client.get(f"{fake.run_urls['math_agent']}/")
    assert reply.json() == {"status": "ok"}


async def test_http_handler_error_is_a_500_json_string(client: httpx.AsyncClient) -> None:
    """A handler that raises answers 500 with a JSON string, as Gym servers do."""

    def explode(context: FaultContext) -> None:
        raise RuntimeError("boom")

    async with open_fake_deployment(DeploymentSpec(agents=("a",)), fault_fn=explode) as fake:
        reply = await client.post(f"{fake.run_urls['a']}/run", content=ROW)
        assert reply.status_code == 500
        assert (
            reply.json()
            == "Hit an exception in FakeEnvironment___a_environment_server: RuntimeError: boom"
        )
        assert fake.stats.in_flight == 0
