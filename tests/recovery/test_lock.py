"""Tests of the run folder's cross-process lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from trollout.errors import RunFolderError, RunFolderLockedError, RunFolderWriteError
from trollout.recovery import lock as lock_module
from trollout.recovery.layout import RunLayout
from trollout.recovery.lock import LockOwner, RunLock, read_owner

# A child that takes the lock, says so, and waits to be killed.
HOLDER = """
import sys, time
from trollout.recovery.lock import RunLock
lock = RunLock(sys.argv[1], output=sys.argv[2])
lock.acquire()
print("locked", flush=True)
time.sleep(60)
"""


@pytest.fixture
def layout(tmp_path: Path) -> RunLayout:
    return RunLayout.for_output(tmp_path / "a.jsonl")


@pytest.fixture
def holder(layout: RunLayout) -> Iterator[subprocess.Popen[str]]:
    """A separate process holding the run's lock (killed at teardown)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(layout.lock), str(layout.output)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "locked\n"
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_lock_second_holder_in_process_fails_naming_owner(layout: RunLayout) -> None:
    """A second RunLock in the same process fails at once, naming pid, output and remedy."""
    with RunLock.for_layout(layout), pytest.raises(RunFolderLockedError) as caught:
        RunLock.for_layout(layout).acquire()
    message = str(caught.value)
    assert f"another trollout (pid {os.getpid()}) is collecting into {str(layout.output)!r}" in (
        message
    )
    assert message.endswith(f"wait for it to finish, or stop it (kill {os.getpid()})")
    assert isinstance(caught.value, OSError)


def test_lock_records_owner_while_held(layout: RunLayout) -> None:
    """While held, the lock file names the owner; after release it is empty but kept."""
    lock = RunLock.for_layout(layout)
    with lock:
        owner = read_owner(layout.lock)
        assert owner is not None
        assert owner.pid == os.getpid()
        assert owner.describe() == f"pid {os.getpid()}"
        assert lock.held
    assert not lock.held
    assert layout.lock.read_bytes() == b""
    assert read_owner(layout.lock) is None


def test_lock_release_lets_the_next_holder_in(layout: RunLayout) -> None:
    """Releasing (also on an exception) frees the lock for the next RunLock."""
    with pytest.raises(ZeroDivisionError), RunLock.for_layout(layout):
        1 / 0  # noqa: B018
    second = RunLock.for_layout(layout)
    second.acquire()
    second.release()
    second.release()  # a second release is a no-op


def test_lock_unreadable_owner_says_pid_unknown(layout: RunLayout) -> None:
    """A lock file whose owner record cannot be read still refuses, with pid unknown."""
    with RunLock.for_layout(layout):
        layout.lock.write_bytes(b"\x00garbage")
        with pytest.raises(RunFolderLockedError, match=r"another trollout \(pid unknown\)"):
            RunLock.for_layout(layout).acquire()


def test_lock_acquire_twice_on_one_object_fails(layout: RunLayout) -> None:
    """Acquiring a lock object that is already held is refused."""
    with RunLock.for_layout(layout) as lock, pytest.raises(RunFolderError, match="already held"):
        lock.acquire()


def test_lock_missing_folder_is_a_run_folder_error(tmp_path: Path) -> None:
    """A lock in a folder that does not exist fails naming the lock file."""
    layout = RunLayout.for_output(tmp_path / "missing" / "a.jsonl")
    with pytest.raises(RunFolderError, match=r"cannot open the run lock '.*missing/a\.lock'"):
        RunLock.for_layout(layout).acquire()


def test_lock_held_by_another_process_names_its_pid(
    layout: RunLayout, holder: subprocess.Popen[str]
) -> None:
    """A lock held by another process fails at once, naming that process's pid."""
    with pytest.raises(RunFolderLockedError, match=rf"\(pid {holder.pid}\) is collecting into"):
        RunLock.for_layout(layout).acquire()


def test_lock_of_a_sigkilled_owner_is_released(
    layout: RunLayout, holder: subprocess.Popen[str]
) -> None:
    """When the owner is SIGKILLed, the OS drops its lock and the next acquire succeeds."""
    with pytest.raises(RunFolderLockedError):
        RunLock.for_layout(layout).acquire()
    holder.send_signal(signal.SIGKILL)
    assert holder.wait(timeout=10) == -signal.SIGKILL
    with RunLock.for_layout(layout) as lock:
        assert lock.held
        owner = read_owner(layout.lock)
        assert owner is not None
        assert owner.pid == os.getpid()


def test_lock_owner_on_another_host_is_named() -> None:
    """An owner record from another host names the host (its pid means nothing here)."""
    owner = LockOwner(pid=42, host="elsewhere.example", started_at=0.0)
    assert owner.describe() == "pid 42 on host 'elsewhere.example'"


def test_lock_verify_reads_the_owner_record_only_when_the_file_changed(
    layout: RunLayout, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Verifying an unchanged lock file is one stat: the record is not read again per batch."""
    reads: list[object] = []
    real = lock_module.read_owner

    def counting(path: str | os.PathLike[str]) -> LockOwner | None:
        reads.append(path)
        return real(path)

    monkeypatch.setattr(lock_module, "read_owner", counting)
    with RunLock.for_layout(layout) as lock:
        for _ in range(5):
            lock.verify()
    assert len(reads) == 1


def test_lock_verify_still_sees_a_record_rewritten_in_place(layout: RunLayout) -> None:
    """After a verified check, another token written into the same file still stops the writer."""
    with RunLock.for_layout(layout) as lock:
        lock.verify()
        layout.lock.write_text('{"pid": 1, "host": "elsewhere", "started_at": 0, "token": "x"}')
        with pytest.raises(RunFolderWriteError, match="was replaced while this writer held it"):
            lock.verify()


def test_acquire_outlasts_a_probes_momentary_shared_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`check_free` (status, preflight) holds a shared lock for an instant; a collector that
    starts in that instant takes the lock once the probe lets go, not "in use"."""
    import fcntl

    lock = RunLock(tmp_path / "r.lock", output=tmp_path / "r.jsonl")
    (tmp_path / "r.lock").write_text("")
    probe = os.open(tmp_path / "r.lock", os.O_RDONLY)
    fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
    pauses: list[float] = []

    def probe_ends(seconds: float) -> None:
        pauses.append(seconds)
        os.close(probe)  # the probe lets go while the acquirer pauses

    monkeypatch.setattr(lock_module.time, "sleep", probe_ends)
    lock.acquire()
    try:
        assert lock.held
        assert len(pauses) == 1
    finally:
        lock.release()


def test_acquire_still_fails_at_once_against_a_holder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real holder outlasts the pauses: the second lock fails naming it."""
    monkeypatch.setattr(lock_module.time, "sleep", lambda seconds: None)
    first = RunLock(tmp_path / "r.lock", output=tmp_path / "r.jsonl")
    first.acquire()
    try:
        with pytest.raises(RunFolderLockedError):
            RunLock(tmp_path / "r.lock", output=tmp_path / "r.jsonl").acquire()
    finally:
        first.release()
