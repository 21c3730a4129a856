"""``+materialized_jsonl_fpath`` anywhere: the inputs are written there, and the run stays whole.

NeMo Gym's key names where the materialized inputs go (`settings.derived`). A run given another
folder for them collects, and is resumed (``trollout resume``, and NeMo Gym's
``+resume_from_cache=true`` without the key), shown and aggregated with no option of their own:
the manifest records the place (`recovery.layout`). The run-folder checks hold for the file
(`recovery.preflight`). Everything goes through the real CLI against the bundled fake (in its
own process, following a fault script), with real files.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from click.testing import Result

from builders import invoke, read_jsonl
from trollout import jsonl
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

TASKS = 6
FAILING = range(3, TASKS)  # these tasks' first attempts fail while the run is first collected


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("faults") / "faults.jsonl"
    write_fault_script(path, {})
    return path


@pytest.fixture(scope="module")
def fake(script: Path) -> Iterator[FakeUrls]:
    with spawn_fake_deployment(
        DeploymentSpec(agents=(AgentSpec(name="math_agent"),)), fault_script=script
    ) as urls:
        yield urls


@pytest.fixture
def paths(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The input, the output and the materialized inputs in a folder of their own."""
    source = tmp_path / "data" / "in.jsonl"
    source.parent.mkdir()
    source.write_bytes(b"".join(jsonl.dumps(row) for row in task_rows(TASKS, seed=4)))
    (tmp_path / "inputs").mkdir()
    return source, tmp_path / "out" / "r.jsonl", tmp_path / "inputs" / "planned.jsonl"


def collect(fake: FakeUrls, source: Path, out: Path, *extra: str) -> Result:
    return invoke(
        "collect", str(source), "-o", str(out), "--agent", "math_agent",
        "--agent-url", f"math_agent={fake.run_urls['math_agent']}", "--progress", "plain", *extra,
    )  # fmt: skip


def test_inputs_elsewhere_collect_resume_and_aggregate(
    fake: FakeUrls, script: Path, paths: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    source, out, inputs = paths
    fail = Fault(kind=FaultKind.STATUS, status=500)
    write_fault_script(script, {(None, task, 0, 0, 0): fail for task in FAILING})
    try:
        first = collect(fake, source, out, f"+materialized_jsonl_fpath={inputs}")
    finally:
        write_fault_script(script, {})
    assert first.exit_code != 2, first.output
    assert len(read_jsonl(inputs)) == TASKS
    assert not (out.parent / "r_materialized_inputs.jsonl").exists()
    manifest = orjson.loads(RunLayout.for_output(out).manifest.read_bytes())
    assert manifest["settings"]["materialized_jsonl_fpath"] == str(inputs)
    assert RunLayout.for_output(out).materialized_inputs == inputs
    landed = {row["_ng_task_index"] for row in read_jsonl(out)}
    assert landed == set(range(TASKS)) - set(FAILING)

    shown = invoke("status", str(out), "--json")
    assert shown.exit_code == 0, shown.output
    doc = orjson.loads(shown.output)
    assert (doc["expected"], doc["to_dispatch"]) == (TASKS, len(FAILING))

    resumed = invoke("resume", str(out), "--progress", "plain")
    assert resumed.exit_code == 0, resumed.output
    assert f"dispatched {len(FAILING)}" in resumed.output
    assert {row["_ng_task_index"] for row in read_jsonl(out)} == set(range(TASKS))
    assert_exactly_once(out)

    again = collect(fake, source, out, "+resume_from_cache=true")  # the key read from the manifest
    assert again.exit_code == 0, again.output
    assert "dispatched 0" in again.output

    merged = tmp_path / "merged" / "all.jsonl"
    aggregated = invoke("aggregate", str(out), "-o", str(merged))
    assert aggregated.exit_code == 0, aggregated.output
    assert f"Metrics cover: {TASKS} of {TASKS} rollouts" in aggregated.output


def test_a_resume_naming_another_place_for_the_inputs_is_refused(
    fake: FakeUrls, paths: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    source, out, inputs = paths
    assert collect(fake, source, out, f"+materialized_jsonl_fpath={inputs}").exit_code == 0
    held = out.read_bytes()
    other = tmp_path / "inputs" / "other.jsonl"
    result = collect(
        fake, source, out, "+resume_from_cache=true", f"+materialized_jsonl_fpath={other}"
    )
    assert result.exit_code == 2, result.output
    assert "is not where" in result.output
    assert str(inputs) in result.output
    assert out.read_bytes() == held


@pytest.mark.parametrize(
    "where",
    [
        "link",  # a symlink is never followed
        "output",  # another file of this run
        "other-run",  # a file of another run
        "existing",  # a file that is not the run's, without --overwrite
    ],
)
def test_the_run_folder_checks_hold_for_inputs_elsewhere(
    fake: FakeUrls, paths: tuple[Path, Path, Path], tmp_path: Path, where: str
) -> None:
    source, out, inputs = paths
    target = inputs
    if where == "link":
        victim = tmp_path / "victim.jsonl"
        victim.write_text("keep\n")
        inputs.symlink_to(victim)
    elif where == "output":
        target = out.with_name("r_failures.jsonl")
    elif where == "other-run":
        other = tmp_path / "other" / "o.jsonl"
        assert collect(fake, source, other).exit_code == 0
        target = other
    else:
        inputs.write_text("someone's file\n")
    before = target.read_bytes() if target.exists() else None

    result = collect(fake, source, out, f"+materialized_jsonl_fpath={target}")

    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert "materialized_jsonl_fpath" in result.output or "symlink" in result.output
    assert not out.exists()
    if before is not None:
        assert target.read_bytes() == before
    if where == "link":
        assert (tmp_path / "victim.jsonl").read_text() == "keep\n"


def test_one_file_for_a_run_split_into_parts_is_refused(
    paths: tuple[Path, Path, Path],
) -> None:
    source, out, inputs = paths
    result = invoke(
        "collect", str(source), "-o", str(out), "--agent", "math_agent",
        "--agent-url", "math_agent=http://127.0.0.1:9", "+shard=0/2",
        f"+materialized_jsonl_fpath={inputs}",
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "splits the run into parts" in result.output
    assert not inputs.exists()
