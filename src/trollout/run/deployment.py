"""Finding the deployment of a run, and the HTTP client of the cold path.

The cold path is everything but ``/run``: the head server's config, ``/aggregate_metrics``,
the model servers' ``/metrics``. It runs on trollout's own transport with explicit timeouts:
httpx's default of 5 s would cut a server's ``/aggregate_metrics`` over a large run short.
"""

from __future__ import annotations

import httpx

from ..collector.deployment.discovery import Deployment, discover
from ..collector.http.transport import Http11Transport
from ..settings import RunConfig

__all__ = ["http_client", "load_deployment"]


def http_client(*, connect_timeout_s: float, read_timeout_s: float) -> httpx.AsyncClient:
    """Return an httpx client for the cold path (module docstring). Use it with ``async with``."""
    transport = Http11Transport(connect_timeout_s=connect_timeout_s, read_timeout_s=read_timeout_s)
    return httpx.AsyncClient(transport=transport)


async def load_deployment(config: RunConfig) -> Deployment:
    """Find the deployment: explicit ``--agent-url``s, else the head server.

    Cancellation: a checkpoint; nothing has been written yet, so a retry is safe.
    """
    if config.agent_urls:
        return Deployment.from_agent_urls(config.agent_urls)
    head = config.head_server or "http://127.0.0.1:11000"
    read_timeout_s = min(config.read_timeout_s, 60.0)
    async with http_client(
        connect_timeout_s=config.connect_timeout_s, read_timeout_s=read_timeout_s
    ) as client:
        return await discover(client, head, env_allow=config.served_config_env_allow)
