"""Measure the fake deployment's ceiling: ``/run`` requests per second with zero latency.

The fake runs in its own process (``python -m trollout.testing serve``, one core); a load
generator in another process drives it over raw loopback sockets with keep-alive connections,
optionally pipelined, so the client costs as little as possible. Printed per scenario:
requests/s, the server's CPU microseconds per request (from /proc), the ceiling that implies for
one full core (1e6 / that), and the server's CPU share (near 100 % means the server, not the
generator, is the limit; well below it on a busy machine means both were starved of CPU, and
the per-request CPU figure is the one to trust).

Also measured, for the design note in trollout/httpserver.py: the same server with its
hand-written HTTP/1.1 parser swapped for h11 (``--parsers fast,h11``).

    .venv/bin/python bench/fake_server_ceiling.py [--seconds 4] [--parsers fast,h11]

Bounded: every scenario stops after ``--seconds``; all traffic goes to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import selectors
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import h11
import orjson
import trio
import yaml

from trollout.httpserver import Handler, Reply, Request
from trollout.testing import AgentSpec, DeploymentSpec, spec_to_dict, task_rows

SCENARIOS = (  # (connections, pipeline depth)
    (1, 1),
    (64, 1),
    (512, 1),
    (8, 32),
)


# -- the h11 variant of the server's connection loop (measured, not shipped) ---------------


async def serve_connection_h11(sock: socket.socket, handler: Handler) -> None:
    """Serve one connection with h11 instead of the hand-written parser."""
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
    conn = h11.Connection(h11.SERVER)
    try:
        async with stream:
            while True:
                request = await _h11_request(stream, conn)
                if request is None:
                    return
                reply: Reply = await handler(request)
                head = h11.Response(
                    status_code=reply.status,
                    headers=[
                        ("content-type", reply.content_type),
                        ("content-length", str(len(reply.body))),
                    ],
                )
                out = conn.send(head) + conn.send(h11.Data(data=reply.body))
                out += conn.send(h11.EndOfMessage())
                await stream.send_all(out)
                if reply.on_done is not None:
                    reply.on_done()
                if conn.our_state is h11.MUST_CLOSE:
                    return
                conn.start_next_cycle()
    except (trio.BrokenResourceError, trio.ClosedResourceError, h11.RemoteProtocolError):
        return


async def _h11_event(stream: trio.SocketStream, conn: h11.Connection) -> Any:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        conn.receive_data(await stream.receive_some(65536))


async def _h11_request(stream: trio.SocketStream, conn: h11.Connection) -> Request | None:
    event = await _h11_event(stream, conn)
    if not isinstance(event, h11.Request):
        return None
    body = bytearray()
    while not isinstance(data := await _h11_event(stream, conn), h11.EndOfMessage):
        body += data.data
    headers = {k.decode().lower(): v.decode() for k, v in event.headers}
    return Request(event.method.decode(), event.target.decode(), headers, bytes(body))


def serve_h11(spec_path: str) -> None:
    """Run the fake deployment with the h11 connection loop (a child process of this bench)."""
    from functools import partial

    from trollout.testing import deployment, load_spec
    from trollout.testing.process import serve_until_signal

    deployment.serve_connection = serve_connection_h11  # type: ignore[attr-defined]
    trio.run(partial(serve_until_signal, load_spec(spec_path), record_runs=False))


# -- the load generator -------------------------------------------------------------------


def requests_bytes(port: int, count: int = 1000) -> list[bytes]:
    """Return ``count`` distinct raw ``POST /run`` requests."""
    out = []
    for i, row in enumerate(task_rows(count, seed=1)):
        body = orjson.dumps(row | {"_ng_task_index": i, "_ng_rollout_index": 0})
        head = (
            f"POST /run HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        )
        out.append(head.encode() + body)
    return out


class _Conn:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.outstanding = 0


def _count_replies(conn: _Conn) -> int:
    done, pos, buf = 0, 0, conn.buf
    while True:
        end = buf.find(b"\r\n\r\n", pos)
        if end < 0:
            break
        head = bytes(buf[pos:end]).lower()
        at = head.find(b"content-length:") + len(b"content-length:")
        length = int(head[at:].split(b"\r\n", 1)[0])
        if len(buf) < end + 4 + length:
            break
        pos = end + 4 + length
        done += 1
    del buf[:pos]
    return done


def generate_load(
    port: int, connections: int, depth: int, seconds: float, out: multiprocessing.Queue[int]
) -> None:
    """Keep ``depth`` requests outstanding on each connection for ``seconds``; report the count."""
    payloads = requests_bytes(port)
    sel = selectors.DefaultSelector()
    conns = []
    for _ in range(connections):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Conn(sock)
        conns.append(conn)
        sel.register(sock, selectors.EVENT_READ, conn)
    sent = completed = 0
    for conn in conns:
        batch = b"".join(payloads[(sent + k) % len(payloads)] for k in range(depth))
        conn.sock.sendall(batch)
        conn.outstanding, sent = depth, sent + depth
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.5):
            conn = key.data
            data = conn.sock.recv(1 << 20)
            if not data:
                raise RuntimeError("server closed a connection")
            conn.buf += data
            done = _count_replies(conn)
            completed += done
            if done:
                batch = b"".join(payloads[(sent + k) % len(payloads)] for k in range(done))
                conn.sock.sendall(batch)
                sent += done
    for conn in conns:
        conn.sock.close()
    out.put(completed)


def cpu_seconds(pid: int) -> float:
    """Return the user + system CPU seconds of process ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(pid: int, port: int, connections: int, depth: int, seconds: float) -> dict[str, float]:
    """Drive one scenario and return its figures."""
    out: multiprocessing.Queue[int] = multiprocessing.Queue()
    proc = multiprocessing.Process(
        target=generate_load, args=(port, connections, depth, seconds, out)
    )
    cpu0, t0 = cpu_seconds(pid), time.monotonic()
    proc.start()
    completed = out.get(timeout=seconds + 60)
    proc.join()
    cpu1, elapsed = cpu_seconds(pid), time.monotonic() - t0
    return {
        "rps": completed / seconds,
        "cpu_us": 1e6 * (cpu1 - cpu0) / max(completed, 1),
        "cpu_share": (cpu1 - cpu0) / elapsed,
    }


def start_server(parser: str, spec_path: str) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """Start the fake with the chosen parser; return the process and its ready line."""
    if parser == "fast":
        cmd = [
            sys.executable,
            "-m",
            "trollout.testing",
            "serve",
            "--spec",
            spec_path,
            "--no-record-runs",
        ]
    else:
        cmd = [sys.executable, __file__, "--serve-h11", spec_path]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    return proc, orjson.loads(proc.stdout.readline())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--parsers", default="fast,h11")
    parser.add_argument("--serve-h11", metavar="SPEC", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_h11:
        serve_h11(args.serve_h11)
        return
    spec = DeploymentSpec(agents=(AgentSpec(name="bench_agent"),))
    with tempfile.TemporaryDirectory() as folder:
        spec_path = str(Path(folder, "spec.yaml"))
        Path(spec_path).write_text(yaml.safe_dump(spec_to_dict(spec)))
        print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
        header = ("parser", "conns", "depth", "req/s", "srv CPU us/req", "1 core req/s", "srv CPU")
        print("{:6} {:>5} {:>5} {:>9} {:>14} {:>12} {:>7}".format(*header))
        for name in args.parsers.split(","):
            proc, ready = start_server(name, spec_path)
            port = int(ready["run_urls"]["bench_agent"].rsplit(":", 1)[1])
            try:
                for conns, depth in SCENARIOS:
                    r = measure(proc.pid, port, conns, depth, args.seconds)
                    print(
                        f"{name:6} {conns:5d} {depth:5d} {r['rps']:9.0f} {r['cpu_us']:14.1f} "
                        f"{1e6 / r['cpu_us']:12.0f} {100 * r['cpu_share']:6.0f}%",
                        flush=True,
                    )
            finally:
                proc.terminate()
                proc.wait(timeout=10)


if __name__ == "__main__":
    main()
