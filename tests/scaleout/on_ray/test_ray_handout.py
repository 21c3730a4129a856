"""Handing a Ray run's blocks out (`scaleout.ray.handout._hand_out`), with a scripted fake of Ray.

`ScriptedBlocks` stands in for `RayBlocks`: every hand-out ends at once, its first item as its
script says (a report, or a dead worker's Ray error), so the queue's rules are checked without
a cluster.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")

from ray.exceptions import WorkerCrashedError

from trollout.collector.engine.progress import Progress
from trollout.recovery.layout import RunLayout
from trollout.scaleout.ray.block import WIND_DOWN, BlockReport
from trollout.scaleout.ray.handout import _MAX_CRASHES, HandoutEnd, RayRun, _hand_out
from trollout.settings import RunConfig

Script = dict[tuple[int, int], "BlockReport | BaseException"]
SIGTERMED = "its worker received SIGTERM"


def finished(block: int, landed: int = 2) -> BlockReport:
    """A hand-out that ran its block to the end."""
    return BlockReport(block, Progress(landed=landed), None, 100 + block)


class ScriptedBlocks:
    """`RayBlocks` whose hand-outs end in start order, each as `script` says (else finished)."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.started: list[tuple[int, int]] = []
        self.stops: list[tuple[int, str]] = []

    def start(
        self, config: RunConfig, key: tuple[int, int], carrier: dict[str, str]
    ) -> tuple[int, int]:
        assert config.output_jsonl_fpath is not None
        assert f"/{key[0]:05d}-of-00003/" in config.output_jsonl_fpath
        assert config.input_jsonl_fpath == config.output_jsonl_fpath.replace(
            "run.jsonl", "run_materialized_inputs.jsonl"
        )
        self.started.append(key)
        return key

    async def wait(self, handles: list[Any]) -> list[Any]:
        return handles[:1]

    async def next(self, handle: tuple[int, int]) -> BlockReport:
        outcome = self.script.get(handle, finished(handle[0]))
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def stop(self, level: int, reason: str) -> None:
        self.stops.append((level, reason))


async def hand_out(tmp_path: Path, script: Script) -> tuple[HandoutEnd, ScriptedBlocks, str]:
    """Hand 3 blocks out over 2 workers; return the end, the fake and what was printed."""
    out = tmp_path / "run.jsonl"
    config = RunConfig(output_jsonl_fpath=str(out), ray_blocks=3, ray_workers=2)
    run = RayRun(RunLayout.for_output(out), config, expected=12, to_dispatch=12)
    blocks, end, lines = ScriptedBlocks(script), HandoutEnd(), []
    await _hand_out(run, blocks, end, lines.append)  # type: ignore[arg-type]
    return end, blocks, "\n".join(lines)


async def test_hand_out_gives_a_block_stopped_by_its_own_worker_out_again(tmp_path: Path) -> None:
    """A block whose worker got SIGTERM (not the driver) ended early: it is handed out again,
    and the run goes on to every block's end."""
    stopped = BlockReport(1, Progress(landed=1), SIGTERMED, 101)
    end, blocks, printed = await hand_out(tmp_path, {(1, 1): stopped})
    assert blocks.started == [(0, 1), (1, 1), (2, 1), (1, 2)]
    assert end.error is None
    assert not end.stopping
    assert blocks.stops == []
    assert end.deaths == [f"block 1: {SIGTERMED}"]
    assert f"block 1 stopped before its end ({SIGTERMED}); handing it to another" in printed
    assert sorted(end.reports) == [(0, 1), (1, 1), (1, 2), (2, 1)]


async def test_hand_out_keeps_a_block_the_driver_stopped(tmp_path: Path) -> None:
    """Block 0 fails, so the driver stops: block 1, wound down by it, is not handed out again."""
    failed = BlockReport(0, Progress(), "an error", 100, error="boom")
    wound_down = BlockReport(1, Progress(landed=1), "the driver: another block failed", 101)
    end, blocks, printed = await hand_out(tmp_path, {(0, 1): failed, (1, 1): wound_down})
    assert blocks.started == [(0, 1), (1, 1)]
    assert end.error == ("block 0: boom", False)
    assert end.deaths == []
    assert "handing it to another" not in printed
    assert end.reports[(1, 1)].progress.landed == 1


async def test_hand_out_ends_the_run_after_max_crashes_of_one_block(tmp_path: Path) -> None:
    """Block 0 lost 3 times (dead workers, a SIGTERM): the run ends with one error naming the
    block; the other blocks' reports (what landed) are kept, and nothing more is handed out."""
    assert _MAX_CRASHES == 3
    lost = BlockReport(0, Progress(landed=1), SIGTERMED, 100)
    script: Script = {(0, 1): WorkerCrashedError(), (0, 2): lost, (0, 3): WorkerCrashedError()}
    end, blocks, printed = await hand_out(tmp_path, script)
    assert blocks.started == [(0, 1), (1, 1), (0, 2), (2, 1), (0, 3)]
    assert end.error is not None
    message, usage = end.error
    assert not usage
    assert message.startswith("block 0 did not finish in 3 hand-outs")
    assert "WorkerCrashedError" in message
    assert end.stopping
    assert blocks.stops == [(WIND_DOWN, "another block failed")]
    assert {key: r.progress.landed for key, r in end.reports.items()} == {
        (1, 1): 2,
        (0, 2): 1,
        (2, 1): 2,
    }
    assert printed.count("handing it to another") == 3
