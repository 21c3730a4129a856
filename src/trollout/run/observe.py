"""How a run reports to whoever started it: lines for people, and a view of its counters.

A `RunObserver` gets two things: `message` lines (warnings, notes, periodic timing summaries,
where the Prometheus endpoint is), and one `watch` task, started beside the engine when the
first row is about to go out and cancelled when the rows have settled, given a `RunView`
whose `snapshot` is the engine's counters as of now. What it does with them is its own: the
command line draws a live line with rich (`trollout.cli.progress`), a Ray driver's view sums
its blocks, the library default (`StreamObserver`) prints lines and draws nothing.

The view is pull, not push: the engine's writer updates plain counters on the hot path and
never calls out, so a slow display cannot slow collection (`collector.engine.progress`).

Text helpers shared by every display (`progress_line`, `format_duration`) live here, with no
rich: they are the run's words, whoever prints them.
"""

from __future__ import annotations

import io
import math
import sys
from typing import IO, Protocol

import attrs

from ..collector.engine.collector import Collector
from ..collector.engine.progress import Progress
from ..text import visible

__all__ = [
    "CollectorView",
    "RunObserver",
    "RunView",
    "Snapshot",
    "StreamObserver",
    "format_duration",
    "line_stream",
    "progress_line",
]


@attrs.frozen
class Snapshot:
    """A run's counters at one moment.

    Attributes:
        progress: what has settled.
        in_flight: rollouts sent and not settled.
        retries: the retry counters in one line ("" when there is nothing to say).
    """

    progress: Progress
    in_flight: int
    retries: str = ""


class RunView(Protocol):
    """A running run, as a display sees it."""

    @property
    def total(self) -> int:
        """How many rollouts this session dispatches."""
        ...

    def snapshot(self) -> Snapshot:
        """Return the counters as of now (cheap; never blocks)."""
        ...


class RunObserver(Protocol):
    """What a run reports to (module docstring)."""

    def message(self, text: str) -> None:
        """Show one line for people."""
        ...

    async def watch(self, view: RunView) -> None:
        """Show the run's progress until cancelled (then, if it likes, a last state)."""
        ...


class StreamObserver:
    """The library default: lines on ``stream`` (stderr when None), no progress display."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        """Print to ``stream`` (stderr when None, looked up when a line is printed)."""
        self.stream = stream

    def message(self, text: str) -> None:
        """Print the line and flush."""
        print(text, file=self.stream or sys.stderr, flush=True)

    async def watch(self, view: RunView) -> None:
        """Draw nothing."""


@attrs.frozen
class CollectorView:
    """The view of one collector (a run on this machine)."""

    collector: Collector
    total: int

    def snapshot(self) -> Snapshot:
        """Return the collector's counters as of now."""
        collector = self.collector
        retries = collector.retry_state.counters.summary()
        return Snapshot(collector.progress, collector.in_flight, retries)


class _LineStream(io.TextIOBase):
    """A text stream that hands each complete line to an observer (for `print(file=...)`)."""

    def __init__(self, observer: RunObserver) -> None:
        self._observer = observer
        self._pending = ""

    def write(self, text: str) -> int:
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            self._observer.message(line)
        return len(text)


def line_stream(observer: RunObserver) -> IO[str]:
    """Return a stream whose every printed line goes to ``observer.message``."""
    return _LineStream(observer)  # type: ignore[return-value]


def format_duration(seconds: float) -> str:
    """Format seconds as ``1h02m``, ``3m05s`` or ``4.2s``."""
    if not math.isfinite(seconds):
        return "?"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def progress_line(progress: Progress, *, total: int, in_flight: int, now: float) -> str:
    """Return one line describing a run in progress."""
    done = progress.settled
    elapsed = max(now - progress.started_at, 1e-9)
    rate = done / elapsed
    eta = (total - done) / rate if rate > 0 else math.inf
    parts = [
        f"{done}/{total} rollouts",
        f"{rate:.1f}/s",
        f"ETA {format_duration(eta)}",
        f"in flight {in_flight}",
        f"landed {progress.landed}",
    ]
    failures = sum(progress.failed.values())
    if failures:
        by_class = ", ".join(f"{visible(k)} {v}" for k, v in progress.failed.most_common(3))
        parts.append(f"failed {failures} ({by_class})")
    if progress.no_persist:
        parts.append(f"no-persist {progress.no_persist}")
    if progress.omitted:
        parts.append(f"omitted {progress.omitted}")
    if progress.drained:
        parts.append(f"drained {progress.drained}")
    if progress.scored:
        parts.append(f"mean reward {progress.mean_reward:.3f}")
    return " | ".join(parts)
