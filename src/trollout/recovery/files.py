"""The run folder's file operations: appends, atomic replaces, fsyncs, clear errors.

Synchronous: the store runs the slow ones in worker threads. Every OS error is translated once,
here, into a `RunFolderError` (the folder cannot be used) or a `RunFolderWriteError` (mid-run:
the run stops) naming the file, the action, the free space when the disk is full, the remedy.

Nothing here follows a symlink to write: run files are opened with ``O_NOFOLLOW`` and temp files
with ``O_EXCL``, so a planted link never redirects a write. A failed append is cut back to where
it began, so a full disk never leaves a torn row behind.

One atomic replace for every file trollout writes whole (the run folder's status, inputs and
manifest, the aggregation's metrics file, report and merged files, ``sbatch`` scripts):
`AtomicFile` writes a temp file beside the target (``.<name>.<8 hex digits>.tmp``, opened with
``O_EXCL``), then `AtomicFile.commit` fsyncs it, renames it into place and fsyncs the folder,
or `AtomicFile.discard` removes it. `atomic_write` (a file object to stream into) and
`replace_atomically` (chunks) are the two ways to use it. Without both fsyncs a power loss
soon after the rename can leave an empty or absent file where the old one was, so only a run
under ``--fsync never`` skips them (``durable=False``). Rejected: a copy per module (four
existed, three without fsync, with temp names the next run's cleanup did not recognise).

One refusal of links, likewise: `check_replaceable` is the rule for every path trollout is about
to write, a file (run files, ``sbatch --script``) or a folder it writes into (the shards folder):
absent, or what trollout would have made there, never a symlink.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
import stat
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any

from .. import jsonl
from ..errors import RunFolderError, RunFolderWriteError, TrolloutError
from ..records import MaterializedRow
from .layout import RunLayout

__all__ = [
    "REMEDY",
    "Appender",
    "AtomicFile",
    "WriteStoppedError",
    "atomic_write",
    "check_replaceable",
    "folder_error",
    "format_bytes",
    "free_space_text",
    "fsync_all",
    "fsync_dir",
    "os_errors",
    "remove_temp_files",
    "replace_atomically",
    "temp_files",
    "write_materialized",
]

REMEDY = "check free space and permissions of the folder, then resume the run"
_DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
# A temp file's name in a listing joined by NULs; group 1: ".<name of the file it replaces>".
_TEMP_NAME = re.compile(r"\0(\.[^\0]+)\.[0-9a-f]{8}\.tmp(?=\0)")


class WriteStoppedError(Exception):
    """A whole-file write was asked to stop (its caller was cancelled); nothing was replaced."""


class Appender:
    """One append-only file of the run, opened once, written with plain ``os.write``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None
        self.dirty = False  # rows written since the last fsync
        self.created = False  # opened with O_CREAT when the file did not exist

    def open(self) -> int:
        """Open the file for appending (once, never through a symlink); return its descriptor."""
        if self.fd is None:
            with os_errors(self.path, "open"):
                self.created = not os.path.lexists(self.path)
                self.fd = os.open(self.path, _APPEND_FLAGS, 0o644)
        return self.fd

    def append(self, data: bytes) -> None:
        """Append ``data`` whole (a short write is continued).

        Raises:
            RunFolderWriteError: the write failed (disk full, I/O error); what this call wrote
                was cut away again, so the file ends where it ended before.
        """
        fd = self.fd if self.fd is not None else self.open()
        written = 0
        try:
            written = os.write(fd, data)
            if written == len(data):
                return  # the common case: one whole write (a reservation per rollout)
            view = memoryview(data)[written:]
            while view:
                n = os.write(fd, view)
                written += n
                view = view[n:]
        except OSError as exc:  # a try, not os_errors: this runs once per batch
            if written:
                with suppress(OSError):  # freeing blocks works on a full disk
                    os.ftruncate(fd, os.fstat(fd).st_size - written)
            raise folder_error(self.path, "append to", exc, RunFolderWriteError) from exc
        finally:
            self.dirty = True  # a partial write still needs its fsync

    def sync_target(self) -> int:
        """The descriptor to fsync."""
        assert self.fd is not None
        return self.fd

    def close(self) -> None:
        """Close the file if open."""
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


_Hook = Callable[[Path], None] | None  # called with a complete temp file before its rename
_APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


class AtomicFile:
    """A file being replaced atomically: written to a temp file beside it, then committed.

    A reader sees the old file or the new one, never a part; a crash leaves at most a temp file
    named ``.<name>.<8 hex digits>.tmp``, which the folder's next run removes (`recovery.lock`).

    Args:
        path: the file to replace (a symlink there is replaced, never followed; the temp file
            is created with ``O_EXCL``, so a link planted under its name is never written).
        durable: fsync the new content and the folder (False: ``--fsync never``; still atomic).
    """

    def __init__(self, path: Path, *, durable: bool = True) -> None:
        self.path = path
        self.durable = durable
        self.temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        fd = os.open(self.temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        self.file: IO[bytes] = open(fd, "wb", buffering=1 << 20)  # noqa: SIM115

    def commit(self, *, before_replace: _Hook = None) -> None:
        """Fsync the new content (`close`), rename it over ``path``, fsync the folder.

        Any error removes the temp file and leaves ``path`` as it was (until the rename).

        Args:
            before_replace: called with the temp file's path once the new content is complete
                and synced, just before the rename (a fresh run clears the old run's files
                there, and only there).
        """
        try:
            self.close()
            if before_replace is not None:
                before_replace(self.temp)
            os.replace(self.temp, self.path)
        except BaseException:
            self.discard()
            raise
        if self.durable:
            fsync_dir(self.path.parent)

    def close(self) -> None:
        """Flush, fsync and close the temp file (once; `commit` calls it too)."""
        if not self.file.closed:
            try:
                self.file.flush()
                if self.durable:
                    os.fsync(self.file.fileno())
            finally:
                self.file.close()

    def discard(self) -> None:
        """Close and remove the temp file; ``path`` stays as it was."""
        self.file.close()
        with suppress(FileNotFoundError):
            os.unlink(self.temp)


@contextmanager
def atomic_write(
    path: Path, *, before_replace: _Hook = None, durable: bool = True
) -> Iterator[IO[bytes]]:
    """Yield a file object whose content replaces ``path`` atomically when the block ends.

    An error in the block (`WriteStoppedError` included) discards the new content; see `AtomicFile`.
    """
    new = AtomicFile(path, durable=durable)
    try:
        yield new.file
    except BaseException:
        new.discard()
        raise
    new.commit(before_replace=before_replace)


def replace_atomically(
    path: Path, chunks: Iterable[bytes], *, before_replace: _Hook = None, durable: bool = True
) -> None:
    """Replace ``path`` with ``chunks``: temp file beside it, fsync, rename, fsync the folder.

    Any error (`WriteStoppedError` included) removes the temp file and leaves ``path`` as it was.

    Args:
        path: the file to replace (see `AtomicFile`).
        chunks: the new content.
        before_replace, durable: as for `AtomicFile`.
    """
    with atomic_write(path, before_replace=before_replace, durable=durable) as f:
        for chunk in chunks:
            f.write(chunk)


_KINDS = (
    (stat.S_ISREG, "a regular file"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)


def check_replaceable(path: Path, what: str, instead: str, *, folder: bool = False) -> bool:
    """Refuse to write ``path`` unless it is absent or what trollout makes there; return whether
    it exists.

    The one rule for every path trollout writes, run files and others (``sbatch --script``, the
    shards folder): never through a symlink, never over a device, FIFO, socket or (for a file)
    a directory, or (for a ``folder``) a file.

    Args:
        path: the file about to be written or replaced, or the folder about to be written into.
        what: how messages name it (``"the run file"``).
        instead: what to choose instead (``"another output file (-o)"``).
        folder: ``path`` is a folder trollout writes into, not a file it replaces.

    Raises:
        RunFolderError: naming the path, what it is, and the remedy.
    """
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise RunFolderError(
            f"cannot inspect {what} {str(path)!r}: {exc.strerror}; check the folder's permissions"
        ) from exc
    if stat.S_ISLNK(mode):
        raise RunFolderError(
            f"{what} {str(path)!r} is a symlink; trollout never writes through links (one could "
            f"point outside the run folder); remove the link, or choose {instead}"
        )
    expected, made, fate = (
        (stat.S_ISDIR, "a directory", "written into")
        if folder
        else (stat.S_ISREG, "a regular file", "replaced")
    )
    if not expected(mode):
        kind = next((name for test, name in _KINDS if test(mode)), f"not {made}")
        raise RunFolderError(
            f"{what} {str(path)!r} is {kind}, not {made} trollout made; it would be {fate}; "
            f"choose {instead}"
        )
    return True


def write_materialized(
    path: Path,
    rows: Iterable[MaterializedRow | Mapping[str, Any]],
    *,
    stop: threading.Event | None = None,
    before_replace: _Hook = None,
    digest: Any = None,
    durable: bool = True,
) -> int:
    """Write the materialized-inputs file atomically; return the row count.

    Args:
        path: the materialized-inputs file.
        rows: the rows, or their bodies (what the file holds), consumed once.
        stop: when set (by a cancelled caller in another thread), the write stops at the next
            row with `WriteStoppedError` and removes its temp file.
        before_replace, durable: as for `replace_atomically`.
        digest: a ``hashlib`` object updated with every byte written (no read-back to hash).
    """
    count = 0

    def lines() -> Iterator[bytes]:
        nonlocal count
        for row in rows:
            if stop is not None and count % 256 == 0 and stop.is_set():
                raise WriteStoppedError(f"writing {str(path)!r} was stopped")
            count += 1
            body = row.body if isinstance(row, MaterializedRow) else row  # as written, not copied
            line = jsonl.dumps(body if type(body) is dict else dict(body))
            if digest is not None:
                digest.update(line)
            yield line

    with os_errors(path, "write"):
        replace_atomically(path, lines(), before_replace=before_replace, durable=durable)
    return count


def fsync_all(fds: list[int | None], folder: Path) -> None:
    """Fsync each descriptor (None stands for the folder itself)."""
    for fd in fds:
        os.fsync(fd) if fd is not None else fsync_dir(folder)


def fsync_dir(folder: Path) -> None:
    """Fsync a folder, so a rename or a new file in it is durable."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_files(layout: RunLayout) -> list[Path]:
    """Return the temp files a crash left beside the run's files (our names only), one listing
    per folder in one regex pass; `recovery.lock` says when a run calls it."""
    wanted: dict[Path, set[str]] = {}
    for path in layout.all_files():
        wanted.setdefault(path.parent, set()).add(f".{path.name}")
    found = []
    for folder, prefixes in wanted.items():
        try:
            listing = "\0" + "\0".join(os.listdir(folder)) + "\0"
        except (FileNotFoundError, NotADirectoryError):
            continue  # no folder yet: no temp file either
        found += [folder / m[0][1:] for m in _TEMP_NAME.finditer(listing) if m[1] in prefixes]
    return found


def remove_temp_files(layout: RunLayout, *, keep: Path | None = None) -> None:
    """Remove temp files a crash left beside the run's files (never anything else)."""
    for tmp in temp_files(layout):
        if tmp == keep:
            continue
        with os_errors(tmp, "remove the leftover temp file"):
            tmp.unlink(missing_ok=True)


@contextmanager
def os_errors(
    path: Path, action: str, cls: type[RunFolderError | RunFolderWriteError] = RunFolderError
) -> Iterator[None]:
    """Translate an OSError into ``cls`` naming the file, the free space and the remedy."""
    try:
        yield
    except OSError as exc:
        if isinstance(exc, TrolloutError):
            raise
        raise folder_error(path, action, exc, cls) from exc


def folder_error(
    path: Path,
    action: str,
    exc: OSError,
    cls: type[RunFolderError | RunFolderWriteError] = RunFolderError,
) -> RunFolderError | RunFolderWriteError:
    """Return the error for an OSError during ``action`` on ``path`` (free space if full)."""
    reason = exc.strerror or str(exc)
    if exc.errno in _DISK_FULL:
        reason += f" ({free_space_text(path.parent)})"
    return cls(f"cannot {action} {str(path)!r}: {reason}; {REMEDY}")


def free_space_text(folder: Path) -> str:
    """Return e.g. ``"12.5 MB free on its file system"`` (or that it cannot be measured)."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return "free space unknown"
    return f"{format_bytes(free)} free on its file system"


def format_bytes(n: float) -> str:
    """Return a byte count for people: ``512 B``, ``12.5 MB``, ``3.1 GB``."""
    if n < 1000:
        return f"{n:.0f} B"
    for unit in ("kB", "MB", "GB"):
        n /= 1000
        if n < 1000:
            return f"{n:.1f} {unit}"
    return f"{n / 1000:.1f} TB"
