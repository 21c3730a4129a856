"""Measure client CPU per request: Http11Transport.post versus httpx.AsyncClient on Trio.

A minimal keep-alive HTTP/1.1 server (a raw asyncio Protocol) runs in a separate process, so the
client process's ``time.process_time`` (user + system) counts only the client's own work. For
each client and each concurrency, ``--requests`` POSTs of a small JSON body are spread over that
many Trio tasks (after a warm-up that opens the connections), and the CPU time per request is
printed.

Clients: ``h11`` is `Http11Transport.post` (the key is historical: it runs trollout's own
codec, collector/http/http11.py); ``httpx`` is ``httpx.AsyncClient`` with its default transport
(httpcore), given ``Limits(max_connections=concurrency)`` so that neither client queues for a
connection; ``bare`` is one h11 connection per task in a plain loop, no pool, no timeouts, no
error mapping (its figure includes opening its connections); ``raw`` is the floor of any Trio
client: per task, send fixed request bytes on a plain socket, wait until readable, ``recv``, no
parsing, no timeouts.

Usage: ``python bench/transport_cpu.py [--requests 5000] [--concurrency 1 64 512]
[--clients raw bare h11 httpx]``
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import multiprocessing.connection
import socket
import time
from collections.abc import Awaitable, Callable

import h11
import httpx
import orjson
import trio

from trollout.collector.http.transport import Http11Transport

_REPLY = orjson.dumps({"responses_create_params": {"input": []}, "response": {}, "reward": 1.0})
_RESPONSE = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
    + str(len(_REPLY)).encode()
    + b"\r\n\r\n"
    + _REPLY
)
_BODY = orjson.dumps({"responses_create_params": {"input": [{"role": "user", "content": "hi"}]}})


class _Server(asyncio.Protocol):
    """Answer every request with the same 200 (keep-alive, pipelining-safe)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            head_end = self.buffer.find(b"\r\n\r\n")
            if head_end < 0:
                return
            length = _content_length(self.buffer[:head_end])
            end = head_end + 4 + length
            if len(self.buffer) < end:
                return
            self.buffer = self.buffer[end:]
            self.transport.write(_RESPONSE)


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def _serve(conn: multiprocessing.connection.Connection) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_Server, "127.0.0.1", 0, backlog=4096)
        conn.send(server.sockets[0].getsockname()[1])
        await loop.run_in_executor(None, conn.recv)  # until the parent says stop
        server.close()

    asyncio.run(main())


async def _drive(post: Callable[[], Awaitable[None]], concurrency: int, requests: int) -> None:
    remaining = requests

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await post()

    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)


async def _bare(url: str, concurrency: int, requests: int) -> None:
    host, _, port = url.removeprefix("http://").removesuffix("/run").partition(":")
    remaining = requests

    async def worker() -> None:
        nonlocal remaining
        stream = await trio.open_tcp_stream(host, int(port))
        state = h11.Connection(h11.CLIENT)
        headers = [(b"host", host.encode()), (b"content-length", str(len(_BODY)).encode())]
        while remaining > 0:
            remaining -= 1
            data = state.send(h11.Request(method=b"POST", target=b"/run", headers=headers)) or b""
            data += state.send(h11.Data(data=_BODY)) or b""
            await stream.send_all(data + (state.send(h11.EndOfMessage()) or b""))
            while not isinstance(event := state.next_event(), h11.EndOfMessage):
                if event is h11.NEED_DATA:
                    state.receive_data(await stream.receive_some(65536))
            state.start_next_cycle()
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)


async def _raw(url: str, concurrency: int, requests: int) -> None:
    host, _, port = url.removeprefix("http://").removesuffix("/run").partition(":")
    head = f"POST /run HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-length: {len(_BODY)}\r\n\r\n"
    data = head.encode() + _BODY
    remaining = requests

    async def worker() -> None:
        nonlocal remaining
        stream = await trio.open_tcp_stream(host, int(port))
        sock = socket.socket(fileno=stream.socket.detach())
        while remaining > 0:
            remaining -= 1
            sock.send(data)  # small: the kernel takes it whole
            await trio.lowlevel.wait_readable(sock)
            sock.recv(65536)  # the reply is small and sent in one write: one recv holds it
        sock.close()

    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)


async def _measure(client: str, url: str, concurrency: int, requests: int) -> tuple[float, float]:
    if client in ("bare", "raw"):
        cpu, wall = time.process_time(), time.perf_counter()
        await (_bare if client == "bare" else _raw)(url, concurrency, requests)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        return cpu * 1000 / requests, requests / wall
    if client == "h11":
        async with Http11Transport(connect_timeout_s=10, read_timeout_s=60) as transport:

            async def post() -> None:
                response = await transport.post(url, _BODY)
                assert response.status == 200

            return await _timed(post, concurrency, requests)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=60) as http:

        async def post() -> None:
            response = await http.post(url, content=_BODY)
            assert response.status_code == 200

        return await _timed(post, concurrency, requests)


async def _timed(
    post: Callable[[], Awaitable[None]], concurrency: int, requests: int
) -> tuple[float, float]:
    await _drive(post, concurrency, max(concurrency, 200))  # warm-up: open the connections
    cpu, wall = time.process_time(), time.perf_counter()
    await _drive(post, concurrency, requests)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return cpu * 1000 / requests, requests / wall


_NAMES = {
    "raw": "raw socket loop",
    "bare": "bare h11 loop",
    "h11": "Http11Transport.post",
    "httpx": "httpx.AsyncClient",
}


def main() -> None:
    """Run the benchmark and print one line per client and concurrency."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64, 512])
    parser.add_argument("--clients", nargs="+", default=["raw", "bare", "h11", "httpx"])
    args = parser.parse_args()
    parent, child = multiprocessing.Pipe()
    server = multiprocessing.get_context("spawn").Process(target=_serve, args=(child,))
    server.start()
    try:
        url = f"http://127.0.0.1:{parent.recv()}/run"
        print(f"{'client':<24}{'in flight':>10}{'CPU ms/request':>16}{'requests/s':>12}")
        for concurrency in args.concurrency:
            for client in args.clients:
                cpu_ms, rate = trio.run(_measure, client, url, concurrency, args.requests)
                name = _NAMES[client]
                print(f"{name:<24}{concurrency:>10}{cpu_ms:>16.3f}{rate:>12.0f}")
    finally:
        parent.send("stop")
        server.join(timeout=5)
        if server.is_alive():
            server.kill()


if __name__ == "__main__":
    main()
