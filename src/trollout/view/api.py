"""The view's JSON API: its routes, each request's parameters checked, every answer bounded.

Routes (``r`` a run's number on the command line, a rollout ``s/t/k``: shard, task, rollout):

- ``/api/runs``: the runs (number, label, shard paths);
- ``/api/run/r``: the run page's summary (manifest, settings changed, counts, metrics, latency);
- ``/api/run/r/rollouts?offset&limit&sort&desc&outcome&class&agent&health&rmin&rmax&q``: one
  page (at most `MAX_PAGE` rows) of the filtered, sorted table;
- ``/api/run/r/rollout/s/t/k``: one rollout (materialized row, landed row, every failed
  attempt, verdict); ``.../field?src&path&start``: the next slice of one cut string;
  ``.../raw?src``: one row as its JSON line (at most `answers.MAX_RAW` bytes);
- ``/api/compare/a/b?offset&limit&diff``: per task, each run's reward and outcomes, the tasks
  that differ first.

`src` names a row: ``input``, ``landed``, ``failure:N`` (the N-th failed attempt, file order)
or ``verdict``. A row's long strings, lists and deep nesting come cut, each cut marked (key
`CUT`): `answers` says how.

Routes apart from answers: this module turns a URL into a run, a rollout and checked
parameters, and holds the view's state (the run indexes, the last few searches and table
orders of each run); `answers` computes each answer from one index and keeps nothing, so an
answer is read without the routing around it.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final
from urllib.parse import parse_qs

import orjson

from . import answers
from .answers import CUT, ROW_SOURCES, ApiError, run_header, sort_key, summary_row
from .index import FAILURE_ROW, HEALTH, OUTCOMES, RunIndex
from .meta import small_files
from .runs import Run

__all__ = ["CUT", "ApiError", "ViewApi"]

MAX_PAGE: Final = 500
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
        return run_header(number, self.runs[number])

    # --- the run page --------------------------------------------------------------------

    def summary(self, index: RunIndex) -> dict[str, Any]:
        """The run page's summary of one run."""
        return answers.summary(index, self.runs[index.number], self.files[index.number])

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
        rows = [summary_row(index, i) for i in order[offset : offset + limit]]
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
        order = sorted(keep, key=sort_key(index, sort), reverse=desc)
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
        return answers.rollout(index, self.runs[index.number], i)

    def _source(self, index: RunIndex, i: int, src: str) -> tuple[int, int]:
        if src in ROW_SOURCES:
            return ROW_SOURCES[src], 0
        name, _, n = src.partition(":")
        if name == "failure" and n.isdigit() and int(n) < len(index.failures.get(i, [])):
            return FAILURE_ROW, int(n)
        raise ApiError(400, f"src must be input, landed, verdict or failure:N, not {src[:40]!r}")

    def field(self, index: RunIndex, i: int, params: dict[str, str]) -> dict[str, Any]:
        """The next slice of one string that `answers.cut` shortened."""
        kind, n = self._source(index, i, params.get("src", ""))
        try:
            path = orjson.loads(params.get("path", "[]"))
        except orjson.JSONDecodeError:
            raise ApiError(400, "path must be a JSON array of keys and indices") from None
        start = max(0, _int(params.get("start", "0"), "start"))
        return answers.field(index, i, kind, n, path, start)

    def raw(self, index: RunIndex, i: int, params: dict[str, str]) -> dict[str, Any]:
        """One row as its JSON line, cut at `answers.MAX_RAW` bytes."""
        kind, n = self._source(index, i, params.get("src", ""))
        return answers.raw(index, i, kind, n)

    # --- two runs ------------------------------------------------------------------------

    def compare(self, a: RunIndex, b: RunIndex, params: dict[str, str]) -> dict[str, Any]:
        """Per task, each run's mean reward and outcomes; tasks that differ first."""
        offset = max(0, _int(params.get("offset", "0"), "offset"))
        limit = min(MAX_PAGE, max(1, _int(params.get("limit", "100"), "limit")))
        headers = [self._run_header(a.number), self._run_header(b.number)]
        return answers.compare(a, b, headers, offset, limit, params.get("diff") == "1")


# --- parameters ------------------------------------------------------------------------


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
