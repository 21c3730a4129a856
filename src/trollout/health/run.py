# Stays whole: the one pass and the state it folds (task flags, verdict spool) act together.
"""The reduce step: one pass over a rollouts file, task state, the two files, the report lines.

See the package docstring for the design; this module holds `check_run` and `check_files`.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from itertools import groupby
from pathlib import Path
from typing import Any, Final

from attrs import frozen

from ..errors import ConfigError
from ..jsonl import iter_lines
from .checks import CHECKS, NO_STAGE, ROLLOUT_CHECKS, TASK_CHECKS, RowResult, evaluate_chunk
from .checks import render as _render
from .spool import SortedSpool

__all__ = [
    "QUALITY_SUMMARY",
    "ROLLOUT_VERDICTS",
    "HealthReport",
    "check_files",
    "check_run",
    "parse_ignored",
    "report_lines",
]

QUALITY_SUMMARY: Final = "quality_summary.json"
ROLLOUT_VERDICTS: Final = "rollout_verdicts.jsonl"
VERDICTS: Final = ("healthy", "unhealthy", "unobserved")
MAX_LINE_BYTES: Final = 64 * 2**20  # one rollout line; beyond it the file is not a rollouts file
_CHUNK: Final = 64  # lines per work unit of a worker process
_POOL_MIN_BYTES: Final = 1 * 2**20  # smaller files are checked inline (a pool costs more)
_DUP: Final = CHECKS.index("rollout_duplicate_identity")


@frozen
class HealthReport:
    """What one health check found, and where it wrote it.

    Attributes:
        checked: rows checked (physical lines of the rollouts file, unreadable ones included).
        verdicts: rows per verdict (healthy, unhealthy, unobserved).
        issues: findings per check id, registry order (task checks count flagged tasks).
        ignored: the ignored check ids, sorted.
        summary_path: ``quality_summary.json``; verdicts_path: ``rollout_verdicts.jsonl``.
        summary: the summary object as written.
    """

    checked: int
    verdicts: dict[str, int]
    issues: dict[str, int]
    ignored: tuple[str, ...]
    summary_path: Path
    verdicts_path: Path
    summary: dict[str, Any]

    def lines(self) -> list[str]:
        """The two lines NeMo Gym prints after a health check (`report_lines`)."""
        return report_lines(self)

    def top_flagged(self, n: int = 5) -> list[tuple[str, int]]:
        """The checks with the most findings, most first (ties in registry order)."""
        flagged = [(check, count) for check, count in self.issues.items() if count]
        return sorted(flagged, key=lambda item: -item[1])[:n]


def report_lines(report: HealthReport) -> list[str]:
    """``Rollout health: N checked, ...`` and ``Quality summary: PATH``, as NeMo Gym prints them."""
    v = report.verdicts
    head = (
        f"Rollout health: {report.checked} checked, {v['healthy']} healthy, "
        f"{v['unhealthy']} unhealthy, {v['unobserved']} unobserved"
    )
    if report.ignored:
        head += f" (ignored: {', '.join(report.ignored)})"
    return [head, f"Quality summary: {report.summary_path}"]


def parse_ignored(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """Return ignored check ids from a comma string or a list, sorted and checked.

    Raises:
        ConfigError: an id that is not a check (``Unknown rollout health check(s): ...``).
    """
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    names = [str(item).strip() for item in items if str(item).strip()]
    unknown = [name for name in names if name not in CHECKS]
    if unknown:
        raise ConfigError(f"Unknown rollout health check(s): {', '.join(unknown)}")
    return tuple(sorted(set(names)))


def check_run(
    rollouts_file: str | os.PathLike[str],
    out_dir: str | os.PathLike[str] | None = None,
    *,
    ignored_checks: str | Iterable[str] | None = (),
    workers: int = 1,
) -> HealthReport:
    """Check every row of a rollouts file; write both files into ``out_dir`` (default: beside it).

    Args:
        rollouts_file: the rollouts JSONL (a collection's output, or a merged output).
        out_dir: where ``quality_summary.json`` and ``rollout_verdicts.jsonl`` go (replaced).
        ignored_checks: check ids to skip (a comma string or a list).
        workers: processes checking rows (1: inline); the files are the same for any number.

    Raises:
        ConfigError: an unknown check id, ``workers`` < 1, or a missing rollouts file.
        InputError: a line longer than `MAX_LINE_BYTES`.
        OSError: the output directory cannot be written.
    """
    return check_files([rollouts_file], out_dir, ignored_checks=ignored_checks, workers=workers)


def check_files(
    rollouts_files: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str] | None = None,
    *,
    ignored_checks: str | Iterable[str] | None = (),
    workers: int = 1,
) -> HealthReport:
    """`check_run` over several files (shards kept apart), numbered ``input-0``, ``input-1``..."""
    ignored = parse_ignored(ignored_checks)
    if type(workers) is not int or workers < 1:
        raise ConfigError(f"health check workers must be an integer >= 1 (got {workers!r})")
    paths = [Path(os.path.abspath(p)) for p in rollouts_files]
    for path in paths:
        if not path.is_file():
            raise ConfigError(f"Rollout JSONL not found: {path}")
    out = Path(out_dir) if out_dir is not None else paths[0].parent
    summary_path = Path(os.path.abspath(out / QUALITY_SUMMARY))
    verdicts_path = Path(os.path.abspath(out / ROLLOUT_VERDICTS))
    with SortedSpool(out) as spool:
        state = _State(frozenset(ignored), spool)
        for file_index, path in enumerate(paths):
            for result in _results(path, file_index, state.ignored, workers):
                state.add(result)
        _replace(verdicts_path, state.verdict_lines())
    summary = state.summary(ignored)
    _replace(summary_path, [_indented(summary)])
    run = summary["run"]
    return HealthReport(
        checked=run["artifacts"]["records"],
        verdicts=dict(run["verdicts"]),
        issues=dict(run["issues"]),
        ignored=ignored,
        summary_path=summary_path,
        verdicts_path=verdicts_path,
        summary=summary,
    )


def _indented(obj: Any) -> str:
    import json

    return json.dumps(obj, indent=2)


def _replace(path: Path, parts: Iterable[str]) -> None:
    """Write a file whole and rename it into place: a reader never sees half of it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="ascii", newline="") as f:
            for part in parts:
                f.write(part)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _chunks(path: Path) -> Iterator[list[tuple[int, bytes]]]:
    chunk: list[tuple[int, bytes]] = []
    for number, line in iter_lines(path, max_line_bytes=MAX_LINE_BYTES):
        chunk.append((number, line))
        if len(chunk) == _CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _results(
    path: Path, file_index: int, ignored: frozenset[str], workers: int
) -> Iterator[RowResult]:
    """Yield each line's result in file order, inline or from a pool of worker processes."""
    source = str(path)
    if workers == 1 or path.stat().st_size < _POOL_MIN_BYTES:
        for chunk in _chunks(path):
            yield from evaluate_chunk(chunk, file_index, source, ignored)
        return
    yield from _pooled(_chunks(path), workers, file_index, source, ignored)


def _pooled(
    chunks: Iterator[list[tuple[int, bytes]]],
    workers: int,
    file_index: int,
    source: str,
    ignored: frozenset[str],
) -> Iterator[RowResult]:
    """Check chunks in worker processes, at most two per worker in flight, in order.

    A pool that cannot start or breaks is not an error: the chunks not yet checked are checked
    inline (NeMo Gym falls back the same way), so the files are the same either way.
    """
    context = multiprocessing.get_context("spawn")  # the caller may hold threads (trio, click)
    pending: list[tuple[list[tuple[int, bytes]], concurrent.futures.Future[list[RowResult]]]] = []
    try:
        pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=context)
    except (OSError, RuntimeError, ValueError):
        for chunk in chunks:
            yield from evaluate_chunk(chunk, file_index, source, ignored)
        return
    broken = False
    with pool:
        for chunk in chunks:
            if broken:
                yield from evaluate_chunk(chunk, file_index, source, ignored)
                continue
            pending.append((chunk, pool.submit(evaluate_chunk, chunk, file_index, source, ignored)))
            while len(pending) >= 2 * workers or (broken and pending):
                done_chunk, future = pending.pop(0)
                results, broken = _collect(future, done_chunk, file_index, source, ignored)
                yield from results
        for done_chunk, future in pending:
            results, _ = _collect(future, done_chunk, file_index, source, ignored)
            yield from results


def _collect(
    future: concurrent.futures.Future[list[RowResult]],
    chunk: list[tuple[int, bytes]],
    file_index: int,
    source: str,
    ignored: frozenset[str],
) -> tuple[list[RowResult], bool]:
    try:
        return future.result(), False
    except (concurrent.futures.process.BrokenProcessPool, OSError):
        return evaluate_chunk(chunk, file_index, source, ignored), True


def _order(value: Any) -> tuple[int, Any]:
    """Sort key of an index: integers first, then strings, then anything else."""
    if type(value) is int:
        return (0, value)
    if type(value) is str:
        return (1, value)
    return (2, repr(value))


_NO_STAGE_KEY: Final = (-1, 0)  # a row without a stage sorts before its staged copies
_VERDICT_OF: Final = ("unhealthy", "unobserved", "healthy")  # a row's verdict before duplicates
# A spooled row: (key, head, before, after, verdict, tail, readable, complete, successful);
# key = (task order, rollout order, stage order, file order); before/after: the rendered
# findings that go before and after a duplicate-identity finding; tail: the line after its
# findings. Positions, not names: a tuple of plain values is the smallest thing to spool.
_KEY, _HEAD, _BEFORE, _AFTER, _VERDICT, _TAIL, _READABLE, _COMPLETE, _SUCCESSFUL = range(9)


class _State:
    """Run totals, the task names, and the rows' verdict-line parts in a `SortedSpool`."""

    def __init__(self, ignored: frozenset[str], spool: SortedSpool) -> None:
        self.ignored = ignored
        self.spool = spool
        self.task_names: dict[tuple[int, Any], str] = {}  # task order -> its name in the summary
        self.records = 0
        self.captures = 0
        self.rows_unobserved = [0] * len(ROLLOUT_CHECKS)
        self.rows_unreadable = 0
        self.by_status: Counter[str] = Counter()
        self.failed_calls = 0
        self.rollouts_affected = 0
        self.ended_on_error = 0
        self.replayed = 0
        self.replayed_rollouts = 0
        self.tokens = [0, 0, 0, 0]
        # Set while the verdict lines are written (`verdict_lines`), read by `summary`.
        self.verdicts = dict.fromkeys(VERDICTS, 0)
        self.issues = [0] * len(CHECKS)
        self.tasks_out: dict[str, dict[str, Any]] = {}
        self.task_count = 0
        self.task_unobserved = [0, 0]

    def add(self, result: RowResult) -> None:
        self.records += 1
        head = {"_ng_task_index": result.task, "_ng_rollout_index": result.rollout}
        head["rollout_id"] = result.rollout_id
        task = _order(result.task)
        if task not in self.task_names:
            self.task_names[task] = str(result.task)
        stage = _NO_STAGE_KEY if result.stage is NO_STAGE else _order(result.stage)
        before = ",".join(text for index, text in result.findings if index < _DUP)
        after = ",".join(text for index, text in result.findings if index > _DUP)
        for index, _ in result.findings:
            self.issues[index] += 1
        staged = "" if result.stage is NO_STAGE else f',"stage_index":{_render(result.stage)}'
        tail = f'],"unobserved":{_render([CHECKS[i] for i in result.unobserved])}{staged}}}\n'
        verdict = 0 if result.findings else 1 if result.unobserved else 2
        self.spool.add(
            (
                (task, _order(result.rollout), stage, self.records),
                _render(head)[:-1],  # the line's opening keys, without the closing brace
                before,
                after,
                verdict,
                tail,
                result.readable,
                result.turn_complete,
                result.successful > 0,
            )
        )
        for index in result.unobserved:
            self.rows_unobserved[index] += 1
        self.rows_unreadable += not result.readable
        self.captures += result.captured
        if result.failed_statuses:
            self.failed_calls += len(result.failed_statuses)
            self.by_status.update(result.failed_statuses)
            self.rollouts_affected += 1
        self.ended_on_error += result.ended_on_error
        if result.replayed:
            self.replayed += result.replayed
            self.replayed_rollouts += 1
        for i, value in enumerate(result.tokens):
            self.tokens[i] += value

    def verdict_lines(self) -> Iterator[str]:
        """Yield the verdict lines in order, settling duplicates and tasks on the way.

        The spool yields rows by (task, rollout, stage, file order), so one task's rows, and
        within it one rollout's copies, arrive together: a repeat is settled (duplicate
        findings, verdicts, its collapsed verdict) and written before the next is read.
        """
        dup_on = "rollout_duplicate_identity" not in self.ignored
        for task, rows in groupby(self.spool.sorted(), key=_task_of):
            self.task_count += 1
            counts = dict.fromkeys(VERDICTS, 0)
            repeats = computable = unhealthy = 0
            complete, successful = True, False
            for _, group in groupby(rows, key=_rollout_of):
                copies = list(group)
                stages = Counter(row[_KEY][2] for row in copies if row[_READABLE])
                found = set()
                for row in copies:
                    verdict = _VERDICT_OF[row[_VERDICT]]
                    findings = [row[_BEFORE], row[_AFTER]]
                    count = stages[row[_KEY][2]] if row[_READABLE] else 0
                    if dup_on and count > 1:
                        findings.insert(1, _duplicate(count))
                        self.issues[_DUP] += 1
                        verdict = "unhealthy"
                    self.verdicts[verdict] += 1
                    found.add(verdict)
                    complete = complete and row[_COMPLETE]
                    successful = successful or row[_SUCCESSFUL]
                    yield (
                        f'{row[_HEAD]},"verdict":"{verdict}","findings":['
                        f"{','.join(f for f in findings if f)}{row[_TAIL]}"
                    )
                collapsed = found.pop() if len(found) == 1 else "unobserved"
                counts[collapsed] += 1
                repeats += 1
                computable += collapsed != "unobserved"
                unhealthy += collapsed == "unhealthy"
            flags = []
            if "task_consistently_unhealthy" not in self.ignored:
                if computable < 2:
                    self.task_unobserved[0] += 1
                elif unhealthy == computable:
                    flags.append("task_consistently_unhealthy")
            if "task_no_successful_model_calls" not in self.ignored:
                if not complete:
                    self.task_unobserved[1] += 1
                elif not successful:
                    flags.append("task_no_successful_model_calls")
            for flag in flags:
                self.issues[CHECKS.index(flag)] += 1
            self.tasks_out[self.task_names[task]] = {"repeats": repeats, **counts, "flags": flags}

    def summary(self, ignored: tuple[str, ...]) -> dict[str, Any]:
        """The summary object (after `verdict_lines` has been consumed)."""
        issues = dict(zip(CHECKS, self.issues, strict=True))
        coverage: dict[str, dict[str, int]] = {}
        for index, check in enumerate(ROLLOUT_CHECKS):
            if check in self.ignored:
                coverage[check] = {"evaluated": 0, "unobserved": 0, "ignored": self.records}
                continue
            unobserved = self.rows_unobserved[index]
            if check == "rollout_duplicate_identity":
                unobserved = self.rows_unreadable
            coverage[check] = {
                "evaluated": self.records - unobserved,
                "unobserved": unobserved,
                "ignored": 0,
            }
        for index, check in enumerate(TASK_CHECKS):
            n = self.task_count
            if check in self.ignored:
                coverage[check] = {"evaluated": 0, "unobserved": 0, "ignored": n}
            else:
                u = self.task_unobserved[index]
                coverage[check] = {"evaluated": n - u, "unobserved": u, "ignored": 0}
        prompt, completion, capture_prompt, capture_completion = self.tokens
        run = {
            "ignored_checks": list(ignored),
            "artifacts": {"records": self.records, "captures": self.captures, "coverage": coverage},
            "verdicts": dict(self.verdicts),
            "issues": issues,
            "stats": {
                "model_call_errors": {
                    "total": self.failed_calls,
                    "by_status": dict(sorted(self.by_status.items())),
                    "rollouts_affected": self.rollouts_affected,
                    "ended_on_error": self.ended_on_error,
                },
                "duplicated_calls": {"replayed": self.replayed, "rollouts": self.replayed_rollouts},
                "tokens": {
                    "prompt": prompt,
                    "completion": completion,
                    "capture_prompt": capture_prompt,
                    "capture_completion": capture_completion,
                },
            },
        }
        return {"run": run, "tasks": self.tasks_out}


def _task_of(row: tuple[Any, ...]) -> Any:
    return row[_KEY][0]


def _rollout_of(row: tuple[Any, ...]) -> Any:
    return row[_KEY][1]


def _duplicate(count: int) -> str:
    return _render({"check": "rollout_duplicate_identity", "detail": {"duplicate_count": count}})
