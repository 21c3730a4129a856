"""Handing a Ray run's blocks out: the queue, the watchers, the summed progress.

`drive` runs beside the driver's watchers in one nursery: it keeps at most N blocks in flight
(`block.run_block` generator tasks), gives the next block to whichever worker frees up first, puts a
lost block back at the front of the queue (its worker died, or something other than the driver
stopped it before its end: a signal to the worker, as a node drain or a preemption sends; the
hand-out's rows stay in its folder, which the next one resumes; `_MAX_CRASHES` losses of one
block end the run), and stops handing out on the first SIGINT or SIGTERM, on ``--max-run-time``, or
when a block fails, raising the stop level in the run's stop file (`block.write_stop`) so
the running blocks wind down (a second SIGINT: cancel them). Progress goes to the caller's
observer (`trollout.run.observe`) through `BlocksView`: every hand-out's progress, summed
(`total_progress`): a block's report when it ended, else the last snapshot it streamed.

Everything that coordinates the run lives here, in the driver's process: nothing is lost with
a worker node but the hand-outs running there (`block`'s module docstring).

`ray.wait` and `ray.get` block, so they run in worker threads, ``ray.wait`` with a short
timeout (`_WAIT_S`) so the loop stays cancellable.
"""

from __future__ import annotations

import signal
import threading
from collections import Counter, deque
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Final, Protocol

import attrs
import ray
import trio
from ray.exceptions import RayError, RayTaskError

from ...collector.deployment.discovery import Deployment
from ...collector.engine.progress import Progress
from ...recovery.layout import RunLayout
from ...run.observe import RunObserver, Snapshot
from ...settings import RunConfig
from .block import CANCEL, WIND_DOWN, BlockReport, BlockSnapshot, run_block, stop_file, write_stop
from .rows import block_config


class HandoutWatcher(Protocol):
    """What `_hand_out` tells about every hand-out (`telemetry.RayTelemetry`)."""

    async def handing_out(self, key: tuple[int, int]) -> dict[str, str]:
        """A hand-out is about to start; return the trace context to send with it."""
        ...

    def received(self, end: HandoutEnd) -> None:
        """A running hand-out streamed a snapshot."""
        ...

    def ended(self, key: tuple[int, int], end: HandoutEnd, lost: str | None) -> None:
        """A hand-out ended (``lost``: why it is to be handed out again)."""
        ...


__all__ = [
    "BlocksView",
    "HandoutEnd",
    "HandoutWatcher",
    "RayBlocks",
    "RayRun",
    "drive",
    "total_progress",
]

_MAX_CRASHES: Final = 3  # hand-outs of one block that may die before the run gives up
_WAIT_S: Final = 0.25  # how long one ray.wait blocks a worker thread


@attrs.frozen
class RayRun:
    """A prepared distributed run: its folder, settings (workers and blocks fixed), sizes."""

    layout: RunLayout
    config: RunConfig
    expected: int
    to_dispatch: int
    run_id: str = ""
    fresh: bool = True  # started now: no block folder holds a row yet

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
    snapshots: dict[tuple[int, int], BlockSnapshot] = attrs.field(factory=dict)
    deaths: list[str] = attrs.field(factory=list)
    handouts: int = 0


class RayBlocks:
    """The blocks' side on Ray: `run_block` generator tasks and the run's stop file.

    `_hand_out` sees only these four methods, so its queue is tested with a fake.
    """

    def __init__(self, deployment: Deployment, stop_path: Path) -> None:
        self.deployment = deployment
        self.stop_path = stop_path

    def start(self, config: RunConfig, key: tuple[int, int], carrier: dict[str, str]) -> Any:
        """Start one hand-out of a block (``carrier``: its span's trace context); return its
        handle (a Ray object ref generator)."""
        servers, head_url = self.deployment.servers, self.deployment.head_url
        return run_block.remote(config, servers, head_url, key, str(self.stop_path), carrier)

    async def wait(self, handles: list[Any]) -> list[Any]:
        """Return the hand-outs that have an item (none after `_WAIT_S`, so the caller can
        go on)."""
        return await trio.to_thread.run_sync(_ready, handles)

    async def next(self, handle: Any) -> BlockSnapshot | BlockReport | None:
        """Return a hand-out's next item, None when it ended without a report (raises Ray's
        error when its worker died)."""
        item: BlockSnapshot | BlockReport | None = await trio.to_thread.run_sync(_next, handle)
        return item

    async def stop(self, level: int, reason: str) -> None:
        """Raise the stop level every running block reads (`block.write_stop`)."""
        await trio.to_thread.run_sync(write_stop, self.stop_path, level, reason)


def _clear_stop(path: Path) -> None:
    """Remove an earlier invocation's stop file (under the run's lock), so blocks go on."""
    path.unlink(missing_ok=True)


def _ready(handles: list[Any]) -> list[Any]:
    ready, rest = ray.wait(handles, num_returns=1, timeout=_WAIT_S)
    if ready and rest:  # the others ready by now too, in one call
        more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
        ready += more
    return list(ready)


def _next(handle: Any) -> Any:
    try:
        ref = next(handle)
    except StopIteration:
        return None
    return ray.get(ref)


async def drive(
    run: RayRun,
    deployment: Deployment,
    observer: RunObserver,
    telemetry: HandoutWatcher | None = None,
) -> HandoutEnd:
    """Hand the blocks out beside the watchers (signals, deadline, progress), telling
    ``telemetry`` about every hand-out."""
    end = HandoutEnd()
    stop_path = stop_file(run.layout.output)
    await trio.to_thread.run_sync(_clear_stop, stop_path)
    blocks = RayBlocks(deployment, stop_path)
    emit = observer.message
    try:
        async with trio.open_nursery() as nursery:
            if _on_main_thread():
                nursery.start_soon(_watch_signals, end, blocks, run.config.grace_s, emit)
            if run.config.max_run_time_s is not None:
                nursery.start_soon(_watch_deadline, end, blocks, run.config.max_run_time_s)
            nursery.start_soon(observer.watch, BlocksView(run.to_dispatch, end))
            await _hand_out(run, blocks, end, emit, telemetry)
            nursery.cancel_scope.cancel(reason="every block ended")
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(partial(stop_path.unlink, missing_ok=True))
    return end


async def _hand_out(
    run: RayRun,
    blocks: RayBlocks,
    end: HandoutEnd,
    emit: Callable[[str], None],
    telemetry: HandoutWatcher | None = None,
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
            carrier = await telemetry.handing_out(key) if telemetry is not None else {}
            config = block_config(run.config, run.layout.output, block)
            running[blocks.start(config, key, carrier)] = key
        if not running:
            break
        for handle in await blocks.wait(list(running)):
            key = running[handle]
            ended, lost = await _receive(handle, key, end, blocks)
            if ended:
                del running[handle]
            if telemetry is not None and ended:
                telemetry.ended(key, end, lost)
            elif telemetry is not None:
                telemetry.received(end)
            if lost is None:
                continue
            block = key[0]
            deaths[block] += 1
            end.deaths.append(f"block {block}: {lost}")
            emit(f"trollout: block {block} stopped before its end ({lost}); handing it to another")
            if deaths[block] >= _MAX_CRASHES:
                message = (
                    f"block {block} did not finish in {deaths[block]} hand-outs (the last: "
                    f"{lost}); what landed is kept: see the workers' logs, then trollout resume"
                )
                await _fail(end, blocks, message, False)
            pending.appendleft(block)


async def _receive(
    handle: Any, key: tuple[int, int], end: HandoutEnd, blocks: RayBlocks
) -> tuple[bool, str | None]:
    """Take a hand-out's next item; return whether it ended, and why it was lost (to hand it
    out again), or None.

    A hand-out is lost when its worker died, or when something other than the driver (a
    signal to the worker: a node drain, a preemption) stopped it before its block's end.
    """
    try:
        item = await blocks.next(handle)
    except RayTaskError as exc:  # a bug in the block: Ray keeps the traceback
        await _fail(end, blocks, f"block {key[0]} failed: {exc}", False)
        return True, None
    except RayError as exc:
        return True, f"its worker died: {type(exc).__name__}"
    if item is None:
        return True, "its worker ended without a report"
    if not isinstance(item, BlockReport):
        end.snapshots[key] = item
        return False, None
    end.reports[key] = item
    if item.error is not None:
        await _fail(end, blocks, f"block {key[0]}: {item.error}", item.usage_error)
    elif item.stopped is not None and not end.stopping:
        return True, item.stopped
    return True, None


async def _fail(end: HandoutEnd, blocks: RayBlocks, message: str, usage: bool) -> None:
    if end.error is None:
        end.error = (message, usage)
    end.stopping = True
    await blocks.stop(WIND_DOWN, "another block failed")


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


async def _watch_signals(
    end: HandoutEnd, blocks: RayBlocks, grace_s: float, emit: Callable[[str], None]
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
                await blocks.stop(WIND_DOWN, f"the driver received {name}")
            elif signum == signal.SIGINT:
                emit("trollout: second SIGINT: cancelling the rollouts in flight")
                await blocks.stop(CANCEL, "the driver received a second SIGINT")


async def _watch_deadline(end: HandoutEnd, blocks: RayBlocks, max_run_time_s: float) -> None:
    await trio.sleep(max_run_time_s)
    end.deadline_reached, end.stopping = True, True
    await blocks.stop(WIND_DOWN, f"--max-run-time of {max_run_time_s:g} s reached")


# --- progress -----------------------------------------------------------------------------------


_Snapshots = dict[tuple[int, int], BlockSnapshot]


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


class BlocksView:
    """The run's progress summed over blocks, as a `trollout.run.observe.RunView`: the blocks'
    reports and the snapshots they streamed (`total_progress`); never blocks."""

    def __init__(self, total: int, end: HandoutEnd) -> None:
        self.total = total
        self.end = end
        self.started = trio.current_time()

    def snapshot(self) -> Snapshot:
        """Return the summed progress and rollouts in flight as of now."""
        progress, in_flight = total_progress(self.end.snapshots, self.end)
        progress.started_at = self.started
        return Snapshot(progress, in_flight)
