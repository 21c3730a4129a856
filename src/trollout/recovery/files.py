"""The run folder's file operations: appends, atomic replaces, fsyncs, clear errors.

Synchronous on purpose: the store runs the slow ones (fsync, whole-file writes) in worker
threads. Every OS error is translated once, here, into a `RunFolderError` that names the file,
the action and the remedy.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from .. import jsonl
from ..errors import RunFolderError, TrolloutError
from ..records import MaterializedRow, converter
from .layout import RunLayout

__all__ = [
    "REMEDY",
    "Appender",
    "folder_error",
    "fsync_all",
    "fsync_dir",
    "os_errors",
    "remove_temp_files",
    "replace_atomically",
    "write_materialized",
]

REMEDY = "check free space and permissions of the folder, then resume the run"


class Appender:
    """One append-only file of the run, opened once, written with plain ``os.write``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None
        self.dirty = False  # rows written since the last fsync
        self.created = False  # opened with O_CREAT when the file did not exist

    def open(self) -> int:
        """Open the file for appending (once); return its descriptor."""
        if self.fd is None:
            with os_errors(self.path, "open"):
                self.created = not self.path.exists()
                self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return self.fd

    def append(self, data: bytes) -> None:
        """Append ``data`` whole (a short write is continued)."""
        fd = self.open()
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(fd, view) :]
        except OSError as exc:  # a try, not os_errors: this runs once per batch
            raise folder_error(self.path, "append to", exc) from exc
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


def replace_atomically(path: Path, chunks: Iterable[bytes]) -> None:
    """Replace ``path`` with ``chunks``: temp file beside it, fsync, rename, fsync the folder.

    A reader sees the old file or the new one, never a part; a crash leaves at most a temp file
    named ``.<name>.<random>.tmp``, which the next `open_run_store` removes.
    """
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with open(fd, "wb", buffering=1 << 20) as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def write_materialized(path: Path, rows: Iterable[MaterializedRow]) -> int:
    """Write the materialized-inputs file atomically; return the row count."""
    count = 0

    def lines() -> Iterator[bytes]:
        nonlocal count
        for row in rows:
            count += 1
            yield jsonl.dumps(converter.unstructure(row, MaterializedRow))

    with os_errors(path, "write"):
        replace_atomically(path, lines())
    return count


def fsync_all(fds: list[int | None], folder: Path) -> None:
    """Fsync each descriptor (None stands for the folder itself)."""
    for fd in fds:
        if fd is None:
            fsync_dir(folder)
        else:
            os.fsync(fd)


def fsync_dir(folder: Path) -> None:
    """Fsync a folder, so a rename or a new file in it is durable."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_temp_files(layout: RunLayout) -> None:
    """Remove temp files a crash left beside the run's files."""
    folder = layout.output.parent
    for path in layout.all_files():
        for tmp in folder.glob(f".{path.name}.*.tmp"):
            with os_errors(tmp, "remove the leftover temp file"):
                tmp.unlink(missing_ok=True)


@contextmanager
def os_errors(path: Path, action: str) -> Iterator[None]:
    """Translate an OSError into a `RunFolderError` naming the file and the remedy."""
    try:
        yield
    except OSError as exc:
        if isinstance(exc, TrolloutError):
            raise
        raise folder_error(path, action, exc) from exc


def folder_error(path: Path, action: str, exc: OSError) -> RunFolderError:
    """Return the `RunFolderError` for an OSError during ``action`` on ``path``."""
    reason = exc.strerror or str(exc)
    return RunFolderError(f"cannot {action} {str(path)!r}: {reason}; {REMEDY}")
