"""Progress while a run goes on, and the summary when it ends.

On a terminal, a live line redrawn a few times a second (rich): done/total, rate, ETA, in flight,
failures by class, running mean reward. When stderr is not a terminal (CI logs, ``nohup``), a
plain line every ``plain_interval_s`` seconds instead, so logs stay readable and small.

The reporter only reads the engine's `Progress` counters; it never touches the hot path.
Failure classes are server text: they are shown through `trollout.text.visible`, and rich is
given `Text` objects only, so no class is ever read as markup.
"""

from __future__ import annotations

import math
import sys
from typing import IO

import trio
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ..collector.engine.collector import Collector
from ..collector.engine.progress import Progress
from ..text import visible

__all__ = ["ProgressReporter", "format_duration", "summary_table"]


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


class ProgressReporter:
    """Shows a collector's progress until cancelled."""

    def __init__(
        self,
        *,
        total: int,
        stream: IO[str] | None = None,
        live: bool | None = None,
        plain_interval_s: float = 10.0,
    ) -> None:
        self.total = total
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.plain_interval_s = plain_interval_s

    async def run(self, collector: Collector) -> None:
        """Report until cancelled, then print the last state once.

        Cancellation: this is how it stops; it only writes to the stream.
        """
        if self.live:
            await self._run_live(collector)
        else:
            await self._run_plain(collector)

    def _line(self, collector: Collector) -> str:
        line = progress_line(
            collector.progress,
            total=self.total,
            in_flight=collector.in_flight,
            now=trio.current_time(),
        )
        retries = collector.retry_state.counters.summary()
        return f"{line} | {retries}" if retries else line

    async def _run_live(self, collector: Collector) -> None:
        console = Console(file=self.stream)
        with Live(console=console, auto_refresh=False, transient=False) as live:
            try:
                while True:
                    live.update(Text(self._line(collector)), refresh=True)
                    await trio.sleep(0.25)
            finally:
                live.update(Text(self._line(collector)), refresh=True)

    async def _run_plain(self, collector: Collector) -> None:
        try:
            while True:
                await trio.sleep(self.plain_interval_s)
                print(self._line(collector), file=self.stream, flush=True)
        finally:
            print(self._line(collector), file=self.stream, flush=True)


def summary_table(progress: Progress, *, total: int, elapsed_s: float, title: str) -> Table:
    """Return the final summary of a collection run as a table (every cell a `Text`)."""
    table = Table(title=Text(visible(title)), show_header=True, header_style="bold")
    table.add_column("what")
    table.add_column("count", justify="right")
    table.add_column("share", justify="right")
    rows: list[tuple[str, int]] = [("expected rollouts", total), ("landed", progress.landed)]
    rows += [(f"failed: {cls}", n) for cls, n in sorted(progress.failed.items())]
    if progress.no_persist:
        rows.append(("no-persist (kill-shaped)", progress.no_persist))
    if progress.omitted:
        rows.append(("omitted (interrupted)", progress.omitted))
    if progress.drained:
        rows.append(("drained (never started)", progress.drained))
    missing = total - progress.settled
    if missing > 0:
        rows.append(("not started", missing))
    for label, count in rows:
        share = f"{100.0 * count / total:.1f}%" if total else "-"
        _add_row(table, label, str(count), share)
    mean = f"{progress.mean_reward:.4f}" if progress.scored else "-"
    _add_row(table, "mean reward (landed)", mean, f"n={progress.scored}")
    rate = progress.settled / elapsed_s if elapsed_s > 0 else 0.0
    _add_row(table, "wall time", format_duration(elapsed_s), f"{rate:.1f}/s")
    return table


def _add_row(table: Table, *cells: str) -> None:
    table.add_row(*(Text(visible(cell)) for cell in cells))
