"""Properties of the retry policy through the engine over random outage schedules (fake clock).

Each endpoint follows a schedule: segments of a state for some seconds, the last one for good.
A scripted transport answers every request by its endpoint's state at the instant it is sent:

- ``up``: 200 after `LATENCY`;
- ``refusing``: connection refused at once (not sent);
- ``hanging``: the connect times out after ``connect_timeout_s`` (not sent);
- ``stalled``: the request goes out and no reply comes: read timeout after ``read_timeout_s``
  (possibly delivered);
- ``429``/``503``: refused with ``Retry-After`` after `LATENCY`; ``429-`` without one.

The properties (collector/dispatch/retry.py's design note states them as promises):

1. every accepted rollout settles exactly once;
2. an outage shorter than the grace ends no rollout unsent (no ``endpoint_down``, no ``connect``);
3. an endpoint dead for good from ``t0`` has all its rollouts settled by ``t1 + WAIT + GRACE +
   REQUEST``, where ``t1`` is when a rollout first asked for it in the outage (``t0``, or the
   first dispatch after it): a bound that does not grow with their number (one, forty, ten
   thousand);
4. requests per rollout: ``1 + max_request_retries + probes it carried`` and
   ``max_connect_retries + 1`` for each outage it met;
5. no stretch longer than `WAIT` in which a rollout of an endpoint is in dispatch, the endpoint
   is up and no request to it is in flight.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any

import attrs
import httpx
import orjson
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import materialized_rows
from trollout.collector.dispatch.retry import BreakerState, RetryState
from trollout.collector.engine.collector import open_collector
from trollout.collector.engine.sink import ListSink
from trollout.collector.http.transport import RawResponse
from trollout.errors import RunStoppedError
from trollout.records import Failed, Landed, MaterializedRow
from trollout.settings import RunConfig

GRACE = 20.0
OPEN_MAX = 4.0  # breaker_open_s
BACKOFF_MAX = 4.0  # retry_backoff_max_s: the longest own backoff and Retry-After honoured
CONNECT_TIMEOUT = 3.0
READ_TIMEOUT = 5.0
LATENCY = 0.5
RETRY_AFTER = 2.0
REQUEST = max(CONNECT_TIMEOUT, READ_TIMEOUT, LATENCY)  # the longest one request takes
# The longest any wait lasts: an own backoff, an open period, a Retry-After with its jitter.
WAIT = max(BACKOFF_MAX, OPEN_MAX, RETRY_AFTER + min(0.1 * RETRY_AFTER, 1.0))
SILENT = frozenset({"refusing", "hanging", "stalled"})  # no answer at all
STATES = ["up", "refusing", "hanging", "stalled", "429", "429-", "503"]
AGENTS = ("a", "b")

CONFIG = RunConfig(
    connect_timeout_s=CONNECT_TIMEOUT,
    read_timeout_s=READ_TIMEOUT,
    dispatch_connect_grace_s=GRACE,
    breaker_open_s=OPEN_MAX,
    breaker_failure_threshold=3,
    max_connect_retries=2,
    max_request_retries=3,
    retry_backoff_base_s=0.5,
    retry_backoff_max_s=BACKOFF_MAX,
    retry_budget_per_endpoint=10_000,
    on_endpoint_outage="fail",
)
URLS = {agent: f"http://{agent}.test:80" for agent in AGENTS}


class Schedule:
    """One endpoint's states over time: ``[(state, seconds), ...]``, the last one for good."""

    def __init__(self, segments: list[tuple[str, float]]) -> None:
        self.segments = segments
        self.starts: list[float] = []
        t = 0.0
        for _, seconds in segments:
            self.starts.append(t)
            t += seconds

    def at(self, t: float) -> str:
        """The state at virtual time `t`."""
        state = self.segments[0][0]
        for start, (name, _) in zip(self.starts, self.segments, strict=True):
            if t >= start:
                state = name
        return state

    def stretches(self) -> list[tuple[float, float]]:
        """The maximal silent stretches ``(start, end)``; the end is inf for the last one."""
        out: list[tuple[float, float]] = []
        for i, (name, seconds) in enumerate(self.segments):
            last = i == len(self.segments) - 1
            end = math.inf if last else self.starts[i] + seconds
            if name not in SILENT:
                continue
            if out and out[-1][1] == self.starts[i]:
                out[-1] = (out[-1][0], end)
            else:
                out.append((self.starts[i], end))
        return out

    def changes(self) -> list[float]:
        return list(self.starts)


class Recorder:
    """The transport and the observer of one run: what was sent when, and who carried probes."""

    def __init__(self, schedules: dict[str, Schedule]) -> None:
        self.schedules = schedules
        self.state: RetryState | None = None
        self.sends: Counter[tuple[int, int]] = Counter()
        self.probes: Counter[tuple[int, int]] = Counter()
        self.requests: dict[str, list[tuple[float, float]]] = defaultdict(list)  # start, end
        self.dispatching: dict[str, list[tuple[float, float]]] = defaultdict(list)
        self._open: dict[Any, tuple[str, float]] = {}

    # --- the transport ---------------------------------------------------------------------

    async def post(self, url: str, body: bytes, *, headers: bytes = b"") -> RawResponse:
        agent = url.split("//")[1].split(".")[0]
        request = orjson.loads(body)
        key = (request["_ng_task_index"], request["_ng_rollout_index"])
        self.sends[key] += 1
        assert self.state is not None
        health = self.state.endpoint(url)
        if health.state is BreakerState.HALF_OPEN and health.probing:
            self.probes[key] += 1  # admitted as the probe, with no checkpoint since
        start = trio.current_time()
        try:
            return await self._answer(self.schedules[agent].at(start))
        finally:
            self.requests[agent].append((start, trio.current_time()))

    async def _answer(self, state: str) -> RawResponse:
        if state == "refusing":
            await trio.lowlevel.checkpoint()
            raise httpx.ConnectError("Connection refused")
        if state == "hanging":
            await trio.sleep(CONNECT_TIMEOUT)
            raise httpx.ConnectTimeout("connect timed out")
        if state == "stalled":
            await trio.sleep(READ_TIMEOUT)
            raise httpx.ReadTimeout("read timed out")
        await trio.sleep(LATENCY)
        if state == "up":
            return RawResponse(200, [], b'{"reward": 1.0}')
        status = 503 if state == "503" else 429
        headers = [] if state == "429-" else [(b"retry-after", b"%g" % RETRY_AFTER)]
        return RawResponse(status, headers, b'"not now"')

    async def aclose(self) -> None:
        pass

    # --- the observer ----------------------------------------------------------------------

    def attempt_started(self, row: MaterializedRow, attempt: int, url: str) -> Any:
        trace = _Trace()
        self._open[trace] = (url.split("//")[1].split(".")[0], trio.current_time())
        return trace

    def retry_wait(self, trace: Any, reason: str, delay_s: float) -> None:
        pass

    def attempt_ended(self, trace: Any, outcome: Landed | Failed | None, retries: int) -> None:
        agent, start = self._open.pop(trace)
        self.dispatching[agent].append((start, trio.current_time()))

    def outcome_settled(self, outcome: Any, final: bool) -> None:
        pass


class _Trace:
    headers = b""


def rows_for(n_a: int, n_b: int) -> list[MaterializedRow]:
    return materialized_rows(n_a, agent="a") + materialized_rows(n_b, agent="b", first_task=n_a)


async def run(
    schedules: dict[str, Schedule], rows: list[MaterializedRow], concurrency: int
) -> tuple[Recorder, ListSink, dict[tuple[int, int], float]]:
    """Collect `rows` against the schedules; return the recorder, the sink and settle times."""
    recorder = Recorder(schedules)
    sink = ListSink()
    settled: dict[tuple[int, int], float] = {}
    original = sink.write

    async def write(outcomes: Any) -> None:
        for outcome in outcomes:
            settled[outcome.identity.key] = trio.current_time()
        await original(outcomes)

    sink.write = write  # type: ignore[method-assign]
    config = attrs.evolve(CONFIG, num_samples_in_parallel=concurrency)
    async with open_collector(
        config=config, urls=URLS, sink=sink, transport=recorder, seed=7, observer=recorder
    ) as collector:
        recorder.state = collector.retry_state
        await collector.collect(rows)
    return recorder, sink, settled


segment = st.tuples(st.sampled_from(STATES), st.floats(0.5, 30.0))
schedule = st.lists(segment, min_size=1, max_size=6).map(Schedule)


@settings(deadline=None, max_examples=300)
@given(
    a=schedule,
    b=schedule,
    n_a=st.integers(0, 24),
    n_b=st.integers(0, 24),
    concurrency=st.integers(1, 12),
)
def test_outage_schedules_keep_every_promise(
    a: Schedule, b: Schedule, n_a: int, n_b: int, concurrency: int
) -> None:
    """The five properties of the module docstring, over random schedules of two endpoints."""
    schedules = {"a": a, "b": b}
    rows = rows_for(n_a, n_b)
    recorder, sink, settled = trio.run(
        run, schedules, rows, concurrency, clock=trio.testing.MockClock(autojump_threshold=0)
    )
    # 1. Exactly once.
    keys = Counter(o.identity.key for o in sink.outcomes)
    assert keys == Counter(row.identity.key for row in rows)
    by_agent = {row.identity.key: row.identity.agent_name or "" for row in rows}
    for agent, sched in schedules.items():
        mine = [o for o in sink.outcomes if by_agent[o.identity.key] == agent]
        stretches = sched.stretches()
        # 2. Outages shorter than the grace (with room for the last probe and request) end no
        # rollout unsent.
        finite = [end - start for start, end in stretches]
        if all(length < GRACE - WAIT - REQUEST for length in finite):
            unsent = [o.kind for o in mine if isinstance(o, Failed) and not o.spends_attempt]
            assert unsent == [], (agent, unsent)
        # 3. Dead for good from t0: all settled by t0 + WAIT + GRACE + REQUEST.
        if stretches and stretches[-1][1] == math.inf and mine:
            t0 = stretches[-1][0]
            spans = recorder.dispatching[agent]
            asked = [max(start, t0) for start, end in spans if end >= t0]
            bound = min(asked, default=t0) + WAIT + GRACE + REQUEST + 1e-6
            late = [settled[o.identity.key] for o in mine if settled[o.identity.key] > bound]
            assert late == [], (agent, t0, late)
        # 4. Requests per rollout.
        for o in mine:
            key = o.identity.key
            outages = len(stretches)
            limit = 1 + CONFIG.max_request_retries + recorder.probes[key]
            limit += (CONFIG.max_connect_retries + 1) * max(outages, 1)
            assert recorder.sends[key] <= limit, (key, recorder.sends[key], limit)
        # 5. No idle stretch longer than WAIT while a rollout of this endpoint is in dispatch.
        assert longest_idle(recorder, agent, sched) <= WAIT + 1e-6


def longest_idle(recorder: Recorder, agent: str, sched: Schedule) -> float:
    """The longest stretch with the endpoint up, a rollout in dispatch, no request in flight."""
    points = sorted(
        {0.0}
        | set(sched.changes())
        | {t for span in recorder.requests[agent] for t in span}
        | {t for span in recorder.dispatching[agent] for t in span}
    )
    longest, began = 0.0, None
    for t, nxt in zip(points, [*points[1:], math.inf], strict=True):
        if nxt == math.inf:
            break
        mid = (t + nxt) / 2
        idle = (
            sched.at(mid) == "up"
            and any(s <= mid < e for s, e in recorder.dispatching[agent])
            and not any(s <= mid < e for s, e in recorder.requests[agent])
        )
        if idle:
            began = t if began is None else began
            longest = max(longest, nxt - began)
        else:
            began = None
    return longest


@pytest.mark.parametrize("rollouts", [1, 40, 10_000])
async def test_a_dead_endpoint_ends_its_rollouts_at_the_grace_whatever_their_number(
    rollouts: int, autojump_clock: trio.testing.MockClock
) -> None:
    """Refusing from the start, in fail mode: every rollout ends endpoint_down, unsent, by the
    grace, however many there are (at 64 in flight, the later ones end as they start)."""
    recorder = Recorder({"a": Schedule([("refusing", 1.0)])})
    sink = ListSink()
    async with open_collector(
        config=attrs.evolve(CONFIG, num_samples_in_parallel=64),
        urls=URLS,
        sink=sink,
        transport=recorder,
        seed=3,
    ) as collector:
        recorder.state = collector.retry_state
        await collector.collect(materialized_rows(rollouts, agent="a"))
    assert trio.current_time() <= GRACE + 1e-6
    assert len(sink.outcomes) == rollouts
    kinds = Counter((o.kind, o.spends_attempt) for o in sink.outcomes if isinstance(o, Failed))
    assert set(kinds) <= {("endpoint_down", False), ("connect", False)}
    assert kinds[("endpoint_down", False)] >= rollouts - 64
    assert sum(recorder.sends.values()) <= 64 * (1 + CONFIG.max_connect_retries) + GRACE / 0.5


async def test_a_dead_endpoint_stops_the_run_in_one_line_at_the_grace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The default (on_endpoint_outage=stop): the first rollout ended by the outage stops the
    run at the grace, naming the agent, its endpoint and how long it gave no answer."""
    recorder = Recorder(
        {"a": Schedule([("up", 3.0), ("refusing", 1.0)]), "b": Schedule([("up", 1.0)])}
    )
    sink = ListSink()
    config = attrs.evolve(CONFIG, num_samples_in_parallel=8, on_endpoint_outage="stop")

    async def collect() -> None:
        async with open_collector(
            config=config, urls=URLS, sink=sink, transport=recorder, seed=3
        ) as collector:
            recorder.state = collector.retry_state
            await collector.collect(materialized_rows(400, agent="a"))

    with pytest.raises(RunStoppedError) as info:
        await collect()
    stopped_at = trio.current_time()
    assert 3.0 + GRACE <= stopped_at <= 3.0 + WAIT + GRACE + REQUEST
    message = str(info.value)
    assert message.startswith("'a' is down: http://a.test:80 gave no answer for ")
    assert "dispatch_connect_grace_s=20" in message
    assert "bring it back, then resume" in message
    assert "\n" not in message
    landed = sum(isinstance(o, Landed) for o in sink.outcomes)
    assert 0 < landed < 400  # the rollouts of the first 3 s landed; the rest resume later
