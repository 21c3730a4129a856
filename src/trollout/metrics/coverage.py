"""What a score covers: the latest failure of each rollout, imputed zeros, the coverage report.

Rules (docs/protocol.md section 8):

- Per rollout the **latest** sidecar row stands, across classes: latest by attempt index, then by
  position (shard order, then line). A row for a never-started (drained) attempt does not
  supersede anything; an interrupted ``_ng_omitted_rollout`` row does, and the rollout then
  counts as missing.
- A rollout that also landed is landed: its failures are skipped (reported as recovered).
- A latest row its producer marked ``_ng_failure_counts_as_zero`` settles its rollout as a scored
  zero (resume never runs it again), so it always enters the metric input (NeMo Gym's
  ``_final_zero_failure_rows``).
- ``count_failure_classes_as_zero``: a latest row whose class is listed also enters it; the
  class matches ``_ng_failure_class`` or the original producer's ``_ng_failure_legacy_class``
  (``_matches_failure_class``). A counted row enters with its ``_ng_failure_*``,
  ``failure_kind`` and ``failure_reason`` keys dropped, ``mask_sample`` false, and ``reward``
  0.0 when it has none (``_counted_failure_row``).
- ``count_missing_rollouts_as_zero``: a planned rollout with no row in either file (or whose
  latest row is an omitted one) enters as ``reward: 0.0``.
- Imputed zeros live only in the metric input, never in files.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping
from typing import Any, Final, TypeAlias

import attrs
from attrs import frozen

from ..records import (
    FAILURE_CLASS,
    FAILURE_DELIVERY,
    FAILURE_KIND,
    FAILURE_MAX_ATTEMPTS,
    FAILURE_TERMINAL,
    Delivery,
    OmitReason,
    Omitted,
    outcome_from_row,
)

__all__ = [
    "MISSING",
    "OMITTED",
    "Coverage",
    "FailureLedger",
    "FailureMark",
    "GroupKey",
    "RolloutKey",
    "counted_row",
    "counts_as_zero",
    "coverage_lines",
    "imputed_row",
    "matches_failure_class",
]

COUNTS_AS_ZERO: Final = "_ng_failure_counts_as_zero"
LEGACY_CLASS: Final = "_ng_failure_legacy_class"
_DIAGNOSTIC_KEYS: Final = frozenset({"failure_kind", "failure_reason"})
_NOT_SENT: Final = Delivery.NOT_SENT.value
_FAILURE_PREFIX: Final = "_ng_failure_"
MISSING: Final = "no row"  # the coverage label of a planned rollout with no row anywhere
OMITTED: Final = "omitted"  # the label of a rollout whose latest row is an interrupted attempt

GroupKey: TypeAlias = tuple[str | None, str | None]  # (agent, environment server if no agent)
RolloutKey: TypeAlias = tuple[GroupKey, int, int]  # (group, task, rollout)


@frozen
class FailureMark:
    """The latest sidecar row of one rollout.

    Attributes:
        order: (attempt, file order, line): a larger order is later.
        failure_class: ``_ng_failure_class``, or `OMITTED` for an interrupted attempt.
        drained: the row records a never-started attempt (it supersedes nothing).
        kept: the row enters the metric input as a zero (``count_failure_classes_as_zero``).
        row: for a kept row, the row without its ``_ng_failure_*`` keys; else empty.
    """

    order: tuple[int, int, int]
    failure_class: str
    drained: bool = False
    kept: bool = False
    row: Mapping[str, Any] = attrs.field(factory=dict, eq=False, repr=False)
    max_attempts: int | None = None
    terminal: bool = False
    timeout: bool = False  # a time limit ended it (retried under retry_terminal_timeouts)
    marked: bool = False  # its producer marked it _ng_failure_counts_as_zero


class FailureLedger:
    """The latest sidecar row per rollout, across classes and shards.

    Attributes:
        marks: the latest row of each rollout.
        attempts: failed attempts per rollout: rows of attempts that reached a server (not an
            omitted attempt, nor one never sent), as resume counts them against the cap.
    """

    def __init__(self, keep_classes: frozenset[str] | None) -> None:
        self.keep_classes = keep_classes
        self.marks: dict[RolloutKey, FailureMark] = {}
        self.attempts: Counter[RolloutKey] = Counter()

    def add(self, key: RolloutKey, row: Mapping[str, Any], position: tuple[int, int]) -> None:
        """Record one sidecar row read at ``position`` (file order, line)."""
        mark = self._mark(row, position)
        if mark.failure_class != OMITTED and row.get(FAILURE_DELIVERY) != _NOT_SENT:
            self.attempts[key] += 1
        current = self.marks.get(key)
        if current is None or (
            not mark.drained and (current.drained or mark.order > current.order)
        ):
            self.marks[key] = mark

    def _mark(self, row: Mapping[str, Any], position: tuple[int, int]) -> FailureMark:
        outcome = outcome_from_row(row)
        order = (outcome.attempt_index, *position)
        if isinstance(outcome, Omitted):
            return FailureMark(order, OMITTED, drained=outcome.reason is OmitReason.DRAINED)
        failure_class = str(row.get(FAILURE_CLASS) or "unknown")
        keep = counts_as_zero(row, self.keep_classes or frozenset())
        cap = row.get(FAILURE_MAX_ATTEMPTS)
        return FailureMark(
            order,
            failure_class,
            kept=keep,
            row=counted_row(row) if keep else {},
            max_attempts=cap if type(cap) is int else None,
            terminal=row.get(FAILURE_TERMINAL) is True,
            timeout=failure_class == "timeout_exceeded" or row.get(FAILURE_KIND) == "timeout",
            marked=row.get(COUNTS_AS_ZERO) is True,
        )

    def settled(
        self, mark: FailureMark, key: RolloutKey, cap: int, *, retry_timeouts: bool
    ) -> bool:
        """Whether a rollout whose latest row is ``mark`` is done without landing.

        As resume decides (docs/protocol.md section 8): terminal (a timeout is retried under
        ``retry_timeouts``), marked ``_ng_failure_counts_as_zero``, or ``cap`` attempts spent.
        """
        if mark.failure_class == OMITTED:
            return False
        terminal = mark.terminal and not (retry_timeouts and mark.timeout)
        return terminal or mark.marked or self.attempts[key] >= cap


def matches_failure_class(row: Mapping[str, Any], classes: Collection[str]) -> bool:
    """Whether a row's class, or its producer's original (legacy) class, is one of ``classes``."""
    return row.get(FAILURE_CLASS) in classes or row.get(LEGACY_CLASS) in classes


def counts_as_zero(row: Mapping[str, Any], wanted: Collection[str]) -> bool:
    """Whether a rollout's latest sidecar row enters the metrics as a zero (wanted or marked)."""
    return row.get(COUNTS_AS_ZERO) is True or matches_failure_class(row, wanted)


def counted_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """Return the metric-input copy of a sidecar row counted as zero (diagnostics left out)."""
    out = {
        k: v
        for k, v in row.items()
        if not k.startswith(_FAILURE_PREFIX) and k not in _DIAGNOSTIC_KEYS
    }
    out["mask_sample"] = False
    return out


def imputed_row(identity: Mapping[str, Any], *rows: Mapping[str, Any]) -> dict[str, Any]:
    """Return a metric-input row: task fields, then a kept failure's fields, reward 0.0 if none."""
    out: dict[str, Any] = {}
    for row in rows:
        out.update(row)
    out.update(identity)
    if "reward" not in out:
        out["reward"] = 0.0
    return out


@frozen
class Coverage:
    """How much of a group's (or a run's) planned rollouts a score covers.

    Attributes:
        expected: rollouts planned (materialized) or seen in any file.
        landed: rollouts with a row in a rollouts file (each counted once).
        scored: landed rollouts with a ``reward`` and not masked.
        masked: landed rows NeMo Gym leaves out (``mask_sample``).
        unscored: landed rows without a ``reward``.
        failed: rollouts that never landed, by the class of their latest failure.
        omitted: rollouts whose latest row is an interrupted attempt (they count as missing).
        missing: planned rollouts with no row in any file.
        imputed: zeros put in the metric input, by failure class or `MISSING`/`OMITTED`.
        recovered: rollouts that failed, then landed (counted once, as landed).
    """

    expected: int = 0
    landed: int = 0
    scored: int = 0
    masked: int = 0
    unscored: int = 0
    failed: dict[str, int] = attrs.field(factory=dict)
    omitted: int = 0
    missing: int = 0
    imputed: dict[str, int] = attrs.field(factory=dict)
    recovered: int = 0

    @property
    def covered(self) -> int:
        """Rollouts the score covers: scored landed rows plus imputed zeros."""
        return self.scored + sum(self.imputed.values())

    @property
    def complete(self) -> bool:
        """Whether the score covers every planned rollout."""
        return self.covered == self.expected

    def without_outcome(self) -> dict[str, int]:
        """Return the planned rollouts with no outcome row (`MISSING`: none at all, or only a
        never-started attempt's; `OMITTED`: the latest attempt was cut short) that no imputed
        zero stands for: rows that went in and did not come out."""
        left = {
            MISSING: self.missing - self.imputed.get(MISSING, 0),
            OMITTED: self.omitted - self.imputed.get(OMITTED, 0),
        }
        return {k: v for k, v in left.items() if v > 0}

    def did_not_land(self) -> dict[str, int]:
        """Return the rollouts that did not land, by failure class, `OMITTED` or `MISSING`."""
        reasons = dict(self.failed)
        reasons[OMITTED] = reasons.get(OMITTED, 0) + self.omitted
        reasons[MISSING] = reasons.get(MISSING, 0) + self.missing
        return {k: v for k, v in sorted(reasons.items()) if v > 0}

    def not_scored(self) -> dict[str, int]:
        """Return the rollouts left out of the score, by reason (imputed ones excluded)."""
        reasons: Counter[str] = Counter(self.failed)
        reasons[OMITTED] += self.omitted
        reasons[MISSING] += self.missing
        reasons["masked"] += self.masked
        reasons["unscored"] += self.unscored
        reasons.subtract(self.imputed)
        return {k: v for k, v in sorted(reasons.items()) if v > 0}

    def __add__(self, other: Coverage) -> Coverage:
        """Return the coverage of two disjoint groups together."""
        return Coverage(
            **{f: getattr(self, f) + getattr(other, f) for f in _COUNTS},
            failed=dict(Counter(self.failed) + Counter(other.failed)),
            imputed=dict(Counter(self.imputed) + Counter(other.imputed)),
        )

    def to_json(self) -> dict[str, Any]:
        """Return the coverage as a JSON-able mapping (with ``covered`` and ``not_scored``)."""
        out = attrs.asdict(self)
        out["covered"] = self.covered
        out["not_scored"] = self.not_scored()
        return out


_COUNTS: Final = (
    "expected",
    "landed",
    "scored",
    "masked",
    "unscored",
    "omitted",
    "missing",
    "recovered",
)


def coverage_lines(coverage: Coverage) -> list[str]:
    """Return the coverage report: one line, plus details when the score is not complete."""
    head = f"Metrics cover: {coverage.covered} of {coverage.expected} rollouts"
    if coverage.complete and not coverage.imputed:
        return [head]
    lines = [head]
    left_out = coverage.not_scored()
    if left_out:
        lines.append("  not scored: " + _counts(left_out))
    if coverage.imputed:
        lines.append("  imputed zeros: " + _counts(coverage.imputed))
    return lines


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{name} {count}" for name, count in sorted(counts.items()))
