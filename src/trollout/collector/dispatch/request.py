# Stays whole: one rollout's request loop (`_Rollout`: send, wait, re-send, supersede) and the
# policy it reads share the attempt's state; the retry decisions are `retry`.
"""One rollout: POST the materialized row to `/run`, re-send what is safe, classify the result.

Design note. `dispatch` runs one rollout's request loop; which results are re-sent, after how
long, and what ends a wait are `retry`'s (its design note holds the policy as one table). In
short: a connection never established is re-sent within the attempt (its own backoff while the
endpoint's breaker is closed, as the probe while it is open) until the endpoint has given no
answer for the outage grace; a 429 or 503 is re-sent after its ``Retry-After`` (or a backoff);
a possibly-delivered request is re-sent only with ``retry_requests`` and a ``new_attempt`` hook,
as a new attempt. Re-sends within an attempt carry ``X-Trollout-Retry: n``.

Every draw comes from the caller's seeded `random.Random`, so tests replay exact schedules. With
a shared `RetryState`, every request passes its endpoint's breaker and is counted towards its
health. The whole loop runs in one scope bounded by ``rollout_timeout_s``.

Rejected alternative: one generic retry loop around the whole request (httpx-style
``retries=``, or tenacity) that retries any transport error. It cannot tell a refused connect
from a reset after the body went out, so it either replays non-idempotent rollouts or, made
conservative, never retries at all; and it hides the attempts it made from the run folder.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import attrs
import httpx
import orjson
import trio
from attrs import frozen

from ...errors import ConfigError
from ...records import Delivery, Failed, FailureClass, Identity, Landed, MaterializedRow
from ...settings import POSITIVE_COUNT, POSITIVE_SECONDS, RunConfig
from ...text import public_url
from ..classify.echo import expected_echo
from ..classify.episodes import IDENTITY_VIOLATION, outcome_from_episode_response
from ..classify.outcomes import (
    IDENTITY_MISMATCH,
    ReplyClassifier,
    one_line_message,
    outcome_from_error,
    outcome_from_response,
)
from ..http.transport import DEFAULT_MAX_BODY_BYTES, Http11Transport, PostTransport, RawResponse
from .hooks import AttemptObserver, AttemptTrace
from .retry import (
    ENDPOINT_DOWN,
    REFUSAL_STATUSES,
    RETRY_HEADER,
    Admission,
    BreakerState,
    RetryPolicy,
    RetryState,
)

__all__ = ["DispatchPolicy", "NewAttempt", "OnResend", "check_run_url", "dispatch"]

OnResend = Callable[[Identity, int, int], None]
"""Note that re-send ``retry`` (1, 2, ...) of an attempt leaves (`sink.ResendRecorder.resent`)."""
NewAttempt = Callable[[Failed], Awaitable[int]]
"""Record a superseded failed attempt and return the next attempt number, reserved durably.

It runs inside the rollout's time limit: a write that must not be lost belongs in a shielded
scope (the engine's writer channel send already is, for omitted outcomes).
"""


@frozen
class DispatchPolicy:
    """How one rollout talks to its server: timeouts, reply limits, retries, its time limit.

    Attributes:
        connect_timeout_s: the longest wait to establish a connection.
        read_timeout_s: the longest silence while the server holds a request.
        reply_timeout_s: the longest one request may take, sending through the last reply
            byte (None: twice `read_timeout_s`).
        max_reply_bytes: the longest reply body read (after decoding).
        check_echoed_input: a 200 that echoes another input is ``identity_mismatch``.
        max_attempts: the attempt cap in force, written on failure rows.
        retry: every retry setting (`retry.RetryPolicy`: re-sends, backoff, breaker, grace).
        rollout_timeout_s: the per-rollout limit, retries and waits included (None: none).
        timeout_is_terminal: a rollout that hits the limit is never retried.
    """

    connect_timeout_s: float = attrs.field(validator=POSITIVE_SECONDS)
    read_timeout_s: float = attrs.field(validator=POSITIVE_SECONDS)
    max_attempts: int = attrs.field(default=3, kw_only=True, validator=POSITIVE_COUNT)
    retry: RetryPolicy = attrs.field(factory=RetryPolicy, kw_only=True)
    rollout_timeout_s: float | None = attrs.field(
        default=None, kw_only=True, validator=POSITIVE_SECONDS.or_none
    )
    timeout_is_terminal: bool = attrs.field(default=False, kw_only=True)
    reply_timeout_s: float | None = attrs.field(
        default=None, kw_only=True, validator=POSITIVE_SECONDS.or_none
    )
    max_reply_bytes: int = attrs.field(
        default=DEFAULT_MAX_BODY_BYTES, kw_only=True, validator=POSITIVE_COUNT
    )
    check_echoed_input: bool = attrs.field(default=True, kw_only=True)

    @classmethod
    def from_config(cls, config: RunConfig) -> DispatchPolicy:
        """Take the dispatch settings of a run (the attempt cap is ``config.max_attempts``)."""
        return cls(
            config.connect_timeout_s,
            config.read_timeout_s,
            max_attempts=config.max_attempts,
            retry=RetryPolicy.from_config(config),
            rollout_timeout_s=config.rollout_timeout_s,
            timeout_is_terminal=config.timeout_is_terminal,
            reply_timeout_s=config.reply_timeout_s,
            max_reply_bytes=config.max_reply_bytes,
            check_echoed_input=config.check_echoed_input,
        )

    def make_transport(self, *, max_idle_per_host: int | None = None) -> Http11Transport:
        """Return a transport with this policy's timeouts and limits (use with ``async with``)."""
        return Http11Transport(
            connect_timeout_s=self.connect_timeout_s,
            read_timeout_s=self.read_timeout_s,
            reply_timeout_s=self.reply_timeout_s,
            max_body_bytes=self.max_reply_bytes,
            max_idle_per_host=max_idle_per_host,
        )


async def dispatch(
    transport: PostTransport,
    url: str,
    row: MaterializedRow,
    attempt_index: int,
    policy: DispatchPolicy,
    *,
    rng: random.Random,
    retry_state: RetryState | None = None,
    new_attempt: NewAttempt | None = None,
    policy_model_server: str | None = None,
    observer: AttemptObserver | None = None,
    started_at: float | None = None,
    on_resend: OnResend | None = None,
) -> Landed | Failed:
    """Run one rollout of `row` against `url` (the full ``.../run`` URL), starting at an attempt.

    A failed rollout is returned as `Failed`, never raised. The attempt index of the outcome is
    `attempt_index`, or a later one handed out by `new_attempt`.

    Args:
        transport: the `/run` transport.
        url: the full URL.
        row: the materialized row.
        attempt_index: the attempt number of the first request.
        policy: timeouts, retries and the rollout's time limit.
        rng: the seeded source of backoff jitter.
        retry_state: the run's shared budgets, breakers and counters (None: no per-endpoint
            bounds, nothing counted).
        new_attempt: the engine's hook for possibly-delivered retries under ``retry_requests``;
            without it such requests are not re-sent.
        policy_model_server: the executing agent's model server, stamped on the outcome as
            ``ng_policy_model_server`` (None: not known, not stamped).
        observer: telemetry's hook (`hooks.AttemptObserver`): told when each attempt starts,
            waits and ends; its trace headers go on every POST (None: off, nothing called).
        started_at: the trio time the rollout started, when the caller has just read the
            clock (the pool does); outcomes' ``elapsed_seconds`` count from it. None: now.
        on_resend: told just before each re-send within an attempt leaves (the ledger's
            ``resent`` line); None: not told.

    Raises:
        ConfigError: `url` is not a plain ``http://`` URL.

    Cancellation: a checkpoint; `trio.Cancelled` propagates (the engine records the attempt as
    omitted) and the connection in use is closed. Whether the server got the request is then
    unknown, so re-sending it is not automatically safe. Hitting ``rollout_timeout_s`` is not
    a cancellation of the caller: it returns ``Failed(kind="timeout")``.
    """
    if policy_model_server is not None and row.identity.policy_model_server != policy_model_server:
        # Rows read from a run folder come stamped (`MaterializedRow.from_body`): no copy then.
        identity = attrs.evolve(row.identity, policy_model_server=policy_model_server)
        row = MaterializedRow(identity, row.body, row.raw)
    start = trio.current_time() if started_at is None else started_at
    rollout = _Rollout(
        transport, url, row, attempt_index, policy, rng, retry_state, new_attempt, on_resend, start
    )
    if observer is not None:
        return await _observed(rollout, observer)
    limit = policy.rollout_timeout_s
    if limit is None:
        return await rollout.run()  # no scope: it would cost ~8 us per rollout for nothing
    with trio.move_on_after(limit):
        return await rollout.run()
    return rollout.timed_out()


async def _observed(rollout: _Rollout, observer: AttemptObserver) -> Landed | Failed:
    """`dispatch` with an observer told of every attempt (the off path never comes here)."""
    rollout.observer = observer
    rollout.trace = observer.attempt_started(rollout.row, rollout.attempt, rollout.url)
    try:
        limit = rollout.policy.rollout_timeout_s
        outcome = None
        if limit is None:
            outcome = await rollout.run()
        else:
            with trio.move_on_after(limit):
                outcome = await rollout.run()
        if outcome is None:
            outcome = rollout.timed_out()
    except BaseException:
        observer.attempt_ended(rollout.trace, None, rollout.retries)
        raise
    observer.attempt_ended(rollout.trace, outcome, rollout.retries)
    return outcome


def check_run_url(url: str, *, what: str) -> str:
    """Return ``url`` if the `/run` transport can POST to it: ``http://host[:port][/path]``.

    The engine checks every URL it resolves before a row is accepted, so a URL that
    `Http11Transport` would refuse (``https://``, no host) is the caller's error, not every
    rollout's; ``what`` names where the URL came from.

    Raises:
        ConfigError: naming ``what`` and the URL (without credentials or query).
    """
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError for a port that is not a number in range
    except ValueError as exc:
        problem = f"it does not parse ({exc})"
    else:
        if parts.scheme == "http" and parts.hostname:
            return url
        problem = (
            f"its scheme is {parts.scheme!r}, and trollout speaks plain HTTP/1.1 without TLS"
            if parts.scheme != "http"
            else "it has no host"
        )
    try:
        shown = repr(public_url(url))  # never its user:password@ or ?query
    except ValueError:
        shown = "a URL that does not parse"
    raise ConfigError(
        f"{what} is {shown}, which cannot be sent to: {problem}; give agent URLs as "
        "http://host:port (reach a TLS-only server through a local proxy or tunnel)"
    )


class _Rollout:
    """The state of one rollout's request loop: attempt, retries so far, what was last seen."""

    __slots__ = (
        "answered_at",
        "attempt",
        "classify",
        "connect_retries",
        "delivery",
        "echo",
        "furthest",
        "health",
        "last",
        "new_attempt",
        "note",
        "observer",
        "on_resend",
        "policy",
        "request_retries",
        "resends",
        "rng",
        "row",
        "sent_at",
        "start",
        "state",
        "streak",
        "trace",
        "transport",
        "url",
    )

    def __init__(
        self,
        transport: PostTransport,
        url: str,
        row: MaterializedRow,
        attempt_index: int,
        policy: DispatchPolicy,
        rng: random.Random,
        state: RetryState | None,
        new_attempt: NewAttempt | None,
        on_resend: OnResend | None,
        start: float,
    ) -> None:
        self.transport, self.url, self.row = transport, url, row
        self.attempt, self.policy, self.rng = attempt_index, policy, rng
        self.state = state
        self.health = state.endpoint(url) if state is not None else None
        self.new_attempt = new_attempt
        self.on_resend = on_resend
        self.start = start
        self.sent_at = start  # when the last request was sent (re-sends read the clock)
        self.answered_at = start  # when the last request ended (its outcome was built)
        self.connect_retries = 0  # own re-sends after connection failures, this attempt
        self.request_retries = 0  # re-sends after refusals or possibly-delivered failures
        self.resends = 0  # re-sends within the current attempt (the X-Trollout-Retry number)
        self.delivery = Delivery.NOT_SENT
        self.furthest = Delivery.NOT_SENT  # the furthest any request of this attempt got
        self.streak = 0  # the endpoint's streak its last connection failure met
        self.last: Failed | None = None
        self.note = ""
        self.echo: list[tuple[str, Any]] = []
        self.observer: AttemptObserver | None = None
        self.trace: AttemptTrace | None = None
        self.classify: ReplyClassifier = (
            outcome_from_episode_response if row.is_episode else outcome_from_response
        )

    async def run(self) -> Landed | Failed:
        """Send, and re-send while the rules allow; return the final outcome."""
        body = self._request()
        while True:
            outcome = await self._send_once(body)
            if isinstance(outcome, Landed):
                return outcome
            if outcome.kind == ENDPOINT_DOWN:
                return outcome
            self.last = outcome
            delay = self._retry_delay(outcome)
            if delay is None:
                return self._final(outcome)
            if not await self._wait(delay):
                return self._endpoint_down()
            if outcome.delivery is Delivery.POSSIBLY_DELIVERED:
                # After the wait (a cancellation in it spends no number): the superseded
                # attempt is recorded and the next number reserved, then sent.
                assert self.new_attempt is not None
                superseded = self._final(outcome)
                self.attempt = await self.new_attempt(superseded)
                self.delivery = self.furthest = Delivery.NOT_SENT
                self.resends = self.connect_retries = 0
                body = self._request()
                if self.observer is not None:
                    self._next_trace(superseded)
            else:
                self.resends += 1
                if self.on_resend is not None:
                    self.on_resend(self.row.identity, self.attempt, self.resends)
            self.sent_at = self._now()

    @property
    def retries(self) -> int:
        """Re-sends so far, connect and request retries together."""
        return self.connect_retries + self.request_retries

    def _next_trace(self, superseded: Failed) -> None:
        """End the superseded attempt's trace and start the new attempt's."""
        assert self.observer is not None
        assert self.trace is not None
        self.observer.attempt_ended(self.trace, superseded, self.retries)
        self.trace = self.observer.attempt_started(self.row, self.attempt, self.url)

    def _request(self) -> bytes:
        """Return the current attempt's body, noting the identity its reply may echo."""
        row, check_input = self.row, self.policy.check_echoed_input
        if row.raw is not None and not self.attempt and not row.is_episode:
            # the request is the row, as it was read
            self.echo = expected_echo(row.body, check_input=check_input)
            return row.raw
        request = row.request_body(self.attempt)
        self.echo = expected_echo(request, check_input=check_input)
        return orjson.dumps(request)

    async def _wait(self, delay: float) -> bool:
        """Sleep `delay` before a re-send; False when the endpoint went down meanwhile.

        Cancellation: a checkpoint; nothing changes if cancelled.
        """
        health = self.health
        if health is None:
            await trio.sleep(delay)
            return True
        with trio.move_on_at(health.down_at()):
            await trio.sleep(delay)
            return True
        return False  # the outage grace ended first: the rollout ends now, not at its backoff

    async def _send_once(self, body: bytes) -> Landed | Failed:
        health = self.health
        # A closed breaker admits every request: the clock is read only when it is not.
        if health is None or health.state is BreakerState.CLOSED:
            admission = Admission.ALLOWED
        else:
            admission = health.admit(self._now())
            if admission is Admission.REJECTED:
                admission = await health.await_turn(self._now)  # within the rollout's limit
                self.sent_at = self._now()
            if admission is Admission.DOWN:
                return self._endpoint_down()
        probe = admission is Admission.PROBE
        try:
            outcome = await self._post(body)
        except BaseException:
            if probe and health is not None:
                health.abandon_probe()  # a cancelled probe must not block the endpoint
            raise
        if health is not None:
            health.record(outcome, self.sent_at, self.answered_at, probe=probe)
        return outcome

    async def _post(self, body: bytes) -> Landed | Failed:
        # What a timeout during the request must assume; between requests the last one decides.
        self.delivery = Delivery.POSSIBLY_DELIVERED
        headers = b"" if self.trace is None else self.trace.headers
        if self.resends:
            headers += b"%s: %d\r\n" % (RETRY_HEADER, self.resends)
        try:
            if not headers:  # the common case: a transport may not take headers
                response = await self.transport.post(self.url, body)
            else:
                response = await self.transport.post(self.url, body, headers=headers)
        except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            raise ConfigError(
                f"cannot POST to {public_url(self.url)!r}: {exc}; give agent URLs as "
                "http://host:port"
            ) from exc
        except Exception as exc:  # httpx's errors, or anything a driver's own transport raises
            self.answered_at = self._now()
            failed = outcome_from_error(
                self.row.identity,
                self.attempt,
                exc,
                elapsed_seconds=self.answered_at - self.start,
                max_attempts=self.policy.max_attempts,
            )
            self.delivery = failed.delivery
            if _REACH[self.delivery] > _REACH[self.furthest]:
                self.furthest = self.delivery
            return failed
        self.delivery = Delivery.DELIVERED
        self.answered_at = self._now()
        outcome = self.classify(
            self.row.identity,
            self.attempt,
            response,
            elapsed_seconds=self.answered_at - self.start,
            max_attempts=self.policy.max_attempts,
            echo=self.echo,
        )
        if type(outcome) is Failed and (
            outcome.kind == IDENTITY_MISMATCH or outcome.exception_type == IDENTITY_VIOLATION
        ):
            self._foreign_reply(outcome, response)
        if _REACH[self.delivery] > _REACH[self.furthest]:
            self.furthest = self.delivery
        return outcome

    def _foreign_reply(self, failed: Failed, response: RawResponse) -> None:
        """Close the connection that carried another request's (or episode's) reply."""
        self.delivery = failed.delivery
        if response.discard_connection is not None:
            response.discard_connection()

    def _retry_delay(self, failed: Failed) -> float | None:
        """Return the wait before re-sending after `failed`, or None to stop here."""
        reason, delay = self._rule(failed)
        if delay is None or not reason:
            return delay  # no re-send, or one the open breaker holds until its probe
        scheduled = failed.retry_after_s is not None  # the server set the time: no token
        if reason == "connect":
            self.connect_retries += 1  # connection re-sends take no token (module note)
        elif not scheduled and self.health is not None and not self.health.take_retry():
            self.note = f"; the retry budget of {self.health.endpoint} is spent"
            return None
        else:
            self.request_retries += 1
        if self.state is not None:
            self.state.counters.retries[reason] += 1
            self.state.counters.retry_wait_s += delay
        if self.trace is not None:
            assert self.observer is not None
            self.observer.retry_wait(self.trace, reason, delay)
        return delay

    def _rule(self, failed: Failed) -> tuple[str, float | None]:
        """Return the retry reason and wait the policy allows for `failed` (wait None: none).

        The reason "" with a wait of 0 re-sends through the open breaker: the probe is the
        endpoint's, not the rollout's own retry.
        """
        retry = self.policy.retry
        if failed.delivery is Delivery.NOT_SENT:
            health = self.health
            if health is not None:
                if health.state is not BreakerState.CLOSED:
                    return "", 0.0  # the breaker holds it until the probe: no own backoff
                if health.streaks != self.streak:  # a new outage: its own re-sends anew
                    self.streak, self.connect_retries = health.streaks, 0
            if self.connect_retries >= retry.max_connect_retries:
                return "", None
            return "connect", retry.backoff_s(self.connect_retries, self.rng)
        if self.request_retries >= retry.max_request_retries:
            return "", None
        if failed.http_status in REFUSAL_STATUSES and failed.failure_class == _REQUEST_FAILED:
            wait = retry.refusal_wait_s(failed, self.request_retries, self.rng)
            return f"http_{failed.http_status}", wait
        possibly = failed.delivery is Delivery.POSSIBLY_DELIVERED
        if (
            possibly
            and retry.retry_requests
            and self.new_attempt is not None
            and self.attempt + 1 < self.policy.max_attempts  # numbers stay under the cap
        ):
            return "possibly_delivered", retry.backoff_s(self.request_retries, self.rng)
        return "", None

    def _final(self, failed: Failed) -> Failed:
        """Return the attempt's failure: the furthest any of its requests got, with a note of
        its re-sends (a 503 then a refused connect was seen by the server: never not_sent)."""
        if _REACH[self.furthest] > _REACH[failed.delivery]:
            failed = attrs.evolve(failed, delivery=self.furthest)
        parts = []
        if self.connect_retries:
            n = self.connect_retries
            parts.append(f"{n} connect retr{'y' if n == 1 else 'ies'}")
        if self.request_retries:
            n = self.request_retries
            parts.append(f"{n} request retr{'y' if n == 1 else 'ies'}")
        if not parts and not self.note:
            return failed
        note = f" (after {' and '.join(parts)})" if parts else ""
        message = one_line_message((failed.message or "") + note + self.note)
        return attrs.evolve(failed, message=message)

    def _endpoint_down(self) -> Failed:
        """Return the failure of a rollout whose endpoint is past its outage grace."""
        assert self.health is not None
        health = self.health
        if self.state is not None:
            self.state.counters.outages[health.endpoint] += 1
        last = self.last.message if self.last is not None else None
        message = f"{health.outage_message(self._now(), last)}; not sent (resume re-runs it)"
        return self._request_failed(
            ENDPOINT_DOWN, "EndpointDown", one_line_message(message), Delivery.NOT_SENT
        )

    def timed_out(self) -> Failed:
        """Return the failure of a rollout that hit ``rollout_timeout_s``."""
        if self.state is not None:
            self.state.counters.timeouts += 1
        last = f"; last: {self.last.message}" if self.last is not None else ""
        message = (
            f"rollout {self.row.identity.key} ran past rollout_timeout_s="
            f"{self.policy.rollout_timeout_s!r}{last}"
        )
        return self._request_failed(
            "timeout",
            "RolloutTimeout",
            one_line_message(message),
            self.delivery,
            terminal=self.policy.timeout_is_terminal,
        )

    def _request_failed(
        self,
        kind: str,
        exception_type: str,
        message: str,
        delivery: Delivery,
        *,
        terminal: bool = False,
    ) -> Failed:
        """Return an ``agent_request_failed`` outcome the dispatcher decided on itself."""
        return Failed(
            identity=self.row.identity,
            attempt_index=self.attempt,
            failure_class=_REQUEST_FAILED,
            kind=kind,
            terminal=terminal,
            exception_type=exception_type,
            message=message,
            max_attempts=self.policy.max_attempts,
            delivery=max(delivery, self.furthest, key=_REACH.__getitem__),
            elapsed_seconds=self._now() - self.start,
        )

    @staticmethod
    def _now() -> float:
        return trio.current_time()


_REQUEST_FAILED = FailureClass.AGENT_REQUEST_FAILED.value
_REACH = {Delivery.NOT_SENT: 0, Delivery.POSSIBLY_DELIVERED: 1, Delivery.DELIVERED: 2}
