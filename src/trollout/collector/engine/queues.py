"""Model-server queues: read vLLM's Prometheus gauges from every server and sum them.

`sample_queues` GETs every ``/metrics`` URL at once (``server_queue_metrics_urls``) and sums
``vllm:num_requests_waiting`` and ``vllm:num_requests_running`` over the servers that answered;
`RunTimer.run_queue_sampler` calls it every ``server_queue_sample_interval_s``. Give it a client
built with short timeouts: a round that outlives its interval is abandoned whole. Each reply is
read up to `MAX_QUEUE_METRICS_BYTES` (vLLM's page is tens of KB); a server past it, like one that
does not answer, counts as an error, and the round keeps the first error's one-line reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import httpx
import trio
from attrs import frozen

from ...text import concealed
from ..http.transport import read_bounded

__all__ = [
    "MAX_QUEUE_METRICS_BYTES",
    "RUNNING",
    "WAITING",
    "QueueSample",
    "parse_vllm_queue",
    "sample_queues",
]

WAITING: Final = "vllm:num_requests_waiting"
RUNNING: Final = "vllm:num_requests_running"
MAX_QUEUE_METRICS_BYTES: Final = 8 * 1024 * 1024
"""The longest ``/metrics`` reply read from a model server."""


@frozen
class QueueSample:
    """vLLM queue gauges summed over the model servers that answered one sampling round.

    Attributes:
        at: trio time of the round.
        waiting: summed ``vllm:num_requests_waiting``.
        running: summed ``vllm:num_requests_running``.
        servers: servers that answered with both gauges.
        errors: servers that did not (unreachable, slow, too large, no gauges).
        problem: why the first of them did not, in one line (None: no error, or no reason).
    """

    at: float
    waiting: float
    running: float
    servers: int
    errors: int = 0
    problem: str | None = None


def parse_vllm_queue(text: str) -> tuple[float, float] | None:
    """Return summed (waiting, running) from Prometheus text, or None when a gauge is absent.

    Every series of a gauge is summed (a server may label one per model).
    """
    found: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        close = line.rfind("}")
        name = line[: line.find("{")] if close >= 0 else line.split()[0]
        if name not in (WAITING, RUNNING):
            continue
        rest = line[close + 1 :].split() if close >= 0 else line.split()[1:]
        try:
            found[name] = found.get(name, 0.0) + float(rest[0])
        except (IndexError, ValueError):
            continue
    if WAITING not in found or RUNNING not in found:
        return None
    return found[WAITING], found[RUNNING]


async def sample_queues(client: httpx.AsyncClient, urls: Sequence[str]) -> QueueSample:
    """GET every ``/metrics`` URL at once and sum their vLLM queue gauges.

    A server that fails to answer, answers non-200 or lacks a gauge counts as an error.

    Cancellation: a checkpoint; a cancelled round returns nothing and leaves nothing behind.
    """
    results: list[tuple[float, float] | None] = [None] * len(urls)
    problems: list[str] = []

    async def one(i: int, url: str) -> None:
        try:
            response = await read_bounded(
                client, "GET", url, limit=MAX_QUEUE_METRICS_BYTES, bound="MAX_QUEUE_METRICS_BYTES"
            )
        except httpx.HTTPError as exc:
            problems.append(concealed(str(exc)) or type(exc).__name__)
            return
        if response.status_code == 200:
            results[i] = parse_vllm_queue(response.text)

    at = trio.current_time()
    async with trio.open_nursery() as nursery:
        for i, url in enumerate(urls):
            nursery.start_soon(one, i, url)
    answered = [r for r in results if r is not None]
    return QueueSample(
        at=at,
        waiting=sum(w for w, _ in answered),
        running=sum(r for _, r in answered),
        servers=len(answered),
        errors=len(urls) - len(answered),
        problem=problems[0] if problems else None,
    )
