"""Handing a Ray run's blocks out: the queue, the watchers, the summed progress.

`drive` runs beside the driver's watchers in one nursery: it keeps at most N blocks in flight
(`ray_block.run_block` tasks), gives the next block to whichever worker frees up first, puts the
block of a worker that died back at the front of the queue (`_MAX_CRASHES` deaths of one block
end the run), and stops handing out on the first SIGINT or SIGTERM, on ``--max-run-time``, or
when a block fails, raising the `ray_block.Control` actor's stop level so the running blocks
wind down (a second SIGINT: cancel them). `Reporter` prints the progress of every hand-out,
summed (`total_progress`): a block's report when it ended, else its last snapshot.

`ray.wait` and `ray.get` block, so they run in worker threads, ``ray.wait`` with a short
timeout (`_WAIT_S`) so the loop stays cancellable.
"""

from __future__ import annotations

import signal
import threading
from collections import Counter, deque
from collections.abc import Callable
from functools import partial
from typing import IO, Any, Final

import attrs
import ray
import trio
from ray.exceptions import RayError, RayTaskError
from rich.console import Console
from rich.live import Live
from rich.text import Text

from ..collector.deployment import Deployment
from ..collector.progress import Progress
from ..config import RunConfig
from ..recovery.layout import RunLayout
from ..scaleout.layout import shard_output
from .progress import progress_line
from .ray_block import CANCEL, WIND_DOWN, BlockReport, Control, run_block

__all__ = ["HandoutEnd", "RayRun", "Reporter", "drive", "total_progress"]

_MAX_CRASHES: Final = 3  # hand-outs of one block that may die before the run gives up
_WAIT_S: Final = 0.25  # how long one ray.wait blocks a worker thread


@attrs.frozen
class RayRun:
    """A prepared distributed run: its folder, settings (workers and blocks fixed), sizes."""

    layout: RunLayout
    config: RunConfig
    expected: int
    to_dispatch: int

    @property
    def blocks(self) -> int:
        """B, the number of blocks (saved in the manifest)."""
        assert self.config.ray_blocks is not None
        return self.config.ray_blocks

    @property
    def workers(self) -> int:
        """N, the blocks in flight at once."""
        assert self.config.ray_workers is not None
        return self.config.ray_workers


@attrs.define
class HandoutEnd:
    """How the hand-outs ended, and what every hand-out reported."""

    signal: int | None = None
    deadline_reached: bool = False
    stopping: bool = False
    error: tuple[str, bool] | None = None  # (message, usage error)
    reports: dict[tuple[int, int], BlockReport] = attrs.field(factory=dict)
    deaths: list[str] = attrs.field(factory=list)
    handouts: int = 0


def _block_config(run: RayRun, block: int) -> RunConfig:
    """Return block ``block``'s own settings: its folder, its shard, resumed if it exists."""
    return attrs.evolve(
        run.config,
        output_jsonl_fpath=str(shard_output(run.layout.output, block, run.blocks)),
        shard=f"{block}/{run.blocks}",
        resume_from_cache=True,
        overwrite=False,
        disable_aggregation=True,
        require_complete=False,
        batch_manifest_fpath=None,
        max_run_time_s=None,
        ray_address=None,
        ray_workers=None,
        ray_blocks=None,
    )


async def drive(
    run: RayRun, deployment: Deployment, live: bool | None, stream: IO[str]
) -> HandoutEnd:
    """Hand the blocks out beside the watchers (signals, deadline, progress)."""
    end = HandoutEnd()
    control = Control.remote()  # type: ignore[attr-defined]
    emit = partial(_emit, stream)
    async with trio.open_nursery() as nursery:
        if _on_main_thread():
            nursery.start_soon(_watch_signals, end, control, run.config.grace_s, emit)
        if run.config.max_run_time_s is not None:
            nursery.start_soon(_watch_deadline, end, control, run.config.max_run_time_s)
        reporter = Reporter(run.to_dispatch, stream, live, control, end)
        nursery.start_soon(reporter.run)
        await _hand_out(run, deployment, control, end, emit)
        nursery.cancel_scope.cancel(reason="every block ended")
    return end


async def _hand_out(
    run: RayRun, deployment: Deployment, control: Any, end: HandoutEnd, emit: Callable[[str], None]
) -> None:
    pending = deque(range(run.blocks))
    running: dict[Any, tuple[int, int]] = {}
    handouts: Counter[int] = Counter()
    deaths: Counter[int] = Counter()
    while pending or running:
        while pending and len(running) < run.workers and not end.stopping:
            block = pending.popleft()
            handouts[block] += 1
            end.handouts += 1
            key = (block, handouts[block])
            config = _block_config(run, block)
            ref = run_block.remote(config, deployment.servers, deployment.head_url, key, control)
            running[ref] = key
        if not running:
            break
        wait = partial(ray.wait, list(running), num_returns=1, timeout=_WAIT_S)
        ready, _ = await trio.to_thread.run_sync(wait)
        for ref in ready:
            key = running.pop(ref)
            died = await _settle(ref, key, end, control)
            if died is not None:
                deaths[key[0]] += 1
                end.deaths.append(f"block {key[0]}: {died}")
                emit(f"trollout: block {key[0]}'s worker died ({died}); handing it to another")
                if deaths[key[0]] >= _MAX_CRASHES:
                    await _fail(
                        end,
                        control,
                        f"block {key[0]}'s workers died {deaths[key[0]]} times ({died})",
                        False,
                    )
                pending.appendleft(key[0])


async def _settle(ref: Any, key: tuple[int, int], end: HandoutEnd, control: Any) -> str | None:
    """Record a finished hand-out; return why its worker died, or None."""
    try:
        report: BlockReport = await trio.to_thread.run_sync(ray.get, ref)
    except RayTaskError as exc:  # a bug in the block: Ray keeps the traceback
        await _fail(end, control, f"block {key[0]} failed: {exc}", False)
        return None
    except RayError as exc:
        return type(exc).__name__
    end.reports[key] = report
    if report.error is not None:
        await _fail(end, control, f"block {key[0]}: {report.error}", report.usage_error)
    return None


async def _fail(end: HandoutEnd, control: Any, message: str, usage: bool) -> None:
    if end.error is None:
        end.error = (message, usage)
    end.stopping = True
    await _stop(control, WIND_DOWN, "another block failed")


async def _stop(control: Any, level: int, reason: str) -> None:
    await trio.to_thread.run_sync(ray.get, control.stop.remote(level, reason))


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _emit(stream: IO[str], text: str) -> None:
    print(text, file=stream, flush=True)


async def _watch_signals(
    end: HandoutEnd, control: Any, grace_s: float, emit: Callable[[str], None]
) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            name = signal.Signals(signum).name
            if end.signal is None:
                end.signal, end.stopping = signum, True
                emit(
                    f"trollout: {name}: handing out no new block; running blocks start no new "
                    f"rollout and get {grace_s:g} s for the rest (SIGINT again to stop at once)"
                )
                await _stop(control, WIND_DOWN, f"the driver received {name}")
            elif signum == signal.SIGINT:
                emit("trollout: second SIGINT: cancelling the rollouts in flight")
                await _stop(control, CANCEL, "the driver received a second SIGINT")


async def _watch_deadline(end: HandoutEnd, control: Any, max_run_time_s: float) -> None:
    await trio.sleep(max_run_time_s)
    end.deadline_reached, end.stopping = True, True
    await _stop(control, WIND_DOWN, f"--max-run-time of {max_run_time_s:g} s reached")


# --- progress -----------------------------------------------------------------------------------


_Snapshots = dict[tuple[int, int], tuple[Progress, int, int]]


def total_progress(snapshots: _Snapshots, end: HandoutEnd) -> tuple[Progress, int]:
    """Sum every hand-out's progress (its report when it ended, else its last snapshot)."""
    total = Progress()
    in_flight = 0
    for key in snapshots.keys() | end.reports.keys():
        report = end.reports.get(key)
        progress = report.progress if report is not None else snapshots[key][0]
        if report is None:
            in_flight += snapshots[key][1]
        total.landed += progress.landed
        total.failed.update(progress.failed)
        total.no_persist += progress.no_persist
        total.omitted += progress.omitted
        total.drained += progress.drained
        total.reward_sum += progress.reward_sum
        total.scored += progress.scored
    return total, in_flight


class Reporter:
    """Prints the run's progress, summed over blocks, like one machine's reporter."""

    def __init__(
        self, total: int, stream: IO[str], live: bool | None, control: Any, end: HandoutEnd
    ) -> None:
        self.total = total
        self.stream = stream
        self.live = stream.isatty() if live is None else live
        self.control = control
        self.end = end
        self.started = trio.current_time()
        self.last: Progress = Progress(started_at=self.started)

    async def fetch(self) -> tuple[Progress, int]:
        """Return the summed progress and rollouts in flight, as of now."""
        snapshots: _Snapshots = await trio.to_thread.run_sync(
            ray.get, self.control.progress.remote()
        )
        progress, in_flight = total_progress(snapshots, self.end)
        progress.started_at = self.started
        self.last = progress
        return progress, in_flight

    def line(self, in_flight: int) -> str:
        """Return the progress line of the last fetch."""
        now = trio.current_time()
        return progress_line(self.last, total=self.total, in_flight=in_flight, now=now)

    async def run(self) -> None:
        """Redraw a line 4 times a second (live), or print one every 10 s (plain).

        Cancellation: this is how it stops; it only writes to the stream.
        """
        if not self.live:
            while True:
                await trio.sleep(10.0)
                _, in_flight = await self.fetch()
                print(self.line(in_flight), file=self.stream, flush=True)
        console = Console(file=self.stream)
        with Live(console=console, auto_refresh=False, transient=False) as live:
            while True:
                await trio.sleep(0.25)
                _, in_flight = await self.fetch()
                live.update(Text(self.line(in_flight)), refresh=True)
