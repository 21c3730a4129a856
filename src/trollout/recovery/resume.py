# Stays whole: one scan of the run folder (`_Scanner`) and the plan it returns: each fate and
# the rule that assigns it are read together.
"""Resume: decide from the run folder alone what is done and what to dispatch next.

`scan_run` reads the materialized inputs, the rollouts file, the failures sidecar and the
attempt ledger (docs/protocol.md section 8) and sorts every materialized rollout into one `Fate`:

- ``LANDED``: a row in the rollouts file.
- ``TERMINAL``: its latest failure says ``_ng_failure_terminal`` (a producer's
  ``timeout_exceeded``, or kind ``timeout``, is retried instead under
  ``retry_terminal_timeouts``).
- ``ZERO``: its latest failure is marked ``_ng_failure_counts_as_zero``.
- ``AT_CAP``: it spent ``max_attempts`` attempts, or its attempt numbers are used up. An
  attempt is spent by a failure row that reached a server: not by a ``not_sent`` failure, a
  drained or interrupted attempt, or a kill-shaped (``_ng_no_persist``) reply, since none of
  those proves the rollout ran. Its numbers are used up when the next one would be
  ``max_attempts`` or more: its requests may have reached a server ``max_attempts`` times, if
  only through kills in flight (see "Attempt numbers" below).
- ``FAILED``: its latest failure is retryable and the cap is not reached (not dispatched
  under ``retry_failed_on_resume=false``: a resubmitted Slurm task finishes only what never
  finished, so a preemption cannot change the result an uninterrupted run gives).
- ``MISSING``: no outcome, or its latest evidence is an interrupted attempt (an
  ``_ng_omitted_rollout`` row hides older failures) or a kill-shaped reply.

"Latest" is file order among rows that supersede: rows of never-started attempts (drained,
``not_sent``) and unrouted evidence (a row with neither ``agent_ref.name`` nor
``_ng_environment_server``) do not. FAILED and MISSING are dispatched, in materialized order or,
with ``dispatch_longest_first``, by the longest ``elapsed_seconds`` seen before (rollouts never
timed go last, in materialized order). `Resubmit` widens the choice to rollouts that are done but
did not land (at the cap included: the user's explicit override of ``--max-attempts``).

Attempt numbers (``_ng_attempt_index``) count the times a rollout may have reached a server as
a new attempt. Each rollout dispatched gets one above the largest number that may have: the
largest in the ledger that was not released (`ledger.SentNumbers`: the ledger's rule) or in an
outcome row of an attempt that may have started (not a drained or ``not_sent`` one). A number
that may have reached a server is never reused, so a server can tell attempts apart; one that
provably never left (a release, or no record at all) is handed out again, so an interrupted
run resumed N times lands a rollout sent once with index 0 or 1. ``--max-attempts`` bounds
the numbers: a rollout whose next number would reach it is not sent again but counted
``AT_CAP`` (``trollout status`` shows it; a higher ``max_attempts`` on resume sends it), even
when no failure was recorded, because a server may have run it that many times. A ledger
written before releases existed counts every reservation as possibly sent (the safe reading).

Memory and time: one pass per file, streaming. State is a set of landed keys (one int each),
one small record per rollout with failure or ledger evidence that has not landed, and two
arrays per rollout to dispatch (8 bytes each for the line offset and the attempt). Rows to
dispatch are read back from the materialized inputs by offset, never held.

Design note: the rejected alternative decided from ``<stem>_batch_status.json``. It is small,
but it is a snapshot taken every few seconds, so it trails the files it summarizes after a
crash, and a NeMo Gym folder does not have it; the append-only files are the truth. Rejected for
the cap: counting only spent failures (what this did before), which sent a rollout killed in
flight three times a fourth time, numbered past the cap; and counting kills as spent failures,
which would hide an interrupted rollout's older failures' class (it is missing, not failed).
"""

from __future__ import annotations

import enum
import math
from array import array
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import orjson
from attrs import frozen

from .. import records
from ..records import MaterializedRow, RolloutState, RolloutStatus
from .layout import RunLayout
from .ledger import SentNumbers, read_entries
from .run_files import materialized_keys, row_key, run_rows
from .status import rollout_key

__all__ = ["Fate", "Resubmit", "ResumePlan", "ResumeRules", "RunTally", "scan_run"]

COUNTS_AS_ZERO = "_ng_failure_counts_as_zero"
_TIMEOUT_CLASSES = frozenset({"timeout_exceeded"})
_TIMEOUT_KINDS = frozenset({"timeout"})


class Fate(enum.Enum):
    """Where a materialized rollout stands (module docstring)."""

    LANDED = "landed"  # a row in the rollouts file: done
    TERMINAL = "terminal"  # latest failure terminal: done
    ZERO = "counts_as_zero"  # latest failure marked _ng_failure_counts_as_zero: done
    AT_CAP = "at_cap"  # spent max_attempts attempts: done
    FAILED = "failed"  # latest failure retryable: dispatched
    MISSING = "missing"  # no outcome, interrupted or kill-shaped: dispatched


_DONE = frozenset({Fate.LANDED, Fate.TERMINAL, Fate.ZERO, Fate.AT_CAP})


@frozen
class Resubmit:
    """Dispatch rollouts that are done but did not land (``trollout resubmit``).

    Attributes:
        classes: only rollouts whose latest failure has one of these classes; empty means
            every rollout that has not landed (terminal, at the cap and missing included).
    """

    classes: frozenset[str] = frozenset()


@frozen
class ResumeRules:
    """How to decide: the attempt cap and the options of docs/protocol.md section 8."""

    max_attempts: int = 3
    retry_terminal_timeouts: bool = False
    longest_first: bool = False
    resubmit: Resubmit | None = None
    retry_failed: bool = True  # False: a FAILED rollout is done (only MISSING is dispatched)


@frozen
class RunTally:
    """What a run folder holds, from its files alone (``trollout status``).

    Attributes:
        expected: materialized rollouts.
        fates: rollouts per `Fate` (every materialized rollout is in exactly one).
        failures_by_class: latest failure class of rollouts that failed and did not land.
        to_dispatch: rollouts the next resume would dispatch.
        failure_rows: rows in the sidecar.
        reserved_attempts: attempt numbers in the ledger.
        duplicate_landed: extra rows in the rollouts file for a rollout already there.
        foreign_rows: rows in either file for rollouts not in the materialized inputs.
        not_started: the ``MISSING`` rollouts no attempt of which ever started: no outcome
            row but drained ones, and no attempt number that may have reached a server.
    """

    expected: int
    fates: dict[str, int]
    failures_by_class: dict[str, int]
    to_dispatch: int
    failure_rows: int
    reserved_attempts: int
    duplicate_landed: int
    foreign_rows: int
    not_started: int = 0

    def count(self, fate: Fate) -> int:
        """Return how many rollouts have ``fate``."""
        return self.fates.get(fate.value, 0)

    @property
    def retryable_remains(self) -> bool:
        """Whether a resume would dispatch anything."""
        return self.to_dispatch > 0

    def to_json(self) -> dict[str, Any]:
        """Return the tally as a JSON-ready mapping."""
        doc = attrs.asdict(self)
        doc["retryable_remains"] = self.retryable_remains
        return doc


# Latest superseding evidence of a rollout that has not landed.
_NONE, _FAILED, _INTERRUPTED, _NO_PERSIST = 0, 1, 2, 3


class _Evidence(SentNumbers):
    """What the sidecar and the ledger say about one rollout that has not landed."""

    __slots__ = (
        "agent",
        "elapsed",
        "failure_class",
        "kind",
        "latest",
        "seen",
        "spent",
        "terminal",
        "zero",
    )

    def __init__(self) -> None:
        super().__init__()
        self.latest = _NONE
        self.seen = -1  # the largest attempt number seen anywhere (the status shows it)
        self.spent = 0
        self.elapsed = math.nan
        self.failure_class: str | None = None
        self.kind: str | None = None
        self.terminal = False
        self.zero = False
        self.agent: str | None = None


@attrs.define
class ResumePlan:
    """The outcome of `scan_run`: the tally, and what to dispatch with which attempt.

    Attributes:
        layout: the run folder.
        tally: the counts.
        landed: keys (`store.rollout_key`) of landed rollouts, to seed the store.
    """

    layout: RunLayout
    tally: RunTally
    landed: set[Any]
    _offsets: array[int] = attrs.field(alias="offsets")
    _attempts: array[int] = attrs.field(alias="attempts")
    _statuses: list[RolloutStatus] = attrs.field(alias="statuses")

    def rows(
        self, policy_model_servers: Mapping[str, str] | None = None
    ) -> Iterator[tuple[MaterializedRow, int]]:
        """Yield ``(row, attempt)`` to dispatch, in order, read back from the inputs file.

        Blocking file reads, one line at a time (as the engine's feeder reads a fresh run).
        ``policy_model_servers`` stamps each identity's model server (`Identity.from_row`).
        """
        servers = policy_model_servers
        with open(self.layout.materialized_inputs, "rb") as f:
            for offset, attempt in zip(self._offsets, self._attempts, strict=True):
                f.seek(offset)
                yield MaterializedRow.from_body(orjson.loads(f.readline()), None, servers), attempt

    def take_statuses(self) -> list[RolloutStatus]:
        """Hand over the latest state of rollouts with an outcome that have not landed.

        The plan forgets them (a second call returns ``[]``), so once the store holds them
        they are freed as the store replaces them.
        """
        statuses, self._statuses = self._statuses, []
        return statuses


def scan_run(layout: RunLayout, rules: ResumeRules) -> ResumePlan:
    """Read a run folder and decide what is done and what to dispatch (blocking).

    Tolerates a torn last line in any file (it is skipped, as `jsonl.repair_tail` would drop
    it), so it may run on a folder a collector is writing (``trollout status``).

    Raises:
        RunFolderError: the materialized inputs are missing, or a file is damaged mid-way.
    """
    scanner = _Scanner(layout, rules)
    scanner.read_outcomes()
    return scanner.decide()


class _Scanner:
    def __init__(self, layout: RunLayout, rules: ResumeRules) -> None:
        self.layout = layout
        self.rules = rules
        self.landed: set[Any] = set()
        self.evidence: dict[Any, _Evidence] = {}
        self.duplicates = 0
        self.failure_rows = 0
        self.reserved = 0

    def read_outcomes(self) -> None:
        for row in run_rows(self.layout.rollouts):
            key = row_key(row)
            if key is None:
                continue
            if key in self.landed:
                self.duplicates += 1
            self.landed.add(key)
        for row in run_rows(self.layout.failures):
            self.failure_rows += 1
            key = row_key(row)
            if key is not None and key not in self.landed:
                _apply_failure(self._evidence(key), row)
        for released, task, rollout, attempt in read_entries(self.layout.attempts):
            key = rollout_key(task, rollout)
            if released:
                ev = self.evidence.get(key)
                if ev is not None:
                    ev.released(attempt)
                continue
            self.reserved += 1
            if key not in self.landed:
                ev = self._evidence(key)
                ev.reserved(attempt)
                if attempt > ev.seen:
                    ev.seen = attempt

    def _evidence(self, key: Any) -> _Evidence:
        ev = self.evidence.get(key)
        if ev is None:
            ev = self.evidence[key] = _Evidence()
        return ev

    def decide(self) -> ResumePlan:
        fates: Counter[str] = Counter()  # by value: a str hashes faster than an Enum member
        classes: Counter[str] = Counter()
        offsets, attempts, elapsed = array("q"), array("l"), array("d")
        statuses: list[RolloutStatus] = []
        landed, evidence = self.landed, self.evidence
        landed_seen = never_started = 0
        for offset, task, rollout in materialized_keys(self.layout.materialized_inputs):
            key = rollout_key(task, rollout)
            if key in landed:
                landed_seen += 1
                continue
            ev = evidence.pop(key, None)
            fate = self._fate(ev)
            fates[fate.value] += 1
            if fate is Fate.MISSING and (ev is None or (ev.latest == _NONE and ev.largest < 0)):
                never_started += 1
            if ev is not None and ev.latest == _FAILED:
                classes[ev.failure_class or ""] += 1
            if ev is not None and ev.latest != _NONE:
                statuses.append(_status(task, rollout, ev))
            if self._dispatches(fate, ev):
                offsets.append(offset)
                attempts.append(ev.largest + 1 if ev is not None else 0)
                elapsed.append(ev.elapsed if ev is not None else math.nan)
        if self.rules.longest_first:
            offsets, attempts = _longest_first(offsets, attempts, elapsed)
        fates[Fate.LANDED.value] = landed_seen
        tally = self._tally(fates, classes, len(offsets), landed_seen)
        tally = attrs.evolve(tally, not_started=never_started)
        return ResumePlan(self.layout, tally, self.landed, offsets, attempts, statuses)

    def _tally(
        self, fates: Counter[str], classes: Counter[str], to_dispatch: int, landed_seen: int
    ) -> RunTally:
        unplanned = sum(1 for ev in self.evidence.values() if ev.latest != _NONE)
        return RunTally(
            expected=sum(fates.values()),
            fates={fate.value: fates[fate.value] for fate in Fate},
            failures_by_class=dict(sorted(classes.items())),
            to_dispatch=to_dispatch,
            failure_rows=self.failure_rows,
            reserved_attempts=self.reserved,
            duplicate_landed=self.duplicates,
            foreign_rows=len(self.landed) - landed_seen + unplanned,
        )

    def _fate(self, ev: _Evidence | None) -> Fate:
        if ev is None:
            return Fate.MISSING
        if ev.latest == _FAILED:
            if ev.terminal and not (self.rules.retry_terminal_timeouts and _is_timeout(ev)):
                return Fate.TERMINAL
            if ev.zero:
                return Fate.ZERO
        cap = self.rules.max_attempts
        if ev.spent >= cap or ev.largest + 1 >= cap:  # spent, or its numbers are used up
            return Fate.AT_CAP
        return Fate.FAILED if ev.latest == _FAILED else Fate.MISSING

    def _dispatches(self, fate: Fate, ev: _Evidence | None) -> bool:
        resubmit = self.rules.resubmit
        if resubmit is None:
            return fate not in _DONE and (self.rules.retry_failed or fate is not Fate.FAILED)
        if not resubmit.classes:
            return True
        return ev is not None and ev.latest == _FAILED and ev.failure_class in resubmit.classes


def _apply_failure(ev: _Evidence, row: dict[str, Any]) -> None:
    """Fold one sidecar row (in file order) into a rollout's evidence."""
    attempt = row.get(records.ATTEMPT_INDEX, 0)
    took = row.get(records.ELAPSED)
    if isinstance(took, int | float) and not took <= ev.elapsed:
        ev.elapsed = float(took)
    never_started = _never_started(row)
    if isinstance(attempt, int):
        ev.seen = max(ev.seen, attempt)
        if not never_started:
            ev.sent(attempt)
    if never_started or _unrouted(row):
        return
    if row.get(records.OMITTED):
        ev.latest, ev.failure_class, ev.kind = _INTERRUPTED, None, row.get(records.FAILURE_KIND)
        return
    if row.get(records.NO_PERSIST) is True:
        ev.latest, ev.failure_class, ev.kind = _NO_PERSIST, None, None
        return
    ev.latest = _FAILED
    ev.spent += 1
    ev.failure_class = str(row.get(records.FAILURE_CLASS))
    ev.kind = row.get(records.FAILURE_KIND)
    ev.terminal = row.get(records.FAILURE_TERMINAL) is True
    ev.zero = row.get(COUNTS_AS_ZERO) is True
    agent_ref = row.get(records.AGENT_REF)
    ev.agent = agent_ref.get("name") if isinstance(agent_ref, dict) else None


def _never_started(row: dict[str, Any]) -> bool:
    if row.get(records.OMITTED):
        return bool(row.get(records.DISPATCH_DRAINED)) or row.get(records.FAILURE_KIND) == "drained"
    return row.get(records.FAILURE_DELIVERY) == records.Delivery.NOT_SENT.value


def _unrouted(row: dict[str, Any]) -> bool:
    agent_ref = row.get(records.AGENT_REF)
    named = isinstance(agent_ref, dict) and agent_ref.get("name") is not None
    return not named and row.get(records.ENVIRONMENT_SERVER) is None


def _is_timeout(ev: _Evidence) -> bool:
    return ev.failure_class in _TIMEOUT_CLASSES or ev.kind in _TIMEOUT_KINDS


def _status(task: int, rollout: int, ev: _Evidence) -> RolloutStatus:
    state = {
        _FAILED: RolloutState.FAILED,
        _INTERRUPTED: RolloutState.OMITTED,
        _NO_PERSIST: RolloutState.NO_PERSIST,
    }[ev.latest]
    return RolloutStatus(
        task_index=task,
        rollout_index=rollout,
        attempt_index=max(ev.seen, 0),
        state=state,
        agent_name=ev.agent,
        failure_class=ev.failure_class if state is RolloutState.FAILED else "cancelled",
        kind=ev.kind,
        terminal=ev.terminal if state is RolloutState.FAILED else False,
    )


def _longest_first(
    offsets: array[int], attempts: array[int], elapsed: array[float]
) -> tuple[array[int], array[int]]:
    """Reorder by elapsed time seen, longest first; never-timed rollouts last, in order."""
    order = sorted(
        range(len(offsets)),
        key=lambda i: (0, -elapsed[i]) if not math.isnan(elapsed[i]) else (1, 0.0),
    )
    return array("q", (offsets[i] for i in order)), array("l", (attempts[i] for i in order))
