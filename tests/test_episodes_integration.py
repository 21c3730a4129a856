"""Episodes end to end (docs/protocol.md section 3): the fake's episode servers, misbehaving.

- 1,000 task rows x 4 repeats against an episode server mixing every misbehaving mode into its
  first attempts: each rollout ends in exactly one file with the class its reply deserves, with
  the keys the reference names; a resume retries what is not terminal under new attempt numbers.
- The violation stop through the CLI: it fires on exactly the N-th consecutive violation, the
  run exits 1, and resuming once the server behaves completes it.
- A property test: any sequence of episode replies per attempt, over sessions resumed until
  done, gives the outcome the rules say, and the run folder keeps docs/design.md's invariants.
"""

from __future__ import annotations

import tempfile
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import orjson
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import invoke, read_jsonl, served_block, write_jsonl
from trollout.cli.collect import collect_run
from trollout.collector.deployment.discovery import Deployment
from trollout.collector.http.transport import RawResponse
from trollout.recovery.layout import RunLayout
from trollout.settings import RunConfig
from trollout.testing import (
    AgentSpec,
    DeploymentSpec,
    EpisodeServerSpec,
    FakeUrls,
    Fault,
    FaultPlan,
    Generation,
    episode_task_rows,
    open_fake_deployment,
    spawn_fake_deployment,
)
from trollout.testing.faults import EPISODE_VARIANTS, FaultKind
from trollout.testing.policy import answer_task

SERVER = "puzzle_env"
VIOLATION = "environment_protocol_violation"

# The keys of digest section 3.9 (NeMo Gym 0.7.0's names; trollout adds _ng_result_type,
# elapsed_seconds and the failure-row extras docs/protocol.md section 7 lists).
MATERIALIZED_TASK_KEYS = {
    "task_id", "task_input", "task_data",
    "_ng_task_index", "_ng_rollout_index", "_ng_environment_server", "_ng_result_type",
}  # fmt: skip
RECORD_STAMPS = {
    "_ng_task_id", "_ng_task_index", "_ng_rollout_index", "_ng_environment_server",
    "_ng_result_type", "_ng_digest", "_ng_dataset_digest", "ng_policy_model_server",
    "elapsed_seconds",
}  # fmt: skip
RESULT_KEYS = {"response", "reward", "reward_components", "terminated"}
FAILURE_KEYS = {
    "_ng_failure_class", "_ng_failure_terminal", "_ng_failure_type", "_ng_failure_message",
    "_ng_failure_http_status", "_ng_failure_response_body", "_ng_failure_max_attempts",
    "_ng_failure_delivery", "failure_kind",
}  # fmt: skip
REPORT_KEYS = {"_ng_failure_events", "_ng_failure_id", "_ng_failure_events_omitted"}


def every_misbehaviour() -> tuple[tuple[Fault, float], ...]:
    """Every way an episode server can misbehave, with weights."""
    faults: list[tuple[Fault, float]] = [
        (Fault(kind="episode_failure"), 2.0),
        (Fault(kind="episode_failure", terminal=True, failure_class="timeout_exceeded"), 1.0),
        (Fault(kind="episode_failure", failure_class="transient", stage="tool", partial=True,
               report="valid"), 1.0),
        (Fault(kind="episode_failure", report="invalid"), 1.0),
        (Fault(kind="episode_failure", terminal=True, report="many"), 1.0),
        (Fault(kind="latency", report="valid"), 1.0),
        (Fault(kind="status", status=500), 1.0),
        (Fault(kind="status", status=502), 1.0),
        (Fault(kind="not_json"), 1.0),
        (Fault(kind="not_object"), 1.0),
        (Fault(kind="reset_mid_request"), 0.5),
    ]  # fmt: skip
    for kind in (
        FaultKind.EPISODE_SHAPE,
        FaultKind.EPISODE_COLLECTOR_KEYS,
        FaultKind.EPISODE_IDENTITY,
    ):
        variants = EPISODE_VARIANTS[kind]
        faults += [(Fault(kind=kind, variant=v), 3.0 / len(variants)) for v in variants]
    return tuple(faults)


def expected_outcome(fault: Fault | None) -> tuple[str | None, bool]:
    """Return (class or None for landed, terminal) that a first attempt under `fault` deserves."""
    if fault is None or fault.kind is FaultKind.LATENCY:
        return None, False
    if fault.kind is FaultKind.EPISODE_FAILURE:
        return fault.failure_class or "environment_server_failed", fault.terminal
    if fault.kind is FaultKind.STATUS:
        return ("agent_request_failed" if fault.status == 502 else "agent_run_error"), False
    if fault.kind is FaultKind.NOT_JSON:
        return "agent_run_error", False
    if fault.kind is FaultKind.RESET_MID_REQUEST:
        return "agent_request_failed", False
    return VIOLATION, False  # episode_shape, episode_identity, episode_collector_keys, not_object


def keyed(rows: list[dict[str, Any]]) -> dict[tuple[int, int], list[dict[str, Any]]]:
    """Group rows by (task, rollout)."""
    out: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        out[(row["_ng_task_index"], row["_ng_rollout_index"])].append(row)
    return out


PLAN = FaultPlan(seed=9, rate=0.4, mix=every_misbehaviour(), max_attempt=0)
MIXED = DeploymentSpec(
    agents=(AgentSpec(name="math_agent"),),
    generation=Generation.LEGACY,
    episode_servers=(
        EpisodeServerSpec(name=SERVER, tasksets=("puzzles",), agent="math_agent", faults=PLAN),
    ),
    record_runs=True,
)


@pytest.mark.slow
async def test_mixed_misbehaviour_every_rollout_lands_in_exactly_one_place(tmp_path: Path) -> None:
    """4,000 rollouts, every misbehaving mode on first attempts: each ends once, in the file and
    class its reply deserves, with the reference's keys; resume retries the non-terminal ones
    under new attempt numbers and they land, rewards coming from the result."""
    tasks = list(episode_task_rows(1000, taskset="puzzles", seed=4))
    write_jsonl(tmp_path / "in.jsonl", tasks)
    async with open_fake_deployment(MIXED) as fake:
        config = RunConfig(
            input_jsonl_fpath=str(tmp_path / "in.jsonl"),
            output_jsonl_fpath=str(tmp_path / "run" / "r.jsonl"),
            head_server=fake.head_url,
            environment_server_routes=MIXED.routes,
            num_repeats=4,
            num_samples_in_parallel=16,
            environment_protocol_violation_stop_after=12,  # a streak that long: p < 1e-9 here
        )
        await collect_run(config, live=False)
        layout = RunLayout.for_output(config.output_jsonl_fpath or "")
        first_landed, first_failed = read_jsonl(layout.rollouts), read_jsonl(layout.failures)
        await collect_run(attrs.evolve(config, resume_from_cache=True), live=False)
        sent = Counter(run.key for run in fake.stats.runs)
    materialized = read_jsonl(layout.materialized_inputs)
    assert len(materialized) == 4000
    assert {frozenset(row) for row in materialized} == {frozenset(MATERIALIZED_TASK_KEYS)}

    landed, failed = keyed(first_landed), keyed(first_failed)
    predicted: dict[tuple[int, int], tuple[str | None, bool]] = {}
    for task in range(1000):
        for rollout in range(4):
            key = (task, rollout)
            predicted[key] = cls, terminal = expected_outcome(PLAN.fault_for(task, rollout, 0))
            rows = landed.get(key, []) + failed.get(key, [])
            assert len(rows) == 1, key  # exactly one place
            row = rows[0]
            if cls is None:
                assert key in landed, key
                check_success_row(row, tasks[task], rollout)
            else:
                assert key in failed, key
                check_failure_row(row, cls, terminal, PLAN.fault_for(task, rollout, 0))
    assert not any("_ng_failure_class" in row for row in first_landed)
    classes = {cls for cls, _ in predicted.values()}
    assert classes >= {None, VIOLATION, "environment_server_failed", "timeout_exceeded"}
    assert classes >= {"transient", "agent_run_error", "agent_request_failed"}

    # Resume: every non-terminal failure or violation again, as attempt 1; terminal never.
    final = keyed(read_jsonl(layout.rollouts))
    for key, (cls, terminal) in predicted.items():
        if cls is not None and not terminal:
            assert final[key][0]["_ng_attempt_index"] == 1
            check_success_row(final[key][0], tasks[key[0]], key[1], attempt=1)
            assert sent[(*key, 1)] == 1
        elif terminal:
            assert key not in final
            assert sent[(*key, 1)] == 0
        assert len(final.get(key, [])) <= 1
    assert max(sent.values()) == 1  # no (task, rollout, attempt) sent twice


def check_success_row(
    row: dict[str, Any], task: dict[str, Any], rollout: int, attempt: int = 0
) -> None:
    """A landed episode: the inner result, the reference's stamps, the policy's reward."""
    expected = RESULT_KEYS | RECORD_STAMPS | ({"_ng_attempt_index"} if attempt else set())
    assert set(row) == expected
    assert row["_ng_task_id"] == task["task_id"]
    assert row["_ng_digest"] == task["task_data"]["_ng_digest"]
    assert row["_ng_dataset_digest"] == task["task_data"]["_ng_dataset_digest"]
    assert (row["_ng_environment_server"], row["_ng_result_type"]) == (
        SERVER,
        "fake_episode_environment",
    )
    assert row["ng_policy_model_server"] == "policy_model"
    answer = answer_task(
        task["task_input"], server=SERVER, accuracy=0.7, policy_seed=0, seed=rollout
    )
    assert row["reward"] == answer["reward"]


def check_failure_row(row: dict[str, Any], cls: str, terminal: bool, fault: Fault) -> None:
    """A failed episode: its class and terminal flag, the reference's keys, no invented score."""
    assert (row["_ng_failure_class"], row["_ng_failure_terminal"]) == (cls, terminal)
    assert FAILURE_KEYS | (RECORD_STAMPS - {"elapsed_seconds"}) <= set(row)
    assert "reward" not in row
    assert "response" not in row
    extras = set(row) - FAILURE_KEYS - RECORD_STAMPS
    if cls == VIOLATION:
        assert (row["failure_kind"], row["_ng_failure_response_body"]) == (VIOLATION, None)
        assert row["_ng_failure_type"] in {
            "EpisodeShapeViolation", "EpisodeIdentityMismatch", "EpisodeCollectorKeys",
        }  # fmt: skip
        assert not extras
    elif fault.kind is FaultKind.EPISODE_FAILURE:
        assert row["failure_kind"] == fault.failure_class
        assert row["_ng_failure_type"] == "EpisodeFailure"
        want = set()
        if fault.stage:
            want.add("_ng_failure_stage")
        if fault.partial:
            want.add("_ng_failure_partial_response")
        if fault.report in ("valid", "many"):
            want |= (
                REPORT_KEYS if fault.report == "many" else {"_ng_failure_id", "_ng_failure_events"}
            )
        assert extras == want
        if fault.report == "many":
            assert len(row["_ng_failure_events"]) == 32
            assert row["_ng_failure_events_omitted"] == 3 + 40 - 32


# --- the violation stop, through the CLI --------------------------------------------------------

STOP_SPEC = DeploymentSpec(
    agents=(AgentSpec(name="math_agent"),),
    generation=Generation.LEGACY,
    episode_servers=(EpisodeServerSpec(name=SERVER, tasksets=("puzzles",)),),
    record_runs=True,
)
# What the server answers to each row's first attempt; later attempts are answered well.
SCRIPT: list[dict[str, Any] | None] = [
    {"kind": "episode_failure"},  # 0 usable: streak 0
    {"kind": "episode_shape", "variant": "array"},  # 1 violation: 1
    {"kind": "episode_identity", "variant": "attempt"},  # 2 violation: 2
    {"kind": "episode_failure", "terminal": True, "failure_class": "skipped"},  # 3 usable: 0
    {"kind": "episode_collector_keys"},  # 4 violation: 1
    {"kind": "status", "status": 500},  # 5 transport: neither counts nor resets
    {"kind": "not_object"},  # 6 violation: 2
    {"kind": "episode_shape", "variant": "flat"},  # 7 violation: 3
    {"kind": "episode_identity", "variant": "taskset"},  # 8 violation: 4, the stop
    None, None, None,
]  # fmt: skip
STOP_AT = 8


@pytest.fixture(scope="module")
def stop_fake() -> Iterator[FakeUrls]:
    """The episode server in its own process, for the CLI."""
    with spawn_fake_deployment(STOP_SPEC) as urls:
        yield urls


def scripted_tasks(path: Path) -> Path:
    """Write one task row per SCRIPT entry, its first-attempt fault in task_input."""
    rows = list(episode_task_rows(len(SCRIPT), taskset="puzzles", seed=2))
    for row, fault in zip(rows, SCRIPT, strict=True):
        if fault is not None:
            row["task_input"]["fake_fault"] = {**fault, "attempts": [0]}
    return write_jsonl(path, rows)


def stop_args(tmp_path: Path, fake: FakeUrls, *extra: str) -> list[str]:
    """A collect of the scripted rows through the fake's episode server, one at a time."""
    return ["collect", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "run" / "r.jsonl"),
            "--head-server", fake.head_url, "--concurrency", "1", "--progress", "plain",
            "--no-aggregate",
            f"+environment_server_routes={{puzzles:{SERVER}}}",
            "+environment_protocol_violation_stop_after=4", *extra]  # fmt: skip


def fake_runs(fake: FakeUrls) -> list[list[Any]]:
    """The fake's log of /run requests: [server, agent, task, rollout, attempt, fault]."""
    return httpx.get(fake.head_url + "/_fake/runs").json()  # type: ignore[no-any-return]


def test_violation_stop_fires_on_exactly_the_nth_and_the_run_resumes(
    tmp_path: Path, stop_fake: FakeUrls
) -> None:
    """4 consecutive violations stop the run (exit 1); usable failures reset the streak,
    transport errors leave it; a resume once the server behaves completes the run."""
    scripted_tasks(tmp_path / "in.jsonl")
    before = len(fake_runs(stop_fake))
    result = invoke(*stop_args(tmp_path, stop_fake))
    assert result.exit_code == 1, result.output + result.stderr
    assert "run stopped:" in result.stderr
    assert f"{SERVER!r} broke the environment protocol on 4 consecutive rollouts" in result.stderr
    layout = RunLayout.for_output(tmp_path / "run" / "r.jsonl")
    failures = read_jsonl(layout.failures)
    assert [row["_ng_task_index"] for row in failures] == list(range(STOP_AT + 1))
    assert [row["_ng_failure_class"] == VIOLATION for row in failures] == [
        False, True, True, False, True, False, True, True, True,
    ]  # fmt: skip
    assert {row["_ng_task_index"] for row in read_jsonl(layout.rollouts)} <= {STOP_AT + 1}
    first = fake_runs(stop_fake)[before:]
    assert {task for _, _, task, *_ in first} <= set(range(STOP_AT + 2))

    again = invoke(*stop_args(tmp_path, stop_fake, "+resume_from_cache=true"))
    assert again.exit_code == 0, again.output + again.stderr
    landed = {row["_ng_task_index"]: row for row in read_jsonl(layout.rollouts)}
    assert set(landed) == set(range(len(SCRIPT))) - {3}  # 3 failed terminally
    for task in range(STOP_AT + 1):
        if task != 3:
            assert landed[task]["_ng_attempt_index"] == 1  # a new attempt number
    resent = Counter((task, attempt) for _, _, task, _, attempt, _ in fake_runs(stop_fake)[before:])
    assert resent[(3, 1)] == 0
    assert max(resent.values()) == 1


# --- a property test: any replies, sessions resumed until done ----------------------------------

REPLIES = ("result", "failure", "terminal", "shape", "identity", "keys", "status", "not_json")
ROUTE = {"ep": {"environment_servers": {"fake_episode": {"host": "127.0.0.1", "port": 9}}}}
CLASSES = {
    "failure": ("environment_server_failed", False),
    "terminal": ("skipped", True),
    "shape": (VIOLATION, False),
    "identity": (VIOLATION, False),
    "keys": (VIOLATION, False),
    "status": ("agent_run_error", False),
    "not_json": ("agent_run_error", False),
}


class ScriptedEpisodes:
    """An in-memory episode server: the n-th request of a rollout gets its n-th scripted reply."""

    def __init__(self, script: dict[str, list[tuple[str, float]]]) -> None:
        self.script = script
        self.sent: list[tuple[str, int]] = []

    async def post(self, url: str, body: bytes, **_: Any) -> RawResponse:
        request = orjson.loads(body)
        episode_id, task_id = request["episode_id"], request["task"]["task_id"]
        rollout_id = episode_id["rollout_id"]
        n = sum(1 for rid, _ in self.sent if rid == rollout_id)
        self.sent.append((rollout_id, episode_id["attempt"]))
        replies = self.script[rollout_id]
        kind, reward = replies[n] if n < len(replies) else ("result", 1.0)
        echo = {"episode_id": episode_id, "task_id": task_id}
        status, payload = 200, {
            "result": {**echo, "result": {"reward": reward}},
            "failure": {**echo, "failure": {"failure_reason": "f", "terminal": False}},
            "terminal": {**echo, "failure": {"failure_reason": "t", "terminal": True,
                                             "failure_kind": "skipped"}},
            "shape": [echo],
            "identity": {**echo, "episode_id": {**episode_id, "attempt": -1}, "result": {}},
            "keys": {**echo, "result": {"reward": reward, "_ng_reward": 1}},
            "status": "boom",
            "not_json": None,
        }[kind]  # fmt: skip
        status = 500 if kind == "status" else 200
        raw = b"<html>" if kind == "not_json" else orjson.dumps(payload)
        return RawResponse(status, [], raw, False, url)

    async def aclose(self) -> None:
        pass


def model(replies: list[tuple[str, float]], cap: int) -> list[tuple[str, float]]:
    """Return the replies a rollout gets under the rules: until a result, a terminal failure,
    or the attempt cap."""
    got = []
    for n in range(cap):
        kind, reward = replies[n] if n < len(replies) else ("result", 1.0)
        got.append((kind, reward))
        if kind in ("result", "terminal"):
            break
    return got


scripts = st.lists(
    st.lists(st.tuples(st.sampled_from(REPLIES), st.sampled_from([0.0, 0.5, 1.0])), max_size=4),
    min_size=1,
    max_size=5,
)


@settings(max_examples=25, deadline=None)
@given(scripts, st.integers(1, 2))
def test_any_episode_replies_give_the_outcome_the_rules_say(
    replies: list[list[tuple[str, float]]], repeats: int
) -> None:
    """Per rollout, each attempt's row is in the file and class its reply deserves; sessions
    resumed until done land exactly what the rules say, once, under new attempt numbers;
    every attempt that produced an outcome is in exactly one file."""
    with tempfile.TemporaryDirectory() as folder:
        trio.run(run_property_case, Path(folder), replies, repeats)


async def run_property_case(
    folder: Path, replies: list[list[tuple[str, float]]], repeats: int
) -> None:
    rows = list(episode_task_rows(len(replies), taskset="t", seed=1))
    write_jsonl(folder / "in.jsonl", rows)
    script = {f"{t}-{r}": replies[t] for t in range(len(replies)) for r in range(repeats)}
    transport = ScriptedEpisodes(script)
    deployment = Deployment.from_config(ROUTE)
    config = RunConfig(
        input_jsonl_fpath=str(folder / "in.jsonl"),
        output_jsonl_fpath=str(folder / "run" / "r.jsonl"),
        environment_server_routes={"t": "ep"},
        num_repeats=repeats,
        num_samples_in_parallel=4,
        environment_protocol_violation_stop_after=None,
        disable_aggregation=True,
    )
    result = await collect_run(config, deployment=deployment, transport=transport, live=False)
    for _ in range(4):
        result = await collect_run(
            attrs.evolve(config, resume_from_cache=True),
            deployment=deployment,
            transport=transport,
            live=False,
        )
    assert result.resumed is not None
    assert result.resumed.to_dispatch == 0
    layout = RunLayout.for_output(folder / "run" / "r.jsonl")
    landed, failed = keyed(read_jsonl(layout.rollouts)), keyed(read_jsonl(layout.failures))
    assert sum(map(len, landed.values())) + sum(map(len, failed.values())) == len(transport.sent)
    for rollout_id, scripted in script.items():
        task, rollout = map(int, rollout_id.split("-"))
        got = model(scripted, cap=config.max_attempts)
        attempts = [a for rid, a in transport.sent if rid == rollout_id]
        assert attempts == list(range(len(got)))  # one new number per attempt
        failures = sorted(
            failed.get((task, rollout), []), key=lambda r: r.get("_ng_attempt_index", 0)
        )
        assert [(r["_ng_failure_class"], r["_ng_failure_terminal"]) for r in failures] == [
            CLASSES[kind] for kind, _ in got if kind != "result"
        ]
        rows = landed.get((task, rollout), [])
        if got[-1][0] == "result":
            assert len(rows) == 1
            assert rows[0]["reward"] == got[-1][1]
            assert rows[0].get("_ng_attempt_index", 0) == len(got) - 1
            assert rows[0]["_ng_task_id"] == {"taskset": "t", "task_id": f"t-{task:05d}"}
        else:
            assert rows == []


# --- ng_policy_model_server on both paths -------------------------------------------------------


def test_policy_model_servers_maps_agents_and_their_environment_servers() -> None:
    """Agents map to their model server; an environment server to its bound agent's; others
    (no model server, no bound agent) are left out."""
    config = {
        "m": served_block("responses_api_models", 1),
        "a": served_block("responses_api_agents", 2, model_server="m"),
        "b": served_block("responses_api_agents", 3),
        "a_env": served_block("environment_servers", 4, agent_server="a"),
        "b_env": served_block("environment_servers", 5, agent_server="b"),
        "native": served_block("environment_servers", 6),
    }
    assert Deployment.from_config(config).policy_model_servers() == {"a": "m", "a_env": "m"}


async def test_policy_model_server_is_on_landed_and_failed_records_of_both_paths(
    tmp_path: Path,
) -> None:
    """Flat rows (their agent's model server) and task rows (the episode server's bound agent's)
    carry ng_policy_model_server on success and failure rows alike."""
    ref = {"name": "math_agent"}
    flat = [
        {"responses_create_params": {"input": "What is 1 + 1?"}, "agent_ref": ref},
        {"responses_create_params": {"input": "What is 2 + 2?"}, "agent_ref": ref},
    ]
    flat[0]["fake_fault"] = {"kind": "status", "status": 500}
    tasks = list(episode_task_rows(2, taskset="puzzles", seed=1))
    tasks[0]["task_input"]["fake_fault"] = {"kind": "episode_failure"}
    write_jsonl(tmp_path / "in.jsonl", [*flat, *tasks])
    spec = attrs.evolve(
        MIXED, episode_servers=(attrs.evolve(MIXED.episode_servers[0], faults=None),)
    )
    async with open_fake_deployment(spec) as fake:
        config = RunConfig(
            input_jsonl_fpath=str(tmp_path / "in.jsonl"),
            output_jsonl_fpath=str(tmp_path / "run" / "r.jsonl"),
            head_server=fake.head_url,
            environment_server_routes=spec.routes,
            disable_aggregation=True,
        )
        await collect_run(config, live=False)
    layout = RunLayout.for_output(tmp_path / "run" / "r.jsonl")
    rows = read_jsonl(layout.rollouts) + read_jsonl(layout.failures)
    assert len(rows) == 4
    assert {row["ng_policy_model_server"] for row in rows} == {"policy_model"}
    assert {"_ng_task_id" in row for row in rows} == {True, False}
