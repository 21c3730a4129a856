"""A Ray run's telemetry, on the driver: one trace for the run, the run's counts as its metrics.

The driver opens it (`open_ray_telemetry`; this module is imported only then, so a run
without telemetry never loads OpenTelemetry) when the run's settings or ``OTEL_*`` ask for
telemetry, as `trollout.run.collect` does on one machine (`trollout.telemetry`); `handout`
then tells it about every hand-out.

Traces. The driver opens the run's span (``ray.run``, under ``TRACEPARENT`` when that is set)
and one ``ray.block`` span per hand-out under it, and hands each block its span's context (W3C
trace context, ``propagate.inject`` into a dict sent with the block's arguments). The block makes
it its ``TRACEPARENT`` for its run (`block.block_environment`), so the block's own ``job`` span
(`trollout.telemetry.traces`) is a child of its hand-out's span: the run is one trace of run,
blocks and jobs. Attempts stay traces of their own linked to their job span, as on one machine.

Metrics. The driver is the run's one metrics exporter (OTLP and, when asked, the Prometheus
endpoint: one process, one port): ``trollout.rollouts`` by outcome and failure class, and
``trollout.rollouts.expected``, the blocks' counts summed (`RayTelemetry.counts`) whenever a
block streams a snapshot or ends. Blocks export no metrics (``OTEL_METRICS_EXPORTER=none`` for
their run): a block's counters start at 0 in every hand-out under one process identity, so
their values cannot be summed (summed last values once read 36 of 194 landed).

Adding up. A block's counts are what its folder held when its current hand-out began (read by
the driver, `recovery.resume.scan_run`, when the block was handed out before or the run is
resumed) plus what that hand-out reported since. A lost hand-out is superseded by the next
one's reading of the folder, so the rows a killed worker landed after its last snapshot are
counted once, not lost. Landed rollouts add up exactly to the run folder's, in the metrics and
in the spans (the run span's ``trollout.rollouts.landed``; each block's last hand-out span's
``trollout.block.landed``); failures count the final failures the hand-outs reported.

Design note. Rejected: each block exporting its own metrics under a ``trollout.block``
resource attribute. Summing those needs every block's last export, and a block whose worker is
killed never sends its last one; its counters would also restart at 0 in the next hand-out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING

import trio
from opentelemetry import propagate, trace
from opentelemetry.trace import Status, StatusCode

from ...collector.engine.progress import Progress
from ...recovery.layout import RunLayout
from ...recovery.resume import ResumeRules, scan_run
from ...run.observe import RunObserver, line_stream
from ...telemetry import TelemetrySettings
from ...telemetry.metrics import metric_failure_class
from ...telemetry.runtime import Telemetry, open_telemetry
from ..layout import shard_output

if TYPE_CHECKING:
    from .handout import HandoutEnd, RayRun

__all__ = ["RayTelemetry", "open_ray_telemetry"]

Key = tuple[int, int]


@asynccontextmanager
async def open_ray_telemetry(
    settings: TelemetrySettings, run: RayRun, observer: RunObserver
) -> AsyncIterator[RayTelemetry]:
    """Open the run's telemetry; flush it on exit (`trollout.telemetry.runtime`).

    Raises:
        ConfigError: the Prometheus endpoint's address cannot be bound.
    """
    stream = line_stream(observer)
    async with open_telemetry(
        settings, max_attempts=run.config.max_attempts, stream=stream
    ) as telemetry:
        ray_telemetry = RayTelemetry(telemetry, run)
        try:
            yield ray_telemetry
        finally:
            ray_telemetry.close()


class RayTelemetry:
    """The run's span, its hand-outs' spans and the run's summed counts (module docstring)."""

    def __init__(self, telemetry: Telemetry, run: RayRun) -> None:
        self.telemetry = telemetry
        self.run = run
        self.bases: dict[int, int] = {}  # landed in a block's folder as its hand-out began
        self.current: dict[int, Key] = {}  # each block's latest hand-out
        self.spans: dict[Key, trace.Span] = {}
        self.span: trace.Span | None = None
        tracing = telemetry.tracing
        if tracing is not None:
            self.span = tracing.tracer.start_span(
                "ray.run",
                context=tracing.parent,
                attributes={
                    "trollout.run.id": run.run_id,
                    "trollout.run": str(run.layout.output),
                    "trollout.rollouts.expected": run.to_dispatch,
                    "trollout.ray.blocks": run.blocks,
                    "trollout.ray.workers": run.workers,
                },
            )
        if telemetry.metrics is not None:
            telemetry.metrics.expected = run.to_dispatch

    async def handing_out(self, key: Key) -> dict[str, str]:
        """Note a hand-out about to start; return the trace context to send with it."""
        block, number = key
        landed = 0
        if number > 1 or not self.run.fresh:  # the folder may hold rows already
            output = shard_output(self.run.layout.output, block, self.run.blocks)
            layout = RunLayout.for_output(output)
            landed = await trio.to_thread.run_sync(
                partial(_landed, layout, self.run.config.max_attempts)
            )
        self.bases[block] = landed
        self.current[block] = key
        carrier: dict[str, str] = {}
        tracing = self.telemetry.tracing
        if tracing is not None and self.span is not None:
            span = tracing.tracer.start_span(
                "ray.block",
                context=trace.set_span_in_context(self.span),
                attributes={"trollout.block": block, "trollout.block.handout": number},
            )
            self.spans[key] = span
            propagate.inject(carrier, context=trace.set_span_in_context(span))
        return carrier

    def counts(self, end: HandoutEnd) -> Progress:
        """Return the run's counts: each block's base and its latest hand-out's progress."""
        total = Progress()
        for block, key in self.current.items():
            progress = _progress(key, end)
            total.landed += self.bases[block] + progress.landed
            total.failed.update(progress.failed)
            total.no_persist += progress.no_persist
            total.omitted += progress.omitted
            total.drained += progress.drained
        return total

    def received(self, end: HandoutEnd) -> None:
        """Export the run's counts as of now (after a snapshot or a report)."""
        metrics = self.telemetry.metrics
        if metrics is None:
            return
        counts = self.counts(end)
        rollouts = metrics.rollouts
        rollouts["landed", None] = counts.landed
        rollouts["omitted", None] = counts.omitted
        rollouts["drained", None] = counts.drained
        if counts.no_persist:
            rollouts["no_persist", None] = counts.no_persist
        failed: Counter[str] = Counter()
        for failure_class, count in counts.failed.items():
            failed[metric_failure_class(failure_class)] += count
        for label, count in failed.items():
            rollouts["failed", label] = count

    def ended(self, key: Key, end: HandoutEnd, lost: str | None) -> None:
        """Close a hand-out's span (with what it landed; lost: why), export the counts."""
        self.received(end)
        span = self.spans.pop(key, None)
        if span is None:
            return
        progress = _progress(key, end)
        span.set_attribute("trollout.rollouts.landed", progress.landed)
        span.set_attribute("trollout.rollouts.failed", sum(progress.failed.values()))
        if self.current.get(key[0]) == key:
            span.set_attribute("trollout.block.landed", self.bases[key[0]] + progress.landed)
        report = end.reports.get(key)
        if lost is not None or report is None:
            reason = lost or "it ended without a report"
            span.set_attribute("trollout.block.lost", reason)
            span.set_status(Status(StatusCode.ERROR, reason))
        elif report.stopped is not None:
            span.set_attribute("trollout.block.stopped", report.stopped)
        span.end()

    def close(self) -> None:
        """End the spans still open (a cancelled run), and the run's span with its counts."""
        for key in list(self.spans):
            self.spans.pop(key).end()
        if self.span is not None:
            self.span.end()
            self.span = None

    def finish(self, end: HandoutEnd) -> None:
        """Give the run's span and metrics the run's final counts."""
        self.received(end)
        if self.span is not None:
            counts = self.counts(end)
            self.span.set_attributes(
                {
                    "trollout.rollouts.landed": counts.landed,
                    "trollout.rollouts.failed": sum(counts.failed.values()),
                    "trollout.rollouts.omitted": counts.omitted + counts.drained,
                    "trollout.ray.handouts": end.handouts,
                }
            )


def _progress(key: Key, end: HandoutEnd) -> Progress:
    report = end.reports.get(key)
    if report is not None:
        return report.progress
    snapshot = end.snapshots.get(key)
    return snapshot[0] if snapshot is not None else Progress()


def _landed(layout: RunLayout, max_attempts: int) -> int:
    """Return the rollouts landed in a block's folder (blocking: a worker thread)."""
    if not layout.materialized_inputs.exists():
        return 0
    tally = scan_run(layout, ResumeRules(max_attempts=max_attempts)).tally
    return tally.fates.get("landed", 0)
