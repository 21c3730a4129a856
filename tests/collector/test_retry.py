"""Tests of the retry policy, per-endpoint budgets and breakers, and the per-rollout limit.

`dispatch` is driven by a scripted transport (no sockets) under Trio's fake clock, so every
test asserts exact virtual times.
"""

from __future__ import annotations

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
from trollout.collector.dispatch import DispatchPolicy, dispatch
from trollout.collector.retry import (
    Admission,
    BreakerState,
    EndpointHealth,
    RetryCounters,
    RetryPolicy,
    RetryState,
    endpoint_of,
)
from trollout.collector.transport import RawResponse
from trollout.config import RunConfig
from trollout.errors import ConfigError
from trollout.records import Delivery, Failed, Identity, Landed

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

    async def post(self, url: str, body: bytes, **_: Any) -> RawResponse:
        self.sent.append((trio.current_time(), orjson.loads(body).get("_ng_attempt_index", 0)))
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
    return DispatchPolicy(
        10.0,
        60.0,
        3,
        30.0,
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
    )
    assert RetryPolicy.from_config(config) == RetryPolicy(
        retry_requests=True,
        max_request_retries=5,
        backoff_base_s=0.1,
        backoff_max_s=4.0,
        budget=7,
        breaker_failure_threshold=2,
        breaker_open_s=9.0,
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


def test_retry_policy_refusal_wait_is_retry_after_plus_jitter() -> None:
    """The wait is Retry-After plus capped full jitter; a too-long Retry-After is not waited."""
    p = RetryPolicy(backoff_base_s=1.0, backoff_max_s=10.0)
    failed = Failed(Identity(1, 0), 0, "agent_request_failed", http_status=429, retry_after_s=3.0)
    assert p.refusal_wait_s(failed, 2, random.Random(4)) == 3.0 + jitter(4, [4.0])[0]
    no_header = attrs.evolve(failed, retry_after_s=None)
    assert p.refusal_wait_s(no_header, 0, random.Random(4)) == jitter(4, [1.0])[0]
    assert p.refusal_wait_s(attrs.evolve(failed, retry_after_s=11.0), 0, random.Random(4)) is None


def test_endpoint_of_keys_on_the_origin() -> None:
    """Budgets and breakers are per origin, whatever the path."""
    assert endpoint_of("http://127.0.0.1:9/run") == "http://127.0.0.1:9"
    state = RetryState()
    assert state.endpoint("http://a:1/run") is state.endpoint("http://a:1/aggregate_metrics")
    assert state.endpoint("http://a:1/run") is not state.endpoint("http://a:2/run")


# --- breaker and budget, pure -------------------------------------------------------------------

FAIL = Failed(Identity(1, 0), 0, "agent_request_failed", kind="connect")
RAN = Failed(Identity(1, 0), 0, "agent_run_error", kind="http_500")
LANDED = Landed(Identity(1, 0), 0, {"reward": 1.0})


def health(**settings: Any) -> EndpointHealth:
    """An endpoint's health under a policy with `settings`."""
    return EndpointHealth("http://a:1", RetryPolicy(**settings), RetryCounters())


def test_breaker_opens_after_consecutive_request_failures() -> None:
    """N consecutive agent_request_failed open it; any other answer resets the count."""
    h = health(breaker_failure_threshold=3)
    for outcome in (FAIL, FAIL, RAN, FAIL, FAIL):
        h.record(outcome, 1.0)
    assert (h.state, h.consecutive_failures) == (BreakerState.CLOSED, 2)
    h.record(FAIL, 2.0)
    assert (h.state, h.opened_at) == (BreakerState.OPEN, 2.0)
    assert h.admit(2.5) is Admission.REJECTED
    assert h.counters.breaker_rejections == 1


def test_breaker_half_open_probe_closes_or_reopens() -> None:
    """After breaker_open_s one probe goes; failure re-opens, success closes."""
    h = health(breaker_failure_threshold=1, breaker_open_s=10.0)
    h.record(FAIL, 0.0)
    assert h.admit(9.9) is Admission.REJECTED
    assert h.admit(10.0) is Admission.PROBE
    assert h.admit(10.0) is Admission.REJECTED  # one probe at a time
    h.record(FAIL, 11.0, probe=True)
    assert (h.state, h.opened_at) == (BreakerState.OPEN, 11.0)
    assert h.admit(21.0) is Admission.PROBE
    h.record(LANDED, 22.0, probe=True)
    assert h.state is BreakerState.CLOSED
    assert h.admit(22.0) is Admission.ALLOWED
    assert dict(h.counters.breaker_transitions) == {"open": 2, "half_open": 2, "closed": 1}


def test_breaker_abandoned_probe_frees_the_slot() -> None:
    """A probe cancelled before its answer lets the next request probe."""
    h = health(breaker_failure_threshold=1, breaker_open_s=1.0)
    h.record(FAIL, 0.0)
    assert h.admit(1.0) is Admission.PROBE
    h.abandon_probe()
    assert h.admit(1.0) is Admission.PROBE


def test_budget_is_a_count_refilled_by_good_answers() -> None:
    """Each retry takes a token; a spent budget refuses; ten good answers earn one back."""
    h = health(budget=2)
    assert [h.take_retry() for _ in range(3)] == [True, True, False]
    assert h.counters.budget_refusals == 1
    for _ in range(10):
        h.record(RAN, 0.0)
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
    assert counters.summary() == (
        "retries 3 (waited 4.5s) | breaker opened 1x, turned away 7 (let through 5) | timed out 2"
    )
    rows = dict(counters.rows())
    assert (rows["retries: http_429"], rows["breaker -> open"], rows["rollouts timed out"]) == (
        "3",
        "1",
        "2",
    )
    assert rows["breaker: let through by the probe"] == "5"


# --- dispatch: refusals and Retry-After ---------------------------------------------------------


async def test_dispatch_retry_after_schedule_is_exact(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """429/503 are re-sent after Retry-After plus seeded jitter, then land."""
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
    j = jitter(9, [0.5, 1.0, 2.0])
    expected = [0.0, 2.0 + j[0], 2.0 + j[0] + 1.0 + j[1], 3.0 + j[0] + j[1] + j[2]]
    assert transport.times == pytest.approx(expected, abs=1e-9)
    assert isinstance(outcome, Landed)
    assert outcome.elapsed_seconds == pytest.approx(expected[-1], abs=1e-9)
    assert [a for _, a in transport.sent] == [0, 0, 0, 0]  # refusals re-send the same attempt
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
        policy(retry_requests=True, backoff_base_s=1.0),
        rng=random.Random(2),
        new_attempt=new_attempt,
    )
    assert isinstance(outcome, Landed)
    assert outcome.attempt_index == 6
    assert [a for _, a in transport.sent] == [4, 5, 6]
    assert [(f.attempt_index, f.kind) for f in recorded] == [(4, "reset"), (5, "write")]
    j = jitter(2, [1.0, 2.0])
    assert transport.times == pytest.approx([0.0, j[0], j[0] + j[1]], abs=1e-9)


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


# --- the breaker through dispatch ---------------------------------------------------------------


async def test_dispatch_breaker_opens_probes_and_closes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Refused connects open the breaker; a rollout turned away waits, then is the probe."""
    state = RetryState(RetryPolicy(breaker_failure_threshold=3, breaker_open_s=20.0))
    transport = Script(refused(), refused(), refused(), default=reply(200))
    p = attrs.evolve(policy(), max_connect_retries=5, backoff_base_s=0.0)
    first = await dispatch(transport, URL, row(1), 0, p, rng=random.Random(1), retry_state=state)
    # The third refusal opened the breaker: no connect retry into an open breaker.
    assert isinstance(first, Failed)
    assert (first.kind, first.delivery, first.spends_attempt) == (
        "connect",
        Delivery.NOT_SENT,
        False,
    )
    assert (first.message or "").endswith(
        "(after 2 connect retries); the circuit breaker of http://agent:8000 opened"
    )
    assert (len(transport.sent), state.endpoint(URL).state) == (3, BreakerState.OPEN)
    await trio.sleep(19.0)
    waited = await dispatch(transport, URL, row(2), 0, p, rng=random.Random(1), retry_state=state)
    assert isinstance(waited, Landed)
    assert transport.times[-1] == 20.0  # it waited for the open period, then probed
    assert state.endpoint(URL).state is BreakerState.CLOSED
    assert dict(state.counters.breaker_transitions) == {"open": 1, "half_open": 1, "closed": 1}
    assert (state.counters.breaker_rejections, state.counters.breaker_waits) == (1, 1)
    assert state.open_breakers() == []


async def test_dispatch_breaker_opens_when_the_failing_request_ended(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The breaker's open period counts from the end of the request that opened it."""

    class SlowRefusal:
        async def post(self, url: str, body: bytes, **_: Any) -> RawResponse:
            await trio.sleep(4.0)
            raise refused()

    state = RetryState(RetryPolicy(breaker_failure_threshold=1, breaker_open_s=5.0))
    start = trio.current_time()
    p = attrs.evolve(policy(), max_connect_retries=0)
    failed = await dispatch(
        SlowRefusal(), URL, row(1), 0, p, rng=random.Random(1), retry_state=state
    )
    assert isinstance(failed, Failed)
    assert failed.elapsed_seconds == pytest.approx(4.0)
    health = state.endpoint(URL)
    assert (health.state, health.opened_at) == (BreakerState.OPEN, pytest.approx(start + 4.0))
    assert health.next_probe_at() == pytest.approx(start + 9.0)


async def test_dispatch_waiters_follow_the_probe(autojump_clock: trio.testing.MockClock) -> None:
    """Rollouts turned away while a probe is out send as soon as it closes the breaker."""
    state = RetryState(RetryPolicy(breaker_failure_threshold=1, breaker_open_s=5.0))
    transport = Script(reply(502), "slow", default=reply(200))
    p = policy(max_request_retries=0)
    await dispatch(transport, URL, row(0), 0, p, rng=random.Random(1), retry_state=state)
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
    assert transport.times == [0.0, 5.0, 6.0, 6.0]  # the probe at 5 s took 1 s; then the rest
    assert state.counters.breaker_waits >= 2


async def test_dispatch_turned_away_fails_when_its_probe_fails(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A waiter gives up when its probe fails and the budget has no token to wait longer."""
    state = RetryState(RetryPolicy(breaker_failure_threshold=1, breaker_open_s=5.0, budget=0))
    transport = Script(reply(502), reply(502), default=reply(200))
    p = policy(max_request_retries=0)
    await dispatch(transport, URL, row(0), 0, p, rng=random.Random(1), retry_state=state)
    outcomes: list[Landed | Failed] = []
    async with trio.open_nursery() as nursery:
        for task in (1, 2):

            async def one(task: int = task) -> None:
                rng = random.Random(task)
                outcomes.append(
                    await dispatch(transport, URL, row(task), 0, p, rng=rng, retry_state=state)
                )

            nursery.start_soon(one)
    assert transport.times == [0.0, 5.0]
    kinds = sorted(o.kind or "" for o in outcomes if isinstance(o, Failed))
    assert kinds == ["breaker_open", "http_502"]
    fast = next(o for o in outcomes if isinstance(o, Failed) and o.kind == "breaker_open")
    assert fast.delivery is Delivery.NOT_SENT
    assert "the probe that followed failed too" in (fast.message or "")
    assert state.endpoint(URL).state is BreakerState.OPEN


async def test_dispatch_waiters_outlast_a_failed_probe_within_the_budget(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """With a token left, a waiter waits for the next probe after a failed one, and lands."""
    state = RetryState(RetryPolicy(breaker_failure_threshold=1, breaker_open_s=5.0, budget=1))
    transport = Script(reply(502), reply(502), default=reply(200))
    p = policy(max_request_retries=0)
    await dispatch(transport, URL, row(0), 0, p, rng=random.Random(1), retry_state=state)
    probe = dispatch(transport, URL, row(1), 0, p, rng=random.Random(1), retry_state=state)
    waiter = dispatch(transport, URL, row(2), 0, p, rng=random.Random(2), retry_state=state)
    outcomes: list[Landed | Failed] = []
    async with trio.open_nursery() as nursery:
        for coro in (probe, waiter):
            nursery.start_soon(_append, outcomes, coro)
    assert transport.times == [0.0, 5.0, 10.0]
    assert [type(o).__name__ for o in outcomes] == ["Failed", "Landed"]


async def _append(out: list[Any], coro: Any) -> None:
    out.append(await coro)


async def test_dispatch_budget_bounds_requests_to_a_refusing_endpoint(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Many rollouts against a 429-forever endpoint send at most rollouts + budget requests."""
    state = RetryState(RetryPolicy(budget=5, max_request_retries=10, breaker_failure_threshold=99))
    transport = Script(default=reply(429, retry_after=1))
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

STEPS = st.sampled_from(["refused", "reset", 429, 503, 502, 500, 200])


def scripted_step(step: str | int) -> RawResponse | BaseException:
    """The transport behaviour a drawn step stands for."""
    if step == "refused":
        return refused()
    if step == "reset":
        return httpx.ReadError("reset")
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
    p = attrs.evolve(
        policy(max_request_retries=max_retries, budget=budget, breaker_failure_threshold=3),
        max_connect_retries=2,
    )
    state = RetryState(p.retry)

    async def main() -> list[tuple[Script, Landed | Failed]]:
        done = []
        for task, script in enumerate(scripts):
            transport = Script(*(scripted_step(s) for s in script), default=reply(200))
            rng = random.Random(seed + task)
            outcome = await dispatch(transport, URL, row(task), 0, p, rng=rng, retry_state=state)
            done.append((transport, outcome))
        return done

    results = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    for transport, outcome in results:
        assert len(transport.sent) <= 1 + p.max_connect_retries + max_retries
        if isinstance(outcome, Failed) and outcome.kind not in ("breaker_open", "connect"):
            assert outcome.kind == f"http_{outcome.http_status}" or outcome.kind == "reset"
    retries = sum(state.counters.retries.values())
    earned = sum(len(t.sent) for t, _ in results) // 10  # one token per ten good answers, at most
    assert retries <= budget + earned
    # Every request is sent (after waiting for the breaker's probe, if turned away), except
    # the one each breaker_open failure stands for.
    sends = sum(len(t.sent) for t, _ in results)
    fast = sum(1 for _, o in results if isinstance(o, Failed) and o.kind == "breaker_open")
    assert sends == len(scripts) + retries - fast


async def test_dispatch_cancelled_probe_lets_the_next_rollout_probe(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A half-open probe cancelled mid-request frees the slot: the next rollout probes."""
    state = RetryState.from_config(RunConfig(breaker_failure_threshold=1, breaker_open_s=5.0))
    transport = Script(reply(503), "hang", reply(200))
    p = policy(max_request_retries=0)
    await dispatch(transport, URL, row(1), 0, p, rng=random.Random(1), retry_state=state)
    await trio.sleep(5.0)
    with trio.move_on_after(1.0):
        await dispatch(transport, URL, row(2), 0, p, rng=random.Random(1), retry_state=state)
    assert state.endpoint(URL).state is BreakerState.HALF_OPEN
    outcome = await dispatch(transport, URL, row(3), 0, p, rng=random.Random(1), retry_state=state)
    assert isinstance(outcome, Landed)
    assert transport.times == [0.0, 5.0, 6.0]
    assert state.endpoint(URL).state is BreakerState.CLOSED
