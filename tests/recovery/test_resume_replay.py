"""Replay scripted failure sequences through collect and resume cycles (docs/design.md, Durability).

Each rollout gets a script: the outcome of its 1st, 2nd, ... completed request (success, every
failure class, terminal, counted as zero, ``_ng_no_persist``, a hang, a refused connection, or
a kill). The real `collect_run` runs in process with a scripted transport; a "kill" stops the
run the way SIGKILL does (every outcome flushed so far stays, nothing after it is written, and
a torn line may be left at the end of a file). Cycles resume until nothing retryable remains,
then every invariant is checked against a model of one uninterrupted run.

A script entry is consumed when a request *completes*; a request in flight when the run is
killed consumes nothing (its result never existed). Such a request still used its attempt
number (the server may have run it), and a rollout whose numbers reach the cap is not sent
again (resume.py, "Attempt numbers"): the model's fate is checked on the entries each rollout
consumed, and one that none decided must have used up its numbers.
"""

from __future__ import annotations

import io
import tempfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import attrs
import httpx
import orjson
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from trollout import jsonl
from trollout.cli.collect import collect_run
from trollout.collector.deployment.discovery import Deployment
from trollout.collector.http.transport import RawResponse
from trollout.records import Failed, Landed, Omitted, Outcome
from trollout.recovery.layout import RunLayout
from trollout.recovery.ledger import read_ledger
from trollout.recovery.resume import Fate, ResumeRules, scan_run
from trollout.recovery.store import RunStore
from trollout.settings import FsyncPolicy, RunConfig

URL = "http://127.0.0.1:9"
OUTCOMES = ("success", "run_error", "transient", "terminal", "terminal_timeout", "zero",
            "no_persist", "hang", "refused", "kill")  # fmt: skip
REPLIES = {
    "success": (200, {"response": {"output": []}, "reward": 1.0}),
    "run_error": (500, "Hit an exception"),
    "transient": (200, {"_ng_failure_class": "transient"}),
    "terminal": (200, {"_ng_failure_class": "skipped", "_ng_failure_terminal": True}),
    "terminal_timeout": (200, {"_ng_failure_class": "timeout_exceeded",
                               "_ng_failure_terminal": True}),
    "zero": (200, {"_ng_failure_class": "judge_failed", "_ng_failure_counts_as_zero": True,
                   "reward": 0.0}),
    "no_persist": (200, {"_ng_no_persist": True, "_ng_failure_class": "kill_shaped"}),
}  # fmt: skip
SPENDS = {"run_error", "transient", "hang"}
TORN = {"rollouts": b'{"_ng_task_index": 0, "respo', "failures": b'{"_ng_failure_cl',
        "attempts": b'{"attempts": [[0, 0, 9'}  # fmt: skip


@attrs.frozen
class Scenario:
    """One drawn replay: rollouts, scripts and settings."""

    tasks: int
    repeats: int
    scripts: dict[tuple[int, int], tuple[str, ...]]
    cap: int
    concurrency: int
    record_omitted: bool
    retry_timeouts: bool
    longest_first: bool
    torn: tuple[str | None, ...]


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    """Draw a small run and a script of outcomes per rollout."""
    tasks, repeats = draw(st.integers(1, 4)), draw(st.integers(1, 2))
    keys = [(t, r) for t in range(tasks) for r in range(repeats)]
    scripts = {k: tuple(draw(st.lists(st.sampled_from(OUTCOMES), max_size=4))) for k in keys}
    return Scenario(
        tasks=tasks, repeats=repeats, scripts=scripts, cap=draw(st.integers(1, 3)),
        concurrency=draw(st.integers(1, 3)), record_omitted=draw(st.booleans()),
        retry_timeouts=draw(st.booleans()), longest_first=draw(st.booleans()),
        torn=tuple(draw(st.lists(st.sampled_from((None, *TORN)), min_size=12, max_size=12))),
    )  # fmt: skip


def model(
    script: tuple[str, ...], *, cap: int, retry_timeouts: bool, consumed: int | None = None
) -> Fate | None:
    """Return a rollout's final fate in one uninterrupted run resumed until done, or, given
    the entries ``consumed``, the fate they decide (None: none decided it)."""
    spent = 0
    for entry in (*script, "success")[:consumed]:
        if entry == "success":
            return Fate.LANDED
        if entry == "terminal" or (entry == "terminal_timeout" and not retry_timeouts):
            return Fate.TERMINAL
        if entry == "zero":
            return Fate.ZERO
        if entry in SPENDS or entry == "terminal_timeout":
            spent += 1
            if spent >= cap:
                return Fate.AT_CAP
    assert consumed is not None, "unreachable"
    return None


class World:
    """The scripted server, the kill switch, and what was sent and acknowledged."""

    def __init__(self, scenario: Scenario, layout: RunLayout) -> None:
        self.scenario = scenario
        self.layout = layout
        self.completed: Counter[tuple[int, int]] = Counter()
        self.sent: list[tuple[int, int, int]] = []
        self.refused: list[tuple[int, int, int]] = []  # sent, never reached the server
        self.unreserved: list[tuple[int, int, int]] = []
        self.acknowledged: list[Outcome] = []
        self.returned = 0
        self.settled = 0
        self.killed = False
        self.kills = 0
        self.flushed = trio.Event()  # set by the store after each acknowledged write
        self.scope: trio.CancelScope | None = None

    async def post(self, url: str, body: bytes, **_: Any) -> RawResponse:
        row = orjson.loads(body)
        key = (row["_ng_task_index"], row["_ng_rollout_index"])
        triple = (*key, row.get("_ng_attempt_index", 0))
        if self.killed:
            await trio.sleep_forever()
        self.sent.append(triple)
        if triple not in set(read_ledger(self.layout.attempts)):
            self.unreserved.append(triple)
        await trio.sleep(0.0005)
        if self.killed:
            await trio.sleep_forever()  # in flight when the process died: no result exists
        script = self.scenario.scripts[key]
        done = self.completed[key]
        entry = script[done] if done < len(script) else "success"
        self.completed[key] += 1
        if entry == "kill":
            await self._kill()
        self.returned += 1
        if entry == "hang":
            raise httpx.ReadTimeout("scripted hang")
        if entry == "refused":
            self.refused.append(triple)
            raise httpx.ConnectError("scripted refusal")
        status, reply = REPLIES[entry]
        return RawResponse(status=status, headers=[], body=orjson.dumps(reply), truncated=False)

    async def _kill(self) -> None:
        """Die like SIGKILL once everything already returned is written."""
        while self.returned != self.settled:
            self.flushed = trio.Event()
            await self.flushed.wait()
        self.killed = True
        assert self.scope is not None
        self.scope.cancel()
        await trio.sleep_forever()

    async def aclose(self) -> None:
        pass

    def tear(self, cycle: int) -> None:
        """Leave a torn line at the end of one file, as a kill mid-write may."""
        which = self.scenario.torn[cycle % len(self.scenario.torn)]
        if which is not None:
            path = {"rollouts": self.layout.rollouts, "failures": self.layout.failures,
                    "attempts": self.layout.attempts}[which]  # fmt: skip
            with open(path, "ab") as f:
                f.write(TORN[which])


def patch_store(monkeypatch: Any, world: World) -> None:
    """Make the store drop everything once the world is killed; record acknowledgements."""
    real_write, real_reserve = RunStore.write, RunStore.reserve

    async def write(self: RunStore, outcomes: list[Outcome]) -> None:
        if world.killed:
            return
        await real_write(self, outcomes)
        world.acknowledged.extend(outcomes)
        world.settled += sum(1 for o in outcomes if not isinstance(o, Omitted))
        world.flushed.set()

    async def reserve(self: RunStore, attempts: Any) -> None:
        if not world.killed:
            await real_reserve(self, attempts)

    monkeypatch.setattr(RunStore, "write", write)
    monkeypatch.setattr(RunStore, "reserve", reserve)


def rows_of(path: Path) -> list[dict[str, Any]]:
    """Read a file, asserting that no line is torn."""
    data = path.read_bytes() if path.exists() else b""
    assert not data or data.endswith(b"\n"), path.name
    return [orjson.loads(line) for line in data.splitlines()]


def triple(row: dict[str, Any]) -> tuple[int, int, int]:
    """Return (task, rollout, attempt) of a row."""
    return (row["_ng_task_index"], row["_ng_rollout_index"], row.get("_ng_attempt_index", 0))


def never_started(row: dict[str, Any]) -> bool:
    """Whether a row is of an attempt that never reached a server (not_sent, drained)."""
    return row.get("_ng_failure_delivery") == "not_sent" or row.get("failure_kind") == "drained"


async def replay(scenario: Scenario, root: Path) -> World:
    """Run collect, then resume after every kill, until nothing retryable remains."""
    source = root / "in.jsonl"
    source.write_bytes(b"".join(
        jsonl.dumps({"responses_create_params": {"input": f"q{t}"}}) for t in range(scenario.tasks)
    ))  # fmt: skip
    layout = RunLayout.for_output(root / "run" / "r.jsonl")
    config = RunConfig(
        input_jsonl_fpath=str(source), output_jsonl_fpath=str(layout.output),
        agent_urls={"agent": URL}, agent_name="agent", num_repeats=scenario.repeats,
        num_samples_in_parallel=scenario.concurrency, max_attempts=scenario.cap,
        record_omitted_rollouts=scenario.record_omitted,
        retry_terminal_timeouts=scenario.retry_timeouts,
        dispatch_longest_first=scenario.longest_first, fsync=FsyncPolicy.NEVER,
        max_connect_retries=0, status_interval_s=3600.0,
    )  # fmt: skip
    deployment = Deployment.from_agent_urls({"agent": URL})
    world = World(scenario, layout)
    rules = ResumeRules(max_attempts=scenario.cap, retry_terminal_timeouts=scenario.retry_timeouts)
    entries = sum(len(s) for s in scenario.scripts.values())
    with _monkeypatch() as mp:
        patch_store(mp, world)
        for cycle in range(entries + 3):
            world.killed, world.returned, world.settled = False, 0, 0
            with trio.CancelScope() as world.scope:
                await collect_run(
                    attrs.evolve(config, resume_from_cache=cycle > 0), deployment=deployment,
                    transport=world, live=False, progress_stream=io.StringIO(),  # type: ignore[arg-type]
                )  # fmt: skip
            if world.killed:
                world.kills += 1
                world.tear(cycle)
            elif scan_run(layout, rules).tally.to_dispatch == 0:
                return world
    raise AssertionError(f"not done after {entries + 3} cycles")


def _monkeypatch() -> Any:
    import pytest

    return pytest.MonkeyPatch.context()


def check(scenario: Scenario, world: World) -> None:
    """Assert every Durability invariant and the model's final fates."""
    layout = world.layout
    landed, failures = rows_of(layout.rollouts), rows_of(layout.failures)
    rows_of(layout.attempts)
    rows_of(layout.materialized_inputs)
    # Each rollout has at most one row in the rollouts file.
    landed_keys = [triple(r)[:2] for r in landed]
    assert len(landed_keys) == len(set(landed_keys))
    # A number that reached the server is never sent again (a refused one may be), numbers
    # never fall per rollout, and each is reserved before it is sent.
    reached = Counter(world.sent) - Counter(world.refused)
    assert set(reached.values()) <= {1}, reached
    by_rollout: dict[tuple[int, int], list[int]] = defaultdict(list)
    for task, rollout, attempt in world.sent:
        by_rollout[(task, rollout)].append(attempt)
    assert all(a == sorted(a) for a in by_rollout.values())
    assert world.unreserved == []
    used = {k: 1 + max(a for t, r, a in reached if (t, r) == k) for k in by_rollout}
    # Every attempt with a written outcome is in exactly one file (a never-started attempt's
    # number was released, so a later attempt may carry it again).
    written = [triple(r) for r in landed + failures]
    started = [triple(r) for r in landed + failures if not never_started(r)]
    assert len(started) == len(set(started))
    # Nothing acknowledged as written is lost.
    on_disk = set(written)
    for outcome in world.acknowledged:
        key = (*outcome.identity.key, outcome.attempt_index)
        persisted = (
            isinstance(outcome, Landed)
            or (isinstance(outcome, Failed) and not outcome.no_persist)
            or (isinstance(outcome, Omitted) and scenario.record_omitted)
        )
        if persisted:
            assert key in on_disk, outcome
    # Resumed until done, the fates equal one uninterrupted run's.
    rules = ResumeRules(max_attempts=scenario.cap, retry_terminal_timeouts=scenario.retry_timeouts)
    tally = scan_run(layout, rules).tally
    fates: dict[tuple[int, int], Fate] = {}
    for pair, script in scenario.scripts.items():
        fate = model(script, cap=scenario.cap, retry_timeouts=scenario.retry_timeouts,
                     consumed=world.completed[pair])  # fmt: skip
        if fate is None:  # kills in flight used up its numbers before an entry decided it
            assert used.get(pair, 0) >= scenario.cap, (pair, used)
            fate = Fate.AT_CAP
        fates[pair] = fate
    want = Counter(fate.value for fate in fates.values())
    assert {k: v for k, v in tally.fates.items() if v} == dict(want)
    assert set(landed_keys) == {k for k, fate in fates.items() if fate is Fate.LANDED}


@settings(max_examples=40, deadline=None)
@given(scenarios())
async def test_resume_replay_keeps_every_invariant(scenario: Scenario) -> None:
    """Any script of outcomes and kills, resumed until done, keeps every Durability invariant."""
    with tempfile.TemporaryDirectory() as root:
        world = await replay(scenario, Path(root))
        check(scenario, world)


async def test_resume_replay_example_with_every_outcome() -> None:
    """One fixed scenario that uses every outcome, including two kills, passes the checks."""
    scripts = {(0, 0): ("kill", "run_error", "success"), (0, 1): ("hang", "terminal"),
               (1, 0): ("refused", "no_persist", "zero"), (1, 1): ("transient", "kill"),
               (2, 0): ("terminal_timeout", "run_error"), (2, 1): ("run_error",) * 3}  # fmt: skip
    scenario = Scenario(tasks=3, repeats=2, scripts=scripts, cap=3, concurrency=2,
                        record_omitted=True, retry_timeouts=True, longest_first=True,
                        torn=("rollouts", "attempts", "failures"))  # fmt: skip
    with tempfile.TemporaryDirectory() as root:
        world = await replay(scenario, Path(root))
        check(scenario, world)
    assert world.kills == 2
