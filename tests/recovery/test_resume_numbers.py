"""Resume's attempt numbers (resume.py, "Attempt numbers"; ledger.py's rule), on hand-built
folders: released numbers come back, possibly-sent ones never do, and the cap bounds them."""

from __future__ import annotations

from pathlib import Path

from resume_folders import Folder, failure, omitted
from trollout.records import RolloutState
from trollout.recovery.ledger import SentNumbers, read_entries, read_ledger
from trollout.recovery.resume import ResumeRules, scan_run

KEYS = [(t, 0) for t in range(6)]


def decide(folder: Folder, **rules: object) -> tuple[dict[tuple[int, int], int], dict[str, int]]:
    """Scan the folder; return {key: attempt} to dispatch and the fates."""
    plan = scan_run(folder.layout, ResumeRules(**rules))  # type: ignore[arg-type]
    out = {(row.identity.task_index, row.identity.rollout_index): a for row, a in plan.rows()}
    return out, plan.tally.fates


def test_resume_numbers_released_are_handed_out_again(tmp_path: Path) -> None:
    """A released number is reused; one reserved again after its release is not."""
    folder = (
        Folder(tmp_path, KEYS)
        .reserve((0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 0, 0))
        .release((0, 0, 0), (1, 0, 0))
        .reserve((1, 0, 0))  # the next session sent it
        .reserve((2, 0, 1))
        .release((2, 0, 0))  # names an older number: the latest stays possibly sent
        .reserve((3, 0, 1))
        .release((3, 0, 1))  # the latest taken back; the one before stays possibly sent
    )
    out, _ = decide(folder)
    assert out == {(0, 0): 0, (1, 0): 1, (2, 0): 2, (3, 0): 1, (4, 0): 0, (5, 0): 0}


def test_resume_numbers_old_ledger_counts_every_reservation(tmp_path: Path) -> None:
    """A ledger without release lines: every reserved number may have been sent."""
    folder = Folder(tmp_path, KEYS).reserve(*((t, 0, 0) for t in range(6))).reserve((0, 0, 1))
    out, _ = decide(folder)
    assert out == {(0, 0): 2, (1, 0): 1, (2, 0): 1, (3, 0): 1, (4, 0): 1, (5, 0): 1}
    assert list(read_ledger(folder.layout.attempts))[-1] == (0, 0, 1)


def test_resume_numbers_never_started_rows_do_not_move_them(tmp_path: Path) -> None:
    """A not_sent failure or a drained row without a reservation leaves the number free."""
    folder = (
        Folder(tmp_path, KEYS)
        .fail(failure(0, 0, 0, cls="agent_request_failed", delivery="not_sent"))
        .fail(omitted(1, 0, 0, drained=True))
        .fail(omitted(2, 0, 0))  # interrupted: it may have reached the server
    )
    out, _ = decide(folder)
    assert (out[(0, 0)], out[(1, 0)], out[(2, 0)]) == (0, 0, 1)


def test_resume_numbers_used_up_by_kills_are_at_the_cap(tmp_path: Path) -> None:
    """Killed in flight max_attempts times: not sent again, counted at the cap, shown."""
    folder = (
        Folder(tmp_path, KEYS)
        .reserve((0, 0, 0), (1, 0, 0))
        .fail(omitted(0, 0, 0))
        .reserve((0, 0, 1), (1, 0, 1))
        .reserve((0, 0, 2))  # killed: no row at all
        .release((1, 0, 1))
    )
    plan = scan_run(folder.layout, ResumeRules(max_attempts=3))
    out = {(row.identity.task_index, row.identity.rollout_index): a for row, a in plan.rows()}
    assert (0, 0) not in out
    assert out[(1, 0)] == 1
    assert plan.tally.fates["at_cap"] == 1
    assert plan.tally.to_dispatch == 5
    states = {(s.task_index, s.rollout_index): s for s in plan.take_statuses()}
    assert states[(0, 0)].state is RolloutState.OMITTED
    assert states[(0, 0)].attempt_index == 2
    out, fates = decide(folder, max_attempts=4)  # a higher cap on resume sends it
    assert out[(0, 0)] == 3
    assert fates["at_cap"] == 0


def test_resume_numbers_rule_in_file_order() -> None:
    """The ledger's rule alone: a release takes back only the latest reservation it names."""
    numbers = SentNumbers()
    assert numbers.largest == -1
    numbers.reserved(0)
    numbers.released(0)
    assert numbers.largest == -1
    numbers.reserved(0)
    numbers.reserved(1)
    numbers.released(0)
    assert numbers.largest == 1
    numbers.released(1)
    assert numbers.largest == 0
    numbers.sent(4)
    assert numbers.largest == 4


def test_resume_numbers_ledger_reads_both_kinds(tmp_path: Path) -> None:
    """Reservations and releases read back in file order; read_ledger keeps reservations."""
    folder = Folder(tmp_path, KEYS).reserve((0, 0, 0), (1, 0, 2)).release((0, 0, 0))
    assert list(read_entries(folder.layout.attempts)) == [
        (False, 0, 0, 0),
        (False, 1, 0, 2),
        (True, 0, 0, 0),
    ]
    assert list(read_ledger(folder.layout.attempts)) == [(0, 0, 0), (1, 0, 2)]
