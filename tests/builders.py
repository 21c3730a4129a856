"""Shared test builders: rows, identities, outcomes, JSONL files, configs, scripted transports.

Also the waits that synchronise a test with a run. They wait for an event (a request arrived,
a row was written, a line was printed) and never for a fixed time; the clock only bounds a
wait as a hang guard, whose expiry fails the test however loaded the machine is.
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import orjson
import trio
from click.testing import CliRunner, Result

from trollout import jsonl
from trollout.collector.engine.collector import Collector, open_collector
from trollout.collector.engine.sink import OutcomeSink
from trollout.collector.http.transport import RawResponse
from trollout.records import Failed, Identity, Landed, MaterializedRow, OmitReason, Omitted
from trollout.settings import RunConfig
from trollout.testing import Fault, FaultContext, task_rows

HANG_GUARD_S = 120.0  # a wait this long is a hung test, not a slow machine
AGENT = "agent"
URLS = {AGENT: "http://127.0.0.1:1"}  # scripted transports never connect

# --- rows, identities, outcomes -----------------------------------------------------------------


def _tcp_ports_by_inode() -> dict[str, set[int]]:
    """Each TCP socket's inode and its two ports, from /proc/self/net/tcp{,6}."""
    ports: dict[str, set[int]] = {}
    for table in ("tcp", "tcp6"):
        with suppress(FileNotFoundError):
            for line in Path(f"/proc/self/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                local, remote, inode = fields[1], fields[2], fields[9]
                ports[inode] = {int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16)}
    return ports


def network_descriptors(*, inodes: Iterable[int] = (), ports: Iterable[int] = ()) -> frozenset[str]:
    """The epoll instances this process holds open, and the sockets the test names: by
    inode (``os.fstat(sock.fileno()).st_ino``) or by a TCP port at either end.

    Tests that check a mechanism closes what it opened compare these before and after, never
    the count of every descriptor: another thread of the test process (the Slurm acceptance
    session, tests/scaleout/slurm_session.py) opens pipes, files and HTTP connections of its
    own at any moment. It opens no epoll.
    """
    wanted_inodes = {str(inode) for inode in inodes}
    wanted_ports = set(ports)
    tcp = _tcp_ports_by_inode() if wanted_ports else {}
    links = set()
    for fd in os.listdir("/proc/self/fd"):
        with suppress(FileNotFoundError):  # closed between the listing and the read
            link = os.readlink(f"/proc/self/fd/{fd}")
            inode = link.removeprefix("socket:[").removesuffix("]")
            if (
                link == "anon_inode:[eventpoll]"
                or inode in wanted_inodes
                or tcp.get(inode, set()) & wanted_ports
            ):
                links.add(f"{fd}:{link}")
    return frozenset(links)


def row_body(task: int, rollout: int = 0, *, agent: str = AGENT, **extra: Any) -> dict[str, Any]:
    """Return the body of a materialized row of (task, rollout), asking ``q<task>``."""
    return {
        "responses_create_params": {"input": [{"role": "user", "content": f"q{task}"}]},
        "agent_ref": {"name": agent},
        "_ng_task_index": task,
        "_ng_rollout_index": rollout,
        **extra,
    }


def materialized_row(task: int, rollout: int = 0, *, agent: str = AGENT) -> MaterializedRow:
    """Return the materialized row of (task, rollout) for `agent`."""
    return MaterializedRow.from_body(row_body(task, rollout, agent=agent))


def materialized_rows(n: int, *, agent: str = AGENT, first_task: int = 0) -> list[MaterializedRow]:
    """Return n rows, one task each (tasks first_task .. first_task + n - 1), rollout 0."""
    return [materialized_row(task, agent=agent) for task in range(first_task, first_task + n)]


def identity(
    task: int, rollout: int = 0, *, agent: str | None = AGENT, env: str | None = None
) -> Identity:
    """Return the identity stamps of (task, rollout)."""
    return Identity(task, rollout, agent_name=agent, environment_server=env)


def landed(
    task: int,
    rollout: int = 0,
    attempt: int = 0,
    *,
    result: Mapping[str, Any] | None = None,
    elapsed_seconds: float | None = None,
    agent: str | None = AGENT,
    env: str | None = None,
) -> Landed:
    """Return a Landed outcome (the result defaults to a reward of 1.0)."""
    reply = {"reward": 1.0} if result is None else dict(result)
    return Landed(identity(task, rollout, agent=agent, env=env), attempt, reply, elapsed_seconds)


def failed(
    task: int,
    rollout: int = 0,
    attempt: int = 0,
    *,
    agent: str | None = AGENT,
    env: str | None = None,
    **fields: Any,
) -> Failed:
    """Return a Failed outcome (class ``agent_run_error`` unless `fields` say otherwise)."""
    fields.setdefault("failure_class", "agent_run_error")
    return Failed(identity(task, rollout, agent=agent, env=env), attempt, **fields)


def omitted(
    task: int, rollout: int = 0, attempt: int = 0, *, drained: bool = False, agent: str = AGENT
) -> Omitted:
    """Return an Omitted outcome: interrupted, or never started when `drained`."""
    reason = OmitReason.DRAINED if drained else OmitReason.INTERRUPTED
    return Omitted(identity(task, rollout, agent=agent), attempt, reason)


# --- files --------------------------------------------------------------------------------------


def write_jsonl(path: Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    """Write rows as JSON lines, replacing the file (its folder is made); return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(jsonl.dumps(row) for row in rows))
    return path


def append_jsonl(path: Path, rows: Iterable[Mapping[str, Any]]) -> None:
    """Append rows as JSON lines."""
    with open(path, "ab") as f:
        f.write(b"".join(jsonl.dumps(row) for row in rows))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Read a JSONL file (empty when absent)."""
    return list(jsonl.read_rows(path)) if path.exists() else []


def count_lines(path: Path) -> int:
    """Return the number of newlines in a file (0 when absent)."""
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def write_tasks_input(
    path: Path, n: int, *, seed: int = 1, faults: Mapping[int, Mapping[str, Any]] | None = None
) -> Path:
    """Write n synthetic task rows; row i also gets ``fake_fault: faults[i]``; return the path."""
    rows = list(task_rows(n, seed=seed))
    for i, fault in (faults or {}).items():
        rows[i]["fake_fault"] = dict(fault)
    return write_jsonl(path, rows)


def collect_config(
    source: Path, output: Path, head: str, *, agent: str = "math_agent", **settings: Any
) -> RunConfig:
    """Return a config collecting `source` into `output` through the head server `head`."""
    return RunConfig(
        input_jsonl_fpath=str(source),
        output_jsonl_fpath=str(output),
        head_server=head,
        agent_name=agent,
        **settings,
    )


# --- the CLI ------------------------------------------------------------------------------------


def served_block(kind: str, port: int, **refs: str) -> dict[str, Any]:
    """One server of a served config: ``{kind: {impl: {host, port, refs}}}``.

    ``refs`` name the servers it links to: ``model_server="m"``, ``agent_server="a"``.
    """
    types = {"model_server": "responses_api_models", "agent_server": "responses_api_agents"}
    links = {key: {"type": types[key], "name": name} for key, name in refs.items()}
    return {kind: {"impl": {"host": "127.0.0.1", "port": port, **links}}}


def cli_command(*args: str) -> list[str]:
    """Return the command line of the trollout CLI in this interpreter (for a subprocess)."""
    return [sys.executable, "-m", "trollout.cli.main", *args]


def invoke(*args: str, env: Mapping[str, str] | None = None) -> Result:
    """Run the trollout CLI in process (click's CliRunner) and return its result."""
    from trollout.cli.main import cli

    return CliRunner(env=env).invoke(cli, list(args))


class _HeadServer(http.server.BaseHTTPRequestHandler):
    """Answers every GET with the server's YAML text inside a JSON string, as NeMo Gym does."""

    def do_GET(self) -> None:
        body = json.dumps(self.server.yaml_text).encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Stay quiet."""


@contextmanager
def serve_head_config(yaml_text: str) -> Iterator[str]:
    """Serve ``yaml_text`` as a head server's config on loopback; yield its URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HeadServer)
    server.yaml_text = yaml_text  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


# --- scripted transports and the engine ---------------------------------------------------------


class ScriptedTransport:
    """Answers each POST after a scripted delay with a scripted status; counts what is in flight."""

    def __init__(
        self,
        *,
        delay: Callable[[Mapping[str, Any]], float] = lambda row: 1.0,
        status: Callable[[Mapping[str, Any]], int] = lambda row: 200,
    ) -> None:
        self.delay = delay
        self.status = status
        self.in_flight = 0
        self.max_in_flight = 0
        self.requests: list[tuple[int, int]] = []

    async def post(self, url: str, body: bytes, **_: Any) -> RawResponse:
        row = orjson.loads(body)
        self.requests.append((row["_ng_task_index"], row["_ng_rollout_index"]))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await trio.sleep(self.delay(row))
        finally:
            self.in_flight -= 1
        status = self.status(row)
        reply = {"response": {"output": []}, "reward": float(row["_ng_task_index"] % 2)}
        body_out = orjson.dumps(reply) if status == 200 else b'"boom"'
        return RawResponse(status=status, headers=[], body=body_out, truncated=False)

    async def aclose(self) -> None:
        pass


class FaultScriptTransport:
    """Carries out a `trollout.testing` fault script in memory, under Trio's fake clock.

    ``script`` maps ``(run id, task, rollout, attempt, request)`` (run id None: any run) to a
    `Fault`, as `FaultScript` does for the fake deployment; each request first waits
    ``delay(row)`` seconds. Statuses become replies, resets and disconnects transport errors,
    ``hang`` never answers, the 200-shaped faults their reply; anything else answers normally.
    """

    def __init__(
        self,
        script: Mapping[tuple[Any, int, int, int, int], Fault],
        *,
        delay: Callable[[Mapping[str, Any]], float] = lambda row: 1.0,
    ) -> None:
        self.script = script
        self.delay = delay
        self.counts: dict[tuple[Any, ...], int] = {}
        self.in_flight = 0

    async def post(self, url: str, body: bytes, **_: Any) -> RawResponse:
        row = orjson.loads(body)
        run = row.get("_ng_run_id")
        key = (row["_ng_task_index"], row["_ng_rollout_index"], row.get("_ng_attempt_index", 0))
        request = self.counts.get((run, *key), 0)
        self.counts[(run, *key)] = request + 1
        fault = self.script.get((run, *key, request)) or self.script.get((None, *key, request))
        self.in_flight += 1
        try:
            await trio.sleep(self.delay(row) + (fault.delay_s if fault is not None else 0.0))
            return await self._answer(fault)
        finally:
            self.in_flight -= 1

    async def _answer(self, fault: Fault | None) -> RawResponse:
        ok = {"response": {"output": []}, "reward": 1.0}
        kind = None if fault is None else fault.kind.value
        if fault is None or kind == "latency":
            return RawResponse(status=200, headers=[], body=orjson.dumps(ok))
        if kind == "hang":
            await trio.sleep_forever()
        if kind == "status":
            after = (
                [] if fault.retry_after is None else [(b"retry-after", b"%g" % fault.retry_after)]
            )
            return RawResponse(status=fault.status or 500, headers=after, body=b'"fault"')
        if kind in ("reset_mid_request", "disconnect", "reset_mid_response"):
            raise httpx.ReadError(f"fake {kind}")
        if kind == "not_json":
            return RawResponse(status=200, headers=[], body=b"<html>")
        marks: dict[str, Any] = {"_ng_no_persist": True} if kind == "no_persist" else {}
        if kind == "failure_class":
            marks = {"_ng_failure_class": fault.failure_class or "transient"}
            marks |= {"_ng_failure_terminal": True} if fault.terminal else {}
        return RawResponse(status=200, headers=[], body=orjson.dumps(ok | marks))

    async def aclose(self) -> None:
        pass


@asynccontextmanager
async def scripted_collector(
    transport: Any = None,
    *,
    sink: OutcomeSink | None = None,
    retain_outcomes: bool = False,
    seed: int | None = None,
    **settings: Any,
) -> AsyncIterator[Collector]:
    """Open a collector on `transport` (a ScriptedTransport by default) with `settings`."""
    async with open_collector(
        config=RunConfig(**settings),
        urls=URLS,
        sink=sink,
        transport=ScriptedTransport() if transport is None else transport,
        retain_outcomes=retain_outcomes,
        seed=seed,
    ) as collector:
        yield collector


async def collect_scripted(
    n: int,
    transport: Any = None,
    *,
    sink: OutcomeSink | None = None,
    seed: int | None = None,
    **settings: Any,
) -> Collector:
    """Collect n one-task rows through `transport` with `settings`; return the collector."""
    async with scripted_collector(transport, sink=sink, seed=seed, **settings) as collector:
        await collector.collect(materialized_rows(n))
    return collector


# --- waiting for events -------------------------------------------------------------------------


async def wait_until(condition: Callable[[], bool], what: str, *, poll_s: float = 0.01) -> None:
    """Poll `condition` until it holds; fail the test on the (real-time) hang guard.

    ``poll_s=0`` polls at every checkpoint without sleeping, so Trio's fake clock stands still
    while the kernel delivers loopback I/O (a busy wait: keep it for short waits).
    """
    deadline = time.monotonic() + HANG_GUARD_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"hung: {what} did not happen within {HANG_GUARD_S:g} s")
        await trio.sleep(poll_s)


async def cancel_when(
    run: Callable[[], Awaitable[object]], condition: Callable[[], bool], what: str
) -> None:
    """Run `run` and cancel it as soon as `condition` holds (it must not finish first)."""
    finished = False

    async def body() -> None:
        nonlocal finished
        await run()
        finished = True

    async with trio.open_nursery() as nursery:
        nursery.start_soon(body)
        await wait_until(lambda: finished or condition(), what)
        assert not finished, f"the run finished before {what}"
        nursery.cancel_scope.cancel(reason=f"test: {what}")


def wait_for(
    condition: Callable[[], bool], what: str, *, proc: subprocess.Popen[Any] | None = None
) -> None:
    """Poll `condition` (blocking) until it holds; fail if `proc` exits or on the hang guard."""
    deadline = time.monotonic() + HANG_GUARD_S
    while not condition():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the process exited ({proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"hung: {what} did not happen within {HANG_GUARD_S:g} s")
        time.sleep(0.02)


class HangArrivals:
    """A fake-deployment fault callable: `/run` arrivals first..first+count-1 hang.

    The others are answered as the deployment would. With ``count`` equal to the run's
    concurrency, a run settles exactly ``first`` rollouts and then holds ``count`` in flight
    until it is cancelled: a state a test can wait for (``arrivals == first + count``).
    """

    def __init__(self, first: int, count: int) -> None:
        self.first = first
        self.count = count
        self.arrivals = 0

    def __call__(self, context: FaultContext) -> Fault | None:
        index, self.arrivals = self.arrivals, self.arrivals + 1
        return Fault(kind="hang") if self.first <= index < self.first + self.count else None

    @property
    def all_hanging(self) -> bool:
        """Whether every hanging arrival has come."""
        return self.arrivals >= self.first + self.count


def connections(sock: socket.socket) -> int:
    """Return how many connections reached a `listener` socket since the last call."""
    n = 0
    while True:
        try:
            conn, _ = sock.accept()
        except BlockingIOError:
            return n
        conn.close()
        n += 1


def without_hanging(call: Callable[[], Any], *fifos: Path) -> Any:
    """Run ``call`` in a thread and return its result; fail if it blocks (on opening a FIFO).

    The clock is only a hang guard. On a hang each FIFO is opened for writing (non-blocking),
    which releases a reader stuck opening it, so the stuck thread ends with the test.
    """
    outcome: list[Any] = []
    worker = threading.Thread(target=lambda: outcome.append(call()), daemon=True)
    worker.start()
    worker.join(timeout=HANG_GUARD_S)
    if worker.is_alive():
        for fifo in fifos:
            with suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        raise AssertionError(f"hung: the call did not return within {HANG_GUARD_S:g} s")
    assert outcome, "the call raised (see the thread's traceback above)"
    return outcome[0]
