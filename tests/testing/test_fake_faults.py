"""Every scripted fault kind of the fake deployment, over loopback, and how faults are chosen."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import httpx
import orjson
import pytest
import trio
import trio.testing

from builders import wait_until
from trollout.errors import ConfigError
from trollout.testing import (
    AgentSpec,
    DeploymentSpec,
    FakeDeployment,
    Fault,
    FaultContext,
    FaultKind,
    FaultPlan,
    Latency,
    fault_from_dict,
    open_fake_deployment,
    plan_from_dict,
    task_row,
)


def _row(fault: dict[str, Any] | None = None, **identity: int) -> dict[str, Any]:
    row = task_row("What is 2 + 3?") | {
        "_ng_task_index": identity.get("task", 0),
        "_ng_rollout_index": identity.get("rollout", 0),
    }
    if identity.get("attempt"):
        row["_ng_attempt_index"] = identity["attempt"]
    if fault is not None:
        row["fake_fault"] = fault
    return row


@pytest.fixture
async def one() -> AsyncIterator[FakeDeployment]:
    """Serve a one-agent deployment with no latency and no planned faults."""
    async with open_fake_deployment(DeploymentSpec(agents=("a",))) as fake:
        yield fake


def _url(fake: FakeDeployment) -> str:
    return f"{fake.run_urls['a']}/run"


async def _raw_exchange(
    fake: FakeDeployment, row: dict[str, Any]
) -> tuple[bytes, BaseException | None]:
    """Send one request on a raw socket; return the bytes received and the error that ended it."""
    body = orjson.dumps(row)
    head = b"POST /run HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % len(body)
    received = b""
    with trio.socket.socket() as sock:
        await sock.connect(("127.0.0.1", fake.urls.ports["a_environment_server"]))
        await sock.send(head + body)
        try:
            while data := await sock.recv(65536):
                received += data
        except OSError as exc:
            return received, exc
    return received, None


async def test_fault_latency_adds_its_delay(
    one: FakeDeployment, client: httpx.AsyncClient, autojump_clock: trio.testing.MockClock
) -> None:
    """A latency fault answers normally after exactly its delay."""
    start = trio.current_time()
    reply = await client.post(_url(one), json=_row({"kind": "latency", "delay_s": 7.5}))
    assert trio.current_time() - start == 7.5
    assert reply.status_code == 200
    assert "reward" in reply.json()


async def test_deployment_latency_is_fixed_plus_hashed_jitter(
    client: httpx.AsyncClient, autojump_clock: trio.testing.MockClock
) -> None:
    """Each /run takes the spec's latency for its (task, rollout, attempt)."""
    latency = Latency(fixed_s=2.0, jitter_s=1.0, seed=4)
    async with open_fake_deployment(DeploymentSpec(agents=("a",), latency=latency)) as fake:
        for task in range(3):
            start = trio.current_time()
            await client.post(_url(fake), json=_row(task=task))
            assert trio.current_time() - start == pytest.approx(latency.delay_for(task, 0, 0))
            assert 2.0 <= latency.delay_for(task, 0, 0) < 3.0


async def test_fault_status_sends_body_and_retry_after(
    one: FakeDeployment, client: httpx.AsyncClient
) -> None:
    """A status fault answers that status, a JSON-string body and Retry-After."""
    fault = {"kind": "status", "status": 503, "retry_after": 1, "body": "overloaded"}
    reply = await client.post(_url(one), json=_row(fault))
    assert reply.status_code == 503
    assert reply.headers["retry-after"] == "1"
    assert reply.json() == "overloaded"


async def test_fault_status_without_retry_after_has_no_header(
    one: FakeDeployment, client: httpx.AsyncClient
) -> None:
    """Retry-After is sent only when the fault sets it; fractional values stay fractional."""
    plain = await client.post(_url(one), json=_row({"kind": "status", "status": 500}))
    fractional = await client.post(
        _url(one), json=_row({"kind": "status", "status": 429, "retry_after": 2.5})
    )
    assert "retry-after" not in plain.headers
    assert plain.json() == "fake HTTP 500"
    assert fractional.headers["retry-after"] == "2.5"


async def test_fault_reset_mid_request_sends_nothing(one: FakeDeployment) -> None:
    """The connection is reset before a single reply byte."""
    received, error = await _raw_exchange(one, _row({"kind": "reset_mid_request"}))
    assert received == b""
    assert isinstance(error, ConnectionResetError)


async def test_fault_disconnect_closes_without_a_reply(one: FakeDeployment) -> None:
    """The connection is closed cleanly before a single reply byte."""
    assert await _raw_exchange(one, _row({"kind": "disconnect"})) == (b"", None)


async def test_fault_reset_mid_response_cuts_the_body(one: FakeDeployment) -> None:
    """The head and part of the body arrive, then a reset."""
    received, error = await _raw_exchange(one, _row({"kind": "reset_mid_response"}))
    head, _, body = received.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert 0 < len(body) < length
    assert isinstance(error, ConnectionResetError)


async def test_fault_reset_surfaces_in_httpx_as_a_transport_error(
    one: FakeDeployment, client: httpx.AsyncClient
) -> None:
    """An httpx client sees a reset as a transport error, not a reply."""
    with pytest.raises(httpx.TransportError):
        await client.post(_url(one), json=_row({"kind": "reset_mid_request"}))


async def test_fault_hang_holds_until_the_client_leaves(
    one: FakeDeployment, client: httpx.AsyncClient, autojump_clock: trio.testing.MockClock
) -> None:
    """A hung /run never answers and counts as in flight until the client disconnects."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(client.post, _url(one), json=_row({"kind": "hang"})))
        await wait_until(lambda: one.stats.in_flight == 1, "the request", poll_s=0)
        await trio.sleep(3600)
        assert one.stats.in_flight == 1
        nursery.cancel_scope.cancel()
    await trio.testing.wait_all_tasks_blocked()
    assert one.stats.in_flight == 0
    assert one.stats.by_status == {}
    assert one.stats.by_fault == {"hang": 1}


async def test_fault_not_json_is_a_200_that_does_not_parse(
    one: FakeDeployment, client: httpx.AsyncClient
) -> None:
    """A not_json fault answers 200 with a body that is not JSON."""
    reply = await client.post(_url(one), json=_row({"kind": "not_json"}))
    assert reply.status_code == 200
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(reply.content)


async def test_fault_not_object_is_json_but_not_an_object(
    one: FakeDeployment, client: httpx.AsyncClient
) -> None:
    """A not_object fault answers 200 with a JSON list."""
    reply = await client.post(_url(one), json=_row({"kind": "not_object"}))
    assert reply.status_code == 200
    assert isinstance(reply.json(), list)


async def test_fault_oversized_sends_a_one_megabyte_error(
    one: FakeDeployment, client: httpx.AsyncClient
) -> None:
    """An oversized fault answers 500 with a 1 MB JSON-string body by default."""
    reply = await client.post(_url(one), json=_row({"kind": "oversized"}))
    assert reply.status_code == 500
    assert len(reply.content) == 1024 * 1024
    assert isinstance(reply.json(), str)


@pytest.mark.parametrize("terminal", [False, True])
async def test_fault_failure_class_sentinel_in_a_200(
    one: FakeDeployment, client: httpx.AsyncClient, terminal: bool
) -> None:
    """A failure_class fault carries _ng_failure_class, and _ng_failure_terminal when terminal."""
    fault = {"kind": "failure_class", "failure_class": "timeout_exceeded", "terminal": terminal}
    body = (await client.post(_url(one), json=_row(fault))).json()
    assert body["_ng_failure_class"] == "timeout_exceeded"
    assert ("_ng_failure_terminal" in body) is terminal
    assert body.get("_ng_failure_terminal", True) is True
    assert "reward" not in body


async def test_fault_no_persist_sentinel_in_a_200(
    one: FakeDeployment, client: httpx.AsyncClient
) -> None:
    """A no_persist fault answers 200 with _ng_no_persist: true and no reward."""
    body = (await client.post(_url(one), json=_row({"kind": "no_persist"}))).json()
    assert body["_ng_no_persist"] is True
    assert "reward" not in body
    assert "_ng_failure_class" not in body


async def test_fault_judge_failed_scores_zero_with_its_class(
    one: FakeDeployment, client: httpx.AsyncClient
) -> None:
    """judge_failed carries reward 0.0, its class and the judge's error, like NeMo Gym's."""
    body = (await client.post(_url(one), json=_row({"kind": "judge_failed"}))).json()
    assert body["reward"] == 0.0
    assert body["_ng_failure_class"] == "judge_failed"
    assert body["_ng_failure_judge_error"] == "fake judge_failed"
    assert (body["mask_sample"], body["failure_kind"]) == (True, "judge_failed")


async def test_fault_masked_is_a_success_with_mask_sample(
    one: FakeDeployment, client: httpx.AsyncClient
) -> None:
    """A masked sample is a plain success whose reward is not a measurement."""
    body = (await client.post(_url(one), json=_row({"kind": "masked"}))).json()
    assert (body["mask_sample"], body["failure_kind"], body["reward"]) == (
        True,
        "session_lost",
        0.0,
    )
    assert not any(k.startswith("_ng_") for k in body)


async def test_row_fault_limited_to_attempts(
    one: FakeDeployment, client: httpx.AsyncClient
) -> None:
    """A row's fake_fault with attempts applies only to those attempts."""
    fault = {"kind": "status", "status": 502, "attempts": [0, 2]}
    statuses = []
    for attempt in range(3):
        reply = await client.post(_url(one), json=_row(fault, attempt=attempt))
        statuses.append(reply.status_code)
    assert statuses == [502, 200, 502]
    assert one.stats.by_fault == {"status": 2}


async def test_bad_row_fault_is_a_500_naming_the_field(
    one: FakeDeployment, client: httpx.AsyncClient
) -> None:
    """A malformed fake_fault makes the server fail loudly, naming the field."""
    reply = await client.post(_url(one), json=_row({"kind": "explode"}))
    assert reply.status_code == 500
    assert "unknown fault kind 'explode'" in reply.json()


async def test_fault_callable_sees_the_request_and_ranks_after_the_row(
    client: httpx.AsyncClient,
) -> None:
    """The callable gets the identity and row; a row override wins over it."""
    seen: list[FaultContext] = []

    def fn(context: FaultContext) -> Fault | None:
        seen.append(context)
        return Fault(kind="status", status=418) if context.rollout_index == 1 else None

    async with open_fake_deployment(DeploymentSpec(agents=("a",)), fault_fn=fn) as fake:
        plain = await client.post(_url(fake), json=_row(task=5, rollout=0))
        scripted = await client.post(_url(fake), json=_row(task=5, rollout=1, attempt=2))
        overridden = await client.post(_url(fake), json=_row({"kind": "not_object"}, rollout=1))
    assert [r.status_code for r in (plain, scripted)] == [200, 418]
    assert isinstance(overridden.json(), list)
    assert [(c.task_index, c.rollout_index, c.attempt_index) for c in seen] == [
        (5, 0, 0),
        (5, 1, 2),
    ]
    assert seen[0].server == "a_environment_server"
    assert seen[0].agent == "a"


def _mix() -> tuple[tuple[Fault, float], ...]:
    return (
        (Fault(kind="status", status=503), 3.0),
        (Fault(kind="no_persist"), 1.0),
    )


def test_fault_plan_is_a_pure_function_of_the_key() -> None:
    """Two plans with one seed agree on every key; another seed differs somewhere."""
    plan = FaultPlan(seed=3, rate=0.3, mix=_mix())
    keys = [(t, r, a) for t in range(50) for r in range(4) for a in range(2)]
    same = FaultPlan(seed=3, rate=0.3, mix=_mix())
    other = FaultPlan(seed=4, rate=0.3, mix=_mix())
    assert [plan.fault_for(*k) for k in keys] == [same.fault_for(*k) for k in keys]
    assert [plan.fault_for(*k) for k in keys] != [other.fault_for(*k) for k in keys]


def test_fault_plan_rate_and_mix_are_respected() -> None:
    """About rate of the keys get a fault, split by the weights."""
    plan = FaultPlan(seed=1, rate=0.2, mix=_mix())
    faults = [plan.fault_for(t, r, 0) for t in range(1000) for r in range(5)]
    kinds = Counter(f.kind for f in faults if f is not None)
    assert 900 <= sum(kinds.values()) <= 1100
    assert 2.4 <= kinds[FaultKind.STATUS] / kinds[FaultKind.NO_PERSIST] <= 3.6


def test_fault_plan_max_attempt_spares_later_attempts() -> None:
    """Attempts beyond max_attempt never get a fault."""
    plan = FaultPlan(seed=1, rate=1.0, mix=_mix(), max_attempt=0)
    assert plan.fault_for(0, 0, 0) is not None
    assert plan.fault_for(0, 0, 1) is None


async def test_fault_plan_decides_what_the_server_does(client: httpx.AsyncClient) -> None:
    """The faults the fake applied are exactly those the plan computes for each key."""
    plan = FaultPlan(seed=9, rate=0.5, mix=((Fault(kind="status", status=503), 1.0),))
    async with open_fake_deployment(DeploymentSpec(agents=("a",), faults=plan)) as fake:
        statuses = {}
        for task in range(20):
            reply = await client.post(_url(fake), json=_row(task=task, rollout=task % 3))
            statuses[task] = reply.status_code
    expected = {t: 200 if plan.fault_for(t, t % 3, 0) is None else 503 for t in range(20)}
    assert statuses == expected
    assert 0 < list(expected.values()).count(503) < 20


async def test_agent_fault_plan_overrides_the_deployment_plan(client: httpx.AsyncClient) -> None:
    """An agent's own plan replaces the deployment-wide one for that agent."""
    always = FaultPlan(rate=1.0, mix=((Fault(kind="status", status=503), 1.0),))
    spec = DeploymentSpec(
        agents=(AgentSpec(name="a", faults=FaultPlan()), AgentSpec(name="b")), faults=always
    )
    async with open_fake_deployment(spec) as fake:
        a = await client.post(f"{fake.run_urls['a']}/run", json=_row())
        b = await client.post(f"{fake.run_urls['b']}/run", json=_row())
    assert (a.status_code, b.status_code) == (200, 503)


async def test_set_fault_plan_changes_faults_while_serving(
    one: FakeDeployment, client: httpx.AsyncClient
) -> None:
    """A test can switch faults on between phases."""
    before = await client.post(_url(one), json=_row())
    one.set_fault_plan(FaultPlan(rate=1.0, mix=((Fault(kind="status", status=504), 1.0),)))
    after = await client.post(_url(one), json=_row())
    assert (before.status_code, after.status_code) == (200, 504)


def test_fault_from_dict_refuses_unknown_keys() -> None:
    """A typo in a fault mapping is refused with the known keys listed."""
    with pytest.raises(ConfigError, match="unknown keys \\['stauts'\\]"):
        fault_from_dict({"kind": "status", "stauts": 503})


def test_fault_from_dict_needs_a_kind() -> None:
    """A fault mapping without a kind is refused."""
    with pytest.raises(ConfigError, match="'kind'"):
        fault_from_dict({"status": 503})


def test_plan_from_dict_reads_weights() -> None:
    """Weights sit beside the fault's keys in a mix entry."""
    plan = plan_from_dict(
        {"seed": 2, "rate": 0.1, "mix": [{"kind": "hang", "weight": 2}, {"kind": "not_json"}]}
    )
    assert plan.mix == ((Fault(kind="hang"), 2.0), (Fault(kind="not_json"), 1.0))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"rate": 1.5, "mix": [{"kind": "hang"}]}, "rate must be in"),
        ({"rate": 0.5}, "needs a mix"),
        ({"rate": 0.5, "mix": [{"kind": "hang", "weight": 0}]}, "weights must be > 0"),
        ({"rate": 0.5, "mix": "hang"}, "must be a list"),
    ],
)
def test_plan_from_dict_refuses_bad_plans(data: dict[str, Any], message: str) -> None:
    """Impossible plans are refused with a remedy."""
    with pytest.raises(ConfigError, match=message):
        plan_from_dict(data)
