"""Reading one rollout's capture files safely: bounded, inside the capture dir, never blocking.

A capture file is written by a model server we do not control, into a directory anyone with
access to the deployment may write, so it is read as hostile input:

- **Only the rollout's own name.** The file is ``<key>.capture.jsonl`` where ``key`` is the
  rollout's capture key (`records.Identity.rollout_id_for`, attempt suffix included), checked
  against `records.ROLLOUT_ID_PATTERN` (no ``/``, no leading dot), opened relative to a
  descriptor of the capture dir: no path can leave the dir.
- **No links.** ``O_NOFOLLOW`` refuses a symlink (in or out of the dir: one pointing at another
  rollout's file is "another rollout's key"), and a file with more than one hard link is
  refused too (it is some other file's content under this rollout's name).
- **Regular files only, opened without blocking.** ``O_NONBLOCK`` makes a FIFO open at once,
  and ``fstat`` on the open descriptor (no race with a rename) refuses anything but a regular
  file.
- **Bounded.** A file over ``max_bytes`` (st_size, or more bytes than that actually read: a
  sparse 2 GB file or one still growing) is refused without reading past the cap, so memory
  per rollout is at most the cap.

Every refusal is a `CaptureFileError` naming the file and why; the enricher turns it into the
gap marker ``model_call_capture_unreadable``. A file that does not exist is not an error: it is
evidence that no call was captured (``model_call_capture_no_records``).

These functions block (they read files): the enricher runs them in a worker thread
(`trio.to_thread`), never on the event loop.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Any

import orjson
from attrs import frozen

from ..errors import CaptureFileError
from ..records import ROLLOUT_ID_PATTERN

__all__ = [
    "CAPTURE_SUFFIX",
    "INCOMPLETE_SUFFIX",
    "CaptureFile",
    "capture_name",
    "delete_capture",
    "read_capture",
]

CAPTURE_SUFFIX = ".capture.jsonl"
INCOMPLETE_SUFFIX = ".capture.incomplete"
_READ_CHUNK = 1 << 20


@frozen
class CaptureFile:
    """What one read of a rollout's capture evidence found.

    Attributes:
        path: the capture file's path (for messages).
        exists: the file was there.
        exchanges: the parsed lines, in file order; None for a line that could not be parsed
            (it still takes a ``call_index``).
        partial_tail: the last line had no newline yet (a writer may still be appending it);
            it is counted in `exchanges` as unreadable.
        incomplete: the ``.capture.incomplete`` marker was present.
    """

    path: str
    exists: bool
    exchanges: tuple[dict[str, Any] | None, ...] = ()
    partial_tail: bool = False
    incomplete: bool = False


def capture_name(key: str) -> str:
    """Return the capture file's name for ``key``; refuse a key that could name another file.

    Raises:
        CaptureFileError: the key is not a valid capture key.
    """
    if not ROLLOUT_ID_PATTERN.match(key):
        raise CaptureFileError(
            f"capture key {key!r} is not a valid rollout id ([A-Za-z0-9][A-Za-z0-9._-]*); "
            "nothing was read"
        )
    return key + CAPTURE_SUFFIX


def read_capture(directory: str, key: str, max_bytes: int) -> CaptureFile:
    """Read and parse ``<directory>/<key>.capture.jsonl`` (blocking; see the module doc).

    Raises:
        CaptureFileError: the file is refused or cannot be read (names the file and why).
    """
    name = capture_name(key)
    path = os.path.join(directory, name)
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:  # no model server has captured anything yet
        return CaptureFile(path, exists=False)
    except OSError as exc:
        raise CaptureFileError(f"{directory}: the capture dir cannot be opened ({exc})") from exc
    try:
        incomplete = _exists(key + INCOMPLETE_SUFFIX, dir_fd)
        data = _read_bounded(name, path, dir_fd, max_bytes)
    finally:
        os.close(dir_fd)
    if data is None:
        return CaptureFile(path, exists=False, incomplete=incomplete)
    partial = bool(data) and not data.endswith(b"\n")
    exchanges: list[dict[str, Any] | None] = []
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError:
            value = None
        exchanges.append(value if isinstance(value, dict) else None)
    return CaptureFile(path, True, tuple(exchanges), partial, incomplete)


def _exists(name: str, dir_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return True


def _read_bounded(name: str, path: str, dir_fd: int, max_bytes: int) -> bytes | None:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CaptureFileError(
                f"{path}: is a symbolic link; refused (a capture file must be the model "
                "server's own file inside the capture dir)"
            ) from exc
        raise CaptureFileError(f"{path}: cannot be opened ({exc.strerror})") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CaptureFileError(f"{path}: is not a regular file; refused")
        if st.st_nlink > 1:
            raise CaptureFileError(
                f"{path}: has {st.st_nlink} hard links; refused (it may be another rollout's "
                "file under this rollout's name)"
            )
        if st.st_size > max_bytes:
            raise CaptureFileError(
                f"{path}: is {st.st_size} bytes, over the {max_bytes}-byte cap for one "
                "rollout's capture; refused unread"
            )
        chunks: list[bytes] = []
        total = 0
        while total <= max_bytes:
            chunk = os.read(fd, min(_READ_CHUNK, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > max_bytes:
            raise CaptureFileError(
                f"{path}: grew past the {max_bytes}-byte cap while being read; refused"
            )
        return b"".join(chunks)
    except OSError as exc:
        if isinstance(exc, CaptureFileError):
            raise
        raise CaptureFileError(f"{path}: cannot be read ({exc.strerror})") from exc
    finally:
        os.close(fd)


def delete_capture(directory: str, key: str) -> None:
    """Remove a merged rollout's capture file and its incomplete marker (blocking).

    Only names inside the capture dir are unlinked (a symlink would be removed as a link,
    never followed); a file already gone is fine.

    Raises:
        CaptureFileError: a file could not be removed (names it).
    """
    name = capture_name(key)
    for entry in (name, key + INCOMPLETE_SUFFIX):
        try:
            os.unlink(os.path.join(directory, entry))
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise CaptureFileError(
                f"{os.path.join(directory, entry)}: cannot be deleted ({exc.strerror})"
            ) from exc
