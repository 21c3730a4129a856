"""An in-process agent written for asyncio, run as the `/run` transport of a Trio collector.

Where trio-asyncio fits trollout: hosting asyncio code *inside* Trio. A team whose agent is an
asyncio coroutine (an SDK, aiohttp calls to a model) can collect its rollouts with no server
in between::

    async def my_agent(row: dict) -> dict:          # asyncio code
        reply = await my_sdk.run(row["responses_create_params"])
        return {"response": reply, "reward": score(reply)}

    async with trollout.frontends.asyncio_agent.open_asyncio_agents({"my_agent": my_agent}) as t:
        async with trollout.open_rollouts(t.urls, transport=t) as ro:
            ...

Each rollout's body is decoded and handed to the agent as a dict; what it returns is the
reply, classified as a server's would be (a reward scores it, ``_ng_*`` sentinels route it).
An exception from the agent fails that rollout (``agent_request_failed``, kind ``transport``),
and so does an ``asyncio.CancelledError`` of the agent's own (an SDK cancelling a request):
it becomes a ``RuntimeError``, as it would otherwise cancel the whole collector. Cancelling the
rollout (a batch closed early) cancels the agent's asyncio task.

Needs trio-asyncio (the ``asyncio`` extra). Importing it patches asyncio for the whole process,
so this module imports it only inside `open_asyncio_agents`, and ``import trollout`` never does.
The asyncio *front end* (`aio`) does not use it: trio-asyncio hosts asyncio in Trio, while an
asyncio trainer needs the reverse (bench/frontends.py measured both ways; `bridge` says why).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import orjson

from ..collector.http.transport import RawResponse
from ..errors import UnknownAgentError

__all__ = ["AsyncioAgent", "AsyncioAgentTransport", "open_asyncio_agents"]

AsyncioAgent = Callable[[dict[str, Any]], Awaitable[Mapping[str, Any]]]
_HOST = "in-process"


class AsyncioAgentTransport:
    """Sends each rollout to an asyncio agent in this process; open with `open_asyncio_agents`.

    Attributes:
        urls: ``{agent name: base URL}`` to give the collector (``http://in-process/<name>``).
    """

    def __init__(
        self,
        agents: Mapping[str, AsyncioAgent],
        call: Callable[[AsyncioAgent], Callable[[dict[str, Any]], Awaitable[Any]]],
    ) -> None:
        self._agents = dict(agents)
        self._call = call
        self.urls = {name: f"http://{_HOST}/{name}" for name in self._agents}

    async def post(self, url: str, body: bytes, *, headers: bytes = b"") -> RawResponse:
        """Run the agent ``url`` names on ``body``; return its reply as a 200.

        ``headers`` (telemetry's trace context) have no use in process and are ignored.

        Raises:
            UnknownAgentError: no agent of that name (a routing mistake).
            RuntimeError: the agent let an ``asyncio.CancelledError`` of its own escape.
            Exception: what the agent raised (the rollout fails, typed, and the run goes on).

        Cancellation: a checkpoint; cancelling cancels the agent's asyncio task (and raises
        ``trio.Cancelled``).
        """
        name = urlsplit(url).path.strip("/").removesuffix("/run")
        agent = self._agents.get(name)
        if agent is None:
            known = ", ".join(sorted(self._agents))
            raise UnknownAgentError(f"no asyncio agent {name!r} (known: {known})")
        try:
            reply = await self._call(agent)(orjson.loads(body))
        except asyncio.CancelledError as exc:
            # trio-asyncio raises trio.Cancelled when Trio cancelled the call; this one came
            # from inside asyncio and, a BaseException, would cancel every rollout of the run.
            raise RuntimeError(
                f"the asyncio agent {name!r} was cancelled from inside asyncio (not by "
                f"trollout): {exc!r}; have it return a reply or raise an ordinary exception"
            ) from exc
        return RawResponse(status=200, headers=[], body=orjson.dumps(reply), url=url)

    async def aclose(self) -> None:
        """Nothing to close: the agents live in this process."""


@asynccontextmanager
async def open_asyncio_agents(
    agents: Mapping[str, AsyncioAgent],
) -> AsyncIterator[AsyncioAgentTransport]:
    """Run asyncio agents inside this Trio program for the duration of the block.

    Opens trio-asyncio's loop (imported here, and only here) and yields the transport.

    Cancellation: leaving the block closes the asyncio loop; use the transport only inside it.
    """
    import trio_asyncio  # here only: importing it patches asyncio process-wide

    async with trio_asyncio.open_loop():
        yield AsyncioAgentTransport(agents, trio_asyncio.aio_as_trio)
