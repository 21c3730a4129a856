"""`trollout.nemo_gym` against NeMo Gym 0.7.0's documented semantics, method by method.

Each test drives the helper under ``asyncio.run`` against the fake in its own process (real
loopback). Order is forced with faults, never with time: a row whose first try hangs never
completes, so whatever completes first is known without a clock.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import pytest

import trollout
from builders import read_jsonl
from trollout import records
from trollout.errors import RolloutRequestError
from trollout.nemo_gym import BaseServerConfig, RolloutCollectionHelper, constants
from trollout.testing import FakeUrls, task_rows

T = TypeVar("T")
HANG = {"kind": "hang", "attempts": [0]}
FAIL = {"kind": "status", "status": 500, "body": "boom"}
CONFIG = trollout.RunConfig(max_request_retries=0, max_attempts=1)


def head(fake: FakeUrls) -> BaseServerConfig:
    parts = urlsplit(fake.head_url)
    return BaseServerConfig(host=parts.hostname or "", port=parts.port or 0)


def rows(n: int, faults: dict[int, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """n rows for math_agent, preprocessed; ``faults`` maps a task to its ``fake_fault``."""
    raw = [{**r, "agent_ref": {"name": "math_agent"}} for r in task_rows(n, seed=3)]
    for task, fault in (faults or {}).items():
        raw[task]["fake_fault"] = fault
    return RolloutCollectionHelper().preprocess_examples(raw)


def runs_total(fake: FakeUrls) -> int:
    return int(httpx.get(fake.head_url + "/_fake/stats", timeout=30).json()["runs_total"])


def run(main: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(main())  # type: ignore[arg-type]


def task(pair: tuple[dict[str, Any], Any]) -> int:
    return int(pair[0]["_ng_task_index"])


# --- preprocess_examples ---------------------------------------------------------------------


def test_preprocess_routes_repeats_and_seeds_as_nemo_gym() -> None:
    """agent_map and fan_out route, num_repeats repeats, seeds are rollout indices (NeMo Gym's),
    task_ids selects before repetition, and the caller's rows are not mutated."""
    raw = [{**r, "agent_ref": {"name": "ds"}} for r in task_rows(3, seed=1)]
    before = [dict(r) for r in raw]
    helper = RolloutCollectionHelper()
    out = helper.preprocess_examples(
        raw, agent_map={"ds": "math_agent"}, num_repeats=3, num_repeats_add_seed=True
    )
    assert raw == before
    assert [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in out] == [
        (t, k) for t in range(3) for k in range(3)
    ]
    assert {r["agent_ref"]["name"] for r in out} == {"math_agent"}
    extra = [json.loads(r["responses_create_params"]["metadata"]["extra_body"]) for r in out]
    assert [e["seed"] for e in extra] == [0, 1, 2] * 3


# --- run_examples: pairs, order, failures, drained rows -----------------------------------------


def test_pairs_are_the_rows_given_and_the_replies_run_returns(fake: FakeUrls) -> None:
    """Each pair is the caller's own row and /run's reply (less trollout's identity stamps),
    equal to what posting the same row to the same agent returns."""
    given = rows(3)

    async def main() -> list[tuple[dict[str, Any], Any]]:
        completions = RolloutCollectionHelper().run_examples(given, head_server_config=head(fake))
        return [await future for future in completions]

    pairs = run(main)
    assert sorted(map(task, pairs)) == [0, 1, 2]
    for row, result in pairs:
        assert any(row is g for g in given)
        direct = httpx.post(fake.run_urls["math_agent"] + "/run", json=row, timeout=30).json()
        expected = {k: v for k, v in direct.items() if k not in records.STAMP_KEYS}
        assert result == expected


def test_awaitables_resolve_in_completion_order_whichever_is_awaited(fake: FakeUrls) -> None:
    """The first awaitable awaited gets the first rollout to complete, not the first row."""
    given = rows(3, {0: HANG})

    async def main() -> list[int]:
        completions = RolloutCollectionHelper().run_examples(given, head_server_config=head(fake))
        handed = list(completions)
        assert len(handed) == 3
        got = [task(await handed[0]), task(await handed[2])]
        await completions.aclose()
        with pytest.raises(asyncio.CancelledError):
            await handed[1]  # claimed nothing before the close
        return got

    assert sorted(run(main)) == [1, 2]


def test_a_failed_run_raises_unless_routed_to_the_sidecar(fake: FakeUrls) -> None:
    """route_failures_to_sidecar=False (NeMo Gym's default): the failed row's awaitable raises;
    the others still resolve. True: the pair's result is the typed failure row."""
    given = rows(3, {1: FAIL})
    helper = RolloutCollectionHelper(config=CONFIG)

    async def main(route: bool) -> tuple[list[int], list[BaseException]]:
        completions = helper.run_examples(
            given, head_server_config=head(fake), route_failures_to_sidecar=route
        )
        ok: list[int] = []
        errors: list[BaseException] = []
        for future in completions:
            try:
                row, result = await future
                ok.append(row["_ng_task_index"])
                if row["_ng_task_index"] == 1:
                    assert result["_ng_failure_class"] == constants.AGENT_RUN_ERROR_FAILURE_CLASS
                    assert result["_ng_failure_http_status"] == 500
            except RolloutRequestError as exc:
                errors.append(exc)
        return sorted(ok), errors

    ok, errors = run(lambda: main(False))
    assert ok == [0, 2]
    assert [e.row["_ng_task_index"] for e in errors] == [1]  # type: ignore[attr-defined]
    ok, errors = run(lambda: main(True))
    assert (ok, errors) == ([0, 1, 2], [])


def test_rows_the_budget_never_started_resolve_to_the_drained_result(fake: FakeUrls) -> None:
    """dispatch_budget_s=0 starts nothing: every row resolves to NeMo Gym's drained result."""
    given = rows(2)
    before = runs_total(fake)

    async def main() -> list[tuple[dict[str, Any], Any]]:
        completions = RolloutCollectionHelper().run_examples(
            given, head_server_config=head(fake), dispatch_budget_s=0
        )
        return [await future for future in completions]

    pairs = run(main)
    assert sorted(map(task, pairs)) == [0, 1]
    for _, result in pairs:
        assert result["_ng_failure_class"] == "cancelled"
        assert result["_ng_dispatch_drained"] is True
        assert result["_ng_no_persist"] is True
    assert runs_total(fake) == before


# --- closing -----------------------------------------------------------------------------------


def test_aclose_before_first_use_starts_nothing(fake: FakeUrls) -> None:
    before = runs_total(fake)

    async def main() -> list[Any]:
        helper = RolloutCollectionHelper()
        completions = helper.run_examples(rows(2), head_server_config=head(fake))
        await completions.aclose()
        await completions.aclose()  # again: nothing
        drained = helper.run_examples(rows(2), head_server_config=head(fake))
        return [await drained.aclose_and_drain(), list(completions), list(drained)]

    assert run(main) == [[], [], []]
    assert runs_total(fake) == before


def test_aclose_and_drain_partitions_the_rows(fake: FakeUrls, tmp_path: Path) -> None:
    """Taken, drained and interrupted rollouts are the rows, each once; drained futures hold
    pairs (a failed row's raises its error); a second drain and a drain after aclose are []."""
    given = rows(6, {4: HANG, 5: HANG, 3: FAIL})
    helper = RolloutCollectionHelper(config=CONFIG)

    async def main() -> tuple[list[int], list[int], list[int], list[Any]]:
        completions = helper.run_examples(
            given,
            head_server_config=head(fake),
            record_output_dir=tmp_path,
            record_shard="d",
            record_omitted_rollouts=True,
        )
        taken = []
        try:
            taken.append(task(await next(completions)))
        except RolloutRequestError as exc:
            taken.append(exc.row["_ng_task_index"])  # type: ignore[arg-type]
        drained: list[int] = []
        failed: list[int] = []
        for future in await completions.aclose_and_drain():
            assert future.done()
            try:
                drained.append(task(await future))
            except RolloutRequestError as exc:
                failed.append(exc.row["_ng_task_index"])  # type: ignore[arg-type]
        again = [await completions.aclose_and_drain(), list(completions)]
        return taken, drained, failed, again

    taken, drained, failed, again = run(main)
    assert again == [[], []]
    sidecar = read_jsonl(tmp_path / "rollouts-d_failures.jsonl")
    cut = sorted(r["_ng_task_index"] for r in sidecar if r.get("_ng_omitted_rollout"))
    assert {4, 5} <= set(cut)
    assert sorted(taken + drained + failed + cut) == list(range(6)), (taken, drained, failed, cut)


# --- run_outcomes, reuse_server_client, options ---------------------------------------------------


def test_run_outcomes_stamps_a_run_and_returns_typed_records(fake: FakeUrls) -> None:
    given = rows(2, {1: FAIL})
    snapshot = [dict(r) for r in given]

    async def main() -> list[tuple[dict[str, Any], Any]]:
        completions = RolloutCollectionHelper(config=CONFIG).run_outcomes(
            given, head_server_config=head(fake), run_id="rl-7"
        )
        return [await future for future in completions]

    by_task = {task(pair): pair for pair in run(main)}
    assert given == snapshot  # copies are returned; inputs untouched
    assert {row["_ng_run_id"] for row, _ in by_task.values()} == {"rl-7"}
    assert by_task[0][0]["_ng_rollout_id"] == "rl-7-0-0"
    assert isinstance(by_task[0][1], dict)
    assert isinstance(by_task[1][1], trollout.Failed)
    assert by_task[1][1].http_status == 500


def test_reuse_server_client_fetches_the_config_once(fake: FakeUrls) -> None:
    def config_fetches() -> int:
        stats = httpx.get(fake.head_url + "/_fake/stats", timeout=30).json()
        return int(stats["by_path"].get("/global_config_dict_yaml", 0))

    async def twice(helper: RolloutCollectionHelper) -> None:
        for _ in range(2):
            completions = helper.run_examples(rows(1), head_server_config=head(fake))
            [await future for future in completions]

    before = config_fetches()
    run(lambda: twice(RolloutCollectionHelper(reuse_server_client=True)))
    assert config_fetches() == before + 1
    run(lambda: twice(RolloutCollectionHelper()))
    assert config_fetches() == before + 3


def test_the_constants_are_nemo_gyms_and_trollouts() -> None:
    """The reference's constants agree with trollout's own names for the same keys."""
    assert constants.NG_OMITTED_ROLLOUT_KEY == records.OMITTED
    assert constants.NG_ENVIRONMENT_SERVER_KEY == records.ENVIRONMENT_SERVER
    assert constants.NG_TASK_ID_KEY == records.TASK_ID
    assert constants.NG_TERMINAL_KEY == records.FAILURE_TERMINAL
    assert constants.NG_FAILURE_MAX_ATTEMPTS_KEY == records.FAILURE_MAX_ATTEMPTS
    assert constants.NG_POLICY_MODEL_SERVER_KEY == records.POLICY_MODEL_SERVER
    assert constants.NG_RESULT_TYPE_KEY == records.RESULT_TYPE
    assert constants.PROVENANCE_KEYS == records.PROVENANCE_KEYS
    assert constants.NG_ELAPSED_KEY == records.ELAPSED
    assert constants.STATUS_FAILURE_KIND_KEY == records.FAILURE_KIND
    assert constants.NG_FAILURE_REPORT_KEYS == (
        records.FAILURE_EVENTS,
        records.FAILURE_ID,
        records.FAILURE_EVENTS_OMITTED,
    )
    assert (
        records.FailureClass.AGENT_REQUEST_FAILED.value
        == constants.AGENT_REQUEST_FAILED_FAILURE_CLASS
    )
    assert records.FailureClass.AGENT_RUN_ERROR.value == constants.AGENT_RUN_ERROR_FAILURE_CLASS
    assert (
        records.FailureClass.ENVIRONMENT_SERVER_FAILED.value
        == constants.ENVIRONMENT_SERVER_FAILURE_CLASS
    )
    assert constants.TASK_INDEX_KEY == records.TASK_INDEX
    assert constants.ROLLOUT_INDEX_KEY == records.ROLLOUT_INDEX
    assert constants.RUN_ID_KEY == records.RUN_ID
