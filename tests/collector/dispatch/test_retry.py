"""Tests of the retry policy, per-endpoint budgets and breakers, and the per-rollout limit.

`dispatch` is driven by a scripted transport (no sockets) under Trio's fake clock, so every
test asserts exact virtual times.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import attrs
import httpx
import orjson
import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from builders import materialized_row as row
from trollout.collector.dispatch.request import DispatchPolicy, dispatch
from trollout.collector.dispatch.retry import (
    Admission,
    BreakerState,
    EndpointHealth,
    RetryCounters,
    RetryPolicy,
    RetryState,
    endpoint_of,
    is_connection_failure,
)
from trollout.collector.http.transport import RawResponse
from trollout.errors import ConfigError
from trollout.records import Delivery, Failed, Identity, Landed
from trollout.settings import RunConfig

URL = "http://agent:8000/run"
Step = Callable[[], Any]  # returns a RawResponse, raises, or is "hang"


def reply(status: int, *, retry_after: float | None = None) -> RawResponse:
    """A reply with `status` (200: a scored result)."""
    headers = [] if retry_after is None else [(b"retry-after", f"{retry_after:g}".encode())]
    body = b'{"reward": 1.0}' if status == 200 else b'"no"'
    return RawResponse(status, headers, body, False, URL)


class Script:
    """A transport whose successive POSTs follow a script; records when and what was sent."""

    def __init__(self, *steps: RawResponse | BaseException | str, default: Any = None) -> None:
        self.steps = list(steps)
        self.default = default
        self.sent: list[tuple[float, int]] = []  # (virtual time, attempt index)
        self.headers: list[bytes] = []  # the extra header lines of each POST

    async def post(self, url: str, body: bytes, *, headers: bytes = b"") -> RawResponse:
        self.sent.append((trio.current_time(), orjson.loads(body).get("_ng_attempt_index", 0)))
        self.headers.append(headers)
        step = self.steps.pop(0) if self.steps else self.default
        if step == "hang":
            await trio.sleep_forever()
        if step == "slow":  # answers after one second
            await trio.sleep(1.0)
            step = reply(200)
        if isinstance(step, BaseException):
            raise step
        await trio.lowlevel.checkpoint()
        assert isinstance(step, RawResponse)
        return step

    @property
    def times(self) -> list[float]:
        """Virtual times of the POSTs."""
        return [t for t, _ in self.sent]


def refused() -> httpx.ConnectError:
    """A refused connect (never delivered)."""
    return httpx.ConnectError("cannot connect: Connection refused")


def policy(**retry: Any) -> DispatchPolicy:
    """A dispatch policy with retry settings `retry` (and the rollout limit, if given)."""
    limit = retry.pop("rollout_timeout_s", None)
    terminal = retry.pop("timeout_is_terminal", False)
    retry.setdefault("max_connect_retries", 3)
    return DispatchPolicy(
        10.0,
        60.0,
        retry=RetryPolicy(**retry),
        rollout_timeout_s=limit,
        timeout_is_terminal=terminal,
    )


def jitter(seed: int, caps: list[float]) -> list[float]:
    """Replay the full-jitter draws of `seed` for the given caps."""
    rng = random.Random(seed)
    return [rng.uniform(0.0, cap) for cap in caps]


# --- the policy ---------------------------------------------------------------------------------


def test_retry_policy_from_config_takes_run_settings() -> None:
    """from_config copies every retry setting of the run."""
    config = RunConfig(
        retry_requests=True,
        max_request_retries=5,
        retry_backoff_base_s=0.1,
        retry_backoff_max_s=4.0,
        retry_budget_per_endpoint=7,
        breaker_failure_threshold=2,
        breaker_open_s=9.0,
        max_connect_retries=6,
        dispatch_connect_grace_s=12.0,
    )
    assert RetryPolicy.from_config(config) == RetryPolicy(
        retry_requests=True,
        max_request_retries=5,
        backoff_base_s=0.1,
        backoff_max_s=4.0,
        budget=7,
        breaker_failure_threshold=2,
        breaker_open_s=9.0,
        max_connect_retries=6,
        outage_grace_s=12.0,
    )


def test_retry_policy_rejects_bad_values() -> None:
    """A zero breaker threshold or negative budget is refused with the setting's name."""
    with pytest.raises(ConfigError, match=r"breaker_failure_threshold must be an integer from 1"):
        RetryPolicy(breaker_failure_threshold=0)
    with pytest.raises(ConfigError, match="budget must be an integer from 0"):
        RetryPolicy(budget=-1)


def test_dispatch_policy_from_config_takes_the_rollout_limit() -> None:
    """from_config carries the per-rollout limit, its terminality and the retry policy."""
    config = RunConfig(rollout_timeout_s=120.0, timeout_is_terminal=True, max_request_retries=1)
    p = DispatchPolicy.from_config(config)
    assert (p.rollout_timeout_s, p.timeout_is_terminal, p.retry.max_request_retries) == (
        120.0,
        True,
        1,
    )


def test_retry_policy_refusal_wait_is_what_the_server_asked() -> None:
    """The wait is Retry-After plus at most 10 % (1 s at most), never an exponential backoff on
    top, whatever the retry number; without one, the backoff; a too-long one is not waited."""
    p = RetryPolicy(backoff_base_s=1.0, backoff_max_s=30.0)
    failed = Failed(Identity(1, 0), 0, "agent_request_failed", http_status=429, retry_after_s=3.0)
    assert p.refusal_wait_s(failed, 2, random.Random(4)) == 3.0 + jitter(4, [0.3])[0]
    assert p.refusal_wait_s(failed, 9, random.Random(4)) == 3.0 + jitter(4, [0.3])[0]
    long = attrs.evolve(failed, retry_after_s=25.0)
    assert p.refusal_wait_s(long, 0, random.Random(4)) == 25.0 + jitter(4, [1.0])[0]
    zero = attrs.evolve(failed, retry_after_s=0.0)
    assert p.refusal_wait_s(zero, 3, random.Random(4)) == 0.0
    no_header = attrs.evolve(failed, retry_after_s=None)
    assert p.refusal_wait_s(no_header, 0, random.Random(4)) == jitter(4, [1.0])[0]
    assert p.refusal_wait_s(attrs.evolve(failed, retry_after_s=31.0), 0, random.Random(4)) is None


@given(asked=st.floats(0.0, 30.0), retry=st.integers(0, 10_000), seed=st.integers(0, 2**16))
def test_retry_after_is_honoured_within_ten_percent(asked: float, retry: int, seed: int) -> None:
    """Property: a Retry-After the policy honours is waited for at least as asked, at most 10 %
    (and 1 s) longer, at any retry number."""
    p = RetryPolicy(backoff_base_s=0.5, backoff_max_s=30.0)
    failed = Failed(Identity(1, 0), 0, "agent_request_failed", http_status=503, retry_after_s=asked)
    wait = p.refusal_wait_s(failed, retry, random.Random(seed))
    assert wait is not None
    assert asked <= wait <= asked + min(0.1 * asked, 1.0)


def test_open_period_doubles_per_failed_probe_up_to_breaker_open_s() -> None:
    """The first open period is the backoff base; each failed probe doubles it, up to the max."""
    p = RetryPolicy(backoff_base_s=0.5, breaker_open_s=5.0)
    assert [p.open_period_s(n) for n in range(6)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_endpoint_of_keys_on_the_origin() -> None:
    """Budgets and breakers are per origin, whatever the path."""
    assert endpoint_of("http://127.0.0.1:9/run") == "http://127.0.0.1:9"
    state = RetryState()
    assert state.endpoint("http://a:1/run") is state.endpoint("http://a:1/aggregate_metrics")
    assert state.endpoint("http://a:1/run") is not state.endpoint("http://a:2/run")


# --- breaker and budget, pure -------------------------------------------------------------------

FAIL = Failed(Identity(1, 0), 0, "agent_request_failed", kind="connect", delivery=Delivery.NOT_SENT)
HUNG = Failed(
    Identity(1, 0),
    0,
    "agent_request_failed",
    kind="read_timeout",
    delivery=Delivery.POSSIBLY_DELIVERED,
)
REFUSED_429 = Failed(
    Identity(1, 0),
    0,
    "agent_request_failed",
    kind="http_429",
    http_status=429,
    delivery=Delivery.DELIVERED,
)
BAD_502 = Failed(
    Identity(1, 0),
    0,
    "agent_request_failed",
    kind="http_502",
    http_status=502,
    delivery=Delivery.DELIVERED,
)
RAN = Failed(Identity(1, 0), 0, "agent_run_error", kind="http_500")
LANDED = Landed(Identity(1, 0), 0, {"reward": 1.0})


def health(**settings: Any) -> EndpointHealth:
    """An endpoint's health under a policy with `settings`."""
    return EndpointHealth("http://a:1", RetryPolicy(**settings), RetryCounters())


def test_only_connection_failures_are_the_endpoints_health() -> None:
    """Refused, timed out and reset requests count; any answer (a 429, a 502, a 500) does not."""
    assert is_connection_failure(FAIL)
    assert is_connection_failure(HUNG)
    for answered in (REFUSED_429, BAD_502, RAN, LANDED):
        assert not is_connection_failure(answered)


def test_breaker_opens_after_consecutive_connection_failures() -> None:
    """N consecutive connection failures open it; any answer, even a 429 or 502, resets."""
    h = health(breaker_failure_threshold=3, backoff_base_s=0.5)
    for outcome in (FAIL, FAIL, REFUSED_429, FAIL, HUNG, BAD_502, FAIL, FAIL):
        h.record(outcome, 1.0, 1.0)
    assert (h.state, h.consecutive_failures) == (BreakerState.CLOSED, 2)
    h.record(FAIL, 1.5, 2.0)
    assert (h.state, h.opened_at, h.open_for) == (BreakerState.OPEN, 2.0, 0.5)
    assert h.admit(2.4) is Admission.REJECTED
    assert h.counters.breaker_rejections == 1
    assert h.down_since == 1.0  # the earliest failing request since the last answer


def test_breaker_half_open_probe_closes_or_reopens_for_longer() -> None:
    """When the open period ends one probe goes; a failure re-opens for twice as long (up to
    breaker_open_s); any answer closes it and resets the outage clock."""
    h = health(breaker_failure_threshold=1, backoff_base_s=1.0, breaker_open_s=3.0)
    h.record(FAIL, 0.0, 0.0)
    assert h.admit(0.9) is Admission.REJECTED
    assert h.admit(1.0) is Admission.PROBE
    assert h.admit(1.0) is Admission.REJECTED  # one probe at a time
    h.record(FAIL, 1.0, 1.5, probe=True)
    assert (h.state, h.opened_at, h.open_for) == (BreakerState.OPEN, 1.5, 2.0)
    assert h.admit(3.4) is Admission.REJECTED
    assert h.admit(3.5) is Admission.PROBE
    h.record(FAIL, 3.5, 4.0, probe=True)
    assert h.open_for == 3.0  # capped at breaker_open_s
    assert h.admit(7.0) is Admission.PROBE
    h.record(REFUSED_429, 7.0, 7.5, probe=True)  # a 429 is an answer: the endpoint is up
    assert (h.state, h.down_since, h.failed_probes) == (BreakerState.CLOSED, None, 0)
    assert h.admit(8.0) is Admission.ALLOWED
    assert dict(h.counters.breaker_transitions) == {"open": 3, "half_open": 3, "closed": 1}


def test_a_request_sent_before_the_breaker_opened_does_not_reopen_it() -> None:
    """A failure of a request in flight when the probe went out leaves the probe in charge."""
    h = health(breaker_failure_threshold=1, backoff_base_s=1.0)
    h.record(FAIL, 0.0, 0.0)
    assert h.admit(1.0) is Admission.PROBE
    h.record(HUNG, 0.0, 1.2)  # sent at 0, before the breaker opened
    assert (h.state, h.probing) == (BreakerState.HALF_OPEN, True)
    h.record(LANDED, 1.0, 1.3, probe=True)
    assert h.state is BreakerState.CLOSED


def test_endpoint_is_down_once_silent_for_the_grace() -> None:
    """Down counts from the earliest failed request since the last answer; an answer ends it."""
    h = health(breaker_failure_threshold=2, outage_grace_s=10.0)
    assert (h.down_at(), h.is_down(1e9)) == (math.inf, False)
    h.record(FAIL, 4.0, 4.0)
    h.record(HUNG, 2.0, 6.0)  # sent earlier, failed later: the outage began by 2.0
    assert (h.down_since, h.down_at()) == (2.0, 12.0)
    assert not h.is_down(11.9)
    assert h.is_down(12.0)
    assert h.admit(12.0) is Admission.PROBE  # a probe is still sent when it is due
    assert h.admit(12.0) is Admission.DOWN  # the others end
    h.record(LANDED, 12.0, 12.1, probe=True)
    assert (h.down_at(), h.state) == (math.inf, BreakerState.CLOSED)


def test_breaker_abandoned_probe_frees_the_slot() -> None:
    """A probe cancelled before its answer lets the next request probe."""
    h = health(breaker_failure_threshold=1, breaker_open_s=1.0)
    h.record(FAIL, 0.0, 0.0)
    assert h.admit(1.0) is Admission.PROBE
    h.abandon_probe()
    assert h.admit(1.0) is Admission.PROBE


def test_budget_is_a_count_refilled_by_good_answers() -> None:
    """Each retry takes a token; a spent budget refuses; ten good answers earn one back."""
    h = health(budget=2)
    assert [h.take_retry() for _ in range(3)] == [True, True, False]
    assert h.counters.budget_refusals == 1
    for _ in range(10):
        h.record(RAN, 0.0, 0.0)
    assert h.take_retry() is True
    assert h.take_retry() is False


def test_retry_counters_summary_and_rows() -> None:
    """The progress line and the summary rows name every counter that moved."""
    counters = RetryCounters()
    assert counters.summary() == ""
    counters.retries["http_429"] += 3
    counters.retry_wait_s = 4.5
    counters.breaker_transitions["open"] += 1
    counters.breaker_rejections = 7
    counters.breaker_waits = 5
    counters.timeouts = 2
    counters.outages["http://a:1"] += 4
    assert counters.summary() == (
        "retries 3 (waited 4.5s) | breaker opened 1x, held 7 (sent 5) | "
        "ended by outages: http://a:1 (4) | timed out 2"
    )
    rows = dict(counters.rows())
    assert (rows["retries: http_429"], rows["breaker -> open"], rows["rollouts timed out"]) == (
        "3",
        "1",
        "2",
    )
    assert rows["breaker: held, then sent"] == "5"
    assert rows["ended by outage: http://a:1"] == "4"


# --- dispatch: refusals and Retry-After ---------------------------------------------------------


async def test_dispatch_retry_after_schedule_is_exact(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """429/503 are re-sent after their Retry-After plus at most 10 % jitter (a backoff when
    none is given), within the same attempt, each re-send numbered in X-Trollout-Retry."""
    transport = Script(reply(429, retry_after=2), reply(503, retry_after=1), reply(429), reply(200))
    state = RetryState()
    outcome = await dispatch(
        transport,
        URL,
        row(7),
        0,
        policy(backoff_base_s=0.5),
        rng=random.Random(9),
        retry_state=state,
    )
    j = jitter(9, [0.2, 0.1, 2.0])  # 10 % of 2 s, of 1 s; the third: no header, backoff 2
    expected = [0.0, 2.0 + j[0], 2.0 + j[0] + 1.0 + j[1], 3.0 + j[0] + j[1] + j[2]]
    assert transport.times == pytest.approx(expected, abs=1e-9)
    assert isinstance(outcome, Landed)
    assert outcome.elapsed_seconds == pytest.approx(expected[-1], abs=1e-9)
    assert [a for _, a in transport.sent] == [0, 0, 0, 0]  # refusals re-send the same attempt
    assert transport.headers == [
        b"",
        b"x-trollout-retry: 1\r\n",
        b"x-trollout-retry: 2\r\n",
        b"x-trollout-retry: 3\r\n",
    ]
    assert dict(state.counters.retries) == {"http_429": 2, "http_503": 1}
    assert state.counters.retry_wait_s == pytest.approx(expected[-1], abs=1e-9)


async def test_dispatch_refusal_retries_are_bounded(autojump_clock: trio.testing.MockClock) -> None:
    """After max_request_retries the last 429 is returned, delivered, with a note."""
    transport = Script(default=reply(429, retry_after=1))
    outcome = await dispatch(
        transport, URL, row(7), 0, policy(max_request_retries=2), rng=random.Random(1)
    )
    assert len(transport.sent) == 3
    assert isinstance(outcome, Failed)
    assert (outcome.failure_class, outcome.kind, outcome.delivery) == (
        "agent_request_failed",
        "http_429",
        Delivery.DELIVERED,
    )
    assert (outcome.message or "").endswith("(after 2 request retries)")


async def test_dispatch_long_retry_after_is_not_waited(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A Retry-After beyond retry_backoff_max_s ends the rollout at once."""
    transport = Script(reply(503, retry_after=600))
    outcome = await dispatch(transport, URL, row(7), 0, policy(), rng=random.Random(1))
    assert isinstance(outcome, Failed)
    assert outcome.http_status == 503
    assert (len(transport.sent), trio.current_time()) == (1, 0.0)


@pytest.mark.parametrize("status", [502, 504, 500])
async def test_dispatch_never_resends_after_a_response_began(
    status: int, autojump_clock: trio.testing.MockClock
) -> None:
    """502, 504 and 500 end the rollout at once, retry_requests or not."""
    transport = Script(reply(status), default=reply(200))
    outcome = await dispatch(
        transport,
        URL,
        row(7),
        0,
        policy(retry_requests=True),
        rng=random.Random(1),
        new_attempt=_never,
    )
    assert isinstance(outcome, Failed)
    assert outcome.http_status == status
    assert len(transport.sent) == 1


async def _never(failed: Failed) -> int:
    raise AssertionError("no new attempt expected")


# --- dispatch: possibly delivered ---------------------------------------------------------------


async def test_dispatch_possibly_delivered_is_kept_without_retry_requests(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A reset after sending is not re-sent unless retry_requests is on."""
    transport = Script(httpx.ReadError("reset"), default=reply(200))
    outcome = await dispatch(
        transport, URL, row(7), 0, policy(), rng=random.Random(1), new_attempt=_never
    )
    assert isinstance(outcome, Failed)
    assert outcome.delivery is Delivery.POSSIBLY_DELIVERED
    assert len(transport.sent) == 1


async def test_dispatch_retry_requests_resends_as_a_new_attempt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """With retry_requests, the superseded attempt is recorded and a new number is sent."""
    transport = Script(httpx.ReadError("reset"), httpx.WriteError("broken"), reply(200))
    recorded: list[Failed] = []

    async def new_attempt(failed: Failed) -> int:
        recorded.append(failed)
        return failed.attempt_index + 1

    outcome = await dispatch(
        transport,
        URL,
        row(7),
        4,
        attrs.evolve(policy(retry_requests=True, backoff_base_s=1.0), max_attempts=10),
        rng=random.Random(2),
        new_attempt=new_attempt,
    )
    assert isinstance(outcome, Landed)
    assert outcome.attempt_index == 6
    assert [a for _, a in transport.sent] == [4, 5, 6]
    assert [(f.attempt_index, f.kind) for f in recorded] == [(4, "reset"), (5, "write")]
    j = jitter(2, [1.0, 2.0])
    assert transport.times == pytest.approx([0.0, j[0], j[0] + j[1]], abs=1e-9)


async def test_dispatch_new_attempts_stop_below_the_cap(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A re-send as a new attempt never takes a number at max_attempts or above."""
    transport = Script(default=httpx.ReadError("reset"))
    numbers: list[int] = []

    async def new_attempt(failed: Failed) -> int:
        numbers.append(failed.attempt_index + 1)
        return failed.attempt_index + 1

    p = attrs.evolve(policy(retry_requests=True, max_request_retries=9), max_attempts=3)
    outcome = await dispatch(
        transport, URL, row(7), 0, p, rng=random.Random(2), new_attempt=new_attempt
    )
    assert [a for _, a in transport.sent] == [0, 1, 2]
    assert numbers == [1, 2]
    assert (outcome.attempt_index, outcome.delivery) == (2, Delivery.POSSIBLY_DELIVERED)


async def test_dispatch_an_attempt_the_server_saw_is_never_not_sent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A 503, then refused connects until the endpoint is down: the attempt's failure keeps
    the furthest its requests got (delivered), so its number is never handed out again."""
    p = policy(outage_grace_s=0.0)
    state = RetryState(p.retry)
    transport = Script(reply(503, retry_after=1), default=refused())
    outcome = await dispatch(transport, URL, row(7), 0, p, rng=random.Random(2), retry_state=state)
    assert isinstance(outcome, Failed)
    assert (outcome.kind, outcome.delivery, outcome.spends_attempt) == (
        "endpoint_down",
        Delivery.DELIVERED,
        True,
    )


# --- the per-rollout limit ----------------------------------------------------------------------


async def test_dispatch_rollout_timeout_ends_a_hang_at_the_limit(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A hanging request ends at exactly rollout_timeout_s as a typed, counted timeout."""
    state = RetryState()
    transport = Script("hang")
    p = policy(rollout_timeout_s=7.0)
    outcome = await dispatch(transport, URL, row(7), 1, p, rng=random.Random(1), retry_state=state)
    assert trio.current_time() == 7.0
    assert isinstance(outcome, Failed)
    assert (outcome.failure_class, outcome.kind, outcome.terminal, outcome.delivery) == (
        "agent_request_failed",
        "timeout",
        False,
        Delivery.POSSIBLY_DELIVERED,
    )
    assert (outcome.attempt_index, outcome.elapsed_seconds) == (1, 7.0)
    assert "rollout_timeout_s=7.0" in (outcome.message or "")
    assert state.counters.timeouts == 1


async def test_dispatch_rollout_timeout_covers_retries_and_waits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The limit bounds the whole rollout: waits after 429s included; terminal when set."""
    transport = Script(default=reply(429, retry_after=4))
    p = policy(rollout_timeout_s=10.0, timeout_is_terminal=True, max_request_retries=99)
    outcome = await dispatch(transport, URL, row(7), 0, p, rng=random.Random(3))
    assert trio.current_time() == 10.0
    assert isinstance(outcome, Failed)
    assert (outcome.kind, outcome.terminal, outcome.delivery) == (
        "timeout",
        True,
        Delivery.DELIVERED,
    )
    assert len(transport.sent) == 3  # at 0, ~4.x, ~8.x
    assert "HTTP 429" in (outcome.message or "")


async def test_dispatch_rollout_timeout_lets_outer_cancellation_through(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An outer deadline before the rollout limit cancels; it is not a timeout outcome."""
    results: list[object] = []
    with trio.move_on_after(3) as scope:
        results.append(
            await dispatch(
                Script("hang"), URL, row(7), 0, policy(rollout_timeout_s=7.0), rng=random.Random(1)
            )
        )
    assert scope.cancelled_caught
    assert results == []


# --- the breaker and outages through dispatch ---------------------------------------------------


def refused_policy(**retry: Any) -> DispatchPolicy:
    """A policy for refused-connect tests: no own backoff jitter to replay (base 1 s, max 1 s)."""
    retry.setdefault("backoff_base_s", 1.0)
    retry.setdefault("backoff_max_s", 1.0)
    return policy(**retry)


async def test_dispatch_waits_out_a_short_outage_and_lands(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Refused connects open the breaker; the rollout waits for the probe instead of failing,
    and lands when the endpoint comes back within the grace: no rollout lost."""
    p = refused_policy(breaker_failure_threshold=3, breaker_open_s=4.0, outage_grace_s=30.0)
    state = RetryState(p.retry)
    transport = Script(*[refused()] * 5, default=reply(200))
    outcome = await dispatch(transport, URL, row(1), 0, p, rng=random.Random(1), retry_state=state)
    assert isinstance(outcome, Landed)
    j = jitter(1, [1.0, 1.0])
    t2 = j[0] + j[1]  # the third refusal, its own second retry, opens the breaker at t2
    # Probes at t2 + 1, then + 2 (the open period doubles), then + 4 (capped at 4): lands.
    expected = [0.0, j[0], t2, t2 + 1.0, t2 + 3.0, t2 + 7.0]
    assert transport.times == pytest.approx(expected, abs=1e-9)
    assert transport.headers[1:] == [b"x-trollout-retry: %d\r\n" % n for n in range(1, 6)]
    assert state.endpoint(URL).state is BreakerState.CLOSED
    assert dict(state.counters.retries) == {"connect": 2}  # the probes are the endpoint's
    assert state.counters.breaker_waits == 3


async def test_dispatch_dead_endpoint_ends_every_waiter_at_the_grace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Against a dead endpoint every rollout ends endpoint_down, not sent, at the end of the
    grace counted from the first failed request, however many there are; probes keep going out
    one per open period meanwhile."""
    p = refused_policy(breaker_failure_threshold=2, breaker_open_s=2.0, outage_grace_s=10.0)
    state = RetryState(p.retry)
    transport = Script(default=refused())
    outcomes: list[Landed | Failed] = []
    ended: list[float] = []

    async def one(task: int) -> None:
        rng = random.Random(task)
        outcomes.append(await dispatch(transport, URL, row(task), 0, p, rng=rng, retry_state=state))
        ended.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        for task in range(50):
            nursery.start_soon(one, task)
    assert len(outcomes) == 50
    assert {(o.kind, o.delivery, o.spends_attempt) for o in outcomes if isinstance(o, Failed)} == {
        ("endpoint_down", Delivery.NOT_SENT, False)
    }
    assert ended == [10.0] * 50
    # 50 first requests, then one probe per open period (1 s, then 2 s): at 1, 3, 5, 7, 9.
    probes = [t for t in transport.times if t > 0]
    assert probes == pytest.approx([1.0, 3.0, 5.0, 7.0, 9.0])
    message = outcomes[0].message or ""
    assert message.startswith("http://agent:8000 gave no answer for 10.0s (")
    assert state.counters.outages == {"http://agent:8000": 50}


async def test_dispatch_later_rollouts_of_a_down_endpoint_end_at_once_unless_probing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Once down, a new rollout ends at once without sending, except the one due to probe,
    and a probe that finds the endpoint back lets everyone through again."""
    p = refused_policy(breaker_failure_threshold=1, breaker_open_s=2.0, outage_grace_s=3.0)
    state = RetryState(p.retry)
    transport = Script(*[refused()] * 4, default=reply(200))
    first = await dispatch(transport, URL, row(0), 0, p, rng=random.Random(0), retry_state=state)
    assert (first.kind, trio.current_time()) == ("endpoint_down", 3.0)
    sent = len(transport.sent)  # 0; probes at 1 and 3 (failed): open until 5
    assert transport.times == [0.0, 1.0, 3.0]
    late = await dispatch(transport, URL, row(1), 0, p, rng=random.Random(1), retry_state=state)
    assert (late.kind, len(transport.sent)) == ("endpoint_down", sent)
    await trio.sleep(2.0)  # the open period ends: the next rollout is the probe, and lands
    back = await dispatch(transport, URL, row(2), 0, p, rng=random.Random(2), retry_state=state)
    assert isinstance(back, Failed)  # the 4th refusal: a probe that failed ...
    await trio.sleep(4.0)
    again = await dispatch(transport, URL, row(3), 0, p, rng=random.Random(3), retry_state=state)
    assert isinstance(again, Landed)  # ... and one that found it back
    assert state.endpoint(URL).state is BreakerState.CLOSED


async def test_dispatch_breaker_opens_when_the_failing_request_ended(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The breaker's open period counts from the end of the request that opened it, the
    outage from its start."""

    class SlowRefusal:
        async def post(self, url: str, body: bytes, **_: Any) -> RawResponse:
            await trio.sleep(4.0)
            raise refused()

    p = policy(breaker_failure_threshold=1, backoff_base_s=5.0, outage_grace_s=0.0)
    state = RetryState(p.retry)
    start = trio.current_time()
    failed = await dispatch(
        SlowRefusal(), URL, row(1), 0, p, rng=random.Random(1), retry_state=state
    )
    assert isinstance(failed, Failed)
    assert (failed.kind, failed.elapsed_seconds) == ("endpoint_down", pytest.approx(4.0))
    health = state.endpoint(URL)
    assert (health.state, health.opened_at) == (BreakerState.OPEN, pytest.approx(start + 4.0))
    assert health.next_probe_at() == pytest.approx(start + 9.0)
    assert health.down_since == pytest.approx(start)


async def test_dispatch_waiters_follow_the_probe(autojump_clock: trio.testing.MockClock) -> None:
    """Rollouts held back while a probe is out send as soon as it closes the breaker."""
    p = policy(breaker_failure_threshold=1, backoff_base_s=5.0, max_connect_retries=0)
    state = RetryState(p.retry)
    transport = Script("slow", default=reply(200))
    state.endpoint(URL).record(FAIL, 0.0, 0.0)  # a refused connect opened it at 0
    assert state.endpoint(URL).state is BreakerState.OPEN
    outcomes: list[Landed | Failed] = []
    async with trio.open_nursery() as nursery:
        for task in (1, 2, 3):
            rng = random.Random(task)

            async def one(task: int = task, rng: random.Random = rng) -> None:
                outcomes.append(
                    await dispatch(transport, URL, row(task), 0, p, rng=rng, retry_state=state)
                )

            nursery.start_soon(one)
    assert all(isinstance(o, Landed) for o in outcomes)
    assert transport.times == [5.0, 6.0, 6.0]  # the probe at 5 s took 1 s; then the rest
    assert state.counters.breaker_waits >= 2


@pytest.mark.parametrize("answer", [429, 502, 500])
async def test_dispatch_answers_never_open_the_breaker(
    answer: int, autojump_clock: trio.testing.MockClock
) -> None:
    """However many 429s, 502s or 500s an endpoint gives, its breaker stays closed: they are
    answers (the mixed-fault day that stalled behind an open breaker)."""
    p = policy(breaker_failure_threshold=1, max_request_retries=0)
    state = RetryState(p.retry)
    transport = Script(default=reply(answer))
    for task in range(20):
        await dispatch(transport, URL, row(task), 0, p, rng=random.Random(task), retry_state=state)
    assert state.endpoint(URL).state is BreakerState.CLOSED
    assert len(transport.sent) == 20


async def test_dispatch_retry_after_waits_take_no_budget(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A rate-limit burst paced by Retry-After waits and lands whatever the budget: the server
    set the time, so the re-sends are not the budget's; max_request_retries still bounds them."""
    state = RetryState(RetryPolicy(budget=0))
    transport = Script(*[reply(429, retry_after=1)] * 40, default=reply(200))
    outcomes: list[Landed | Failed] = []

    async def one(task: int) -> None:
        p = policy(budget=0)
        rng = random.Random(task)
        outcomes.append(await dispatch(transport, URL, row(task), 0, p, rng=rng, retry_state=state))

    async with trio.open_nursery() as nursery:
        for task in range(20):
            nursery.start_soon(one, task)
    assert [type(o) for o in outcomes] == [Landed] * 20
    assert len(transport.sent) == 60  # two 429s each, then the 200
    assert state.counters.budget_refusals == 0


async def test_dispatch_budget_bounds_requests_to_a_refusing_endpoint(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Many rollouts against an endpoint answering 429 without Retry-After forever send at most
    rollouts + budget requests: the re-sends trollout paces itself are the budget's."""
    state = RetryState(RetryPolicy(budget=5, max_request_retries=10, breaker_failure_threshold=99))
    transport = Script(default=reply(429))
    outcomes: list[Landed | Failed] = []

    async def one(task: int) -> None:
        p = policy(max_request_retries=10)
        outcomes.append(
            await dispatch(
                transport, URL, row(task), 0, p, rng=random.Random(task), retry_state=state
            )
        )

    async with trio.open_nursery() as nursery:
        for task in range(8):
            nursery.start_soon(one, task)
    assert len(transport.sent) == 8 + 5
    assert all(isinstance(o, Failed) and o.http_status == 429 for o in outcomes)
    assert state.counters.budget_refusals == 8
    spent = [
        o for o in outcomes if "retry budget of http://agent:8000 is spent" in (o.message or "")
    ]
    assert len(spent) == 8


# --- properties ---------------------------------------------------------------------------------

STEPS = st.sampled_from(["refused", "reset", 429, 503, "429 unpaced", 502, 500, 200])


def scripted_step(step: str | int) -> RawResponse | BaseException:
    """The transport behaviour a drawn step stands for."""
    if step == "refused":
        return refused()
    if step == "reset":
        return httpx.ReadError("reset")
    if step == "429 unpaced":
        return reply(429)  # no Retry-After: trollout paces the re-send, from the budget
    assert isinstance(step, int)
    return reply(step, retry_after=1 if step in (429, 503) else None)


@given(
    scripts=st.lists(st.lists(STEPS, max_size=12), min_size=1, max_size=6),
    budget=st.integers(0, 4),
    max_retries=st.integers(0, 3),
    seed=st.integers(0, 2**16),
)
def test_dispatch_sends_stay_within_every_bound(
    scripts: list[list[str | int]], budget: int, max_retries: int, seed: int
) -> None:
    """Whatever the endpoint does, sends per rollout and retries per endpoint stay bounded."""
    p = policy(
        max_request_retries=max_retries,
        budget=budget,
        breaker_failure_threshold=3,
        max_connect_retries=2,
    )
    state = RetryState(p.retry)

    async def main() -> list[tuple[Script, Landed | Failed, int, int]]:
        done: list[tuple[Script, Landed | Failed, int, int]] = []
        health = state.endpoint(URL)
        for task, script in enumerate(scripts):
            transport = Script(*(scripted_step(s) for s in script), default=reply(200))
            rng = random.Random(seed + task)
            waits, streaks = state.counters.breaker_waits, health.streaks
            outcome = await dispatch(transport, URL, row(task), 0, p, rng=rng, retry_state=state)
            waits, streaks = state.counters.breaker_waits - waits, health.streaks - streaks
            done.append((transport, outcome, waits, streaks))
        return done

    results = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    retry = p.retry
    for transport, outcome, probes, outages in results:
        # The documented bound (dispatch/retry.py): 1 + max_request_retries + the probes it
        # carried + (max_connect_retries + 1) per outage it met.
        per_outage = retry.max_connect_retries + 1
        assert len(transport.sent) <= 1 + max_retries + probes + per_outage * max(outages, 1)
        if isinstance(outcome, Failed) and outcome.kind not in ("endpoint_down", "connect"):
            assert outcome.kind == f"http_{outcome.http_status}" or outcome.kind == "reset"
    # Re-sends after an unpaced refusal are the budget's (send k+1 answers step k's refusal).
    unpaced = sum(
        1
        for script, (transport, _, _, _) in zip(scripts, results, strict=True)
        for k in range(len(transport.sent) - 1)
        if k < len(script) and script[k] == "429 unpaced"
    )
    earned = sum(len(t.sent) for t, _, _, _ in results) // 10  # one token per ten good answers
    assert unpaced <= budget + earned


async def test_dispatch_cancelled_probe_lets_the_next_rollout_probe(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A half-open probe cancelled mid-request frees the slot: the next rollout probes."""
    state = RetryState.from_config(RunConfig(breaker_failure_threshold=1, retry_backoff_base_s=5.0))
    transport = Script("hang", reply(200))
    p = policy(max_request_retries=0)
    state.endpoint(URL).record(FAIL, 0.0, 0.0)  # a refused connect opened it at 0
    await trio.sleep(5.0)
    with trio.move_on_after(1.0):
        await dispatch(transport, URL, row(2), 0, p, rng=random.Random(1), retry_state=state)
    assert state.endpoint(URL).state is BreakerState.HALF_OPEN
    outcome = await dispatch(transport, URL, row(3), 0, p, rng=random.Random(1), retry_state=state)
    assert isinstance(outcome, Landed)
    assert transport.times == [5.0, 6.0]
    assert state.endpoint(URL).state is BreakerState.CLOSED
