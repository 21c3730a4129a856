"""One attempt of one rollout: POST the materialized row to `/run` and classify the result.

Design note (retries). Within one attempt, `dispatch` re-sends only what provably never left:
a connection that was refused or never established (`httpx.ConnectError`,
`httpx.ConnectTimeout`, `Delivery.NOT_SENT`). Such a retry cannot run a rollout twice, so it does
not spend an attempt. It is bounded twice: at most `max_connect_retries` retries, and none that
would start later than `dispatch_connect_grace_s` after the attempt began (a server that is
restarting gets a grace period; a dead one fails the rollout promptly). The wait before retry
``n`` (0-based) is drawn uniformly from ``[0, min(backoff_max_s, backoff_base_s * 2**n)]``
("full jitter"), from the caller's seeded `random.Random`, so many workers that lost the same
server spread their reconnects instead of stampeding it, and tests replay exact schedules.

Everything else ends the attempt: a request that may have been delivered is never re-sent here,
because `/run` is not idempotent (NeMo Gym's replay after a disconnect runs the rollout twice),
and the decision to spend another attempt belongs to the engine's policy, which sees the
outcome's `delivery`, `terminal` and `retry_after_s`.

Rejected alternative: one generic retry loop around the whole request (httpx-style
``retries=``, or tenacity) that retries any transport error. It cannot tell a refused connect
from a reset after the body went out, so it either replays non-idempotent rollouts or, made
conservative, never retries at all; and it hides the attempts it made from the run folder.
"""

from __future__ import annotations

import random
from typing import Any

import attrs
import httpx
import orjson
import trio
from attrs import frozen

from ..config import RunConfig
from ..errors import ConfigError
from ..records import Failed, Landed, MaterializedRow
from .classify import one_line_message, outcome_from_error, outcome_from_response
from .transport import H11Transport

__all__ = ["DispatchPolicy", "dispatch"]


def _non_negative(instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if value < 0:
        raise ConfigError(f"{attribute.name} must be >= 0 (got {value!r}); use 0 or more")


def _positive(instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if value <= 0:
        raise ConfigError(f"{attribute.name} must be > 0 (got {value!r}); use a positive number")


@frozen
class DispatchPolicy:
    """How one attempt talks to its server: timeouts, connect retries, backoff.

    Attributes:
        connect_timeout_s: the longest wait to establish a connection.
        read_timeout_s: the longest silence while the server holds a request.
        max_connect_retries: retries of a never-established connection per attempt.
        dispatch_connect_grace_s: no connect retry starts later than this after the attempt began.
        backoff_base_s: the first retry's backoff cap; it doubles per retry.
        backoff_max_s: the backoff cap's ceiling.
        max_attempts: the attempt cap in force, written on failure rows.
    """

    connect_timeout_s: float = attrs.field(validator=_positive)
    read_timeout_s: float = attrs.field(validator=_positive)
    max_connect_retries: int = attrs.field(validator=_non_negative)
    dispatch_connect_grace_s: float = attrs.field(validator=_non_negative)
    backoff_base_s: float = attrs.field(default=0.25, kw_only=True, validator=_non_negative)
    backoff_max_s: float = attrs.field(default=8.0, kw_only=True, validator=_non_negative)
    max_attempts: int = attrs.field(default=3, kw_only=True, validator=_positive)

    @classmethod
    def from_config(cls, config: RunConfig, *, max_attempts: int = 3) -> DispatchPolicy:
        """Take the dispatch settings of a run (the attempt cap comes from resume's rules)."""
        return cls(
            config.connect_timeout_s,
            config.read_timeout_s,
            config.max_connect_retries,
            config.dispatch_connect_grace_s,
            max_attempts=max_attempts,
        )

    def make_transport(self, *, max_idle_per_host: int | None = None) -> H11Transport:
        """Return a transport with this policy's timeouts (use it with ``async with``)."""
        return H11Transport(
            connect_timeout_s=self.connect_timeout_s,
            read_timeout_s=self.read_timeout_s,
            max_idle_per_host=max_idle_per_host,
        )

    def backoff_s(self, retry: int, rng: random.Random) -> float:
        """Return the wait before connect retry `retry` (0-based): capped full jitter."""
        return rng.uniform(0.0, min(self.backoff_max_s, self.backoff_base_s * 2.0**retry))


async def dispatch(
    transport: H11Transport,
    url: str,
    row: MaterializedRow,
    attempt_index: int,
    policy: DispatchPolicy,
    *,
    rng: random.Random,
) -> Landed | Failed:
    """Run one attempt of `row` against `url` (the full ``.../run`` URL).

    A failed rollout is returned as `Failed`, never raised.

    Raises:
        ConfigError: `url` is not a plain ``http://`` URL.

    Cancellation: a checkpoint; `trio.Cancelled` propagates (the engine records the attempt as
    omitted) and the connection in use is closed. Whether the server got the request is then
    unknown, so re-sending it is not automatically safe.
    """
    body = orjson.dumps(row.request_body(attempt_index))
    start = trio.current_time()
    retries = 0
    while True:
        try:
            response = await transport.post(url, body)
        except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            raise ConfigError(
                f"cannot POST to {url!r}: {exc}; give agent URLs as http://host:port"
            ) from exc
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            delay = _connect_retry_delay(policy, retries, start, rng)
            if delay is None:
                return _failed(row, attempt_index, exc, start, policy, retries)
            retries += 1
            await trio.sleep(delay)
            continue
        except httpx.TransportError as exc:
            return _failed(row, attempt_index, exc, start, policy, retries)
        elapsed = trio.current_time() - start
        return outcome_from_response(
            row.identity,
            attempt_index,
            response,
            elapsed_seconds=elapsed,
            max_attempts=policy.max_attempts,
        )


def _connect_retry_delay(
    policy: DispatchPolicy, retries: int, start: float, rng: random.Random
) -> float | None:
    """Return the wait before the next connect retry, or None when none is allowed."""
    if retries >= policy.max_connect_retries:
        return None
    delay = policy.backoff_s(retries, rng)
    if trio.current_time() + delay - start > policy.dispatch_connect_grace_s:
        return None
    return delay


def _failed(
    row: MaterializedRow,
    attempt_index: int,
    error: Exception,
    start: float,
    policy: DispatchPolicy,
    retries: int,
) -> Failed:
    failed = outcome_from_error(
        row.identity,
        attempt_index,
        error,
        elapsed_seconds=trio.current_time() - start,
        max_attempts=policy.max_attempts,
    )
    if not retries:
        return failed
    note = f" (after {retries} connect retr{'y' if retries == 1 else 'ies'})"
    return attrs.evolve(failed, message=one_line_message((failed.message or "") + note))
