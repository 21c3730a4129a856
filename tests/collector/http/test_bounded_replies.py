"""Every reply trollout reads off the `/run` path is bounded: head config, probes, queues, metrics.

Each test points the real code at a loopback server (endless_reply.py) that streams a 200 far
past the bound under test, and checks the one-line error (the URL without credentials, the
bound) and that the read stopped early: the server saw the client leave before the end. The
bounds are lowered here (monkeypatch) so no test moves more than a few MiB; one CLI test keeps
the real `MAX_HEAD_CONFIG_BYTES`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import trio

from builders import invoke, write_tasks_input
from endless_reply import Replies, endless_reply_server
from trollout.collector.deployment import discovery as deployment
from trollout.collector.deployment.discovery import check_alive, discover
from trollout.collector.engine import queues
from trollout.collector.engine.queues import sample_queues
from trollout.collector.http.transport import Http11Transport, ReplyTooLargeError, read_bounded
from trollout.errors import DeploymentError
from trollout.metrics import server
from trollout.metrics.server import fetch_server_metrics

MIB = 1024 * 1024
BOUND = 256 * 1024
TOTAL = 64 * MIB  # what the server would send: far past BOUND plus any socket buffers


@asynccontextmanager
async def client() -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client on trollout's transport, as the run layer builds it (`run.http_client`)."""
    transport = Http11Transport(connect_timeout_s=5.0, read_timeout_s=30.0)
    async with httpx.AsyncClient(transport=transport) as http:
        yield http


async def wait_stopped_early(replies: Replies, count: int = 1) -> None:
    """`stopped_early`, waited for in a thread (the server's handlers end on their own)."""
    ended = await trio.to_thread.run_sync(replies.wait_for_replies, count)
    for sent, left in ended:
        assert left
        assert sent < TOTAL // 4, sent


async def test_read_bounded_names_the_url_and_bound_and_stops_reading() -> None:
    """read_bounded raises one ReplyTooLargeError naming the URL (no query: it may hold a
    token) and the bound; the transport stopped reading at the bound."""
    with endless_reply_server(TOTAL) as (url, replies):
        async with client() as http:
            with pytest.raises(ReplyTooLargeError) as caught:
                await read_bounded(http, "GET", f"{url}/x?token=s3cret", limit=BOUND, bound="B")
        await wait_stopped_early(replies)
    message = str(caught.value)
    assert message == (
        f"the reply to GET {url}/x is larger than {BOUND} bytes (B), so it was not read; "
        "check that the URL is the server you meant"
    )
    assert caught.value.__cause__ is None  # the transport's message names another setting
    assert caught.value.__suppress_context__


# httpx's own stream layers are async generators that a closed response leaves to the garbage
# collector, which Trio reports as a ResourceWarning; the connection itself is closed.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_read_bounded_stops_on_any_httpx_transport() -> None:
    """On an httpx transport that is not trollout's (`aggregate_shards` opens one when given
    no client), the reply is read as a stream and closed at the bound."""
    with endless_reply_server(TOTAL) as (url, replies):
        async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport()) as http:
            with pytest.raises(ReplyTooLargeError, match=f"larger than {BOUND} bytes"):
                await read_bounded(http, "GET", url, limit=BOUND, bound="B")
        await wait_stopped_early(replies)


async def test_discover_refuses_a_head_config_past_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GET /global_config_dict_yaml past MAX_HEAD_CONFIG_BYTES is one DeploymentError."""
    monkeypatch.setattr(deployment, "MAX_HEAD_CONFIG_BYTES", BOUND)
    with endless_reply_server(TOTAL) as (url, replies):
        async with client() as http:
            with pytest.raises(DeploymentError) as caught:
                await discover(http, url)
        await wait_stopped_early(replies)
    message = str(caught.value)
    assert f"GET {url}/global_config_dict_yaml is larger than {BOUND} bytes" in message
    assert "MAX_HEAD_CONFIG_BYTES" in message
    assert "\n" not in message


async def test_liveness_probe_past_its_bound_is_a_dead_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A GET / reply past MAX_PROBE_REPLY_BYTES: the server is reported, with the bound."""
    monkeypatch.setattr(deployment, "MAX_PROBE_REPLY_BYTES", BOUND)
    with endless_reply_server(TOTAL) as (url, replies):
        async with client() as http:
            dead = await check_alive(http, [url])
        await wait_stopped_early(replies)
    assert list(dead) == [url]
    assert f"larger than {BOUND} bytes (MAX_PROBE_REPLY_BYTES)" in dead[url]


async def test_queue_sample_past_its_bound_is_an_error_with_its_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A /metrics reply past MAX_QUEUE_METRICS_BYTES counts as an error; the round keeps its
    one-line reason, the URL shown without its query."""
    monkeypatch.setattr(queues, "MAX_QUEUE_METRICS_BYTES", BOUND)
    with endless_reply_server(TOTAL) as (url, replies):
        async with client() as http:
            sample = await sample_queues(http, [f"{url}/metrics?key=s3cret"])
        await wait_stopped_early(replies)
    assert (sample.servers, sample.errors) == (0, 1)
    assert sample.problem is not None
    assert f"GET {url}/metrics is larger than {BOUND} bytes (MAX_QUEUE_METRICS_BYTES)" in (
        sample.problem
    )
    assert "s3cret" not in sample.problem


async def test_aggregate_metrics_reply_past_its_bound_is_that_groups_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """POST /aggregate_metrics past its bound (a base plus a multiple of the request) is the
    group's error naming the URL and the bound; nothing raises."""
    monkeypatch.setattr(server, "AGGREGATE_REPLY_BASE_BYTES", BOUND)
    rows = [(0, 0, b'{"reward": 1.0}')]
    limit = server.reply_limit(len(server.request_body(list(rows))))
    assert BOUND < limit < 2 * BOUND
    with endless_reply_server(TOTAL) as (url, replies):
        async with client() as http:
            outcome = await fetch_server_metrics(http, url, list(rows))
        await wait_stopped_early(replies)
    assert outcome.reply is None
    assert outcome.error is not None
    assert f"POST {url}/aggregate_metrics is larger than {limit} bytes" in outcome.error
    assert "AGGREGATE_REPLY_BASE_BYTES" in outcome.error


def test_collect_with_an_endless_head_server_exits_2_in_one_line(tmp_path: Path) -> None:
    """`trollout collect --head-server` against a head server streaming 64 MiB: exit 2, one line
    naming the URL and MAX_HEAD_CONFIG_BYTES (16 MiB), no traceback, nothing written, and the
    config read stopped at the bound."""
    source = tmp_path / "tasks.jsonl"
    write_tasks_input(source, 2)
    out = tmp_path / "run" / "r.jsonl"
    with endless_reply_server(TOTAL) as (url, replies):
        result = invoke("collect", str(source), "-o", str(out), "--head-server", url)
        [(sent, left)] = replies.wait_for_replies(1)
    assert result.exit_code == 2, result.output
    assert left
    assert sent < deployment.MAX_HEAD_CONFIG_BYTES + 16 * MIB, sent
    assert "Traceback" not in result.output
    [line] = [line for line in result.output.splitlines() if "MAX_HEAD_CONFIG_BYTES" in line]
    assert f"GET {url}/global_config_dict_yaml is larger than {16 * MIB} bytes" in line
    assert not out.parent.exists() or not any(out.parent.iterdir())
