"""The rows a run folder dispatches: read back from its materialized-inputs file."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import attrs
import orjson
import pytest
import trio
from attrs import frozen

from builders import served_block
from trollout.collector.deployment.discovery import Deployment
from trollout.collector.planning.plan import Plan, plan_rollouts
from trollout.errors import InputError
from trollout.records import MaterializedRow
from trollout.recovery.layout import RunLayout
from trollout.recovery.run_folder import _materialized, open_run_folder
from trollout.settings import RunConfig


def test_rows_keep_their_line_so_the_first_attempt_is_not_serialized_again(
    tmp_path: Path,
) -> None:
    """Each row read back carries its line as read (blank lines skipped, whitespace kept)."""
    layout = RunLayout.for_output(tmp_path / "r.jsonl")
    lines = [
        b'{"_ng_task_index": 0, "_ng_rollout_index": 0, "agent_ref": {"name": "a"}}',
        b'{"_ng_task_index":1,"_ng_rollout_index":0,"agent_ref":{"name":"a"}}',
    ]
    layout.materialized_inputs.write_bytes(lines[0] + b"\n\n" + lines[1] + b"\n")
    rows = list(_materialized(layout, {}))
    assert [row.raw for row in rows] == lines
    assert [row.body for row in rows] == [orjson.loads(line) for line in lines]
    assert [row.identity.task_index for row in rows] == [0, 1]


# --- a new run's rows must be the plan's, read from the input it was planned from -----------

DEPLOYMENT = Deployment.from_agent_urls({"a": "http://127.0.0.1:1"})
ROW = b'{"responses_create_params": {"input": "q%d"}, "agent_ref": {"name": "a"}}\n'


@frozen
class _Rows:
    """A RowSource that passes a plan's rows on, then runs ``after`` (or counts ``expected``)."""

    plan: Plan
    after: Callable[[], None] = lambda: None
    at_end: Callable[[], None] = lambda: None
    expected_shift: int = 0

    @property
    def tasks(self) -> int:
        return self.plan.tasks

    @property
    def expected(self) -> int:
        return self.plan.expected + self.expected_shift

    def rows(self) -> Iterator[MaterializedRow]:
        for number, row in enumerate(self.plan.rows()):
            yield row
            if number == 0:
                self.after()
        self.at_end()


def _start(tmp_path: Path, make: Callable[[Plan, Path], _Rows]) -> tuple[str, list[str]]:
    """Start a run of a 3-row input through `make`'s source; return the error and the folder."""
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"".join(ROW % i for i in range(3)))
    out = tmp_path / "run" / "r.jsonl"
    config = RunConfig(input_jsonl_fpath=str(source), output_jsonl_fpath=str(out))
    rows = make(plan_rollouts(source, config, DEPLOYMENT), source)

    async def main() -> None:
        async with open_run_folder(config, DEPLOYMENT, plan=rows):
            raise AssertionError("the run started")

    with pytest.raises(InputError) as info:
        trio.run(main)
    return str(info.value), sorted(p.name for p in out.parent.iterdir())


def _append(path: Path) -> Callable[[], None]:
    def append() -> None:
        with open(path, "ab") as f:
            f.write(ROW % 1)  # a copy of a planned row: one rollout more, same task

    return append


def test_input_appended_while_materializing_commits_nothing(tmp_path: Path) -> None:
    """A line appended during the materialization pass: refused, no inputs, no manifest."""
    error, left = _start(tmp_path, lambda plan, source: _Rows(plan, _append(source)))
    assert error.endswith("in.jsonl: the input file changed while it was read; plan the run again")
    assert "r_materialized_inputs.jsonl" not in left
    assert "r_manifest.json" not in left


def test_materialized_count_differing_from_the_plan_commits_nothing(tmp_path: Path) -> None:
    """Rows that do not number what the plan said (however that came about) are refused."""
    error, left = _start(tmp_path, lambda plan, _: _Rows(plan, expected_shift=-1))
    assert error == (
        "the rows to materialize numbered 3 but the plan has 2 rollouts; the input changed "
        "while it was read; plan the run again"
    )
    assert "r_materialized_inputs.jsonl" not in left
    assert "r_manifest.json" not in left


def test_input_changed_after_the_pass_ends_commits_nothing(tmp_path: Path) -> None:
    """A change after the last row was read, before the manifest hashes the input: refused,
    so the manifest's hash is always of the input that was planned."""
    error, left = _start(tmp_path, lambda plan, source: _Rows(plan, at_end=_append(source)))
    assert error.endswith(
        "in.jsonl: the input file changed while the run was being started; plan the run again"
    )
    assert "r_materialized_inputs.jsonl" not in left
    assert "r_manifest.json" not in left


async def test_input_sha256_refuses_a_fifo_without_opening_it(tmp_path: Path) -> None:
    """The input's digest (resume, and the Ray driver's resume) checks the file is regular
    before opening it: opening a FIFO would block until a writer came."""
    import os

    from trollout.recovery.run_folder import input_sha256

    fifo = tmp_path / "in.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match=r"in\.jsonl"):
        await input_sha256(str(fifo))
    plain = tmp_path / "plain.jsonl"
    plain.write_bytes(b'{"a": 1}\n')
    assert len(await input_sha256(str(plain))) == 64


# --- the rows come with their model server: the identity is built once per rollout ------------


def _deployment_with_model_server() -> Deployment:
    return Deployment.from_config(
        {
            "m": served_block("responses_api_models", 1),
            "a": served_block("responses_api_agents", 2, model_server="m"),
            "b": served_block("responses_api_agents", 3),
        }
    )


def test_fresh_and_resumed_rows_carry_their_agents_model_server(tmp_path: Path) -> None:
    """Rows read back for a fresh run and for a resume name their agent's model server (as
    the engine would stamp it); an agent without one gets none."""
    source = tmp_path / "in.jsonl"
    source.write_bytes(
        b"".join(ROW % i for i in range(2)) + b'{"responses_create_params": {"input": "b"}, '
        b'"agent_ref": {"name": "b"}}\n'
    )
    out = tmp_path / "run" / "r.jsonl"
    deployment = _deployment_with_model_server()
    config = RunConfig(input_jsonl_fpath=str(source), output_jsonl_fpath=str(out))
    plan = plan_rollouts(source, config, deployment)
    seen: dict[str, list[tuple[str | None, str | None]]] = {}

    def servers(rows: Iterable[tuple[MaterializedRow, int]]) -> list[tuple[str | None, str | None]]:
        return [(r.identity.agent_name, r.identity.policy_model_server) for r, _ in rows]

    async def main() -> None:
        async with open_run_folder(config, deployment, plan=plan) as run:
            seen["fresh"] = servers(run.rows())
        resume = attrs.evolve(config, resume_from_cache=True)
        async with open_run_folder(resume, deployment) as run:
            seen["resumed"] = servers(run.rows())

    trio.run(main)
    expected = [("a", "m"), ("a", "m"), ("b", None)]
    assert seen == {"fresh": expected, "resumed": expected}
