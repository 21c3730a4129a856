"""Agent URLs in telemetry: span attributes and metric labels never carry their secrets.

A URL given through the library (``open_collector(urls=...)`` or ``resolve=``) is not checked
as the command line checks it, so it may hold ``user:password@`` or ``?api_key=``; telemetry
shows it as ``scheme://host:port/path`` only (the house rule: a config's secrets are never
echoed, and spans and labels leave the machine over OTLP and Prometheus).
"""

from __future__ import annotations

from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from builders import materialized_rows
from trollout.collector.dispatch.retry import endpoint_of, public_url
from trollout.collector.engine.collector import open_collector
from trollout.settings import RunConfig
from trollout.telemetry import TelemetrySettings
from trollout.telemetry.runtime import open_telemetry
from trollout.testing import AgentSpec, DeploymentSpec, open_fake_deployment

SPEC = DeploymentSpec(agents=(AgentSpec(name="math_agent"),))
SECRETS = ("alice", "hunter2", "sekret", "frag")


def test_public_url_drops_userinfo_query_and_fragment() -> None:
    """``scheme://host:port/path`` is kept; ``user:pass@``, ``?query`` and ``#frag`` go."""
    url = "http://alice:hunter2@h:1/a/run?api_key=sekret#frag"
    assert public_url(url) == "http://h:1/a/run"
    assert endpoint_of(url) == "http://h:1"
    assert public_url("http://[::1]:8/run") == "http://[::1]:8/run"


async def test_telemetry_never_carries_an_agent_urls_secrets() -> None:
    """A run to ``http://alice:hunter2@host:port/run?api_key=sekret#frag``: no span attribute
    and no metric label holds the user, the password, the query or the fragment."""
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    settings = TelemetrySettings(metrics="console")
    async with open_fake_deployment(SPEC) as fake:
        origin = fake.run_urls["math_agent"].removeprefix("http://").rstrip("/")
        url = f"http://alice:hunter2@{origin}/run?api_key=sekret#frag"
        async with (
            open_telemetry(
                settings, max_attempts=1, span_exporter=exporter, metric_readers=[reader]
            ) as telemetry,
            open_collector(
                config=RunConfig(max_attempts=1), resolve=lambda _: url, observer=telemetry
            ) as collector,
        ):
            telemetry.watch(collector, expected=2)
            await collector.collect(materialized_rows(2))
            data = reader.get_metrics_data()
    shown = [str(v) for span in exporter.get_finished_spans() for v in span.attributes.values()]
    assert f"http://{origin}/run" in shown
    assert data is not None
    labels = [
        str(value)
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        for point in metric.data.data_points
        for value in (point.attributes or {}).values()
    ]
    assert f"http://{origin}" in labels  # the breaker's endpoint label
    for secret in SECRETS:
        assert not [text for text in shown + labels if secret in text], secret


async def test_failure_rows_never_carry_an_agent_urls_secrets() -> None:
    """A refused connection and a server that breaks mid-reply: the failures name the endpoint
    as ``scheme://host:port/path``, never its user, password, query or fragment (failure rows
    are files users share)."""
    import socket
    from functools import partial

    import trio

    from trollout.collector.engine.sink import ListSink
    from trollout.records import Failed

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    refused_port = closed.getsockname()[1]

    async def break_each_reply(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\n{")
        await stream.aclose()  # mid-body

    try:
        async with trio.open_nursery() as nursery:
            serve = partial(trio.serve_tcp, break_each_reply, 0, host="127.0.0.1")
            listeners = await nursery.start(serve)
            broken_port = listeners[0].socket.getsockname()[1]
            sink = ListSink()
            for port in (refused_port, broken_port):
                url = f"http://alice:hunter2@127.0.0.1:{port}/run?api_key=sekret#frag"
                async with open_collector(
                    config=RunConfig(
                        max_attempts=1, dispatch_connect_grace_s=0.0, on_endpoint_outage="fail"
                    ),
                    resolve=lambda _, u=url: u,
                    sink=sink,
                ) as collector:
                    await collector.collect(materialized_rows(1))
            nursery.cancel_scope.cancel()
    finally:
        closed.close()
    failures = [o for o in sink.outcomes if isinstance(o, Failed)]
    assert len(failures) == 2
    messages = [str(f) for f in failures]
    assert f"127.0.0.1:{refused_port}/run" in messages[0]
    assert f"127.0.0.1:{broken_port}/run" in messages[1]
    for secret in SECRETS:
        assert not [text for text in messages if secret in text], (secret, messages)
