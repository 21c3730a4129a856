"""`trollout status RUN --watch`: a live view of a run from its folder alone.

Each refresh recomputes what `trollout status` shows (`run.state.run_status`: the resume rules,
read-only, no lock) and adds what only a watcher that keeps looking can tell: the rate at which
rollouts settle (over the last `_RATE_WINDOW_S` seconds), the ETA at that rate, and the
stragglers, the rollouts whose latest reserved attempt has had no outcome for the longest
(`Outstanding`, read incrementally from the ledger and the outcome files; an attempt the engine
reserved may still be queued behind the concurrency limit, so young ones are not listed).

The watch ends by itself when the run does: when no live process holds the run's lock (a
finished run is shown once). Ctrl-C ends it too (exit 130). Every string read from the folder
goes through `text.visible` and reaches rich only as a `Text`.

Rejected alternative: a watch that tails the collector's own progress (a socket, a shared
file the collector rewrites every second). It would need the collector's cooperation, and a
run started without it could not be watched; the folder is always there.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Final

import orjson
from rich.console import Console
from rich.live import Live
from rich.text import Text

from .. import records
from ..recovery.layout import RunLayout
from ..text import visible

__all__ = ["Outstanding", "watch"]

_RATE_WINDOW_S: Final = 30.0
_STRAGGLERS: Final = 3  # listed, the oldest first
_MIN_STRAGGLER_AGE_S: Final = 2.0  # younger attempts are not stragglers yet

Key = tuple[int, int]
StatusFn = Callable[[], dict[str, Any]]


class _Tail:
    """The complete lines appended to a file since the last call (a torn tail waits)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def rows(self) -> Iterator[dict[str, Any]]:
        try:
            with self.path.open("rb") as f:
                if f.seek(0, 2) < self.offset:
                    self.offset = 0  # replaced (an overwrite): read it afresh
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1
        self.offset += end
        for line in data[:end].splitlines():
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(row, dict):
                yield row


def _int(row: dict[str, Any], key: str) -> int | None:
    value = row.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class Outstanding:
    """Reserved attempts with no outcome yet, and when this watch first saw each one."""

    def __init__(self, layout: RunLayout) -> None:
        self._ledger = _Tail(layout.attempts)
        self._rollouts = _Tail(layout.rollouts)
        self._failures = _Tail(layout.failures)
        self._landed: set[Key] = set()
        self.since: dict[Key, tuple[int, float]] = {}  # key -> (attempt, first seen)

    def update(self, now: float) -> None:
        """Read what was appended since the last update."""
        for row in self._ledger.rows():
            for triple in row.get("attempts") or ():
                self._reserved(triple, now)
        for row in self._rollouts.rows():
            key = self._key(row)
            if key is not None:
                self._landed.add(key)
                self.since.pop(key, None)
        for row in self._failures.rows():
            key, attempt = self._key(row), _int(row, records.ATTEMPT_INDEX) or 0
            seen = self.since.get(key) if key is not None else None
            if key is not None and seen is not None and attempt >= seen[0]:
                del self.since[key]

    def _reserved(self, triple: Any, now: float) -> None:
        try:
            task, rollout, attempt = (int(x) for x in triple)
        except (TypeError, ValueError):
            return
        key = (task, rollout)
        seen = self.since.get(key)
        if key not in self._landed and (seen is None or attempt > seen[0]):
            self.since[key] = (attempt, now)

    @staticmethod
    def _key(row: dict[str, Any]) -> Key | None:
        task, rollout = _int(row, records.TASK_INDEX), _int(row, records.ROLLOUT_INDEX)
        return None if task is None or rollout is None else (task, rollout)

    def oldest(self, now: float) -> list[tuple[Key, int, float]]:
        """Return the stragglers: ``((task, rollout), attempt, age)``, the oldest first."""
        old = sorted(self.since.items(), key=lambda item: item[1][1])[:_STRAGGLERS]
        ages = [(key, attempt, now - seen) for key, (attempt, seen) in old]
        return [item for item in ages if item[2] >= _MIN_STRAGGLER_AGE_S]


class _Rate:
    """Settled rollouts per second over a sliding window."""

    def __init__(self) -> None:
        self.points: deque[tuple[float, int]] = deque()

    def add(self, now: float, settled: int) -> float | None:
        self.points.append((now, settled))
        while now - self.points[0][0] > _RATE_WINDOW_S and len(self.points) > 2:
            self.points.popleft()
        t0, s0 = self.points[0]
        return (settled - s0) / (now - t0) if now > t0 else None


def _eta(missing: int, rate: float | None) -> str:
    if missing == 0:
        return "done"
    if not rate:
        return "ETA -"
    seconds = int(missing / rate)
    return f"ETA {seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def frame_lines(
    doc: dict[str, Any], rate: float | None, stragglers: list[tuple[Key, int, float]]
) -> list[str]:
    """Return one refresh of the watch: progress, rate, ETA, failures, retries, stragglers."""
    expected, missing = doc["expected"], doc["missing"]
    settled = expected - missing
    share = f"{100 * settled / expected:.1f}%" if expected else "-"
    speed = f"{rate:.2f}/s" if rate is not None else "-/s"
    exports = doc.get("export_metrics", {})
    lines = [
        f"{visible(str(doc['run']))}: {settled}/{expected} settled ({share}), "
        f"{doc['landed']} landed · {speed} · {_eta(missing, rate)}",
        f"  retries: {exports.get('retries/attempts', 0)} failed attempts, "
        f"{exports.get('retries/rollouts_retried', 0)} rollouts retried, "
        f"{doc['at_cap']} at the cap",
    ]
    if doc["failures_by_class"]:
        parts = [f"{visible(name)} {n}" for name, n in doc["failures_by_class"].items()]
        lines.append("  failed: " + ", ".join(parts))
    if stragglers:
        parts = [f"task {t} rollout {r} attempt {a} ({age:.0f}s)" for (t, r), a, age in stragglers]
        lines.append("  stragglers: " + ", ".join(parts))
    state = "running (pid {})".format(doc["collector_pid"]) if doc["collector_pid"] else "ended"
    lines.append(f"  collector: {state}")
    return lines


def watch(layout: RunLayout, status: StatusFn, *, interval_s: float, console: Console) -> None:
    """Show `status()` every `interval_s` seconds until no process holds the run's lock.

    Raises:
        KeyboardInterrupt: Ctrl-C (the caller exits 130).
    """
    outstanding, rate = Outstanding(layout), _Rate()
    live = Live(console=console, auto_refresh=False) if console.is_terminal else None
    with live or nullcontext():
        while True:
            now = time.monotonic()
            doc = status()
            outstanding.update(now)
            speed = rate.add(now, doc["expected"] - doc["missing"])
            text = Text("\n".join(frame_lines(doc, speed, outstanding.oldest(now))))
            if live is not None:
                live.update(text, refresh=True)
            else:
                console.print(text)
            if doc["collector_pid"] is None:
                return
            time.sleep(max(0.0, interval_s - (time.monotonic() - now)))  # a refresh per interval
