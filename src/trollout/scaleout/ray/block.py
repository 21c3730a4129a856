"""What runs on a Ray worker: one block of a distributed run, and the run's control actor.

A block is shard ``b`` of ``B`` of the run's plan (``--shard b/B``), collected by the run layer
(`trollout.run.collect`, with the command line's signal watcher: a node drain or a preemption
signals the worker) into its own run folder under the run's shards folder, always with
``resume_from_cache``: a block handed out for the first time starts afresh, and one handed out
again after its worker died resumes what the dead worker left, with new attempt numbers from
the folder's ledger.

`Control` is one small actor per run. Each block reports its progress to it every
`_REPORT_S` seconds and gets back the driver's stop level in the same call: 0 go on, 1 wind
down as on a signal (no new rollout; those in flight get ``grace_s``), 2 cancel what is in
flight at once (a block that starts after a stop runs nothing). Its `BlockReport` says what
stopped it early, if anything, so the driver can hand out again a block that a signal to its
own worker wound down. A block never raises a trollout error to the driver: it returns it in
its `BlockReport`, so the driver can say which block failed and why without unpickling ours.

Blocks serve no Prometheus endpoint, whether ``--metrics-port`` or ``OTEL_METRICS_EXPORTER=
prometheus`` asks (a local cluster inherits the driver's environment): several may share a
host, where one port cannot serve them all. OTLP still goes out from each.

Only the `trollout.scaleout.ray` modules import Ray; the plain command line never imports them.
"""

from __future__ import annotations

import io
import os
import signal
from collections.abc import Sequence
from typing import Any

import attrs
import ray
import trio

from ...collector.deployment.discovery import Deployment
from ...collector.deployment.served_config import Server
from ...collector.engine.collector import Collector
from ...collector.engine.progress import Progress
from ...errors import ConfigError, DeploymentError, RunFolderError, RunStoppedError, TrolloutError
from ...run.compose import RunResult, collect
from ...run.observe import StreamObserver
from ...run.signals import watch_signals
from ...settings import RunConfig

__all__ = ["BlockReport", "Control", "run_block"]

_REPORT_S = 0.5  # how often a block reports progress and learns whether to stop
GO, WIND_DOWN, CANCEL = 0, 1, 2  # the driver's stop levels


@attrs.frozen
class BlockReport:
    """How one hand-out of a block ended (returned by `run_block`).

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


@ray.remote(num_cpus=0)
class Control:
    """The driver's stop level and the blocks' latest progress (module docstring)."""

    def __init__(self) -> None:
        self.level = GO
        self.reason = ""
        self.snapshots: dict[tuple[int, int], tuple[Progress, int, int]] = {}

    def report(self, key: tuple[int, int], progress: Progress, in_flight: int) -> tuple[int, str]:
        """Record a block hand-out's progress; return the stop level and its reason."""
        self.snapshots[key] = (progress, in_flight, os.getpid())
        return self.level, self.reason

    def stop(self, level: int, reason: str) -> None:
        """Raise the stop level (it never goes down)."""
        if level > self.level:
            self.level, self.reason = level, reason

    def progress(self) -> dict[tuple[int, int], tuple[Progress, int, int]]:
        """Return every hand-out's latest progress, in flight count and reporter pid."""
        return self.snapshots


@ray.remote(num_cpus=1, max_retries=0)
def run_block(
    config: RunConfig,
    servers: Sequence[Server],
    head_url: str | None,
    key: tuple[int, int],
    control: Any,
) -> BlockReport:
    """Collect one block (``config`` is the block's own: output, shard) and report."""
    deployment = Deployment(tuple(servers), head_url=head_url)
    return trio.run(_run_block, config, deployment, key, control)


async def _run_block(
    config: RunConfig, deployment: Deployment, key: tuple[int, int], control: Any
) -> BlockReport:
    watcher = _Watcher(key, control)
    await watcher.report()
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
    """Reports a block's progress to the control actor and turns its stop levels into stops."""

    def __init__(self, key: tuple[int, int], control: Any) -> None:
        self.key = key
        self.control = control
        self.level = GO
        self.hard_stop = trio.CancelScope()
        self._collector: Collector | None = None
        self._wind_down = trio.Event()
        self.reason = ""

    def last_progress(self) -> Progress:
        """Return the collector's progress (empty before the session began)."""
        return self._collector.progress if self._collector is not None else Progress()

    async def stop_when(self, collector: Collector) -> str:
        """The session's ``stop_when``: note the collector, wait for a stop level of 1."""
        self._collector = collector
        await self._wind_down.wait()
        return self.reason

    async def report(self) -> None:
        """Report the block's progress once, acting on the stop level it gets back."""
        collector = self._collector
        in_flight = collector.in_flight if collector is not None else 0
        call = self.control.report.remote(self.key, self.last_progress(), in_flight)
        level, reason = await trio.to_thread.run_sync(ray.get, call)
        if level > self.level:
            self.level, self.reason = level, reason
            self._wind_down.set()
            if level >= CANCEL:
                self.hard_stop.cancel(reason=f"the driver: {reason}")

    async def poll(self) -> None:
        """Report every `_REPORT_S` seconds until cancelled."""
        while True:
            await trio.sleep(_REPORT_S)
            await self.report()
