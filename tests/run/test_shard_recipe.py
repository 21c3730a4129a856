"""NeMo Gym's shard-resume recipe, run with ``trollout collect``, on shards the front ends record.

NeMo Gym resumes a shard with ``gym eval run
+input_jsonl_fpath=D/rollouts-L_materialized_inputs.jsonl +output_jsonl_fpath=D/rollouts-L.jsonl
+resume_from_cache=true``: the shard's manifest is the one
that recipe computes, so it runs only what the shard still lacks (`run.shards`). Each test records
a shard for real (12 rollouts: 6 tasks, ``num_repeats`` 2, routed by ``agent_map`` to two agents),
cuts the batch part-way so some rows never run, and then runs the recipe through the real CLI
against the same fake deployment (in its own process), with real files.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

import trollout
import trollout.aio
import trollout.nemo_gym
from builders import invoke, read_jsonl
from trollout.recovery.layout import RunLayout
from trollout.testing import (
    AgentSpec,
    DeploymentSpec,
    FakeUrls,
    Fault,
    FaultKind,
    assert_exactly_once,
    spawn_fake_deployment,
    task_rows,
    write_fault_script,
)

TASKS, REPEATS = 6, 2
ROLLOUTS = TASKS * REPEATS
ANSWERED_TASKS = 3  # tasks 0-2 answer while the shard is recorded; the others hang
CUT = 5  # outcomes taken before the batch is left
AGENT_MAP = {"math": "math_agent", "code": "code_agent"}
SPEC = DeploymentSpec(agents=(AgentSpec(name="math_agent"), AgentSpec(name="code_agent")))
CONFIG = trollout.RunConfig(agent_map=AGENT_MAP, num_repeats=REPEATS, num_samples_in_parallel=2)


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fault script the fake follows (`served` writes it, `heal` empties it)."""
    path = tmp_path_factory.mktemp("faults") / "faults.jsonl"
    write_fault_script(path, {})
    return path


@pytest.fixture(scope="module")
def fake(script: Path) -> Iterator[FakeUrls]:
    """The fake with two agents, in its own process (the CLI runs Trio in the test's thread)."""
    with spawn_fake_deployment(SPEC, fault_script=script) as urls:
        yield urls


@pytest.fixture
def served(fake: FakeUrls, script: Path) -> Iterator[FakeUrls]:
    """The fake, where the first attempt of tasks `ANSWERED_TASKS` and later never answers
    while a test records its shard (so the cut leaves rows that never ran, whatever the
    machine's speed); a test that resumes heals it first."""
    hang = Fault(kind=FaultKind.HANG)
    late = range(ANSWERED_TASKS, TASKS)
    write_fault_script(script, {(None, t, r, 0, 0): hang for t in late for r in range(REPEATS)})
    yield fake
    write_fault_script(script, {})


def heal(script: Path) -> None:
    """Every request is answered from now on."""
    write_fault_script(script, {})


def dataset() -> list[dict[str, Any]]:
    """Six tasks naming agents by the aliases `AGENT_MAP` routes."""
    rows = list(task_rows(TASKS, seed=11))
    for index, row in enumerate(rows):
        row["agent_ref"] = {"name": "math" if index % 2 else "code"}
    return rows


def record_cut_shard(fake: FakeUrls, folder: Path, label: str) -> Path:
    """Record shard ``label`` with the asyncio front end, leaving the batch after `CUT`."""

    async def main() -> None:
        async with (
            trollout.aio.open_rollouts(
                fake.run_urls, config=CONFIG, record_output_dir=folder
            ) as ro,
            ro.open_batch(ro.plan(dataset()), record_shard=label) as batch,
        ):
            seen = 0
            async for _ in batch:
                seen += 1
                if seen == CUT:
                    break

    asyncio.run(main())
    return folder / f"rollouts-{label}.jsonl"


def record_cut_shard_nemo_gym(fake: FakeUrls, folder: Path, label: str) -> Path:
    """Record shard ``label`` with the NeMo Gym drop-in, ``aclose()`` after `CUT` results."""

    async def main() -> None:
        helper = trollout.nemo_gym.RolloutCollectionHelper()
        rows = helper.preprocess_examples(dataset(), agent_map=AGENT_MAP, num_repeats=REPEATS)
        url = httpx.URL(fake.head_url)
        assert url.port is not None
        completions = helper.run_examples(
            rows,
            head_server_config=trollout.nemo_gym.BaseServerConfig(host=url.host, port=url.port),
            semaphore=asyncio.Semaphore(2),
            record_output_dir=folder,
            record_shard=label,
        )
        try:
            for seen, future in enumerate(completions, 1):
                await future
                if seen == CUT:
                    break
        finally:
            await completions.aclose()

    asyncio.run(main())
    return folder / f"rollouts-{label}.jsonl"


def keys(rows: list[dict[str, Any]]) -> set[tuple[int, int]]:
    return {(r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows}


def requests(fake: FakeUrls, run_id: str) -> list[dict[str, Any]]:
    log: list[dict[str, Any]] = httpx.get(fake.head_url + "/_fake/requests", timeout=30).json()
    return [entry for entry in log if entry["run_id"] == run_id]


def deployment_args(fake: FakeUrls, output: Path) -> list[str]:
    """The deployment the shard was recorded against, as the command line gives it."""
    manifest = orjson.loads(RunLayout.for_output(output).manifest.read_bytes())
    if manifest["settings"]["head_server"]:
        return ["--head-server", fake.head_url]
    return [a for name, url in fake.run_urls.items() for a in ("--agent-url", f"{name}={url}")]


def recipe(fake: FakeUrls, output: Path, *extra: str) -> Any:
    """NeMo Gym's shard-resume recipe, through ``trollout collect``."""
    inputs = RunLayout.for_output(output).materialized_inputs
    return invoke(
        "collect",
        *deployment_args(fake, output),
        f"+input_jsonl_fpath={inputs}",
        f"+output_jsonl_fpath={output}",
        "+resume_from_cache=true",
        "--progress",
        "plain",
        *extra,
    )


@pytest.mark.parametrize("front_end", [record_cut_shard, record_cut_shard_nemo_gym])
def test_the_recipe_runs_only_what_a_cut_shard_lacks(
    served: FakeUrls, script: Path, tmp_path: Path, front_end: Any
) -> None:
    output = front_end(served, tmp_path, "step-3")
    layout = RunLayout.for_output(output)
    planned = keys(read_jsonl(layout.materialized_inputs))
    assert len(planned) == ROLLOUTS
    agents = {r["agent_ref"]["name"] for r in read_jsonl(layout.materialized_inputs)}
    assert agents == {"math_agent", "code_agent"}
    landed = keys(read_jsonl(output))
    missing = planned - landed
    assert missing  # the cut left rows without an outcome
    run_id = orjson.loads(layout.manifest.read_bytes())["run_id"]
    before = len(requests(served, run_id))
    heal(script)

    result = recipe(served, output)

    assert result.exit_code == 0, result.output
    sent = [(e["task_index"], e["rollout_index"]) for e in requests(served, run_id)[before:]]
    assert sorted(sent) == sorted(missing)  # only the missing rollouts, each once
    assert keys(read_jsonl(output)) == planned
    assert_exactly_once(output, requests=requests(served, run_id))
    merged = tmp_path / "merged" / "all.jsonl"
    aggregated = invoke("aggregate", str(output), "-o", str(merged))
    assert aggregated.exit_code == 0, aggregated.output
    assert f"Metrics cover: {ROLLOUTS} of {ROLLOUTS} rollouts" in aggregated.output
    assert len(read_jsonl(merged)) == ROLLOUTS


def test_the_recipe_refuses_a_changed_materialized_file(served: FakeUrls, tmp_path: Path) -> None:
    output = record_cut_shard(served, tmp_path, "step-4")
    inputs = RunLayout.for_output(output).materialized_inputs
    rows = read_jsonl(inputs)
    rows[-1]["expected_answer"] = "changed"
    inputs.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    held = output.read_bytes()

    result = recipe(served, output)

    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert "changed since the run began" in result.output
    assert "settings changed" not in result.output  # the file is what changed, nothing else
    assert output.read_bytes() == held


def test_the_recipe_refuses_another_plan_over_the_shards_rows(
    served: FakeUrls, tmp_path: Path
) -> None:
    """The recipe with ``+num_repeats=4`` asks for another plan: refused, not run as recorded."""
    output = record_cut_shard(served, tmp_path, "step-5")
    held = output.read_bytes()

    result = recipe(served, output, "+num_repeats=4")

    assert result.exit_code == 2, result.output
    assert "settings changed: num_repeats 1 -> 4" in result.output
    assert output.read_bytes() == held
