"""Rollout health: NeMo Gym 0.7.0's 14 checks, verdicts, task flags and the two files.

What: after a run (``collect``), after ``aggregate`` (over the merged output) and on demand
(``trollout health-check RUN_DIR``), every row of a rollouts file is judged ``healthy``,
``unhealthy`` (at least one finding) or ``unobserved`` (nothing wrong seen, but some check lacked
its evidence), tasks are flagged when every repeat went wrong, and two files are written beside
the rollouts: ``rollout_verdicts.jsonl`` (one line per row, byte-identical to NeMo Gym's) and
``quality_summary.json`` (coverage, verdicts, issues, statistics, tasks; equal to NeMo Gym's as
JSON). docs/health.md is the user's description; this note is the design.

How, and why this shape:

- **Map, then reduce.** `checks.evaluate_line` turns one line into a `checks.RowResult`: the
  row's identity, its findings already rendered as JSON text, the checks it could not evaluate,
  and small digests (turn bindings complete, successful turn calls, the row's statistics). The
  row itself is dropped there. `run.check_run` reads the file once, line by line
  (`jsonl.iter_lines`, a line capped at 64 MiB), and feeds the results to per-task state.
- **Memory follows tasks, not rows.** A row's payload (kilobytes of request and response) is
  never kept, and neither are its verdict line's parts: the verdict file is sorted by (task,
  rollout, stage) and a duplicate found at the end of the file changes lines of rows seen at
  its start, so each row's pre-rendered parts (identity, findings split around where a
  duplicate finding would go, the line's tail, the task digest) go to a `spool.SortedSpool`,
  an external sort: runs of 2,048 rows sorted in memory, on disk in an anonymous temporary file
  in the output folder, merged at write-out. Rows then arrive grouped by task and rollout, so
  each repeat's copies are settled (duplicate findings, verdicts) and each task's flags
  decided as the lines are written, and dropped. What stays in memory: run totals, one name
  per task, one run of rows, and one block of 16 rows per run on disk (a few bytes a row at
  the worst); tests/health/test_health_memory.py counts it with tracemalloc. Task and rollout
  indices are grouped by the order they are sorted by (integers, strings, then the text of
  anything else), the same as grouping by value for every index NeMo Gym writes.
  Rejected: keeping every row's parts in memory (the first version: about 1.3 KB a row, 16 MB
  at 20,000 small rows); an index of (offset, packed key) per row over a spool (see `spool`);
  two passes over the rollouts file (one for duplicates), which doubles the reading of the
  largest file of a run.
- **Workers.** ``workers=N`` checks 64-line chunks in N spawned processes, at most two chunks per
  worker in flight, results consumed in file order, so the files are byte-identical for any N; a
  file under 1 MiB, ``workers=1``, or a pool that cannot start or breaks is checked inline.
  Spawn, not fork: the caller may be a process with threads (Trio's, the progress display).
- **Validation by hand.** `trajectory.validate_trajectory` checks NeMo Gym's trajectory record
  (types, unknown keys, invariants, nesting) without pydantic: see that module for why.
- **Ignoring a check** skips it entirely: it is neither evaluated nor unobserved and its findings
  do not exist, so ignoring can only turn an ``unhealthy`` verdict into ``unobserved`` or
  ``healthy``, never the reverse. Statistics do not depend on ignores (as in NeMo Gym).
- **Layering.** The package imports only the leaves (``errors``, ``jsonl``); the command line,
  ``collect`` and ``aggregate`` call `check_run`, and `run_after` wraps it for them so a failure
  inside the health step is one line, never a failed run.

Where NeMo Gym's behaviour is not pinned by its artifacts (a line that is JSON but not an object,
what counts as a "message" in an exotic answer, lax type coercions), docs/health.md says what
trollout does.
"""

from __future__ import annotations

from .after import KEYS, HealthSettings, run_after, verdict_counts
from .checks import CHECKS, ROLLOUT_CHECKS, TASK_CHECKS
from .run import (
    QUALITY_SUMMARY,
    ROLLOUT_VERDICTS,
    HealthReport,
    check_files,
    check_run,
    parse_ignored,
    report_lines,
)

__all__ = [
    "CHECKS",
    "KEYS",
    "QUALITY_SUMMARY",
    "ROLLOUT_CHECKS",
    "ROLLOUT_VERDICTS",
    "TASK_CHECKS",
    "HealthReport",
    "HealthSettings",
    "check_files",
    "check_run",
    "parse_ignored",
    "report_lines",
    "run_after",
    "verdict_counts",
]
