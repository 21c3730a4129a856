"""Resume's decision (docs/protocol.md section 8) on hand-built run folders, rule by rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from resume_folders import Folder, failure, landed, omitted
from trollout.errors import RunFolderError
from trollout.records import Identity, Landed, RolloutState
from trollout.recovery.resume import Resubmit, ResumeRules, scan_run
from trollout.recovery.store import open_run_store
from trollout.settings import RunConfig

KEYS = [(t, r) for t in range(3) for r in range(2)]


def decide(folder: Folder, **rules: object) -> tuple[dict[tuple[int, int], int], dict[str, int]]:
    """Scan the folder; return {key: attempt} to dispatch (in order) and the fates."""
    plan = scan_run(folder.layout, ResumeRules(**rules))  # type: ignore[arg-type]
    out = {(row.identity.task_index, row.identity.rollout_index): a for row, a in plan.rows()}
    return out, plan.tally.fates


def test_resume_fresh_folder_dispatches_everything_at_attempt_zero(tmp_path: Path) -> None:
    """No outcomes: every rollout is missing, dispatched in materialized order at attempt 0."""
    out, fates = decide(Folder(tmp_path, KEYS))
    assert list(out) == KEYS
    assert set(out.values()) == {0}
    assert fates["missing"] == 6


def test_resume_landed_is_done_and_never_dispatched(tmp_path: Path) -> None:
    """A landed rollout is done even when it also failed before."""
    folder = Folder(tmp_path, KEYS).fail(failure(0, 0)).land(landed(0, 0, 1), landed(1, 1))
    out, fates = decide(folder)
    assert (0, 0) not in out
    assert (1, 1) not in out
    assert fates["landed"] == 2


def test_resume_failed_rollout_gets_next_attempt(tmp_path: Path) -> None:
    """A retryable failure is dispatched with the number above the largest seen."""
    folder = Folder(tmp_path, KEYS).fail(failure(0, 0, 0), failure(0, 1, 4))
    out, fates = decide(folder, max_attempts=6)
    assert out[(0, 0)] == 1
    assert out[(0, 1)] == 5
    assert fates["failed"] == 2


def test_resume_ledger_numbers_are_never_reused(tmp_path: Path) -> None:
    """An attempt reserved but never recorded (killed in flight) still moves the number on."""
    folder = Folder(tmp_path, KEYS).reserve((0, 0, 0), (0, 1, 0)).reserve((0, 0, 1))
    out, _ = decide(folder)
    assert out[(0, 0)] == 2
    assert out[(0, 1)] == 1
    assert out[(1, 0)] == 0


def test_resume_terminal_failure_is_done(tmp_path: Path) -> None:
    """The latest failure being terminal makes the rollout done."""
    folder = Folder(tmp_path, KEYS).fail(failure(0, 0, cls="skipped", terminal=True))
    out, fates = decide(folder)
    assert (0, 0) not in out
    assert fates["terminal"] == 1


def test_resume_latest_row_stands(tmp_path: Path) -> None:
    """A terminal failure followed by a retryable one: the latest (retryable) stands."""
    folder = Folder(tmp_path, KEYS).fail(
        failure(0, 0, 0, cls="skipped", terminal=True), failure(0, 0, 1, cls="transient")
    )
    out, fates = decide(folder)
    assert out[(0, 0)] == 2
    assert fates["terminal"] == 0


def test_resume_retry_terminal_timeouts(tmp_path: Path) -> None:
    """retry_terminal_timeouts re-dispatches terminal timeouts, not other terminal failures."""
    folder = Folder(tmp_path, KEYS).fail(
        failure(0, 0, cls="timeout_exceeded", terminal=True),
        failure(0, 1, cls="agent_run_error", terminal=True, kind="timeout"),
        failure(1, 0, cls="skipped", terminal=True),
    )
    out, _ = decide(folder, retry_terminal_timeouts=True)
    assert (0, 0) in out
    assert (0, 1) in out
    assert (1, 0) not in out


def test_resume_without_retrying_failures_sends_only_what_never_finished(tmp_path: Path) -> None:
    """retry_failed=False (a resubmitted Slurm task): a retryable failure stays a failure; a
    missing or interrupted rollout is still sent, so a preemption cannot change the result."""
    folder = Folder(tmp_path, KEYS).fail(failure(0, 0), failure(1, 0), omitted(1, 1, 1))
    folder.land(landed(0, 1))
    everything, fates = decide(folder)
    assert {(0, 0), (1, 0), (1, 1)} <= set(everything)
    finished_only, same = decide(folder, retry_failed=False)
    assert (0, 0) not in finished_only
    assert (1, 0) not in finished_only
    assert (0, 1) not in finished_only
    assert set(finished_only) == set(everything) - {(0, 0), (1, 0)}
    assert finished_only[(1, 1)] == everything[(1, 1)]
    assert same == fates  # the fates are the same; only what is dispatched differs


def test_resume_attempt_cap_counts_spent_attempts(tmp_path: Path) -> None:
    """Three delivered failures reach a cap of 3; not_sent failures do not spend one, but a
    number above them that may have reached a server still bounds the next (4 >= a cap of 4)."""
    folder = Folder(tmp_path, KEYS).fail(
        failure(0, 0, 0), failure(0, 0, 1), failure(0, 0, 2),
        failure(0, 1, 0), failure(0, 1, 1, delivery="not_sent"), failure(0, 1, 2),
        failure(0, 1, 3, delivery="possibly_delivered", cls="agent_request_failed"),
    )  # fmt: skip
    out, fates = decide(folder, max_attempts=3)
    assert (0, 0) not in out
    assert (0, 1) not in out
    assert fates["at_cap"] == 2
    out, _ = decide(folder, max_attempts=4)
    assert out[(0, 0)] == 3
    assert (0, 1) not in out
    out, _ = decide(folder, max_attempts=5)
    assert out[(0, 1)] == 4


def test_resume_not_sent_failure_does_not_supersede(tmp_path: Path) -> None:
    """A never-sent attempt after a terminal failure leaves the rollout terminal."""
    folder = Folder(tmp_path, KEYS).fail(
        failure(0, 0, 0, cls="skipped", terminal=True),
        failure(0, 0, 1, cls="agent_request_failed", delivery="not_sent"),
    )
    out, fates = decide(folder)
    assert (0, 0) not in out
    assert fates["terminal"] == 1


def test_resume_counts_as_zero_is_done(tmp_path: Path) -> None:
    """A latest failure marked _ng_failure_counts_as_zero makes the rollout done."""
    folder = Folder(tmp_path, KEYS).fail(
        failure(0, 0, cls="judge_failed", _ng_failure_counts_as_zero=True)
    )
    out, fates = decide(folder)
    assert (0, 0) not in out
    assert fates["counts_as_zero"] == 1


def test_resume_interrupted_row_hides_older_failures(tmp_path: Path) -> None:
    """An interrupted omitted row after a terminal failure: the rollout counts as missing."""
    folder = Folder(tmp_path, KEYS).fail(
        failure(0, 0, 0, cls="skipped", terminal=True), omitted(0, 0, 1)
    )
    out, fates = decide(folder)
    assert out[(0, 0)] == 2
    assert fates["terminal"] == 0
    assert fates["missing"] == 6


def test_resume_drained_row_does_not_supersede(tmp_path: Path) -> None:
    """A never-started (drained) omitted row leaves the earlier terminal failure standing."""
    folder = Folder(tmp_path, KEYS).fail(
        failure(0, 0, 0, cls="skipped", terminal=True), omitted(0, 0, 1, drained=True)
    )
    out, fates = decide(folder)
    assert (0, 0) not in out
    assert fates["terminal"] == 1


def test_resume_unrouted_evidence_does_not_supersede(tmp_path: Path) -> None:
    """A failure row with no agent_ref and no environment server does not replace the latest."""
    unrouted = failure(0, 0, 1, cls="transient")
    del unrouted["agent_ref"]
    folder = Folder(tmp_path, KEYS).fail(failure(0, 0, 0, cls="skipped", terminal=True), unrouted)
    _, fates = decide(folder)
    assert fates["terminal"] == 1


def test_resume_longest_first_orders_by_elapsed(tmp_path: Path) -> None:
    """Longest first: slowest previous attempts first, never-timed rollouts last in order."""
    folder = Folder(tmp_path, KEYS).fail(
        failure(0, 1, elapsed_seconds=5.0),
        failure(1, 0, elapsed_seconds=50.0),
        failure(2, 1, elapsed_seconds=0.5),
    )
    out, _ = decide(folder, longest_first=True)
    assert list(out) == [(1, 0), (0, 1), (2, 1), (0, 0), (1, 1), (2, 0)]
    out, _ = decide(folder)
    assert list(out) == KEYS


def test_resume_resubmit_sends_done_rollouts_but_never_landed(tmp_path: Path) -> None:
    """Resubmit dispatches terminal and capped rollouts; --class narrows it; landed never."""
    folder = (
        Folder(tmp_path, KEYS)
        .land(landed(2, 0))
        .fail(failure(0, 0, cls="skipped", terminal=True), failure(0, 1, cls="transient"))
    )
    out, _ = decide(folder, resubmit=Resubmit())
    assert set(out) == set(KEYS) - {(2, 0)}
    out, _ = decide(folder, resubmit=Resubmit(classes=frozenset({"skipped"})))
    assert out == {(0, 0): 1}


def test_resume_tally_and_statuses(tmp_path: Path) -> None:
    """Every rollout is in exactly one fate; failures are counted by class; statuses seed."""
    folder = (
        Folder(tmp_path, KEYS)
        .land(landed(0, 0), landed(0, 0))
        .fail(failure(1, 0, cls="transient"), failure(1, 1, cls="skipped", terminal=True))
        .fail(failure(9, 9))
    )
    plan = scan_run(folder.layout, ResumeRules())
    tally = plan.tally
    assert sum(tally.fates.values()) == tally.expected == 6
    assert tally.failures_by_class == {"skipped": 1, "transient": 1}
    assert tally.duplicate_landed == 1
    assert tally.foreign_rows == 1
    assert tally.to_dispatch == 4
    states = {(s.task_index, s.rollout_index): s.state for s in plan.take_statuses()}
    assert states == {(1, 0): RolloutState.FAILED, (1, 1): RolloutState.FAILED}


def test_resume_skips_torn_tail_but_refuses_damaged_middle(tmp_path: Path) -> None:
    """A torn last line is skipped; a bad line in the middle names file and line."""
    folder = Folder(tmp_path, KEYS).land(landed(0, 0))
    with open(folder.layout.rollouts, "ab") as f:
        f.write(b'{"_ng_task_index": 0, "_ng_rol')
    _out, fates = decide(folder)
    assert fates["landed"] == 1
    with open(folder.layout.rollouts, "ab") as f:
        f.write(b"\n")
    folder.land(landed(1, 0))
    with pytest.raises(RunFolderError, match=r"r\.jsonl:2"):
        scan_run(folder.layout, ResumeRules())


def test_resume_missing_materialized_inputs_is_refused(tmp_path: Path) -> None:
    """Without the materialized inputs nothing can be decided: a RunFolderError says so."""
    folder = Folder(tmp_path, KEYS)
    folder.layout.materialized_inputs.unlink()
    with pytest.raises(RunFolderError, match=r"materialized inputs .* missing"):
        scan_run(folder.layout, ResumeRules())


async def test_resume_seeded_store_never_writes_a_success_twice(tmp_path: Path) -> None:
    """A store seeded by resume refuses a second landed row and counts the whole run."""
    folder = Folder(tmp_path, KEYS).land(landed(0, 0)).fail(failure(1, 0, cls="transient"))
    plan = scan_run(folder.layout, ResumeRules())
    before = folder.layout.rollouts.read_bytes()
    async with open_run_store(folder.layout, RunConfig(), expected=0, fresh=False) as store:
        store.seed(expected=plan.tally.expected, landed=plan.landed,
                   statuses=plan.take_statuses())  # fmt: skip
        await store.write([Landed(Identity(0, 0, agent_name="agent"), 3, {"reward": 1.0})])
        counts = store.counts
    assert folder.layout.rollouts.read_bytes() == before
    assert (counts.duplicates_refused, counts.landed, counts.failed) == (1, 1, 1)
    assert counts.expected == 6
