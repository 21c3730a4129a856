"""Paths a user names: refuse anything but a regular file before it is opened (a leaf).

Opening a FIFO blocks until a writer comes, and a device or a pipe may never end, so every file
trollout reads because a user named it (the input, a prompt config, a run's input on resume) is
stat'ed first and refused, on one line naming it, unless it is a regular file. The planner and
the run folder both need the check; it lives here, below both, so neither imports the other.
"""

from __future__ import annotations

import os
import stat

from .errors import InputError

__all__ = ["regular_file"]


def regular_file(
    path: str, what: str, remedy: str, expected: str = "a JSONL file"
) -> os.stat_result | None:
    """Stat a file a user named; refuse anything but a regular file, without opening it.

    Opening a FIFO blocks until a writer comes, and a device or a pipe may never end, so the
    kind is checked before any open (``what`` names the file in the message, ``remedy`` ends
    it; ``expected`` is what a directory should have been). Returns None when the path cannot
    be stat'ed: opening it reports why.

    Raises:
        InputError: the path is a directory, FIFO, socket or device (one line naming it).
    """
    try:
        st = os.stat(path)
    except OSError:
        return None
    if stat.S_ISDIR(st.st_mode):
        raise InputError([f"{path}: {what} is a directory; pass {expected}"])
    if not stat.S_ISREG(st.st_mode):
        kind = _file_kind(st.st_mode)
        raise InputError([f"{path}: {what} is {kind}, not a regular file; {remedy}"])
    return st


def _file_kind(mode: int) -> str:
    kinds = (
        (stat.S_ISFIFO, "a pipe or FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "a special file")
