"""Progress while a run goes on, and the summary when it ends.

On a terminal, a live line redrawn a few times a second (rich): done/total, rate, ETA, in flight,
failures by class, running mean reward. When stderr is not a terminal (CI logs, ``nohup``), a
plain line every ``plain_interval_s`` seconds instead, so logs stay readable and small.

`ConsoleObserver` is the command line's `trollout.run.RunObserver`: the run layer hands it
lines and a view of the counters (one collector's, or a Ray run's summed over blocks), and it
draws them here, so rich stays in the command line. The reporter only reads the counters; it
never touches the hot path.
Failure classes are server text: they are shown through `trollout.text.visible`, and rich is
given `Text` objects only, so no class is ever read as markup.
"""

from __future__ import annotations

import sys
from typing import IO, Any

import trio
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ..collector.engine.collector import Collector
from ..collector.engine.progress import Progress
from ..run.observe import CollectorView, RunView, format_duration, progress_line
from ..text import visible

__all__ = [
    "ConsoleObserver",
    "ProgressReporter",
    "format_duration",
    "print_summary",
    "summary_table",
]


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

    async def run(self, source: Collector | RunView) -> None:
        """Report until cancelled, then print the last state once.

        ``source``: a run's view (`trollout.run.observe`), or a collector (its own view).

        Cancellation: this is how it stops; it only writes to the stream.
        """
        view = CollectorView(source, self.total) if isinstance(source, Collector) else source
        if self.live:
            await self._run_live(view)
        else:
            await self._run_plain(view)

    def _line(self, view: RunView) -> str:
        snap = view.snapshot()
        line = progress_line(
            snap.progress, total=self.total, in_flight=snap.in_flight, now=trio.current_time()
        )
        return f"{line} | {snap.retries}" if snap.retries else line

    async def _run_live(self, collector: RunView) -> None:
        console = Console(file=self.stream)
        with Live(console=console, auto_refresh=False, transient=False) as live:
            try:
                while True:
                    live.update(Text(self._line(collector)), refresh=True)
                    await trio.sleep(0.25)
            finally:
                live.update(Text(self._line(collector)), refresh=True)

    async def _run_plain(self, collector: RunView) -> None:
        try:
            while True:
                await trio.sleep(self.plain_interval_s)
                print(self._line(collector), file=self.stream, flush=True)
        finally:
            print(self._line(collector), file=self.stream, flush=True)


class ConsoleObserver:
    """The command line's `trollout.run.RunObserver`: lines and progress on ``stream``."""

    def __init__(self, stream: IO[str] | None = None, live: bool | None = None) -> None:
        """Show on ``stream`` (stderr when None); ``live``: None decides by terminal."""
        self.stream = stream or sys.stderr
        self.live = live

    def message(self, text: str) -> None:
        """Print the line and flush."""
        print(text, file=self.stream, flush=True)

    async def watch(self, view: RunView) -> None:
        """Show the progress line until cancelled (`ProgressReporter`)."""
        await ProgressReporter(total=view.total, stream=self.stream, live=self.live).run(view)


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


def print_summary(result: Any, *, title: str) -> None:
    """Print the final summary table of a run on stdout."""
    console = Console()
    console.print(
        summary_table(
            result.progress, total=result.expected, elapsed_s=result.elapsed_s, title=title
        )
    )
    console.print(Text(visible(f"rollouts: {result.layout.rollouts}")))
    console.print(Text(visible(f"failures: {result.layout.failures}")))
