"""Server metrics: ``POST /aggregate_metrics`` once per agent or environment server.

Protocol.md section 4: the body is ``{"verify_responses": [row, ...]}`` with every row of the
metric input reduced (`reader.reduce_row`) and sorted by (task, rollout). A group goes to the
target naming its environment server (0.7.0), else to the target naming its agent (earlier
generation); a group no target names keeps its local metrics. A call that fails (no reply, a
status other than 200, or a reply without the three collections) becomes an error message for
that group; it never raises, so every other group's metrics are still written.

The body is assembled from the rows already serialized during the read, so a call costs one
join, not a re-serialization; it holds one group's reduced rows, as NeMo Gym does.

The reply is read up to `reply_limit`: `AGGREGATE_REPLY_BASE_BYTES` plus
`AGGREGATE_REPLY_PER_SENT_BYTE` bytes per byte sent, since a server's reply grows with the
group (its ``group_level_metrics`` hold an entry per task); a longer one is that group's error,
naming the URL and the bound. Rejected alternative: one fixed cap, which either refuses an
honest reply for a large run or lets a hostile server hold gigabytes for a small one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import httpx
import orjson
from attrs import frozen

from ..collector.http.transport import read_bounded
from ..text import concealed, public_url
from .coverage import GroupKey

__all__ = [
    "AGGREGATE_REPLY_BASE_BYTES",
    "AGGREGATE_REPLY_PER_SENT_BYTE",
    "ServerOutcome",
    "Target",
    "fetch_server_metrics",
    "reply_limit",
    "target_for",
]

Target = tuple[str | None, str | None, str]  # (agent name, environment server, base URL)
_COLLECTIONS: Final = (
    ("agent_metrics", dict),
    ("key_metrics", dict),
    ("group_level_metrics", list),
)
_MAX_BODY_SHOWN: Final = 300
AGGREGATE_REPLY_BASE_BYTES: Final = 64 * 1024 * 1024
"""The part of the ``/aggregate_metrics`` reply bound that holds for any request."""
AGGREGATE_REPLY_PER_SENT_BYTE: Final = 4
"""The part of that bound that grows with the request: bytes per byte sent."""


@frozen
class ServerOutcome:
    """What one ``/aggregate_metrics`` call gave: a reply, or an error message."""

    url: str
    reply: Mapping[str, Any] | None = None
    error: str | None = None


def target_for(
    key: GroupKey, environment_server: str | None, targets: Sequence[Target]
) -> Target | None:
    """Return the target serving a group: by environment server first, then by agent."""
    agent = key[0]
    env = environment_server or key[1]
    if env is not None:
        for target in targets:
            if target[1] == env:
                return target
    if agent is not None:
        for target in targets:
            if target[0] == agent and target[1] is None:
                return target
    return None


def request_body(rows: list[tuple[int, int, bytes]]) -> bytes:
    """Return the JSON body for rows ``(task, rollout, serialized row)``, sorted by key."""
    rows.sort(key=lambda r: (r[0], r[1]))
    return b'{"verify_responses":[' + b",".join(r[2] for r in rows) + b"]}"


async def fetch_server_metrics(
    client: httpx.AsyncClient, url: str, rows: list[tuple[int, int, bytes]]
) -> ServerOutcome:
    """Call ``POST {url}/aggregate_metrics`` with a group's rows; never raise for a failure.

    Cancellation: a checkpoint; a cancelled call leaves nothing written, and the call is
    read-only on the server, so a retry is safe.
    """
    endpoint = url.rstrip("/") + "/aggregate_metrics"
    body = request_body(rows)
    try:
        response = await read_bounded(
            client,
            "POST",
            endpoint,
            limit=reply_limit(len(body)),
            bound="AGGREGATE_REPLY_BASE_BYTES + AGGREGATE_REPLY_PER_SENT_BYTE per byte sent",
            content=body,
            headers={"content-type": "application/json"},
        )
    except httpx.HTTPError as exc:
        failed = f"POST {public_url(endpoint)} failed: {type(exc).__name__}: {exc}"
        return ServerOutcome(url, error=concealed(failed))
    if response.status_code != 200:
        text = response.text[:_MAX_BODY_SHOWN]
        return ServerOutcome(
            url,
            error=f"POST {public_url(endpoint)} answered HTTP {response.status_code}: {text!r}",
        )
    return _outcome(url, endpoint, response.content)


def reply_limit(sent: int) -> int:
    """Return the longest ``/aggregate_metrics`` reply read for a request of `sent` bytes."""
    return AGGREGATE_REPLY_BASE_BYTES + AGGREGATE_REPLY_PER_SENT_BYTE * sent


def _outcome(url: str, endpoint: str, content: bytes) -> ServerOutcome:
    endpoint = public_url(endpoint)
    try:
        reply = orjson.loads(content)
    except orjson.JSONDecodeError:
        return ServerOutcome(url, error=f"POST {endpoint} answered a body that is not JSON")
    if not isinstance(reply, dict):
        kind = type(reply).__name__
        return ServerOutcome(url, error=f"POST {endpoint} answered a JSON {kind}, not an object")
    bad = [name for name, kind in _COLLECTIONS if not isinstance(reply.get(name), kind)]
    if bad:
        return ServerOutcome(
            url, error=f"POST {endpoint} answered without {', '.join(bad)} (keys {sorted(reply)})"
        )
    return ServerOutcome(url, reply=reply)
