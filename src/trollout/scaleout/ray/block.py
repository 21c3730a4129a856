"""What runs on a Ray worker: one block of a distributed run, and its two channels to the driver.

A block is a run folder under the run's shards folder that the driver wrote before handing it
out, its rows and manifest (`rows`), collected by the run layer (`trollout.run.collect`, with
the command line's signal watcher: a node drain or a preemption signals the worker), always
with ``resume_from_cache``: every hand-out resumes the folder, reading its own rows and never
the input; one handed out again after its worker died resumes what the dead worker left, with
new attempt numbers from the folder's ledger.

The driver holds every piece of the run's coordinating state (the queue, each hand-out's
progress, the stop level), so losing any worker node loses only the blocks running there. Two
channels join a block to it, neither of them a process of its own:

- **block to driver**: `run_block` is a Ray generator task. It yields the block's progress
  (``(progress, in flight, pid)``) every `_REPORT_S` seconds and its `BlockReport` last; Ray
  streams each item to the driver, its owner. Trio runs the block on the worker's main thread
  in guest mode (`_guest_run`), so the generator yields between Trio's callbacks and Trio
  still receives the signals a node drain or a preemption sends the worker.
- **driver to block**: the stop level lives in one small file in the run's shards folder
  (`stop_file`, written atomically by the driver, `write_stop`), which every block reads every
  `_REPORT_S` seconds: 0 go on (no file), 1 wind down as on a signal (no new rollout; those in
  flight get ``grace_s``), 2 cancel what is in flight at once (a block that starts after a stop
  runs nothing). The shards folder is one every worker and the driver must share already.

Its `BlockReport` says what stopped it early, if anything, so the driver can hand out again a
block that a signal to its own worker wound down. A block never raises a trollout error to the
driver: it returns it in its `BlockReport`, so the driver can say which block failed and why
without unpickling ours.

Design note. Rejected: a control actor (what this replaced): an actor lands on any node, so
losing that node ended the run, and its process cost about 1 s of CPU per run; pinning it to
the head node with restarts would keep the CPU and add state to rebuild. Rejected for the
stop: ``ray.cancel``, which raises ``KeyboardInterrupt`` at an arbitrary point of the block
(no wind-down, no grace). A stop file on a network file system may be seen a few seconds late
(attribute caching): the stop is a wind-down with a grace period, so late is harmless.

Blocks serve no Prometheus endpoint, whether ``--metrics-port`` or ``OTEL_METRICS_EXPORTER=
prometheus`` asks (a local cluster inherits the driver's environment): several may share a
host, where one port cannot serve them all. Nor do they export metrics: the driver exports the
run's, summed over the blocks (`telemetry`). Their spans go out over OTLP, each block's job
span under its hand-out's span in the run's one trace (`block_environment`).

Only the `trollout.scaleout.ray` modules import Ray; the plain command line never imports them.
"""

from __future__ import annotations

import io
import os
import queue
import signal
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import orjson
import ray
import trio

from ...collector.deployment.discovery import Deployment
from ...collector.deployment.served_config import Server
from ...collector.engine.collector import Collector
from ...collector.engine.progress import Progress
from ...errors import ConfigError, DeploymentError, RunFolderError, RunStoppedError, TrolloutError
from ...recovery.files import replace_atomically
from ...run.compose import RunResult, collect
from ...run.observe import StreamObserver
from ...run.signals import watch_signals
from ...settings import RunConfig
from ..layout import shards_root

__all__ = ["BlockReport", "block_environment", "read_stop", "run_block", "stop_file", "write_stop"]

_REPORT_S = 0.5  # how often a block reports progress and reads the stop level
GO, WIND_DOWN, CANCEL = 0, 1, 2  # the driver's stop levels
_STOP_NAME = "ray_stop.json"

# What a block yields while it runs: (progress, rollouts in flight, the worker's pid).
BlockSnapshot = tuple[Progress, int, int]


@attrs.frozen
class BlockReport:
    """How one hand-out of a block ended (the last item `run_block` yields).

    Attributes:
        block: the block's index.
        progress: what this hand-out settled.
        stopped: what ended it before its rows ran out (the driver's stop, a signal to its
            worker, an error), or None: it ran its block to the end.
        pid: the worker process that ran it.
        error: the trollout error that ended it, as text, or None.
        usage_error: that error is a usage error (exit 2) rather than a failed run.
    """

    block: int
    progress: Progress
    stopped: str | None
    pid: int
    error: str | None = None
    usage_error: bool = False

    @property
    def interrupted(self) -> bool:
        """Whether something ended the hand-out before its block's rows ran out."""
        return self.stopped is not None


# --- the stop level: a file in the shards folder ------------------------------------------------


def stop_file(output: str | os.PathLike[str]) -> Path:
    """Return the stop file of the Ray run whose output is ``output``."""
    return shards_root(output) / _STOP_NAME


def write_stop(path: Path, level: int, reason: str) -> None:
    """Raise the stop level every block reads (atomically; blocking: a worker thread)."""
    if level > read_stop(path)[0]:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = orjson.dumps({"level": level, "reason": reason})
        replace_atomically(path, [data, b"\n"])


def read_stop(path: Path) -> tuple[int, str]:
    """Return the stop level and its reason (no file, or one being replaced: go on)."""
    try:
        doc = orjson.loads(path.read_bytes())
        return int(doc["level"]), str(doc["reason"])
    except (OSError, ValueError, KeyError, TypeError):
        return GO, ""


# --- a block ------------------------------------------------------------------------------------


@ray.remote(num_cpus=1, max_retries=0)
def run_block(
    config: RunConfig,
    servers: Sequence[Server],
    head_url: str | None,
    key: tuple[int, int],
    stop_path: str,
    carrier: Mapping[str, str],
) -> Iterator[BlockSnapshot | BlockReport]:
    """Collect one block (``config`` is the block's own: output, rows; ``carrier``: its
    hand-out span's trace context); yield its progress every `_REPORT_S` seconds, then its
    report."""
    deployment = Deployment(tuple(servers), head_url=head_url)
    watcher = _Watcher(Path(stop_path))
    run = partial(_run_block, config, deployment, key, watcher)
    with block_environment(carrier):
        yield from _guest_run(run, watcher.snapshot)


@contextmanager
def block_environment(carrier: Mapping[str, str]) -> Iterator[None]:
    """Set the block's telemetry environment for its run, then restore the worker's.

    Its job span's parent is its hand-out's span (``TRACEPARENT``/``TRACESTATE`` from
    ``carrier``, when the driver traces), and it exports no metrics: the driver exports the
    run's (`telemetry`'s module docstring). A worker runs one block at a time.
    """
    names = {"traceparent": "TRACEPARENT", "tracestate": "TRACESTATE"}
    wanted = {names[key]: value for key, value in carrier.items() if key in names}
    wanted["OTEL_METRICS_EXPORTER"] = "none"
    saved = {name: os.environ.get(name) for name in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _guest_run(
    run: Callable[[], Awaitable[BlockReport]], snapshot: Callable[[], BlockSnapshot]
) -> Iterator[BlockSnapshot | BlockReport]:
    """Run ``run`` under Trio on this thread (guest mode); yield ``snapshot()`` every
    `_REPORT_S` seconds while it runs, then its result (its error is raised)."""
    calls: queue.SimpleQueue[Callable[[], object]] = queue.SimpleQueue()
    done: list[Any] = []  # the run's `outcome.Outcome`
    trio.lowlevel.start_guest_run(
        run, run_sync_soon_threadsafe=calls.put, done_callback=done.append
    )
    due = time.monotonic() + _REPORT_S
    while not done:
        with suppress(queue.Empty):
            calls.get(timeout=max(0.0, due - time.monotonic()))()
        if not done and time.monotonic() >= due:
            yield snapshot()
            due = time.monotonic() + _REPORT_S
    yield done[0].unwrap()


async def _run_block(
    config: RunConfig, deployment: Deployment, key: tuple[int, int], watcher: _Watcher
) -> BlockReport:
    watcher.check()
    if watcher.level > GO:  # started after the driver stopped (it was waiting for a CPU)
        return BlockReport(key[0], Progress(), f"the driver: {watcher.reason}", os.getpid())
    progress = Progress()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watcher.poll)
            with watcher.hard_stop:
                result = await collect(
                    config,
                    deployment=deployment,
                    observer=StreamObserver(io.StringIO()),  # a block's lines: nowhere
                    watchers=(watch_signals,),
                    stop_when=watcher.stop_when,
                    # Blocks may share a host, where one port cannot serve them all: neither
                    # --metrics-port nor OTEL_METRICS_EXPORTER=prometheus (OTLP still goes out).
                    prometheus=False,
                )
                progress = result.progress
            nursery.cancel_scope.cancel(reason="the block ended")
    except (TrolloutError, BaseExceptionGroup) as exc:
        errors = list(_leaves(exc))
        if not all(isinstance(error, TrolloutError) for error in errors):
            raise
        usage = all(_is_usage(error) for error in errors)
        message = "; ".join(str(error) for error in errors)
        return BlockReport(key[0], watcher.last_progress(), message, os.getpid(), message, usage)
    if watcher.hard_stop.cancelled_caught:
        stopped: str | None = f"the driver: {watcher.reason}"
        progress = watcher.last_progress()
    else:
        stopped = _why_stopped(result)
    return BlockReport(key[0], progress, stopped, os.getpid())


def _why_stopped(result: RunResult) -> str | None:
    """Return what wound the block's run down before its rows ran out, or None."""
    if result.signal is not None:  # a signal to the worker: a node drain, a preemption
        return f"its worker received {signal.Signals(result.signal).name}"
    if result.deadline_reached:
        return "it reached its --max-run-time"
    if result.stopped is not None:  # the only stop_when is `_Watcher`'s: the driver's stop
        return f"the driver: {result.stopped}"
    return None


def _leaves(exc: BaseException) -> list[BaseException]:
    """Return the errors inside (possibly nested) exception groups, or the error itself."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _is_usage(error: BaseException) -> bool:
    """Whether the command line would exit 2 for this error (else 1: a failed run)."""
    usage = isinstance(error, ConfigError | DeploymentError | RunFolderError)
    return usage and not isinstance(error, RunStoppedError)


class _Watcher:
    """Reads the driver's stop level and turns it into stops; snapshots the block's progress."""

    def __init__(self, stop_path: Path) -> None:
        self.stop_path = stop_path
        self.level = GO
        self.hard_stop = trio.CancelScope()
        self._collector: Collector | None = None
        self._wind_down = trio.Event()
        self.reason = ""

    def last_progress(self) -> Progress:
        """Return the collector's progress (empty before the session began)."""
        return self._collector.progress if self._collector is not None else Progress()

    def snapshot(self) -> BlockSnapshot:
        """Return the block's progress, rollouts in flight and pid, as of now."""
        collector = self._collector
        in_flight = collector.in_flight if collector is not None else 0
        return self.last_progress(), in_flight, os.getpid()

    async def stop_when(self, collector: Collector) -> str:
        """The session's ``stop_when``: note the collector, wait for a stop level of 1."""
        self._collector = collector
        await self._wind_down.wait()
        return self.reason

    def check(self) -> None:
        """Read the stop level once, acting on a raised one."""
        level, reason = read_stop(self.stop_path)
        if level > self.level:
            self.level, self.reason = level, reason
            self._wind_down.set()
            if level >= CANCEL:
                self.hard_stop.cancel(reason=f"the driver: {reason}")

    async def poll(self) -> None:
        """Read the stop level every `_REPORT_S` seconds until cancelled."""
        while True:
            await trio.sleep(_REPORT_S)
            self.check()
