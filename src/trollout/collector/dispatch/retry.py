# Stays whole: one retry policy for every signal (the table below): the per-request decision,
# the retry budget and each endpoint's breaker and outage grace decide together.
"""What may be re-sent, when, and how often: one retry policy for every signal.

Design note. A request's result is one of four signals, and each has one rule. The rules are
this table (docs/retry-policy.md says the same in a user's words):

    signal                          re-sent                        wait before       breaker  budget
    ------------------------------  -----------------------------  ----------------  -------  ------
    429 / 503 with Retry-After      yes, same attempt, at most     the Retry-After   closes   free
      (seconds or HTTP date),         max_request_retries          + <= 10 % (1 s)
      at most retry_backoff_max_s
    429 / 503 without Retry-After   same                           full jitter,      closes   token
                                                                     base * 2**n
    429 / 503 asking longer; any    no: the attempt fails and      -                 closes   -
      other status; a malformed       spends itself (401/403 and
      or foreign reply                quota also stop the run)
    connect refused or timed out;   yes, same attempt: at most     own full-jitter   counts   free
      reset before the request        max_connect_retries own      backoff; while
      was written (not_sent)          re-sends, then as probes     open, the probe
    read timeout; reset after the   only with retry_requests, as   full jitter       counts   token
      request was written             a NEW attempt (the first is
      (possibly_delivered)            spent)

"Breaker: counts" means the failure is a **connection-level failure**: the endpoint did not
answer at all. Those, and only those, are the endpoint's health: any answer, whatever its status,
proves it is up (a 429 is the server working, a 500 is the rollout's problem, not the
endpoint's).

**Per endpoint** (`EndpointHealth`), one mechanism for bursts, blips and dead servers:

- *Breaker.* ``breaker_failure_threshold`` consecutive connection-level failures (no answer in
  between) open it. While open, no rollout sends to the endpoint: they wait. The first open
  period is ``retry_backoff_base_s``; each failed probe doubles it, up to ``breaker_open_s``.
  When it ends, the first waiter is sent at once as the **probe** (no idle gap: waiters sleep
  exactly until then); any answer closes the breaker and every waiter goes; a probe that fails
  re-opens it for the next, longer period.
- *Outage.* An endpoint is **down** once it has given no answer for ``dispatch_connect_grace_s``
  (the outage grace, 30 s by default), counted from the start of the earliest request that
  failed since its last answer. From then, every rollout that would wait for it ends at once,
  typed: ``agent_request_failed`` / ``endpoint_down``, ``not_sent`` (no attempt spent; resume
  re-runs it), its message naming the endpoint and for how long it gave no answer. A rollout
  waiting for it wakes exactly at the grace's end, so a dead endpoint's rollouts all end within
  the grace plus one request timeout of the outage start, whatever their number; an outage
  shorter than the grace ends no rollout (they wait, then go on). What the run does next is the
  run's choice (`stops`, ``on_endpoint_outage``): by default the first ``endpoint_down`` stops
  the run, exit 1, resumable, with that one line; ``fail`` lets the other rollouts go on.
- *Budget.* A token bucket of ``retry_budget_per_endpoint`` re-sends that trollout schedules on
  its own against an endpoint that answers: 429/503 without ``Retry-After``, and possibly
  delivered requests; every `GOOD_ANSWERS_PER_TOKEN` good answers earn one back. It keeps a
  retry storm from amplifying an overload nobody paced. A re-send the server scheduled
  (``Retry-After``) takes no token: it is the server pacing its own load, and a budget would fail
  the rollouts of a 10,000-rollout rate-limit burst that only had to wait (rate limits wait; the
  per-rollout ``max_request_retries`` still ends a 429-forever endpoint). Connection re-sends take
  no token either: the breaker and the grace bound them, and a budget spent by a two-second blip
  would fail rollouts the grace promises to keep.

**Per rollout**, every wait is owed to something: a ``Retry-After``, a backoff after its own
failure, an open period, or a probe in flight. No wait outlasts ``max(retry_backoff_max_s,
breaker_open_s)``: with the endpoint answering and no request in flight, a waiting rollout is sent
within that bound. Sends of one attempt are at most ``1 + max_request_retries`` plus the probes it
carries (an endpoint carries one per open period) plus, for each outage it meets,
``max_connect_retries + 1`` (its own re-sends, and the one the breaker lets through once a probe
found the endpoint back: if that fails, it is a new outage). A rollout that used its own connection
re-sends fails (``not_sent``) only while the breaker is closed, that is while the endpoint answers
others; keep ``breaker_failure_threshold <= max_connect_retries + 1`` (the defaults, 5 and 4, do) so
that a lone rollout opens the breaker before it runs out. Re-sends within an attempt carry
``X-Trollout-Retry: n`` (n = 1, 2, ...), so a server tells a retry from a duplicate; a new attempt
carries its own ``_ng_attempt_index``.

The rollout's own limit (``rollout_timeout_s``) is a Trio scope in `dispatch` around all of it,
waits included; hitting it yields ``agent_request_failed`` / ``timeout`` (no reply arrived, so
nothing proves the rollout ran), terminal when ``timeout_is_terminal``.

Rejected alternatives. Failing every request the open breaker turns away (this module's first
design) failed 11 of 256 rollouts of a trainer's 429 burst one probe before the endpoint was
fine. Waiting for the probe within the retry budget (its second) turned a dead endpoint into a
crawl: budget-limited waits behind 30 s open periods, 14 of 40 rollouts started after 210 s; and
counting 5xx and malformed replies as breaker failures stalled a mixed-fault day for minutes with
the server idle. Inflating ``Retry-After`` with exponential backoff punished servers that ask
politely. A time bound per endpoint (the grace) ends a dead endpoint's rollouts in a time that
does not grow with their number, which no per-rollout count can do.

Every retry, wait, budget refusal, breaker transition and outage is counted in `RetryCounters`,
which the progress display, the final summary and telemetry read.
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

from ...records import Delivery, Failed, FailureClass, Landed
from ...settings import COUNT, POSITIVE_COUNT, POSITIVE_SECONDS, SECONDS, RunConfig
from ...text import concealed, public_url

__all__ = [
    "ENDPOINT_DOWN",
    "GOOD_ANSWERS_PER_TOKEN",
    "REFUSAL_STATUSES",
    "RETRY_HEADER",
    "Admission",
    "BreakerState",
    "EndpointHealth",
    "RetryCounters",
    "RetryPolicy",
    "RetryState",
    "endpoint_of",
    "is_connection_failure",
    "public_url",
]

GOOD_ANSWERS_PER_TOKEN: Final = 10  # well-answered requests that earn one retry token back
REFUSAL_STATUSES: Final = frozenset({429, 503})  # "not now": retried within the attempt
ENDPOINT_DOWN: Final = "endpoint_down"  # the kind of a rollout ended by its endpoint's outage
RETRY_HEADER: Final = b"x-trollout-retry"  # on re-sends within an attempt: the retry number
_RETRY_AFTER_JITTER: Final = 0.1  # of the Retry-After, at most
_RETRY_AFTER_JITTER_MAX_S: Final = 1.0
_REQUEST_FAILED: Final = FailureClass.AGENT_REQUEST_FAILED.value


@frozen(kw_only=True)
class RetryPolicy:
    """The static retry settings of a run (see the module's design note).

    Attributes:
        retry_requests: re-send possibly-delivered requests, as new attempts.
        max_request_retries: re-sends per rollout after 429/503 or a possibly-delivered failure.
        max_connect_retries: a rollout's own re-sends after connection failures, per attempt
            (probes it carries for an open breaker are the endpoint's, not counted here).
        backoff_base_s: the first backoff's cap (it doubles per retry), and the first open
            period of a breaker (it doubles per failed probe).
        backoff_max_s: the backoff cap's ceiling, and the longest ``Retry-After`` honoured.
        budget: re-sends one endpoint may take beyond what its good answers earn back.
        breaker_failure_threshold: consecutive connection failures that open a breaker.
        breaker_open_s: the longest open period of a breaker (between probes).
        outage_grace_s: how long an endpoint may give no answer before the rollouts waiting
            for it end (``dispatch_connect_grace_s``).
    """

    retry_requests: bool = False
    max_request_retries: int = attrs.field(default=3, validator=COUNT)
    max_connect_retries: int = attrs.field(default=4, validator=COUNT)
    backoff_base_s: float = attrs.field(default=0.5, validator=SECONDS)
    backoff_max_s: float = attrs.field(default=30.0, validator=SECONDS)
    budget: int = attrs.field(default=100, validator=COUNT)
    breaker_failure_threshold: int = attrs.field(default=5, validator=POSITIVE_COUNT)
    breaker_open_s: float = attrs.field(default=5.0, validator=POSITIVE_SECONDS)
    outage_grace_s: float = attrs.field(default=30.0, validator=SECONDS)

    @classmethod
    def from_config(cls, config: RunConfig) -> RetryPolicy:
        """Take the retry settings of a run."""
        return cls(
            retry_requests=config.retry_requests,
            max_request_retries=config.max_request_retries,
            max_connect_retries=config.max_connect_retries,
            backoff_base_s=config.retry_backoff_base_s,
            backoff_max_s=config.retry_backoff_max_s,
            budget=config.retry_budget_per_endpoint,
            breaker_failure_threshold=config.breaker_failure_threshold,
            breaker_open_s=config.breaker_open_s,
            outage_grace_s=config.dispatch_connect_grace_s,
        )

    def backoff_s(self, retry: int, rng: random.Random) -> float:
        """Return the backoff before retry `retry` (0-based): capped full jitter."""
        # The exponent is capped: 2.0**1024 overflows, and the cap binds long before anyway.
        cap = self.backoff_base_s * 2.0 ** min(retry, 64)
        return rng.uniform(0.0, min(self.backoff_max_s, cap))

    def refusal_wait_s(self, failed: Failed, retry: int, rng: random.Random) -> float | None:
        """Return the wait before re-sending after a 429/503, or None when it must not be.

        With a ``Retry-After``, the wait is what the server asked plus at most 10 % (and at most
        1 s) of jitter, so clients told "1 s" do not come back in one burst; never an
        exponential backoff on top. Without one, `backoff_s`. A ``Retry-After`` longer than
        `backoff_max_s` is not waited for (the attempt ends; resume re-runs it later).
        """
        asked = failed.retry_after_s
        if asked is None:
            return self.backoff_s(retry, rng)
        if asked > self.backoff_max_s:
            return None
        return asked + rng.uniform(0.0, min(asked * _RETRY_AFTER_JITTER, _RETRY_AFTER_JITTER_MAX_S))

    def open_period_s(self, failed_probes: int) -> float:
        """Return how long a breaker stays open after `failed_probes` failed probes."""
        base = max(self.backoff_base_s, 1e-3)  # a zero base would probe in a busy loop
        return min(self.breaker_open_s, base * 2.0 ** min(failed_probes, 64))


def is_connection_failure(outcome: Landed | Failed) -> bool:
    """Whether a request's result says its endpoint gave no answer at all.

    A transport failure before any response began: refused, timed out, reset (before or after
    the request was written). Any status line is an answer; the dispatcher's own verdicts
    (``timeout``, ``endpoint_down``) are not a request's result.
    """
    return (
        type(outcome) is Failed
        and outcome.http_status is None
        and outcome.failure_class == _REQUEST_FAILED
        and outcome.delivery is not Delivery.DELIVERED
    )


class BreakerState(enum.Enum):
    """Where an endpoint's circuit breaker stands."""

    CLOSED = "closed"  # requests flow
    OPEN = "open"  # requests wait until the open period ends
    HALF_OPEN = "half_open"  # one probe is out; others wait until it answers


class Admission(enum.Enum):
    """What the breaker says about one request."""

    ALLOWED = "allowed"  # send it
    PROBE = "probe"  # send it: it decides whether the breaker closes
    REJECTED = "rejected"  # do not send yet: the breaker is open
    DOWN = "down"  # do not send: the endpoint is past its outage grace


@define
class RetryCounters:
    """Run-wide counters of the retry machinery (read them, never write them).

    Attributes:
        retries: re-sends by reason (``connect``, ``http_429``, ``http_503``,
            ``possibly_delivered``); probes are counted in ``breaker_waits``.
        retry_wait_s: total seconds rollouts spent in their own waits before re-sends.
        budget_refusals: retries refused because an endpoint's budget was spent.
        breaker_transitions: breaker transitions by the state entered.
        breaker_rejections: requests an open breaker held back (each waits for its probe).
        breaker_waits: held-back requests that were then sent (as the probe, or after it).
        outages: rollouts ended because their endpoint was down, by endpoint.
        timeouts: rollouts that hit ``rollout_timeout_s``.
    """

    retries: Counter[str] = attrs.field(factory=Counter)
    retry_wait_s: float = 0.0
    budget_refusals: int = 0
    breaker_transitions: Counter[str] = attrs.field(factory=Counter)
    breaker_rejections: int = 0
    breaker_waits: int = 0
    outages: Counter[str] = attrs.field(factory=Counter)
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
            held = self.breaker_rejections
            parts.append(f"breaker opened {opened}x, held {held} (sent {self.breaker_waits})")
        if self.outages:
            down = ", ".join(f"{e} ({n})" for e, n in sorted(self.outages.items()))
            parts.append(f"ended by outages: {down}")
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
        rows.append(("breaker: requests held", str(self.breaker_rejections)))
        rows.append(("breaker: held, then sent", str(self.breaker_waits)))
        for endpoint, n in sorted(self.outages.items()):
            rows.append((f"ended by outage: {endpoint}", str(n)))
        rows.append(("rollouts timed out", str(self.timeouts)))
        return rows


@define
class EndpointHealth:
    """One endpoint's retry budget, circuit breaker and outage clock.

    Attributes:
        endpoint: the endpoint's origin, ``http://host:port``.
        policy: the run's retry policy.
        counters: the run-wide counters this endpoint adds to.
        tokens: retries left in the budget (-1 at construction: a full budget).
        good_answers: well-answered requests towards the next token.
        state: the breaker's state.
        consecutive_failures: connection failures since the last answer.
        down_since: trio time the current streak of connection failures began (None: the
            endpoint answers): see `record`.
        streaks: streaks of connection failures so far (a rollout's own re-sends are counted
            per streak: a new outage gives them back).
        alive_at: the latest trio time at which the endpoint accepted a request it answered.
        opened_at: trio time the breaker last opened.
        open_for: the current open period.
        probing: a half-open probe is out.
        failed_probes: probes that failed since the last answer (the open period doubles).
        changed: set (and replaced) whenever the breaker changes state or a probe ends;
            held-back requests wait on it.
    """

    endpoint: str
    policy: RetryPolicy
    counters: RetryCounters
    tokens: int = -1
    good_answers: int = 0
    state: BreakerState = BreakerState.CLOSED
    consecutive_failures: int = 0
    down_since: float | None = None
    streaks: int = 0
    alive_at: float = -math.inf
    opened_at: float = -math.inf
    open_for: float = 0.0
    probing: bool = False
    failed_probes: int = 0
    changed: trio.Event = attrs.field(factory=trio.Event, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.tokens < 0:
            self.tokens = self.policy.budget

    def down_at(self) -> float:
        """Trio time the endpoint counts as down if no answer comes first (inf: answering)."""
        if self.down_since is None:
            return math.inf
        return self.down_since + self.policy.outage_grace_s

    def is_down(self, now: float) -> bool:
        """Whether the endpoint has given no answer for the whole outage grace at `now`."""
        return now >= self.down_at()

    def admit(self, now: float, *, waiting: bool = False) -> Admission:
        """Decide whether a request may be sent to the endpoint at trio time `now`.

        ``waiting``: the request was held back before and asks again (not counted twice).
        """
        if self.state is BreakerState.CLOSED:
            return Admission.ALLOWED
        if self.state is BreakerState.OPEN and now >= self.opened_at + self.open_for:
            self._enter(BreakerState.HALF_OPEN)
        if self.state is BreakerState.HALF_OPEN and not self.probing:
            self.probing = True
            return Admission.PROBE
        if not waiting:
            self.counters.breaker_rejections += 1
        return Admission.DOWN if self.is_down(now) else Admission.REJECTED

    async def await_turn(self, now: Callable[[], float]) -> Admission:
        """Wait, after `admit` held a request back, until it may be sent or the endpoint is down.

        Returns PROBE (this request is the probe), ALLOWED (a probe closed the breaker) or DOWN
        (the endpoint has given no answer for the outage grace). It sleeps only until the open
        period ends, the outage grace ends, or the breaker changes: never longer.

        Cancellation: a checkpoint; nothing changes if cancelled.
        """
        while True:
            with trio.move_on_at(min(self.next_probe_at(), self.down_at())):
                await self.changed.wait()
            admission = self.admit(now(), waiting=True)
            if admission is Admission.ALLOWED or admission is Admission.PROBE:
                self.counters.breaker_waits += 1
                return admission
            if admission is Admission.DOWN:
                return admission

    def next_probe_at(self) -> float:
        """Trio time a held-back request may ask again without news (inf: await the probe)."""
        if self.state is BreakerState.OPEN:
            return self.opened_at + self.open_for
        return math.inf if self.probing else -math.inf

    def record(
        self, outcome: Landed | Failed, sent_at: float, now: float, *, probe: bool = False
    ) -> None:
        """Count one request's result (sent at `sent_at`, ended at `now`) towards the budget,
        the breaker and the outage clock.

        A connection failure extends the current streak; the outage counts from the earliest
        request that failed in it, but never from before the endpoint last accepted a request
        that it answered (`alive_at`). An answer ends the streak only if its request was sent
        once the streak had begun: a reply to a request accepted earlier (a server draining its
        old connections while it refuses new ones) says nothing about new requests.
        """
        if probe:
            self.probing = False
        if is_connection_failure(outcome):
            self.consecutive_failures += 1
            began = max(sent_at, self.alive_at)
            if self.down_since is None:
                self.streaks += 1
                self.down_since = began
            elif began < self.down_since:
                self.down_since = began
            if probe:
                self.failed_probes += 1
            # A probe that failed re-opens it; a request sent before it opened does not.
            if (probe and self.state is BreakerState.HALF_OPEN) or (
                self.state is BreakerState.CLOSED
                and self.consecutive_failures >= self.policy.breaker_failure_threshold
            ):
                self.opened_at = now
                self.open_for = self.policy.open_period_s(self.failed_probes)
                self._enter(BreakerState.OPEN)
            elif probe:
                self._notify()
            return
        if not isinstance(outcome, Failed) or outcome.failure_class != _REQUEST_FAILED:
            self.good_answers += 1
            if self.good_answers >= GOOD_ANSWERS_PER_TOKEN:
                self.good_answers = 0
                self.tokens = min(self.policy.budget, self.tokens + 1)
        if sent_at > self.alive_at:
            self.alive_at = sent_at
        if self.down_since is None and not probe and self.state is BreakerState.CLOSED:
            return  # the common case: answering, and nothing to reset (failures set down_since)
        if self.down_since is not None and sent_at < self.down_since:
            if probe:
                self._notify()
            return  # an answer to a request accepted before the streak began
        self.consecutive_failures = 0
        self.failed_probes = 0
        self.down_since = None
        if self.state is not BreakerState.CLOSED:
            self._enter(BreakerState.CLOSED)
        elif probe:
            self._notify()

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

    def outage_message(self, now: float, last: str | None) -> str:
        """Say, in one line, that this endpoint is down, for how long and how it failed."""
        since = 0.0 if self.down_since is None else now - self.down_since
        last = f"; last: {last}" if last else ""
        return (
            f"{self.endpoint} gave no answer for {since:.1f}s ({self.consecutive_failures} "
            f"requests failed in a row{last}), past dispatch_connect_grace_s="
            f"{self.policy.outage_grace_s:g}"
        )

    def _enter(self, state: BreakerState) -> None:
        self.state = state
        self.counters.breaker_transitions[state.value] += 1
        self._notify()

    def _notify(self) -> None:
        self.changed.set()
        self.changed = trio.Event()


def endpoint_of(url: str) -> str:
    """Return the origin ``scheme://host:port`` of `url`: what budgets and breakers key on.

    It has no ``user:password@``, and a host or port read from the environment shows as its
    interpolation text (`text.concealed`): it is shown in failure messages and metric labels.
    """
    parts = urlsplit(url)
    return concealed(f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}")


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
