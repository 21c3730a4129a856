"""What may be re-sent, when, and how often: retry policy, endpoint budgets, circuit breakers.

Design note. Three bounds stack, from the narrowest to the widest:

1. **Per rollout** (`RetryPolicy`, static settings). `dispatch` re-sends a request only when that
   cannot run a rollout twice, or when the user asked for it:

   - never delivered (connect refused or timed out, pool timeout): within
     ``dispatch_connect_grace_s``, at most ``max_connect_retries`` times;
   - **429 and 503**: retried within the attempt, at most ``max_request_retries`` times, after
     the ``Retry-After`` the server asked for plus a full-jitter backoff (so clients told "1 s"
     do not come back in one burst). These statuses are refusals: the server says it did not
     take the request, so they count as *never ran* for retrying. The failure row written when
     retries run out keeps ``delivery: delivered`` (the reply is a fact) and so spends an
     attempt, which is what bounds a 429-forever endpoint across resumes too. A ``Retry-After``
     longer than ``retry_backoff_max_s`` ends the attempt at once: parking a worker for longer
     helps no one, and resume re-runs the rollout later;
   - possibly delivered (the request went out, no response began): only with
     ``retry_requests``, and as a **new attempt** (the engine reserves its number and records
     the superseded failure through `dispatch`'s ``new_attempt`` hook), because every physical
     run must be told apart in captures and in the ledger;
   - never after a response began (502, 504, a broken 200 body, any other status).

2. **Per endpoint, budget** (`EndpointHealth.take_retry`): a token bucket holding at most
   ``retry_budget_per_endpoint`` **retries (a count)**; every re-send to an endpoint takes one
   token, and every `GOOD_ANSWERS_PER_TOKEN` requests that get an answer other than
   ``agent_request_failed`` earn one back. An endpoint that never answers well therefore
   receives at most ``first requests + retry_budget_per_endpoint`` requests over the run,
   whatever the concurrency; a healthy one earns its budget back. A count rather than a ratio
   of requests was chosen so the bound is a number a user can read off the config and a test
   can assert.

3. **Per endpoint, circuit breaker** (`EndpointHealth.admit` / `record`): closed -> open after
   ``breaker_failure_threshold`` consecutive ``agent_request_failed`` results; ``breaker_open_s``
   after opening, the next request is a single half-open probe: success closes the breaker,
   failure re-opens it. A request the open breaker turns away **waits for the probe**: until
   the open period ends (the waiter may then be the probe itself) and the probe answers. A probe
   that succeeds closes the breaker and every waiter goes on. One that fails re-opens it; each
   waiter then takes a token of the endpoint's retry budget to wait for the next probe, and once
   the budget is spent fails, as ``agent_request_failed`` / ``breaker_open`` / ``not_sent`` (no
   attempt spent; resume re-runs it). The first probe is waited for at no cost (waiting sends
   nothing); the rollout's own limit (``rollout_timeout_s``) bounds every wait, as any other.
   A rollout whose own connect or delivery failure opened the breaker is not retried into it;
   a 429/503 refusal is retried after its ``Retry-After`` (and so waits for the probe like any
   other request), since the server only asked it to come back later.

Rejected alternatives for the open breaker: failing every turned-away request at once (this
module's first design): under a 429 burst that honours ``Retry-After`` the breaker opens for a
moment and the rollouts that happen to ask then fail (11 of 256 per batch, measured by a
trainer), though one probe later the endpoint is fine. And waiting until the breaker closes,
however long: a dead endpoint would then park every worker for good and starve the healthy
endpoints; with the budget, the waits on a dead endpoint end after a probe or two (at most
``retry_budget_per_endpoint`` waits past the first probe, less what good answers earn back).

The per-rollout limit (``rollout_timeout_s``) is a Trio scope in `dispatch` around the whole
rollout, retries and waits included; hitting it yields ``agent_request_failed`` / ``timeout``
(no reply arrived, so nothing proves the rollout ran, protocol.md section 2), terminal when
``timeout_is_terminal``.

Every retry, wait, budget refusal, breaker transition and fast failure is counted in
`RetryCounters`, which the progress display and the final summary read.
"""

from __future__ import annotations

import enum
import math
import random
from collections import Counter
from collections.abc import Callable
from typing import Final
from urllib.parse import urlsplit

import attrs
import trio
from attrs import define, frozen

from ..config import COUNT, POSITIVE_COUNT, POSITIVE_SECONDS, SECONDS, RunConfig
from ..records import Failed, FailureClass, Landed
from ..text import public_url

__all__ = [
    "GOOD_ANSWERS_PER_TOKEN",
    "Admission",
    "BreakerState",
    "EndpointHealth",
    "RetryCounters",
    "RetryPolicy",
    "RetryState",
    "endpoint_of",
    "public_url",
]

GOOD_ANSWERS_PER_TOKEN: Final = 10  # well-answered requests that earn one retry token back
REFUSAL_STATUSES: Final = frozenset({429, 503})  # "not now": retried within the attempt


@frozen(kw_only=True)
class RetryPolicy:
    """The static retry settings of a run (see the module's design note).

    Attributes:
        retry_requests: re-send possibly-delivered requests, as new attempts.
        max_request_retries: re-sends per rollout after 429/503 or a possibly-delivered failure.
        backoff_base_s: the first retry's backoff cap; it doubles per retry.
        backoff_max_s: the backoff cap's ceiling, and the longest ``Retry-After`` honoured.
        budget: retries one endpoint may take beyond what its good answers earn back.
        breaker_failure_threshold: consecutive request failures that open an endpoint's breaker.
        breaker_open_s: how long an open breaker rejects requests before one probe.
    """

    retry_requests: bool = False
    max_request_retries: int = attrs.field(default=3, validator=COUNT)
    backoff_base_s: float = attrs.field(default=0.5, validator=SECONDS)
    backoff_max_s: float = attrs.field(default=30.0, validator=SECONDS)
    budget: int = attrs.field(default=100, validator=COUNT)
    breaker_failure_threshold: int = attrs.field(default=20, validator=POSITIVE_COUNT)
    breaker_open_s: float = attrs.field(default=30.0, validator=POSITIVE_SECONDS)

    @classmethod
    def from_config(cls, config: RunConfig) -> RetryPolicy:
        """Take the retry settings of a run."""
        return cls(
            retry_requests=config.retry_requests,
            max_request_retries=config.max_request_retries,
            backoff_base_s=config.retry_backoff_base_s,
            backoff_max_s=config.retry_backoff_max_s,
            budget=config.retry_budget_per_endpoint,
            breaker_failure_threshold=config.breaker_failure_threshold,
            breaker_open_s=config.breaker_open_s,
        )

    def backoff_s(self, retry: int, rng: random.Random) -> float:
        """Return the backoff before retry `retry` (0-based): capped full jitter."""
        # The exponent is capped: 2.0**1024 overflows, and the cap binds long before anyway.
        cap = self.backoff_base_s * 2.0 ** min(retry, 64)
        return rng.uniform(0.0, min(self.backoff_max_s, cap))

    def refusal_wait_s(self, failed: Failed, retry: int, rng: random.Random) -> float | None:
        """Return the wait before re-sending after a 429/503, or None when it must not be.

        The wait is the server's ``Retry-After`` (0 when absent) plus `backoff_s`; a
        ``Retry-After`` longer than `backoff_max_s` is not waited for.
        """
        asked = failed.retry_after_s or 0.0
        if asked > self.backoff_max_s:
            return None
        return asked + self.backoff_s(retry, rng)


class BreakerState(enum.Enum):
    """Where an endpoint's circuit breaker stands."""

    CLOSED = "closed"  # requests flow
    OPEN = "open"  # requests fail fast until the open period ends
    HALF_OPEN = "half_open"  # one probe is out; others fail fast until it answers


class Admission(enum.Enum):
    """What the breaker says about one request."""

    ALLOWED = "allowed"  # send it
    PROBE = "probe"  # send it: it decides whether the breaker closes
    REJECTED = "rejected"  # do not send: the breaker is open


@define
class RetryCounters:
    """Run-wide counters of the retry machinery (read them, never write them).

    Attributes:
        retries: re-sends by reason (``connect``, ``http_429``, ``http_503``,
            ``possibly_delivered``).
        retry_wait_s: total seconds rollouts spent waiting before re-sends.
        budget_refusals: retries refused because an endpoint's budget was spent.
        breaker_transitions: breaker transitions by the state entered.
        breaker_rejections: requests an open breaker turned away (each waits for its probe).
        breaker_waits: turned-away requests that the probe then let through.
        timeouts: rollouts that hit ``rollout_timeout_s``.
    """

    retries: Counter[str] = attrs.field(factory=Counter)
    retry_wait_s: float = 0.0
    budget_refusals: int = 0
    breaker_transitions: Counter[str] = attrs.field(factory=Counter)
    breaker_rejections: int = 0
    breaker_waits: int = 0
    timeouts: int = 0

    def summary(self) -> str:
        """Return one line for the progress display ("" when nothing happened)."""
        parts: list[str] = []
        total = sum(self.retries.values())
        if total:
            parts.append(f"retries {total} (waited {self.retry_wait_s:.1f}s)")
        if self.budget_refusals:
            parts.append(f"budget refusals {self.budget_refusals}")
        opened = self.breaker_transitions[BreakerState.OPEN.value]
        if opened:
            turned = self.breaker_rejections
            parts.append(
                f"breaker opened {opened}x, turned away {turned} (let through {self.breaker_waits})"
            )
        if self.timeouts:
            parts.append(f"timed out {self.timeouts}")
        return " | ".join(parts)

    def rows(self) -> list[tuple[str, str]]:
        """Return ``(what, value)`` rows for the final summary."""
        rows = [(f"retries: {why}", str(n)) for why, n in sorted(self.retries.items())]
        rows.append(("retry waits", f"{self.retry_wait_s:.1f}s"))
        rows.append(("retry budget refusals", str(self.budget_refusals)))
        for state in BreakerState:
            rows.append((f"breaker -> {state.value}", str(self.breaker_transitions[state.value])))
        rows.append(("breaker rejections", str(self.breaker_rejections)))
        rows.append(("breaker: let through by the probe", str(self.breaker_waits)))
        rows.append(("rollouts timed out", str(self.timeouts)))
        return rows


@define
class EndpointHealth:
    """One endpoint's retry budget and circuit breaker.

    Attributes:
        endpoint: the endpoint's origin, ``http://host:port``.
        policy: the run's retry policy.
        counters: the run-wide counters this endpoint adds to.
        tokens: retries left in the budget (-1 at construction: a full budget).
        good_answers: well-answered requests towards the next token.
        state: the breaker's state.
        consecutive_failures: request failures since the last good answer.
        opened_at: trio time the breaker last opened.
        probing: a half-open probe is out.
        failed_probes: probes that failed so far (a waiter gives up after one).
        changed: set (and replaced) whenever the breaker changes state or a probe ends;
            turned-away requests wait on it.
    """

    endpoint: str
    policy: RetryPolicy
    counters: RetryCounters
    tokens: int = -1
    good_answers: int = 0
    state: BreakerState = BreakerState.CLOSED
    consecutive_failures: int = 0
    opened_at: float = -math.inf
    probing: bool = False
    failed_probes: int = 0
    changed: trio.Event = attrs.field(factory=trio.Event, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.tokens < 0:
            self.tokens = self.policy.budget

    def admit(self, now: float, *, waiting: bool = False) -> Admission:
        """Decide whether a request may be sent to the endpoint at trio time `now`.

        ``waiting``: the request was turned away before and asks again (not counted twice).
        """
        if self.state is BreakerState.CLOSED:
            return Admission.ALLOWED
        ready = now >= self.opened_at + self.policy.breaker_open_s
        if self.state is BreakerState.OPEN and ready:
            self._enter(BreakerState.HALF_OPEN)
        if self.state is BreakerState.HALF_OPEN and not self.probing:
            self.probing = True
            return Admission.PROBE
        if not waiting:
            self.counters.breaker_rejections += 1
        return Admission.REJECTED

    async def await_probe(self, now: Callable[[], float]) -> Admission:
        """Wait, after `admit` turned a request away, for the probe; then admit it or not.

        Returns PROBE (this request is the probe) or ALLOWED (the probe closed the breaker),
        or REJECTED when a probe failed and the retry budget has no token to wait for the next.

        Cancellation: a checkpoint; nothing changes if cancelled.
        """
        failed_before = self.failed_probes
        while True:
            await self.wait_for_probe()
            admission = self.admit(now(), waiting=True)
            if admission is not Admission.REJECTED:
                self.counters.breaker_waits += 1
                return admission
            if self.failed_probes > failed_before:
                if not self.take_retry():
                    return Admission.REJECTED  # waiting longer would exceed the budget
                failed_before = self.failed_probes

    def next_probe_at(self) -> float:
        """Trio time a turned-away request may ask again without news (inf: await the probe)."""
        if self.state is BreakerState.OPEN:
            return self.opened_at + self.policy.breaker_open_s
        return math.inf if self.probing else -math.inf

    async def wait_for_probe(self) -> None:
        """Wait until the breaker changes state, a probe ends, or a probe may be sent.

        Cancellation: a checkpoint; nothing changes if cancelled.
        """
        with trio.move_on_at(self.next_probe_at()):
            await self.changed.wait()

    def record(self, outcome: Landed | Failed, now: float, *, probe: bool = False) -> None:
        """Count one answered (or failed) request towards the budget and the breaker."""
        failed = (
            type(outcome) is Failed and outcome.failure_class == FailureClass.AGENT_REQUEST_FAILED
        )
        if probe:
            self.probing = False
            self.failed_probes += failed
            self._notify()
        if failed:
            self.consecutive_failures += 1
            if self.state is BreakerState.HALF_OPEN or (
                self.state is BreakerState.CLOSED
                and self.consecutive_failures >= self.policy.breaker_failure_threshold
            ):
                self.opened_at = now
                self._enter(BreakerState.OPEN)
            return
        self.consecutive_failures = 0
        self.good_answers += 1
        if self.good_answers >= GOOD_ANSWERS_PER_TOKEN:
            self.good_answers = 0
            self.tokens = min(self.policy.budget, self.tokens + 1)
        if self.state is not BreakerState.CLOSED:
            self._enter(BreakerState.CLOSED)

    def abandon_probe(self) -> None:
        """Free the probe slot of a probe that ended without an answer (cancelled)."""
        self.probing = False
        self._notify()

    def take_retry(self) -> bool:
        """Take one retry token; False (and counted) when the budget is spent."""
        if self.tokens > 0:
            self.tokens -= 1
            return True
        self.counters.budget_refusals += 1
        return False

    def _enter(self, state: BreakerState) -> None:
        self.state = state
        self.counters.breaker_transitions[state.value] += 1
        self._notify()

    def _notify(self) -> None:
        self.changed.set()
        self.changed = trio.Event()


def endpoint_of(url: str) -> str:
    """Return the origin ``scheme://host:port`` of `url`: what budgets and breakers key on.

    It has no ``user:password@``: it is shown in failure messages and metric labels.
    """
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


class RetryState:
    """The run's shared retry state: one `EndpointHealth` per endpoint, and the counters.

    Create one per run and pass it to every `dispatch` of that run.
    """

    def __init__(self, policy: RetryPolicy | None = None) -> None:
        self.policy = policy or RetryPolicy()
        self.counters = RetryCounters()
        self.endpoints: dict[str, EndpointHealth] = {}
        self._by_url: dict[str, EndpointHealth] = {}

    @classmethod
    def from_config(cls, config: RunConfig) -> RetryState:
        """Return a fresh state for a run with `config`'s retry settings."""
        return cls(RetryPolicy.from_config(config))

    def endpoint(self, url: str) -> EndpointHealth:
        """Return the health of the endpoint that serves `url`."""
        health = self._by_url.get(url)
        if health is None:
            origin = endpoint_of(url)
            health = self.endpoints.get(origin)
            if health is None:
                health = EndpointHealth(origin, self.policy, self.counters)
                self.endpoints[origin] = health
            self._by_url[url] = health
        return health

    def open_breakers(self) -> list[str]:
        """Return the endpoints whose breaker is not closed."""
        return [e for e, h in self.endpoints.items() if h.state is not BreakerState.CLOSED]
