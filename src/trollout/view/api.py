"""The view's JSON API: answers from the run indexes, every one bounded.

Routes (``r`` a run's number on the command line, a rollout ``s/t/k``: shard, task, rollout):

- ``/api/runs``: the runs (number, label, shard paths);
- ``/api/run/r``: the run page's summary (manifest, settings changed, counts, metrics, latency);
- ``/api/run/r/rollouts?offset&limit&sort&desc&outcome&class&agent&health&rmin&rmax&q``: one
  page (at most `MAX_PAGE` rows) of the filtered, sorted table;
- ``/api/run/r/rollout/s/t/k``: one rollout (materialized row, landed row, every failed
  attempt, verdict); ``.../field?src&path&start``: the next slice of one cut string;
  ``.../raw?src``: one row as its JSON line (at most `MAX_RAW` bytes);
- ``/api/compare/a/b?offset&limit&diff``: per task, each run's reward and outcomes, the tasks
  that differ first.

A row's strings longer than `MAX_STRING` characters, lists longer than `MAX_ITEMS` and nesting
deeper than `MAX_DEPTH` are replaced by a marker object (key `CUT`) saying what was cut and
where, so the page can offer "show more". `src` names a row: ``input``, ``landed``,
``failure:N`` (the N-th failed attempt, file order) or ``verdict``.
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any, Final
from urllib.parse import parse_qs

import orjson

from ..metrics.run_info import run_info
from .index import FAILURE_ROW, HEALTH, INPUT, LANDED, LANDED_ROW, OUTCOMES, VERDICT, RunIndex
from .meta import small_files
from .runs import Run

__all__ = ["CUT", "ApiError", "ViewApi"]

CUT: Final = "__trollout_cut__"
MAX_PAGE: Final = 500
MAX_STRING: Final = 8_000
MAX_SLICE: Final = 100_000
MAX_ITEMS: Final = 200
MAX_KEYS: Final = 500
MAX_DEPTH: Final = 48
MAX_RAW: Final = 4 << 20
MAX_QUERY: Final = 200  # characters of a search text
_SORTS: Final = (
    "task",
    "rollout",
    "agent",
    "reward",
    "outcome",
    "class",
    "attempts",
    "latency",
    "health",
)
_CACHED: Final = 8  # searches and table orders remembered per run
STEP_BYTES: Final = 4 << 20  # indexed per file per request or background step


class ApiError(Exception):
    """A request the API refuses: a status and a one-line reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ViewApi:
    """The API over the runs of one ``trollout view``."""

    def __init__(self, runs: list[Run]) -> None:
        self.runs = runs
        self.indexes = [RunIndex(number, run) for number, run in enumerate(runs)]
        self.files = [[small_files(layout) for layout in run.shards] for run in runs]
        self._searches: list[OrderedDict[tuple[int, str], set[int]]] = [OrderedDict() for _ in runs]
        self._orders: list[OrderedDict[Any, list[int]]] = [OrderedDict() for _ in runs]

    def refresh(self) -> None:
        """Read what every run's files gained, whole (the first call indexes them)."""
        for index in self.indexes:
            index.refresh()

    def step(self) -> bool:
        """Index one step (`STEP_BYTES` per file) of every run; return whether any is behind."""
        for index in self.indexes:
            index.refresh(STEP_BYTES)
        return any(index.behind for index in self.indexes)

    def answer(self, path: str, query: str) -> Any:
        """Return the JSON-able answer to ``GET path?query``.

        Raises:
            ApiError: an unknown route, run or rollout, or a bad parameter.
        """
        parts = [p for p in path.split("/") if p][1:]  # past "api"
        params = {k: v[-1] for k, v in parse_qs(query, max_num_fields=32).items()}
        if parts == ["runs"]:
            return [self._run_header(i) for i in range(len(self.runs))]
        if len(parts) >= 2 and parts[0] == "run":
            index = self._index(parts[1])
            index.refresh(STEP_BYTES)
            rest = parts[2:]
            if not rest:
                return self.summary(index)
            if rest == ["rollouts"]:
                return self.page(index, params)
            if len(rest) in (4, 5) and rest[0] == "rollout":
                i = self._rollout(index, rest[1:4])
                if len(rest) == 4:
                    return self.rollout(index, i)
                if rest[4] == "field":
                    return self.field(index, i, params)
                if rest[4] == "raw":
                    return self.raw(index, i, params)
        if len(parts) == 3 and parts[0] == "compare":
            a, b = self._index(parts[1]), self._index(parts[2])
            a.refresh(STEP_BYTES)
            b.refresh(STEP_BYTES)
            return self.compare(a, b, params)
        raise ApiError(404, f"no such API route {path[:100]!r}")

    # --- lookups -------------------------------------------------------------------------

    def _index(self, text: str) -> RunIndex:
        number = _int(text, "run")
        if not 0 <= number < len(self.indexes):
            raise ApiError(404, f"no run {number}: this view shows runs 0 to {len(self.runs) - 1}")
        return self.indexes[number]

    def _rollout(self, index: RunIndex, parts: list[str]) -> int:
        key = (_int(parts[0], "shard"), _int(parts[1], "task"), _int(parts[2], "rollout"))
        i = index.keys.get(key)
        if i is None:
            raise ApiError(404, f"run {index.number} has no rollout {'/'.join(parts)}")
        return i

    def _run_header(self, number: int) -> dict[str, Any]:
        run = self.runs[number]
        return {
            "number": number,
            "label": run.label,
            "shards": [str(layout.rollouts) for layout in run.shards],
        }

    # --- the run page --------------------------------------------------------------------

    def summary(self, index: RunIndex) -> dict[str, Any]:
        """The run page's summary of one run."""
        files = self.files[index.number]
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
            **self._run_header(index.number),
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
            "report": self.runs[index.number].shards[0].report.exists(),
        }

    def page(self, index: RunIndex, params: dict[str, str]) -> dict[str, Any]:
        """One page of the rollout table."""
        offset = max(0, _int(params.get("offset", "0"), "offset"))
        limit = min(MAX_PAGE, max(1, _int(params.get("limit", "100"), "limit")))
        sort = params.get("sort", "task")
        if sort not in _SORTS:
            raise ApiError(400, f"sort must be one of {', '.join(_SORTS)}, not {sort[:40]!r}")
        desc = params.get("desc", "0") == "1"
        filters = tuple(
            (name, params.get(name, "")[:MAX_QUERY])
            for name in ("outcome", "class", "agent", "health", "rmin", "rmax", "q")
        )
        order = self._order(index, filters, sort, desc)
        rows = [_summary_row(index, i) for i in order[offset : offset + limit]]
        return {
            "version": index.version,
            "total": len(index),
            "matched": len(order),
            "offset": offset,
            "rows": rows,
        }

    def _order(
        self, index: RunIndex, filters: tuple[tuple[str, str], ...], sort: str, desc: bool
    ) -> list[int]:
        cache = self._orders[index.number]
        key = (index.version, filters, sort, desc)
        if key in cache:
            cache.move_to_end(key)
            return cache[key]
        keep = self._filter(index, dict(filters))
        order = sorted(keep, key=_sort_key(index, sort), reverse=desc)
        cache[key] = order
        while len(cache) > _CACHED:
            cache.popitem(last=False)
        return order

    def _filter(self, index: RunIndex, f: dict[str, str]) -> list[int]:
        tests: list[Callable[[int], bool]] = []
        if f["outcome"]:
            if f["outcome"] not in OUTCOMES:
                raise ApiError(400, f"outcome must be one of {', '.join(OUTCOMES)}")
            code = OUTCOMES.index(f["outcome"])
            tests.append(lambda i: index.outcome[i] == code)
        if f["class"]:
            cls = index._name_ids.get(f["class"], -1)
            tests.append(lambda i: index.cls[i] == cls)
        if f["agent"]:
            agent = index._name_ids.get(f["agent"], -1)
            tests.append(lambda i: index.agent[i] == agent)
        if f["health"]:
            health = HEALTH.index(f["health"]) if f["health"] in HEALTH else -1
            if f["health"] == "none":
                health = 0
            tests.append(lambda i: index.health[i] == health)
        if f["rmin"]:
            low = _float(f["rmin"], "rmin")
            tests.append(lambda i: index.reward[i] >= low)  # NaN compares False
        if f["rmax"]:
            high = _float(f["rmax"], "rmax")
            tests.append(lambda i: index.reward[i] <= high)
        if f["q"]:
            hits = self._search(index, f["q"])
            tests.append(hits.__contains__)
        return [i for i in range(len(index)) if all(test(i) for test in tests)]

    def _search(self, index: RunIndex, text: str) -> set[int]:
        cache = self._searches[index.number]
        key = (index.version, text)
        if key not in cache:
            cache[key] = index.search(text)
            while len(cache) > _CACHED:
                cache.popitem(last=False)
        return cache[key]

    # --- a rollout -----------------------------------------------------------------------

    def rollout(self, index: RunIndex, i: int) -> dict[str, Any]:
        """Everything the rollout page shows, each row cut to bounds."""
        notes = []
        rows: dict[str, Any] = {}
        for name, kind in (("input", INPUT), ("landed", LANDED_ROW), ("verdict", VERDICT)):
            row, why = index.read_row(i, kind)
            rows[name] = _cut(row, []) if row is not None else None
            if why:
                notes.append(f"{name}: {why}")
        attempts = []
        for n in range(len(index.failures.get(i, []))):
            row, why = index.read_row(i, FAILURE_ROW, n)
            attempts.append(_cut(row, []) if row is not None else {"note": why})
        return {
            "run": index.number,
            "label": self.runs[index.number].label,
            "summary": _summary_row(index, i),
            **rows,
            "attempts": attempts,
            "notes": notes,
        }

    def _source(self, index: RunIndex, i: int, src: str) -> tuple[int, int]:
        kinds = {"input": INPUT, "landed": LANDED_ROW, "verdict": VERDICT}
        if src in kinds:
            return kinds[src], 0
        name, _, n = src.partition(":")
        if name == "failure" and n.isdigit() and int(n) < len(index.failures.get(i, [])):
            return FAILURE_ROW, int(n)
        raise ApiError(400, f"src must be input, landed, verdict or failure:N, not {src[:40]!r}")

    def field(self, index: RunIndex, i: int, params: dict[str, str]) -> dict[str, Any]:
        """The next slice of one string that `_cut` shortened."""
        kind, n = self._source(index, i, params.get("src", ""))
        try:
            path = orjson.loads(params.get("path", "[]"))
        except orjson.JSONDecodeError:
            raise ApiError(400, "path must be a JSON array of keys and indices") from None
        start = max(0, _int(params.get("start", "0"), "start"))
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

    def raw(self, index: RunIndex, i: int, params: dict[str, str]) -> dict[str, Any]:
        """One row as its JSON line, cut at `MAX_RAW` bytes."""
        kind, n = self._source(index, i, params.get("src", ""))
        locs = index.locs(i, kind)
        if n >= len(locs):
            raise ApiError(404, "the rollout has no such row")
        data = index.read_bytes(i, kind, locs[n], MAX_RAW) or b""
        return {
            "text": data.decode("utf-8", "replace"),
            "length": locs[n][1],
            "cut": locs[n][1] > MAX_RAW,
        }

    # --- two runs ------------------------------------------------------------------------

    def compare(self, a: RunIndex, b: RunIndex, params: dict[str, str]) -> dict[str, Any]:
        """Per task, each run's mean reward and outcomes; tasks that differ first."""
        offset = max(0, _int(params.get("offset", "0"), "offset"))
        limit = min(MAX_PAGE, max(1, _int(params.get("limit", "100"), "limit")))
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
        if params.get("diff") == "1":
            rows = rows[:differing]
        return {
            "runs": [self._run_header(a.number), self._run_header(b.number)],
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


def _int(text: str, what: str) -> int:
    if not (text.isdigit() or (text[:1] == "-" and text[1:].isdigit())) or len(text) > 18:
        raise ApiError(400, f"{what} must be an integer, not {text[:40]!r}")
    return int(text)


def _float(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ApiError(400, f"{what} must be a number, not {text[:40]!r}") from None
    if math.isnan(value):
        raise ApiError(400, f"{what} must be a number")
    return value


def _num(x: float) -> float | None:
    return None if math.isnan(x) else x


def _summary_row(index: RunIndex, i: int) -> dict[str, Any]:
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


def _sort_key(index: RunIndex, sort: str) -> Callable[[int], Any]:
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
            entry["rollouts"].append(_summary_row(index, i))
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


def _cut(value: Any, path: list[Any], depth: int = 0) -> Any:
    """``value`` with long strings, long lists, wide objects and deep nesting cut (module doc)."""
    if isinstance(value, str):
        if len(value) <= MAX_STRING:
            return value
        return {CUT: "text", "text": value[:MAX_STRING], "length": len(value), "path": path}
    if depth >= MAX_DEPTH and isinstance(value, dict | list):
        return {CUT: "deep", "path": path}
    if isinstance(value, list):
        out = [_cut(v, [*path, n], depth + 1) for n, v in enumerate(value[:MAX_ITEMS])]
        if len(value) > MAX_ITEMS:
            out.append({CUT: "items", "more": len(value) - MAX_ITEMS, "path": path})
        return out
    if isinstance(value, dict):
        items = list(value.items())
        out_d = {k: _cut(v, [*path, k], depth + 1) for k, v in items[:MAX_KEYS]}
        if len(items) > MAX_KEYS:
            out_d[CUT] = {CUT: "keys", "more": len(items) - MAX_KEYS, "path": path}
        return out_d
    return value
