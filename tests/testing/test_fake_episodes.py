"""The fake's episode environment servers: requests they accept, replies, misbehaving modes."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
import yaml

from trollout.errors import ConfigError
from trollout.testing import (
    AgentSpec,
    DeploymentSpec,
    EpisodeServerSpec,
    FakeDeployment,
    Fault,
    FaultContext,
    FaultPlan,
    Generation,
    episode_task_rows,
    open_fake_deployment,
    spec_from_dict,
    spec_to_dict,
)
from trollout.testing.faults import EPISODE_VARIANTS, FaultKind
from trollout.testing.policy import answer_task

EPISODE = EpisodeServerSpec(name="puzzle_env", tasksets=("puzzles", "more"), agent="math_agent")
SPEC = DeploymentSpec(
    agents=(AgentSpec(name="math_agent"),), generation=Generation.LEGACY, episode_servers=(EPISODE,)
)
TASK = {"taskset": "puzzles", "task_id": "p-1"}


def request(attempt: int = 0, rollout_id: str = "3-1", **task_input: Any) -> dict[str, Any]:
    """An episode request for TASK."""
    return {
        "episode_id": {"rollout_id": rollout_id, "attempt": attempt},
        "task": {"task_id": TASK, "task_input": {"prompt": "What is 2 + 3?", **task_input}},
    }


async def post(fake: FakeDeployment, body: object) -> httpx.Response:
    """POST `body` to the episode server's /run."""
    url = f"http://127.0.0.1:{fake.urls.ports['puzzle_env']}/run"
    async with httpx.AsyncClient(timeout=None) as client:
        return await client.post(url, content=orjson.dumps(body))


async def test_episode_server_answers_with_the_echo_and_a_result() -> None:
    """A valid request gets {episode_id, task_id, result}; the result is the policy's answer."""
    async with open_fake_deployment(SPEC) as fake:
        reply = await post(fake, request(2))
        seen = fake.stats.runs
    assert reply.status_code == 200
    data = reply.json()
    assert set(data) == {"episode_id", "task_id", "result"}
    assert data["episode_id"] == {"rollout_id": "3-1", "attempt": 2}
    assert data["task_id"] == TASK
    expected = answer_task(
        {"prompt": "What is 2 + 3?"}, server="puzzle_env", accuracy=0.7, policy_seed=0, seed=1
    )
    assert data["result"] == expected
    assert {"response", "reward", "reward_components", "terminated"} <= set(data["result"])
    assert [(s.server, s.agent, s.key) for s in seen] == [("puzzle_env", "math_agent", (3, 1, 2))]


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({**request(), "extra": 1}, ["body", "extra"]),
        ({"episode_id": request()["episode_id"]}, ["body", "task"]),
        ({**request(), "episode_id": {"rollout_id": "3-1"}}, ["body", "episode_id", "attempt"]),
        ({**request(), "episode_id": {"rollout_id": "3-1", "attempt": -1}},
         ["body", "episode_id", "attempt"]),
        ({**request(), "episode_id": {"rollout_id": "3-1", "attempt": True}},
         ["body", "episode_id", "attempt"]),
        (request(rollout_id="3-1-a2"), ["body", "episode_id", "rollout_id"]),
        (request(rollout_id="-x"), ["body", "episode_id", "rollout_id"]),
        ({**request(), "task": {"task_id": {"taskset": "", "task_id": "x"}, "task_input": {}}},
         ["body", "task", "task_id", "taskset"]),
        ({**request(), "task": {"task_id": TASK, "task_input": {}, "_ng_task_index": 1}},
         ["body", "task", "_ng_task_index"]),
        ({"responses_create_params": {"input": []}}, ["body", "episode_id"]),
    ],
)  # fmt: skip
async def test_episode_server_refuses_malformed_requests_with_422(
    body: dict[str, Any], loc: list[str]
) -> None:
    """Episode models are closed: extra keys, missing fields and bad ids get FastAPI's 422."""
    async with open_fake_deployment(SPEC) as fake:
        reply = await post(fake, body)
    assert reply.status_code == 422
    assert reply.json()["detail"][0]["loc"] == loc


async def test_episode_server_explicit_rollout_id_hashes_to_a_task() -> None:
    """An explicit id keys faults by a hashed task number, rollout 0, and the attempt."""
    async with open_fake_deployment(SPEC) as fake:
        await post(fake, request(1, rollout_id="my-id"))
        await post(fake, request(1, rollout_id="my-id"))
        keys = [s.key for s in fake.stats.runs]
    assert keys[0] == keys[1]
    assert keys[0][1:] == (0, 1)


async def replies_under(*faults: dict[str, Any]) -> list[httpx.Response]:
    """POST one request per fault mapping, each carried as task_input.fake_fault."""
    async with open_fake_deployment(SPEC) as fake:
        return [await post(fake, request(fake_fault=fault)) for fault in faults]


async def test_episode_failure_fault_answers_a_failure() -> None:
    """episode_failure: reason, terminal, failure_kind, stage and a partial response."""
    fault = {"kind": "episode_failure", "body": "gone", "failure_class": "sandbox_lost",
             "terminal": True, "stage": "tool", "partial": True}  # fmt: skip
    (reply,) = await replies_under(fault)
    data = reply.json()
    assert set(data) == {"episode_id", "task_id", "failure"}
    failure = data["failure"]
    assert failure["failure_reason"] == "gone"
    assert (failure["terminal"], failure["failure_kind"], failure["stage"]) == (
        True,
        "sandbox_lost",
        "tool",
    )
    assert "output" in failure["partial_response"]
    (plain,) = await replies_under({"kind": "episode_failure"})
    assert plain.json()["failure"] == {"failure_reason": "fake episode failure", "terminal": False}


async def test_episode_shape_variants_answer_other_shapes() -> None:
    """Each episode_shape variant answers a reply that is not an episode reply."""
    variants = EPISODE_VARIANTS[FaultKind.EPISODE_SHAPE]
    replies = await replies_under(*({"kind": "episode_shape", "variant": v} for v in variants))
    shapes = dict(zip(variants, (r.json() for r in replies), strict=True))
    assert all(r.status_code == 200 for r in replies)
    assert isinstance(shapes["array"], list)
    assert shapes["string"] == "episode done"
    assert shapes["null"] is None
    assert "responses_create_params" in shapes["flat"]
    assert "episode_id" not in shapes["flat"]
    assert "episode_id" not in shapes["no_episode_id"]
    assert "task_id" not in shapes["no_task_id"]
    assert not {"result", "failure"} & set(shapes["neither"])
    assert {"result", "failure"} <= set(shapes["both"])
    assert isinstance(shapes["result_not_object"]["result"], list)
    assert isinstance(shapes["failure_not_object"]["failure"], str)
    assert shapes["bad_terminal"]["failure"]["terminal"] == "yes"
    assert "failure_reason" not in shapes["no_reason"]["failure"]


async def test_episode_collector_keys_and_identity_variants() -> None:
    """Collector keys land in the result; identity variants change exactly one echoed field."""
    keys = EPISODE_VARIANTS[FaultKind.EPISODE_COLLECTOR_KEYS]
    idents = EPISODE_VARIANTS[FaultKind.EPISODE_IDENTITY]
    replies = await replies_under(
        *({"kind": "episode_collector_keys", "variant": v} for v in keys),
        *({"kind": "episode_identity", "variant": v} for v in idents),
    )
    results = [r.json()["result"] for r in replies[: len(keys)]]
    assert [
        sorted(set(r) - {"response", "reward", "reward_components", "terminated"}) for r in results
    ] == [
        ["_ng_reward_override"],
        ["ng_perf"],
        ["ng_model_call_capture"],
    ]
    echoed = {v: r.json() for v, r in zip(idents, replies[len(keys) :], strict=True)}
    assert echoed["attempt"]["episode_id"]["attempt"] == 1
    assert echoed["attempt_bool"]["episode_id"]["attempt"] is False
    assert echoed["rollout_id"]["episode_id"]["rollout_id"] == "3-1x"
    assert echoed["taskset"]["task_id"]["taskset"] == "puzzles-other"
    assert echoed["task_id"]["task_id"]["task_id"] == "p-1-other"
    assert echoed["extra_key"]["episode_id"]["server"] == "fake"


async def test_episode_reports_beside_replies() -> None:
    """report: valid, invalid and oversized FailureReports beside a failure or a result."""
    replies = await replies_under(
        {"kind": "episode_failure", "report": "valid"},
        {"kind": "episode_failure", "report": "invalid"},
        {"kind": "latency", "report": "many"},
    )
    valid, invalid, many = (r.json() for r in replies)
    assert valid["_ng_failure_id"] == "fake-3-1-0"
    assert len(valid["_ng_failure_events"]) == 2
    assert isinstance(invalid["_ng_failure_events"], str)
    assert "result" in many
    assert (len(many["_ng_failure_events"]), many["_ng_failure_events_omitted"]) == (40, 3)


async def test_episode_server_carries_out_transport_faults() -> None:
    """Statuses and broken bodies behave on an episode server as on any /run."""
    status, not_json, not_object = await replies_under(
        {"kind": "status", "status": 502}, {"kind": "not_json"}, {"kind": "not_object"}
    )
    assert status.status_code == 502
    assert not_json.content.startswith(b"<html>")
    assert not_object.json() == ["not", "an", "object"]


async def test_episode_server_refuses_flat_only_faults_with_500() -> None:
    """A flat-row sentinel fault on an episode server is a 500 naming the mistake."""
    (reply,) = await replies_under({"kind": "failure_class"})
    assert reply.status_code == 500
    assert "is for flat rows" in reply.json()


async def test_flat_server_refuses_episode_faults_with_500() -> None:
    """An episode fault in a flat row's fake_fault is a 500 naming the mistake."""
    row = {
        "responses_create_params": {"input": "What is 1 + 1?"},
        "fake_fault": {"kind": "episode_failure"},
    }
    async with open_fake_deployment(SPEC) as fake, httpx.AsyncClient(timeout=None) as client:
        reply = await client.post(fake.agent_urls["math_agent"] + "/run", json=row)
    assert reply.status_code == 500
    assert "is for episode servers" in reply.json()


async def test_episode_server_uses_its_own_plan_and_the_callable() -> None:
    """The episode plan picks per (task, rollout, attempt); the deployment plan does not apply;
    a fault callable sees the bound agent."""
    plan = FaultPlan(rate=1.0, mix=((Fault(kind="status", status=500), 1.0),), max_attempt=0)
    episode = EpisodeServerSpec(name="puzzle_env", tasksets=("puzzles",), faults=plan)
    deployment_wide = FaultPlan(rate=1.0, mix=((Fault(kind="hang"), 1.0),))
    spec = DeploymentSpec(
        agents=("math_agent",), episode_servers=(episode,), faults=deployment_wide
    )
    seen: list[FaultContext] = []

    def watch(context: FaultContext) -> None:
        seen.append(context)

    async with open_fake_deployment(spec, fault_fn=watch) as fake:
        first = await post(fake, request(0))
        again = await post(fake, request(1))
    assert (first.status_code, again.status_code) == (500, 200)
    assert [(c.server, c.agent, c.attempt_index) for c in seen] == [
        ("puzzle_env", None, 0),
        ("puzzle_env", None, 1),
    ]


async def test_episode_server_block_in_the_served_config() -> None:
    """The head serves an environment_servers block with its implementation and bound agent."""
    async with open_fake_deployment(SPEC) as fake, httpx.AsyncClient(timeout=None) as client:
        text = (await client.get(fake.head_url + "/global_config_dict_yaml")).json()
    block = yaml.safe_load(text)["puzzle_env"]
    impl = block["environment_servers"]["fake_episode_environment"]
    assert impl["port"] == fake.urls.ports["puzzle_env"]
    assert impl["agent_server"] == {"type": "responses_api_agents", "name": "math_agent"}
    assert SPEC.routes == {"puzzles": "puzzle_env", "more": "puzzle_env"}


def test_spec_with_episode_servers_round_trips() -> None:
    """spec_to_dict/spec_from_dict keep episode servers, their plans and latency."""
    plan = FaultPlan(seed=2, rate=0.5, mix=((Fault(kind="episode_shape", variant="both"), 2.0),))
    episode = EpisodeServerSpec(name="e", tasksets=("t",), faults=plan, refuse=True)
    spec = DeploymentSpec(agents=("a",), episode_servers=(episode,))
    assert spec_from_dict(spec_to_dict(spec)) == spec
    assert spec.with_sleep(0.1).episode_servers[0].faults is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"episode_servers": [{"name": "e", "tasksets": []}]}, "needs tasksets"),
        ({"episode_servers": [{"name": "a", "tasksets": ["t"]}]}, "already a server's"),
        ({"episode_servers": [{"name": "e", "tasksets": ["t"], "agent": "zz"}]}, "no agent 'zz'"),
        ({"episode_servers": [{"name": "e", "tasksets": ["t"]}, {"name": "f", "tasksets": ["t"]}]},
         "routed to two episode servers"),
        ({"episode_servers": ["e"]}, "must be mappings"),
        ({"episode_servers": [{"name": "e", "tasksets": ["t"], "bogus": 1}]}, "'bogus'"),
    ],
)  # fmt: skip
def test_spec_refuses_bad_episode_servers(data: dict[str, Any], message: str) -> None:
    """Bad episode server entries are ConfigErrors naming the problem."""
    with pytest.raises(ConfigError, match=message):
        spec_from_dict({"agents": ["a"], **data})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"kind": "episode_shape", "variant": "nope"}, "has no variant 'nope'"),
        ({"kind": "status", "variant": "array"}, "none \\(leave variant out\\)"),
        ({"kind": "episode_failure", "report": "huge"}, "report 'huge' is unknown"),
    ],
)
def test_fault_refuses_unknown_variants(fields: dict[str, Any], message: str) -> None:
    """Variants and reports are checked when the fault is built."""
    with pytest.raises(ConfigError, match=message):
        Fault(**fields)


def test_episode_task_rows_are_materialized_task_rows() -> None:
    """Generated rows have task_id, task_input and provenance in task_data; all distinct."""
    rows = list(episode_task_rows(50, taskset="t", seed=3))
    assert rows == list(episode_task_rows(50, taskset="t", seed=3))
    assert len({r["task_id"]["task_id"] for r in rows}) == 50
    for row in rows:
        assert set(row) == {"task_id", "task_input", "task_data"}
        assert row["task_id"]["taskset"] == "t"
        assert set(row["task_data"]) == {"_ng_digest", "_ng_dataset_digest"}
        assert answer_task(row["task_input"], server="s", accuracy=1.0, policy_seed=0, seed=0)[
            "reward"
        ] in (0.0, 1.0)
