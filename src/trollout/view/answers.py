"""The view's answers: what each JSON answer holds, computed from one run's index, bounded.

`api` parses a request and finds its run and rollout; the functions here build the answer
from a `RunIndex` (and the run's small files): the run page's summary, a table row and its sort
order, one rollout's rows, the next slice of a cut string, a raw row, and two runs compared per
task. They read an index and its files and keep nothing, so each is one function of its inputs;
the view's state (the indexes, the cached searches and table orders) stays in `api.ViewApi`.

A row's strings longer than `MAX_STRING` characters, lists longer than `MAX_ITEMS`, objects
wider than `MAX_KEYS` and nesting deeper than `MAX_DEPTH` are replaced by a marker object (key
`CUT`) saying what was cut and where (`cut`), so the page can offer "show more"; a raw row is
cut at `MAX_RAW` bytes.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Any, Final

from ..metrics.run_info import run_info
from .index import FAILURE_ROW, HEALTH, INPUT, LANDED, LANDED_ROW, OUTCOMES, VERDICT, RunIndex
from .meta import FileCache
from .runs import Run

__all__ = [
    "CUT",
    "MAX_RAW",
    "ROW_SOURCES",
    "ApiError",
    "compare",
    "cut",
    "field",
    "raw",
    "rollout",
    "run_header",
    "sort_key",
    "summary",
    "summary_row",
]

CUT: Final = "__trollout_cut__"
MAX_STRING: Final = 8_000
MAX_SLICE: Final = 100_000
MAX_ITEMS: Final = 200
MAX_KEYS: Final = 500
MAX_DEPTH: Final = 48
MAX_RAW: Final = 4 << 20
ROW_SOURCES: Final = {"input": INPUT, "landed": LANDED_ROW, "verdict": VERDICT}


class ApiError(Exception):
    """A request the API refuses: a status and a one-line reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def run_header(number: int, run: Run) -> dict[str, Any]:
    """A run's number, label and shard paths (the head of every answer about it)."""
    return {
        "number": number,
        "label": run.label,
        "shards": [str(layout.rollouts) for layout in run.shards],
    }


# --- the run page ----------------------------------------------------------------------


def summary(index: RunIndex, run: Run, files: list[dict[str, FileCache]]) -> dict[str, Any]:
    """The run page's summary of one run (`files`: each shard's small files)."""
    manifests = [f["manifest"].get() for f in files]
    statuses = [f["status"].get() for f in files]
    metrics = [f["metrics"].get() for f in files]
    problems = list(index.problems)
    problems += [c.problem for f in files for c in f.values() if c.problem]
    closed = all(isinstance(s, dict) and s.get("closed") for s in statuses)
    expected = sum(
        m["expected_rollouts"]
        for m in manifests
        if isinstance(m, dict) and isinstance(m.get("expected_rollouts"), int)
    )
    return {
        **run_header(index.number, run),
        "version": index.version,
        "live": index.behind or (not closed and not all(metrics)),
        "indexing": index.behind,
        "problems": problems[:50],
        "manifest": run_info(manifests[0]),
        "manifests": len([m for m in manifests if m]),
        "status": statuses[0] if len(statuses) == 1 else _sum_status(statuses),
        "counts": _counts(index, expected),
        "latency": _latency(index),
        "metrics": [g for m in metrics if m for g in m],
        "agents": sorted({index.names[a] for a in set(index.agent) if a}),
        "classes": sorted({index.names[c] for c in set(index.cls) if c}),
        "report": run.shards[0].report.exists(),
    }


# --- a rollout -------------------------------------------------------------------------


def rollout(index: RunIndex, run: Run, i: int) -> dict[str, Any]:
    """Everything the rollout page shows, each row cut to bounds."""
    notes = []
    rows: dict[str, Any] = {}
    for name, kind in ROW_SOURCES.items():
        row, why = index.read_row(i, kind)
        rows[name] = cut(row, []) if row is not None else None
        if why:
            notes.append(f"{name}: {why}")
    attempts = []
    for n in range(len(index.failures.get(i, []))):
        row, why = index.read_row(i, FAILURE_ROW, n)
        attempts.append(cut(row, []) if row is not None else {"note": why})
    return {
        "run": index.number,
        "label": run.label,
        "summary": summary_row(index, i),
        **rows,
        "attempts": attempts,
        "notes": notes,
    }


def field(index: RunIndex, i: int, kind: int, n: int, path: Any, start: int) -> dict[str, Any]:
    """The slice from `start` of one string that `cut` shortened: the row `kind` (the `n`-th
    of them), then `path`, its keys and indices."""
    row, why = index.read_row(i, kind, n)
    value: Any = row
    for step in path if isinstance(path, list) else [None]:
        in_dict = isinstance(value, dict) and isinstance(step, str) and step in value
        in_list = isinstance(value, list) and type(step) is int and 0 <= step < len(value)
        if in_dict or in_list:
            value = value[step]
        else:
            raise ApiError(404, why or "no such field in the row")
    if not isinstance(value, str):
        raise ApiError(404, "that field is not a string")
    return {"text": value[start : start + MAX_SLICE], "start": start, "length": len(value)}


def raw(index: RunIndex, i: int, kind: int, n: int) -> dict[str, Any]:
    """One row (`kind`, the `n`-th of them) as its JSON line, cut at `MAX_RAW` bytes."""
    locs = index.locs(i, kind)
    if n >= len(locs):
        raise ApiError(404, "the rollout has no such row")
    data = index.read_bytes(i, kind, locs[n], MAX_RAW) or b""
    return {
        "text": data.decode("utf-8", "replace"),
        "length": locs[n][1],
        "cut": locs[n][1] > MAX_RAW,
    }


# --- two runs --------------------------------------------------------------------------


def compare(
    a: RunIndex, b: RunIndex, headers: list[dict[str, Any]], offset: int, limit: int, diff: bool
) -> dict[str, Any]:
    """Per task, each run's mean reward and outcomes; tasks that differ first (only those when
    `diff`); `headers`: the two runs' `run_header`."""
    left, right = _per_task(a), _per_task(b)
    rows = []
    for task in sorted(left.keys() | right.keys()):
        x, y = left.get(task), right.get(task)
        rx, ry = _mean(x), _mean(y)
        differs = x is None or y is None or x["outcomes"] != y["outcomes"] or rx != ry
        delta = abs(rx - ry) if rx is not None and ry is not None else math.inf
        rows.append((not differs, -delta if differs else 0.0, task, x, y))
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    differing = sum(1 for r in rows if not r[0])
    if diff:
        rows = rows[:differing]
    return {
        "runs": headers,
        "versions": [a.version, b.version],
        "tasks": len(rows),
        "differing": differing,
        "offset": offset,
        "rows": [
            {"task": task, "differs": not same, "a": _side(x), "b": _side(y)}
            for same, _, task, x, y in rows[offset : offset + limit]
        ],
    }


# --- helpers ---------------------------------------------------------------------------


def _num(x: float) -> float | None:
    return None if math.isnan(x) else x


def summary_row(index: RunIndex, i: int) -> dict[str, Any]:
    """One rollout's row of the table (its summary in the index)."""
    shard, task, rollout = index.shard[i], index.task[i], index.rollout[i]
    return {
        "id": f"{shard}/{task}/{rollout}",
        "shard": shard,
        "task": task,
        "rollout": rollout,
        "agent": index.names[index.agent[i]],
        "reward": _num(index.reward[i]),
        "outcome": OUTCOMES[index.outcome[i]],
        "class": index.names[index.cls[i]],
        "attempts": index.attempts[i],
        "latency": _num(index.latency[i]),
        "health": HEALTH[index.health[i]],
    }


def sort_key(index: RunIndex, sort: str) -> Callable[[int], Any]:
    """The key that orders the table by the column `sort` (a missing reward or latency last)."""

    def numeric(column: Any) -> Callable[[int], Any]:
        return lambda i: (math.isnan(column[i]), column[i], index.task[i], index.rollout[i])

    keys: dict[str, Callable[[int], Any]] = {
        "task": lambda i: (index.shard[i], index.task[i], index.rollout[i]),
        "rollout": lambda i: (index.rollout[i], index.shard[i], index.task[i]),
        "agent": lambda i: (index.names[index.agent[i]], index.task[i], index.rollout[i]),
        "reward": numeric(index.reward),
        "latency": numeric(index.latency),
        "outcome": lambda i: (index.outcome[i], index.task[i], index.rollout[i]),
        "class": lambda i: (index.names[index.cls[i]], index.task[i], index.rollout[i]),
        "attempts": lambda i: (index.attempts[i], index.task[i], index.rollout[i]),
        "health": lambda i: (index.health[i], index.task[i], index.rollout[i]),
    }
    return keys[sort]


def _counts(index: RunIndex, expected: int) -> dict[str, Any]:
    outcomes = Counter(index.outcome)
    classes = Counter(
        index.names[index.cls[i]] for i in range(len(index)) if index.outcome[i] != LANDED
    )
    classes.pop("", None)
    landed_classes = Counter(
        index.names[index.cls[i]]
        for i in range(len(index))
        if index.outcome[i] == LANDED and index.cls[i]
    )
    health = Counter(HEALTH[h] for h in index.health if h)
    agents: dict[str, dict[str, Any]] = {}
    for i in range(len(index)):
        entry = agents.setdefault(
            index.names[index.agent[i]] or "(none)",
            {"landed": 0, "failed": 0, "pending": 0, "reward_sum": 0.0, "rewarded": 0},
        )
        entry[OUTCOMES[index.outcome[i]]] += 1
        if not math.isnan(index.reward[i]):
            entry["reward_sum"] += index.reward[i]
            entry["rewarded"] += 1
    for entry in agents.values():
        entry["mean_reward"] = (
            entry["reward_sum"] / entry["rewarded"] if entry["rewarded"] else None
        )
        del entry["reward_sum"]
    return {
        "rollouts": len(index),
        "expected": expected or len(index),
        "landed": outcomes[LANDED],
        "failed": outcomes[2],
        "pending": outcomes[0],
        "retried": sum(1 for n in index.attempts if n > 1),
        "attempts": sum(index.attempts),
        "failure_classes": dict(classes.most_common()),
        "landed_with_class": dict(landed_classes.most_common()),
        "health": dict(health),
        "agents": agents,
    }


def _latency(index: RunIndex) -> dict[str, Any]:
    values = sorted(x for x in index.latency if not math.isnan(x))
    if not values:
        return {"n": 0}

    def q(p: float) -> float:
        return values[min(len(values) - 1, int(p * len(values)))]

    return {"n": len(values), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": values[-1]}


def _sum_status(statuses: list[Any]) -> dict[str, Any]:
    total: Counter[str] = Counter()
    for s in statuses:
        if isinstance(s, dict):
            total.update({k: v for k, v in s.items() if type(v) is int})
    closed = all(isinstance(s, dict) and s.get("closed") for s in statuses)
    return {**total, "closed": closed, "shards": len(statuses)}


def _per_task(index: RunIndex) -> dict[int, dict[str, Any]]:
    tasks: dict[int, dict[str, Any]] = {}
    for i in range(len(index)):
        entry = tasks.setdefault(
            index.task[i], {"outcomes": Counter(), "sum": 0.0, "n": 0, "rollouts": []}
        )
        entry["outcomes"][OUTCOMES[index.outcome[i]]] += 1
        if not math.isnan(index.reward[i]):
            entry["sum"] += index.reward[i]
            entry["n"] += 1
        if len(entry["rollouts"]) < 16:
            entry["rollouts"].append(summary_row(index, i))
    return tasks


def _mean(entry: dict[str, Any] | None) -> float | None:
    return entry["sum"] / entry["n"] if entry and entry["n"] else None


def _side(entry: dict[str, Any] | None) -> dict[str, Any] | None:
    if entry is None:
        return None
    return {
        "mean_reward": _mean(entry),
        "outcomes": dict(entry["outcomes"]),
        "rollouts": entry["rollouts"],
    }


def cut(value: Any, path: list[Any], depth: int = 0) -> Any:
    """``value`` with long strings, long lists, wide objects and deep nesting cut (module doc)."""
    if isinstance(value, str):
        if len(value) <= MAX_STRING:
            return value
        return {CUT: "text", "text": value[:MAX_STRING], "length": len(value), "path": path}
    if depth >= MAX_DEPTH and isinstance(value, dict | list):
        return {CUT: "deep", "path": path}
    if isinstance(value, list):
        out = [cut(v, [*path, n], depth + 1) for n, v in enumerate(value[:MAX_ITEMS])]
        if len(value) > MAX_ITEMS:
            out.append({CUT: "items", "more": len(value) - MAX_ITEMS, "path": path})
        return out
    if isinstance(value, dict):
        items = list(value.items())
        out_d = {k: cut(v, [*path, k], depth + 1) for k, v in items[:MAX_KEYS]}
        if len(items) > MAX_KEYS:
            out_d[CUT] = {CUT: "keys", "more": len(items) - MAX_KEYS, "path": path}
        return out_d
    return value
