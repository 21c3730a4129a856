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
   ``breaker_failure_threshold`` consecutive ``agent_request_failed`` results; while open every
   request to the endpoint **fails fast** as ``agent_request_failed`` / ``breaker_open`` /
   ``not_sent`` (no attempt spent; resume re-runs it); ``breaker_open_s`` after opening, the
   next request is a single half-open probe: success closes the breaker, failure re-opens it.
   A rollout whose own failure opened the breaker is not retried into it.

Rejected alternative for the open breaker: rollouts wait until it closes. Workers are shared by
every endpoint, so a dead endpoint would soon hold every worker parked and starve the healthy
endpoints' rollouts; failing fast with a typed, not-spent failure keeps the run moving, and the
failures say exactly why.

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
from typing import Final
from urllib.parse import urlsplit

import attrs
from attrs import define, frozen

from ..config import COUNT, POSITIVE_COUNT, POSITIVE_SECONDS, SECONDS, RunConfig
from ..records import Failed, FailureClass, Landed

__all__ = [
    "GOOD_ANSWERS_PER_TOKEN",
    "Admission",
    "BreakerState",
    "EndpointHealth",
    "RetryCounters",
    "RetryPolicy",
    "RetryState",
    "endpoint_of",
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
        breaker_rejections: requests failed fast by an open breaker.
        timeouts: rollouts that hit ``rollout_timeout_s``.
    """

    retries: Counter[str] = attrs.field(factory=Counter)
    retry_wait_s: float = 0.0
    budget_refusals: int = 0
    breaker_transitions: Counter[str] = attrs.field(factory=Counter)
    breaker_rejections: int = 0
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
            parts.append(f"breaker opened {opened}x, fast-failed {self.breaker_rejections}")
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
        rows.append(("breaker fast failures", str(self.breaker_rejections)))
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

    def __attrs_post_init__(self) -> None:
        if self.tokens < 0:
            self.tokens = self.policy.budget

    def admit(self, now: float) -> Admission:
        """Decide whether a request may be sent to the endpoint at trio time `now`."""
        if self.state is BreakerState.CLOSED:
            return Admission.ALLOWED
        ready = now >= self.opened_at + self.policy.breaker_open_s
        if self.state is BreakerState.OPEN and ready:
            self._enter(BreakerState.HALF_OPEN)
        if self.state is BreakerState.HALF_OPEN and not self.probing:
            self.probing = True
            return Admission.PROBE
        self.counters.breaker_rejections += 1
        return Admission.REJECTED

    def record(self, outcome: Landed | Failed, now: float, *, probe: bool = False) -> None:
        """Count one answered (or failed) request towards the budget and the breaker."""
        if probe:
            self.probing = False
        if type(outcome) is Failed and outcome.failure_class == FailureClass.AGENT_REQUEST_FAILED:
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


def endpoint_of(url: str) -> str:
    """Return the origin ``scheme://host:port`` of `url`: what budgets and breakers key on."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


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
