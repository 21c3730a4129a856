"""The end of a run, as Prometheus sees it: final values scrapeable after it, or pushed.

Every scrape is a real GET over loopback (httpx), every push lands on a loopback HTTP server the
test starts. Runs go through `collect_run` to the fake deployment. The linger window runs on
Trio's fake clock (`mock_clock`: it moves only when the test jumps it, so a scrape's real I/O
never races the window's end); nothing is asserted about wall-clock time.
"""

from __future__ import annotations

import http.server
import io
import re
import signal
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families

from builders import HANG_GUARD_S, collect_config, count_lines, read_jsonl, write_tasks_input
from trollout import __version__
from trollout.cli.collect import collect_run
from trollout.recovery.manifest import read_manifest
from trollout.telemetry import TelemetrySettings
from trollout.telemetry.runtime import Telemetry, open_telemetry
from trollout.testing import AgentSpec, DeploymentSpec, Fault, FaultContext, open_fake_deployment

TASKS = 9
SPEC = DeploymentSpec(agents=(AgentSpec(name="math_agent"),))


def faults(context: FaultContext) -> Fault | None:
    """Task 1: a 500; task 2: a producer's failure class; the rest land."""
    if context.task_index == 1:
        return Fault(kind="status", status=500, body="boom")
    if context.task_index == 2:
        return Fault(kind="failure_class", failure_class="transient")
    return None


def samples(text: str) -> dict[str, list[Any]]:
    """Parse an exposition into samples by sample name (prometheus-client's own parser)."""
    out: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


async def get(url: str) -> httpx.Response:
    """One GET over loopback."""
    async with httpx.AsyncClient(timeout=30) as client:
        return await client.get(url)


def outcomes(got: dict[str, list[Any]]) -> Counter[tuple[str, str]]:
    """``trollout_rollouts_total`` by (outcome, failure class)."""
    counts: Counter[tuple[str, str]] = Counter()
    for sample in got["trollout_rollouts_total"]:
        counts[(sample.labels["outcome"], sample.labels.get("failure_class", ""))] += sample.value
    return counts


def folder_outcomes(run: Path) -> Counter[tuple[str, str]]:
    """The same, counted from the run folder's files."""
    failures = Counter(row["_ng_failure_class"] for row in read_jsonl(run / "r_failures.jsonl"))
    landed = count_lines(run / "r.jsonl")
    return Counter({("landed", ""): landed} | {("failed", c): n for c, n in failures.items()})


async def test_prometheus_scrape_after_the_run_ends_returns_the_final_counts(
    tmp_path: Path,
) -> None:
    """After the run (summary data, aggregation and all), the endpoint still answers with the
    final counts, in_flight 0, the run's identity and the process metrics; only /metrics."""
    source = write_tasks_input(tmp_path / "tasks.jsonl", TASKS)
    stream = io.StringIO()
    async with open_fake_deployment(SPEC, fault_fn=faults) as fake:
        config = collect_config(
            source,
            tmp_path / "run" / "r.jsonl",
            fake.head_url,
            metrics_port=0,
            num_samples_in_parallel=4,
        )
        result = await collect_run(config, progress_stream=stream, live=False)
    assert result.aggregate is not None  # the run ended through aggregation
    match = re.search(r"Prometheus metrics at (\S+)", stream.getvalue())
    assert match is not None, stream.getvalue()
    url = match[1]

    response = await get(url)
    assert response.status_code == 200
    got = samples(response.text)
    expected = folder_outcomes(tmp_path / "run")
    assert sum(expected.values()) == TASKS
    assert expected[("failed", "transient")] == 1
    assert outcomes(got) == expected
    assert [s.value for s in got["trollout_in_flight"]] == [0]
    assert [s.value for s in got["trollout_queued"]] == [0]
    counts = {s.labels["outcome"]: s.value for s in got["trollout_attempt_duration_seconds_count"]}
    assert counts == {"landed": expected[("landed", "")], "failed": 2}
    manifest = read_manifest(result.layout)
    assert manifest is not None
    [info] = got["trollout_run_info"]
    assert info.labels == {"run_id": manifest.run_id, "version": __version__}
    assert info.value == 1
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "python_info"):
        assert name in got, sorted(got)

    base = url.removesuffix("/metrics")
    for path in ("/", "/metrics/", "/metric", "/favicon.ico", "/anything?x=1"):
        assert (await get(base + path)).status_code == 404, path
    assert (await get(url + "?name[]=trollout_in_flight")).status_code == 200


async def ended_telemetry(linger_s: float, stream: io.StringIO) -> Telemetry:
    """Open the telemetry and end it without an exception (a run that ended)."""
    async with open_telemetry(
        TelemetrySettings(prometheus=("127.0.0.1", 0), linger_s=linger_s),
        max_attempts=3,
        stream=stream,
    ) as telemetry:
        pass
    return telemetry


async def test_prometheus_endpoint_lingers_for_the_window_on_trio_clock(
    mock_clock: trio.testing.MockClock,
) -> None:
    """Ended: still served, with a line saying for how long; served half-way through the
    window; closed once the fake clock has jumped past its end."""
    stream = io.StringIO()
    telemetry = await ended_telemetry(60.0, stream)
    server = telemetry.server
    assert server is not None
    assert (await get(server.url)).status_code == 200  # served once the run has ended

    async with trio.open_nursery() as nursery:
        nursery.start_soon(telemetry.linger)
        await trio.testing.wait_all_tasks_blocked()
        # the window counts from the run's end (real time has passed since): "for 60 s more"
        # on an idle machine, a little less on a loaded one
        assert re.search(r"serving the final metrics at \S+ for \d+ s more", stream.getvalue())
        mock_clock.jump(30.0)
        await trio.testing.wait_all_tasks_blocked()
        response = await get(server.url)  # the fake clock stands still meanwhile
        assert response.status_code == 200
        assert "trollout_nemo_gym_export" in response.text
        assert not server.closed
        mock_clock.jump(30.0)
    assert server.closed
    with pytest.raises(httpx.ConnectError):
        await get(server.url)


def test_prometheus_linger_from_a_later_trio_run() -> None:
    """The command line prints its summary after the run's trio.run returns: a second
    trio.run (here on an autojumping fake clock) waits out the window and closes."""
    stream = io.StringIO()
    telemetry = trio.run(ended_telemetry, 60.0, stream)
    server = telemetry.server
    assert server is not None
    assert not server.closed
    clock = trio.testing.MockClock(autojump_threshold=0)
    trio.run(telemetry.linger, clock=clock)
    assert server.closed
    assert clock.current_time() > 30  # the window was waited out on the fake clock
    assert "serving the final metrics at" in stream.getvalue()


async def test_prometheus_linger_ends_early_on_sigint() -> None:
    """Ctrl-C during the linger: it returns at once and the endpoint is closed."""
    telemetry = await ended_telemetry(3600.0, io.StringIO())
    server = telemetry.server
    assert server is not None
    with trio.fail_after(HANG_GUARD_S):  # a hang guard, not a timing assertion
        async with trio.open_nursery() as nursery:
            nursery.start_soon(telemetry.linger)
            await trio.testing.wait_all_tasks_blocked()
            assert not server.closed
            signal.raise_signal(signal.SIGINT)
    assert server.closed


async def test_prometheus_linger_cancelled_closes_the_endpoint() -> None:
    """Cancelled during the linger: it returns at once and the endpoint is closed."""
    telemetry = await ended_telemetry(3600.0, io.StringIO())
    server = telemetry.server
    assert server is not None
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(telemetry.linger)
            await trio.testing.wait_all_tasks_blocked()
            scope.cancel()
    assert server.closed


async def test_prometheus_no_linger_when_zero_or_when_the_run_failed() -> None:
    """metrics_linger_s=0, or a run ending in an exception: the endpoint closes with the run."""
    telemetry = await ended_telemetry(0.0, io.StringIO())
    assert telemetry.server is not None
    assert telemetry.server.closed

    holder: list[Telemetry] = []

    async def failing_run() -> None:
        settings = TelemetrySettings(prometheus=("127.0.0.1", 0), linger_s=60.0)
        async with open_telemetry(settings, max_attempts=3) as failing:
            holder.append(failing)
            raise RuntimeError("the run broke")

    with pytest.raises(RuntimeError, match="the run broke"):
        await failing_run()
    assert holder[0].server is not None
    assert holder[0].server.closed


class Pushes:
    """What a loopback Pushgateway received: (method, path, body) per request."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str, str]] = []


@contextmanager
def pushgateway() -> Iterator[tuple[str, Pushes]]:
    """A Pushgateway stand-in on 127.0.0.1 recording every PUT and POST (200 to each)."""
    pushes = Pushes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def _record(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            with pushes.lock:
                pushes.requests.append((self.command, self.path, body.decode()))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        do_PUT = do_POST = _record

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", pushes
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=HANG_GUARD_S)


async def test_pushgateway_receives_the_final_counts_once(tmp_path: Path) -> None:
    """metrics_pushgateway: one PUT at the end, grouped by run id, holding the final counts
    and the run info (no process metrics); no endpoint is served."""
    source = write_tasks_input(tmp_path / "tasks.jsonl", TASKS)
    stream = io.StringIO()
    with pushgateway() as (gateway, pushes):
        async with open_fake_deployment(SPEC, fault_fn=faults) as fake:
            config = collect_config(
                source,
                tmp_path / "run" / "r.jsonl",
                fake.head_url,
                metrics_pushgateway=gateway + "/",
                num_samples_in_parallel=4,
                disable_aggregation=True,
            )
            result = await collect_run(config, progress_stream=stream, live=False)
    assert "Prometheus metrics at" not in stream.getvalue()
    manifest = read_manifest(result.layout)
    assert manifest is not None
    [(method, path, body)] = pushes.requests
    assert method == "PUT"
    assert path == f"/metrics/job/trollout/run_id/{manifest.run_id}"
    got = samples(body)
    assert outcomes(got) == folder_outcomes(tmp_path / "run")
    assert [s.value for s in got["trollout_in_flight"]] == [0]
    [info] = got["trollout_run_info"]
    assert info.labels == {"run_id": manifest.run_id, "version": __version__}
    assert not [name for name in got if name.startswith(("process_", "python_"))]


async def test_pushgateway_unreachable_loses_the_push_not_the_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A Pushgateway refusing connections: the run ends as usual, every outcome in the folder,
    and one warning names the gateway."""
    source = write_tasks_input(tmp_path / "tasks.jsonl", TASKS)
    with socket.socket() as refusing:  # bound, never listening: connections are refused
        refusing.bind(("127.0.0.1", 0))
        gateway = f"http://127.0.0.1:{refusing.getsockname()[1]}"
        async with open_fake_deployment(SPEC, fault_fn=faults) as fake:
            config = collect_config(
                source,
                tmp_path / "run" / "r.jsonl",
                fake.head_url,
                metrics_pushgateway=gateway,
                disable_aggregation=True,
            )
            result = await collect_run(config, progress_stream=io.StringIO(), live=False)
    assert result.progress.settled == TASKS
    assert sum(folder_outcomes(tmp_path / "run").values()) == TASKS
    warnings = [r.getMessage() for r in caplog.records if r.name == "trollout.telemetry"]
    assert len(warnings) == 1, warnings
    assert f"Pushgateway at {gateway}" in warnings[0]
