"""Shards on disk: finding them, reading them safely, and writing the merged run folder.

- `resolve_inputs`: globs or comma-separated globs, sorted and de-duplicated (by resolved path);
  only ``.jsonl`` files that are not a run's sibling (``_failures``, ``_materialized_inputs``,
  ``_attempts``: `is_auxiliary`) are shards.
- `identical_files`: a file given twice under two names (a copy, a hard or symbolic link) is read
  once. Files are compared by inode, then by sha256 among files of equal size only, so distinct
  shards (which differ in size) are never hashed.
- `read_lines`: aggregation never changes its inputs, so a torn last line (a line without its
  newline that does not parse, left by a collector killed or still writing) is skipped and
  reported instead of repaired in place; a bad line anywhere else is an `InputError`. Every
  line is held to the input line limit (``--max-line-bytes``, 64 MiB by default), torn or not:
  a shard that is one 300 MB line is refused once the limit is read, never loaded whole.
- `refuse_overlaps`: before anything is written, no file aggregation writes may be a file it
  reads (an input, the plan, the batch manifest) or one it writes in another role, compared by
  resolved path and by inode, so a symlink or a hard link cannot smuggle one in.
- `refuse_foreign`: the merged output's files are replaced only when trollout wrote them: each is
  absent or empty, or the output's ``<stem>_aggregate_metrics.json`` is one trollout wrote (every
  entry ends with its ``trollout`` block); anything else needs ``--overwrite``. The metrics file
  is the mark because every aggregation writes it, and it is written before the merged files are
  renamed into place, so an aggregation killed between the two is still recognised.
- `MergeWriter`: the merged files are written beside their final names and renamed into place
  only when everything succeeded, so an interrupted aggregation leaves no half-written file.
- `shard_statuses` and `refresh_shard_status`: after an aggregation, each shard's
  ``<stem>_batch_status.json`` says how the aggregation that merged it went
  (``aggregation_status`` ``ok`` or ``error``, the metrics file, the errors), its counts kept
  (NeMo Gym's ``_refresh_shard_status_aggregation``: EvalRDL sums the shards' status files, so
  the merged output gets none). That is the one write into an input folder, so it is made only
  under the shard run's lock, after the merged outputs are written; a folder that cannot be
  written or whose lock a collector holds (its counts are still changing) is skipped with a
  warning, decided before anything is written and checked again under the lock.
"""

from __future__ import annotations

import glob
import os
import stat
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import orjson

from ..errors import ConfigError, RunFolderLockedError
from ..jsonl import read_appended
from ..recovery.files import AtomicFile, replace_atomically
from ..recovery.layout import RunLayout, is_auxiliary
from ..recovery.lock import RunLock
from ..recovery.manifest import sha256_file

__all__ = [
    "MergeWriter",
    "identical_files",
    "read_lines",
    "refresh_shard_status",
    "refuse_foreign",
    "refuse_overlaps",
    "resolve_inputs",
    "shard_statuses",
]

_GLOB_CHARS = frozenset("*?[")
_BLANK_START = (b"\n", b"\r", b" ", b"\t", b"")


def resolve_inputs(patterns: str | Sequence[str]) -> list[Path]:
    """Expand globs (or comma-separated globs) into the sorted, de-duplicated shard list.

    Raises:
        ConfigError: a literal path does not exist, or nothing matches at all.
    """
    pieces = [patterns] if isinstance(patterns, str) else list(patterns)
    found: dict[str, Path] = {}
    for piece in (p.strip() for text in pieces for p in text.split(",")):
        if not piece:
            continue
        for path in _expand(piece):
            if path.suffix == ".jsonl" and not is_auxiliary(path) and path.is_file():
                found.setdefault(os.path.realpath(path), path)
    if not found:
        raise ConfigError(
            f"no rollouts file matches {patterns!r}; give a glob such as 'shards/*.jsonl' "
            "(sidecars and materialized inputs are never shards)"
        )
    return sorted(found.values(), key=str)


def _expand(piece: str) -> list[Path]:
    if _GLOB_CHARS.isdisjoint(piece):
        if not os.path.exists(piece):
            raise ConfigError(f"input {piece!r} does not exist; check the path or quote the glob")
        return [Path(piece)]
    return [Path(p) for p in glob.glob(os.path.expanduser(piece), recursive=True)]


def identical_files(paths: Sequence[Path]) -> dict[Path, Path]:
    """Map each path whose content repeats an earlier path's to that earlier path.

    Empty files are never reported as copies of one another.
    """
    same: dict[Path, Path] = {}
    by_size: defaultdict[int, list[Path]] = defaultdict(list)
    inodes: dict[tuple[int, int], Path] = {}
    for path in paths:
        st = path.stat()
        first = inodes.setdefault((st.st_dev, st.st_ino), path)
        if first is not path:
            same[path] = first
        elif st.st_size:  # empty files hold nothing to count twice
            by_size[st.st_size].append(path)
    for group in by_size.values():
        if len(group) > 1:
            same.update(_same_content(group))
    return same


def _same_content(paths: Sequence[Path]) -> dict[Path, Path]:
    seen: dict[str, Path] = {}
    same: dict[Path, Path] = {}
    for path in paths:
        digest = sha256_file(path)
        first = seen.setdefault(digest, path)
        if first is not path:
            same[path] = first
    return same


def read_lines(
    path: Path, torn: list[str], max_line_bytes: int | None = None
) -> Iterator[tuple[int, bytes, dict[str, Any]]]:
    """Yield ``(line number, raw line, row)`` of a shard; a torn last line goes to ``torn``.

    Raises:
        InputError: a line other than a torn last line is not a JSON object, or a line (torn
            or not) is longer than ``max_line_bytes`` (the input line limit: no more than that
            is ever read into memory for one line).
    """
    return read_appended(path, torn=torn, max_line_bytes=max_line_bytes)


Role = tuple[str, Path]  # ("one of the input files", path): what a file is to aggregation

# What to do when a file written in this role is one aggregation reads or writes otherwise.
_REMEDIES = {
    "output": "write the merged outputs elsewhere (-o merged/merged.jsonl)",
    "the batch status": "the batch status is always batch_status.json beside the batch "
    "manifest; rename the manifest, or move it into a folder of its own",
    "a shard's status file": "move the batch manifest and the plan out of the shards' folders",
}


def refuse_overlaps(written: Iterable[Role], read: Iterable[Role]) -> None:
    """Refuse a file written in one role that is read, or written, in another.

    Files are the same when their resolved paths are (a symlink, or a path through a symlinked
    folder, names its target) or their inodes are (a hard link).

    Raises:
        ConfigError: naming both paths, their roles and the remedy of the written one.
    """
    seen: dict[object, Role] = {}
    for role, path in read:
        for key in _file_keys(path):
            seen.setdefault(key, (role, path))
    for role, path in written:
        for key in _file_keys(path):
            other = seen.setdefault(key, (role, path))
            if other[0] != role:
                raise ConfigError(f"{_same(role, path, other)}: {_REMEDIES[role]}")


def _same(role: str, path: Path, other: Role) -> str:
    alias = "" if other[1] == path else f" {str(other[1])!r} (the same file)"
    return f"{role} {str(path)!r} is {other[0]}{alias}, which trollout would write over"


def _file_keys(path: Path) -> list[object]:
    keys: list[object] = [os.path.realpath(path)]
    try:
        st = path.stat()
    except OSError:
        return keys  # not there (yet): its resolved path is all there is to compare
    return [*keys, (st.st_dev, st.st_ino)]


def refuse_foreign(layout: RunLayout, paths: Iterable[Path], *, overwrite: bool) -> None:
    """Refuse to replace a file at ``paths`` that trollout aggregate did not write.

    Each must be absent or empty, or the layout's metrics file must be one trollout wrote, or
    ``overwrite`` given; a link or anything but a regular file is never replaced.

    Raises:
        ConfigError: naming the first such file and the remedy (``--overwrite``).
    """
    ours = overwrite or _trollout_metrics(layout.aggregate_metrics)
    for path in paths:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(
                f"output file {str(path)!r} exists and is not a regular file (a link, a folder "
                "or a device); aggregation replaces only files it wrote: choose another output "
                "(-o merged/merged.jsonl)"
            )
        if st.st_size and not ours:
            raise ConfigError(
                f"output file {str(path)!r} exists and was not written by trollout aggregate "
                f"(no trollout metrics file {str(layout.aggregate_metrics)!r} beside it); "
                "choose another output (-o merged/merged.jsonl), or pass --overwrite "
                "(+overwrite=true) to replace it"
            )


# The `trollout` block closes every entry of the metrics file (`output`), the last one within
# the file's last bytes; reading only the tail keeps the check cheap for a file of many tasks.
_TAIL_BYTES = 1 << 20
_OUR_MARK = b'"trollout": {'


def _trollout_metrics(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - _TAIL_BYTES))
            return _OUR_MARK in f.read()
    except OSError:
        return False


class MergeWriter:
    """Writes a merged run folder: rollouts, failures and materialized inputs, atomically."""

    def __init__(self, layout: RunLayout) -> None:
        self.layout = layout
        self._targets = (layout.rollouts, layout.failures, layout.materialized_inputs)
        self._files: list[AtomicFile] = []

    def __enter__(self) -> MergeWriter:
        self.layout.output.parent.mkdir(parents=True, exist_ok=True)
        try:
            for path in self._targets:
                self._files.append(AtomicFile(path))
        except BaseException:
            self.discard()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        if exc_info[0] is not None:
            self.discard()
            return
        try:
            for new in self._files:
                new.close()  # complete and synced; `commit` renames them later
        except BaseException:
            self.discard()
            raise

    @property
    def rollouts(self) -> IO[bytes]:
        """The merged rollouts file being written."""
        return self._files[0].file

    @property
    def failures(self) -> IO[bytes]:
        """The merged failures sidecar being written."""
        return self._files[1].file

    @property
    def materialized(self) -> IO[bytes]:
        """The merged materialized inputs being written."""
        return self._files[2].file

    def commit(self) -> None:
        """Move the written files into place (an empty sidecar is not created)."""
        files, self._files = self._files, []
        try:
            while files:
                new = files.pop(0)
                if new.path is not self.layout.rollouts and os.stat(new.temp).st_size == 0:
                    new.discard()
                    new.path.unlink(missing_ok=True)
                else:
                    new.commit()
        finally:
            self._files = files  # any left after an error are for `discard`

    def discard(self) -> None:
        """Remove the temporary files."""
        files, self._files = self._files, []
        for new in files:
            new.discard()


def shard_statuses(shards: Iterable[Path]) -> tuple[list[RunLayout], list[str]]:
    """Return the shard runs whose status file may be marked, and why each other is skipped.

    A shard without a status file (or with a link or anything else there) is left alone
    silently; one whose folder cannot be written, or whose run a collector holds, with a
    warning. Nothing is written.
    """
    layouts, warnings = [], []
    for layout in map(RunLayout.for_output, shards):
        try:
            if not stat.S_ISREG(os.lstat(layout.batch_status).st_mode):
                continue
        except OSError:
            continue
        if not os.access(layout.output.parent, os.W_OK | os.X_OK):
            warnings.append(
                _skipped(
                    layout,
                    f"its folder {str(layout.output.parent)!r} is not writable",
                    "make it writable",
                )
            )
            continue
        try:
            RunLock.for_layout(layout).check_free()
        except RunFolderLockedError:
            warnings.append(_held(layout))
            continue
        layouts.append(layout)
    return layouts, warnings


def refresh_shard_status(
    layouts: Iterable[RunLayout], metrics: Path, errors: Sequence[str]
) -> list[str]:
    """Record in each shard's status file how the aggregation that merged it went.

    Each file is read and replaced under its run's lock when the run has a lock file (a
    trollout collector makes one before it writes anything), so a collector that started since
    `shard_statuses` is never raced; a status file that is not a JSON object is left alone.

    Returns:
        a warning for each shard skipped (its lock is held, or the file could not be written).
    """
    aggregation = {
        "aggregation_status": "error" if errors else "ok",
        "aggregate_metrics_fpath": str(metrics),
        "aggregation_errors": list(errors),
        "aggregated_at": time.time(),
    }
    warnings = []
    for layout in layouts:
        try:
            _mark(layout, aggregation)
        except RunFolderLockedError:
            warnings.append(_held(layout))
        except OSError as exc:  # RunFolderError included: the lock file cannot be opened
            why = f"it cannot be written ({exc.strerror or exc})"
            warnings.append(_skipped(layout, why, "fix that"))
    return warnings


def _mark(layout: RunLayout, aggregation: dict[str, Any]) -> None:
    lock = RunLock.for_layout(layout)
    if layout.lock.exists():
        lock.acquire()
    try:
        try:
            status = orjson.loads(layout.batch_status.read_bytes())
        except (FileNotFoundError, orjson.JSONDecodeError):
            return  # gone, or not ours to understand: left alone
        if isinstance(status, dict):
            data = orjson.dumps(status | aggregation, option=orjson.OPT_INDENT_2)
            replace_atomically(layout.batch_status, [data, b"\n"])
    finally:
        lock.release()


def _held(layout: RunLayout) -> str:
    why = f"a collector holds the lock of {str(layout.output)!r} (its counts still change)"
    return _skipped(layout, why, "let it finish")


def _skipped(layout: RunLayout, why: str, remedy: str) -> str:
    return (
        f"not marking {str(layout.batch_status)!r} with this aggregation's outcome: {why}; the "
        f"aggregation's own files are written; {remedy} and aggregate again to mark it"
    )
