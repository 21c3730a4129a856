"""The cross-process lock that makes a run folder single-owner.

One collector owns a run folder at a time: a second one must fail at once, loudly, naming the
owner, rather than interleave rows into the same files. `RunLock` takes ``fcntl.flock(LOCK_EX |
LOCK_NB)`` on ``<stem>.lock`` beside the output and writes the owner's pid, host, start time
and a random writer token into it, so the loser's error can say who holds the folder and what
to do. A holder checks before each write that the lock file is still the one it locked and
still carries its token (`RunLock.verify`): a lock file deleted and recreated by someone else
(a user clearing the folder while a trainer records into it, then another writer opening the
same shard) would otherwise let two writers hold two different locks on one run. The check runs
before every batch of rows, so it costs one ``stat`` while the file is unchanged: the owner record
is read again only when the file's inode, size or times differ from the last verified ones (a
replaced file is a new inode, since this holder keeps the old one open; a rewritten one has new
times). Only a rewrite in place within the same timestamp tick as the last check, by a process
that writes the record without holding the ``flock``, would be seen late.

Design note: ``flock`` is used rather than ``fcntl``/``lockf`` record locks, and rather than an
``O_EXCL`` pid file. Record locks belong to the *process*, so a second lock taken by the same
process (two stores on one folder, a test) silently succeeds and closing *any* descriptor of the
file drops them; ``flock`` locks belong to the open file description, so a second `RunLock` in the
same process conflicts exactly like another process does. A pid file survives a SIGKILL and needs
a liveness guess to break; a ``flock`` is dropped by the kernel when its owner dies, however it
dies. The lock file is never unlinked: unlinking races with a contender that already opened it
and would let two owners lock two different inodes. Caveats: a forked child inherits the lock
(``fork`` without ``exec``), and ``flock`` on some network file systems is local to one host.

A dead writer's record is its crash report. `RunLock.release` empties the record, so a lock file
that holds one when it is taken was held by a process that died holding it (`RunLock.inherited`).
Only such a writer can have left temp files beside the run's files (every writer of a run's
files holds its lock; aggregation takes it when no collector holds it), so the next writer
lists the folder for them only then (`store.open_run_store`): a shards folder of 10,000 steps
holds 60,000 files, and listing it at every step's open made each step's cost grow with the
steps before it. A holder that does not
clean up after the dead writer (aggregation marking a status file) puts the record back at
release, so the report stays until a writer acts on it (`RunLock.crash_handled`).
Rejected: listing the folder at every open (what this replaced: 2.5 ms per shard opened beside
1,000 others); temp files in a subfolder of their own (a second layout to check for links and
mounts, and temp names older versions left would never be cleaned).
"""

from __future__ import annotations

import fcntl
import os
import secrets
import socket
import time
from pathlib import Path
from types import TracebackType

import orjson
from attrs import frozen

from ..errors import RunFolderError, RunFolderLockedError, RunFolderWriteError
from .layout import RunLayout

__all__ = ["LockOwner", "RunLock", "read_owner"]

# Owner records are tiny; never read more than this from a lock file written by someone else.
_MAX_OWNER_BYTES = 4096
# `check_free` (status, preflight) holds a shared lock for microseconds; a collector starting at
# that moment waits these pauses for it rather than report a folder in use by no one.
_PROBE_PAUSES_S = (0.001, 0.005, 0.025)


@frozen
class LockOwner:
    """Who holds a run folder's lock.

    Attributes:
        pid: the owner's process id.
        host: the owner's host name.
        started_at: Unix time at which the owner took the lock.
        token: the owner's random writer token ("" in a record written before tokens).
    """

    pid: int
    host: str
    started_at: float
    token: str = ""

    def describe(self) -> str:
        """Return ``pid 1234`` (plus the host when it is not this one)."""
        if self.host == socket.gethostname():
            return f"pid {self.pid}"
        return f"pid {self.pid} on host {self.host!r}"


def _signature(st: os.stat_result) -> tuple[int, ...]:
    """Return what changes whenever a file is replaced or rewritten: inode, size, times."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def read_owner(path: str | os.PathLike[str]) -> LockOwner | None:
    """Read the owner record of a lock file, or None when absent or unreadable.

    The record says who took the lock last; only a failed `RunLock.acquire` proves it is held.
    """
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_OWNER_BYTES)
        raw = orjson.loads(data)
        return LockOwner(
            pid=int(raw["pid"]),
            host=str(raw["host"]),
            started_at=float(raw["started_at"]),
            token=str(raw.get("token", "")),
        )
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


def _lock_exclusive(fd: int) -> None:
    """Take ``LOCK_EX`` at once, outlasting a probe's momentary shared lock.

    Raises:
        BlockingIOError: the lock is held (by a holder, not a probe).
    """
    for pause in _PROBE_PAUSES_S:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            time.sleep(pause)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


class RunLock:
    """An exclusive, non-blocking, cross-process lock on one run folder.

    Use as a context manager or with `acquire` / `release`. A held lock is dropped by the kernel
    when the process dies, SIGKILL included.
    """

    def __init__(self, path: str | os.PathLike[str], *, output: str | os.PathLike[str]) -> None:
        """Prepare a lock on ``path`` guarding the run whose rollouts file is ``output``."""
        self.path = Path(path)
        self.output = Path(output)
        self.token = secrets.token_hex(16)
        self._fd: int | None = None
        self._inherited: bytes | None = None  # the record a dead holder left (module docstring)
        self._verified: tuple[int, ...] | None = None  # `_signature` of the file last verified

    @classmethod
    def for_layout(cls, layout: RunLayout) -> RunLock:
        """Return the lock of a run folder (``<stem>.lock``)."""
        return cls(layout.lock, output=layout.output)

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    @property
    def inherited(self) -> bool:
        """Whether the lock, when taken, held the record of a writer that died holding it (it
        may have left temp files); False once `crash_handled`."""
        return self._inherited is not None

    def crash_handled(self) -> None:
        """Say the dead writer's leftovers are cleaned up: `release` then empties the record."""
        self._inherited = None

    def acquire(self) -> None:
        """Take the lock at once, or fail naming the owner.

        Raises:
            RunFolderLockedError: another process, or another `RunLock`, holds it.
            RunFolderError: the lock file cannot be opened (missing folder, permissions).
        """
        if self._fd is not None:
            raise RunFolderError(f"run lock {str(self.path)!r} is already held by this object")
        fd = self._open()
        try:
            _lock_exclusive(fd)
        except BlockingIOError:
            os.close(fd)
            raise RunFolderLockedError(self._locked_message()) from None
        except OSError as exc:
            os.close(fd)
            raise RunFolderError(
                f"cannot lock {str(self.path)!r}: {exc.strerror}; the folder's file system may "
                "not support flock (some network file systems); collect into a local folder"
            ) from exc
        self._fd = fd
        try:
            left = os.pread(fd, _MAX_OWNER_BYTES, 0)  # under the lock: nobody writes it now
        except OSError:
            left = b""
        self._inherited = left or None
        self._write_owner(fd)

    def check_free(self) -> None:
        """Fail if another holds the lock, without taking it or creating the lock file.

        Raises:
            RunFolderLockedError: another process, or another `RunLock`, holds it.
        """
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return  # no lock file: nobody holds it (acquire reports any other problem)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunFolderLockedError(self._locked_message()) from None
        except OSError:
            pass  # flock unsupported here: acquire says so
        finally:
            os.close(fd)  # closing drops the shared lock

    def verify(self) -> None:
        """Check that this lock is still the run's: same lock file, same writer token.

        Raises:
            RunFolderWriteError: the lock file was removed or replaced, or holds another
                writer's token; this writer must stop writing (nothing more is written).
        """
        fd = self._fd
        if fd is None:
            raise RunFolderError(f"run lock {str(self.path)!r} is not held by this writer")
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except OSError:
            st = None
        seen = _signature(st) if st is not None else None
        if seen is not None and seen == self._verified:
            return  # the very file whose record was checked, unchanged since: one stat call
        mine = os.fstat(fd)
        owner = read_owner(self.path)
        if (
            st is None
            or (st.st_dev, st.st_ino) != (mine.st_dev, mine.st_ino)
            or (owner is None or owner.token != self.token)
        ):
            who = owner.describe() if owner is not None else "nobody now"
            raise RunFolderWriteError(
                f"the lock {str(self.path)!r} of {str(self.output)!r} was replaced while this "
                f"writer held it (its owner record names {who}); another writer may be writing "
                "the same run, so this one stops; keep one writer per run folder, then resume it"
            )
        self._verified = seen

    def release(self) -> None:
        """Drop the lock (a no-op when not held); the lock file itself stays."""
        fd, self._fd = self._fd, None
        self._verified = None
        if fd is None:
            return
        left, self._inherited = self._inherited, None
        try:
            if left is None:
                os.ftruncate(fd, 0)  # no stale owner record once nobody holds the lock
            else:  # the dead writer's report, kept for a writer that cleans up after it
                os.pwrite(fd, left, 0)
                os.ftruncate(fd, len(left))
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def _open(self) -> int:
        try:
            # Never through a link: truncating the owner record would truncate its target.
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise RunFolderError(
                f"cannot open the run lock {str(self.path)!r}: {exc.strerror}; check that the "
                "output folder exists and is writable"
            ) from exc

    def _write_owner(self, fd: int) -> None:
        owner = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started_at": time.time(),
            "token": self.token,
        }
        data = orjson.dumps(owner) + b"\n"
        # Write before truncating, so a contender never reads an empty record mid-update.
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))

    def _locked_message(self) -> str:
        owner = read_owner(self.path)
        who = owner.describe() if owner else "pid unknown"
        stop = f" (kill {owner.pid})" if owner and owner.host == socket.gethostname() else ""
        return (
            f"another trollout ({who}) is collecting into {str(self.output)!r} "
            f"(lock {str(self.path)!r}); wait for it to finish, or stop it{stop}"
        )
