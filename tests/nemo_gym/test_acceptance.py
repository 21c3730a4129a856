"""Issue 25's first acceptance item: a NeMo Gym driver runs on trollout by its imports alone.

`nemo_gym_driver.drive` is written against NeMo Gym 0.7.0's API; it runs here through
`trollout.nemo_gym` against the bundled fake (its own process, real loopback): preprocessing
with ``agent_map`` and ``num_repeats``, a cut with ``aclose()``, ``aclose_and_drain()``,
``run_outcomes`` with a run id, and a recorded shard, which NeMo Gym's shard-resume recipe
(``+input_jsonl_fpath=<shard's materialized inputs> +output_jsonl_fpath=<shard>
+resume_from_cache=true``, given to ``trollout collect`` in a real subprocess) then completes.
The auditor confirms every accepted rollout settled once, against the files and the fake's own
request log.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from nemo_gym_driver import drive

from builders import HANG_GUARD_S, cli_command
from trollout import Failed
from trollout.testing import FakeUrls, assert_exactly_once, task_rows

HANG_FIRST_TRY = {"kind": "hang", "attempts": [0]}  # hangs attempt 0; a resume's attempt lands


def examples() -> list[dict[str, Any]]:
    """4 dataset rows for the dataset's agent name; tasks 2 and 3 hang on their first try."""
    rows = [{**row, "agent_ref": {"name": "dataset_agent"}} for row in task_rows(4, seed=5)]
    for i in (2, 3):
        rows[i]["fake_fault"] = HANG_FIRST_TRY
    return rows


def keys(pairs: list[tuple[dict[str, Any], Any]]) -> list[tuple[int, int]]:
    return sorted((row["_ng_task_index"], row["_ng_rollout_index"]) for row, _ in pairs)


def test_a_nemo_gym_driver_runs_unchanged_but_for_its_imports(
    fake: FakeUrls, tmp_path: Path
) -> None:
    head = urlsplit(fake.head_url)
    assert head.hostname is not None
    assert head.port is not None
    seen = asyncio.run(drive(examples(), head.hostname, head.port, str(tmp_path)))

    rows = seen["rows"]
    assert len(rows) == 8  # 4 tasks x num_repeats 2, routed by agent_map
    assert {row["agent_ref"]["name"] for row in rows} == {"math_agent"}
    landing = {(t, r) for t in (0, 1) for r in (0, 1)}

    # aclose after a break: two pairs, both rollouts that finished.
    assert len(seen["cut"]) == 2
    assert set(keys(seen["cut"])) <= landing
    assert all(result["reward"] in (0.0, 1.0) for _, result in seen["cut"])

    # aclose_and_drain: what was taken and kept are finished rollouts, each once; once only.
    drain = seen["drain"]
    taken = [drain["first"], *drain["kept"]]
    assert set(keys(taken)) <= landing
    assert len(set(keys(taken))) == len(taken)
    assert drain["again"] == []

    # run_outcomes with a run id: the rows name it, the results are the replies.
    outcomes = seen["outcomes"]
    assert keys(outcomes) == sorted(landing)
    assert {row["_ng_run_id"] for row, _ in outcomes} == {"step-3"}
    assert all(row["_ng_rollout_id"].startswith("step-3-") for row, _ in outcomes)
    assert all(isinstance(result, dict) and "reward" in result for _, result in outcomes)

    # The recorded step: four landed, four cut; NeMo Gym's shard-resume recipe, given to
    # trollout collect, runs exactly those four.
    assert keys(seen["recorded"]) == sorted(landing)
    shard = tmp_path / "rollouts-step-4.jsonl"
    assert len(shard.read_text().splitlines()) == 4
    recipe = [
        f"+input_jsonl_fpath={tmp_path / 'rollouts-step-4_materialized_inputs.jsonl'}",
        f"+output_jsonl_fpath={shard}",
        "+resume_from_cache=true",
    ]
    resume = subprocess.run(
        cli_command("collect", "--head-server", fake.head_url, *recipe, "--no-aggregate"),
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert resume.returncode == 0, resume.stderr
    assert len(shard.read_text().splitlines()) == 8

    requests = httpx.get(fake.head_url + "/_fake/requests", timeout=30).json()
    (report,) = assert_exactly_once(tmp_path, requests=requests)
    assert (report.expected, report.landed, report.unfinished) == (8, 8, 0)
    assert report.requests == 12  # 8 on the first try (4 cut), 4 on the resume's


def test_the_outcome_records_are_trollouts(fake: FakeUrls) -> None:
    """run_outcomes hands a failed rollout back as a typed record, never as an exception."""
    from trollout.nemo_gym import RolloutCollectionHelper

    head = urlsplit(fake.head_url)
    helper = RolloutCollectionHelper()
    rows = helper.preprocess_examples(examples()[:2], agent_map={"dataset_agent": "math_agent"})
    rows[1]["fake_fault"] = {"kind": "status", "status": 500, "body": "boom"}

    async def run() -> list[Any]:
        from trollout.nemo_gym import BaseServerConfig

        config = BaseServerConfig(host=head.hostname or "", port=head.port or 0)
        completions = helper.run_outcomes(rows, head_server_config=config)
        return [await future for future in completions]

    results = {row["_ng_task_index"]: type(result) for row, result in asyncio.run(run())}
    assert results[0] is dict
    assert results[1] is Failed
